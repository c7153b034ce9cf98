"""Round-2 probes (tag ``r2-out:``): one output guard for every command with an output path
(never an input by path, symlink or hard link, never another output, never inside a live
run's folder), nothing silently dropped by ``label`` / ``eval`` / ``report``, and no metrics
row lost when a kill falls between a batch's rows and its metrics row. Each probe states what
is expected after the fix."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

TAG = "r2-out: "
HOLD = ("import sys, time\nfrom pofe.runs import lock_run\nlock_run(sys.argv[1])\nprint('locked', flush=True)\n"
        "time.sleep(300)\n")


def probes(P) -> list:
    out = []

    def pairs(d: Path, n: int = 6, name: str = "pairs.jsonl") -> Path:
        # response_a always shorter: the length judge (prefer shorter, temperature 0) says p = 1.0
        return P.jsonl(d / name, [{"prompt": f"Question {i}?", "response_a": "short" + "!" * (i % 3),
                                   "response_b": "a much longer answer " * (1 + i % 3)} for i in range(n)])

    def prefs(d: Path, name: str = "cal.jsonl") -> Path:
        p = d / name
        if not p.exists():
            shutil.copy(P.D(P.D_ctx[0], "prefs.jsonl"), p)
        return p

    def responses(d: Path, name: str, tag: str, idx, extra=()) -> Path:
        return P.jsonl(d / name, [{"prompt": f"Question {i}?", "response": f"{tag} answer {i}" * (1 + i % 3)}
                                  for i in idx] + list(extra))

    def linked(src: Path, dst: Path) -> Path:
        if not dst.exists():
            os.link(src, dst)
        return dst

    def untouched(*paths):
        return lambda c, d: [p(c, d) for p in paths]

    # ------------------------------------------------------------------ inputs, by path, link or inode
    out.append(P.cli(TAG + "audit -o onto the calibration file", "outputs", "exit 2 naming -o and the input; file kept",
                     lambda c, d: ["audit", str(prefs(d)), "--judge", "length", "-o", str(prefs(d))], code=2,
                     needles=("-o", "input file", "cal.jsonl"), inputs=untouched(lambda c, d: prefs(d))))
    out.append(P.cli(TAG + "audit --set html= onto the calibration file", "outputs",
                     "exit 2 naming html and the input; file kept; no report written",
                     lambda c, d: ["audit", str(prefs(d)), "--judge", "length", "-o", str(d / "a.json"),
                                   *P.sets(f"html={prefs(d)}")], code=2, needles=("html", "input file"),
                     inputs=untouched(lambda c, d: prefs(d)),
                     check=lambda c, d: "audit.json written anyway" if (d / "a.json").exists() else None))
    out.append(P.cli(TAG + "audit -o and html on one path", "outputs", "exit 2: each output its own path",
                     lambda c, d: ["audit", str(prefs(d)), "--judge", "length", "-o", str(d / "a.json"),
                                   *P.sets(f"html={d / 'a.json'}")], code=2, needles=("also the output of -o",)))
    out.append(P.cli(TAG + "audit -o onto a hard link of the calibration file", "outputs", "exit 2; file kept",
                     lambda c, d: ["audit", str(prefs(d)), "--judge", "length", "-o",
                                   str(linked(prefs(d), d / "other.json"))], code=2, needles=("input file",),
                     inputs=untouched(lambda c, d: prefs(d))))
    out.append(P.cli(TAG + "judge -o onto a hard link of the input", "outputs", "exit 2; input kept",
                     lambda c, d: [*P.judge_args(c, d, inp=pairs(d)), "-o", str(linked(pairs(d), d / "v.jsonl"))],
                     code=2, needles=("input file",), inputs=untouched(lambda c, d: d / "pairs.jsonl"),
                     setup=lambda c, d: pairs(d)))

    def eval_symlink(c, d):
        b = responses(d, "b.jsonl", "B", range(3))
        if not (d / "out.jsonl").is_symlink():
            (d / "out.jsonl").symlink_to(b)
        return ["eval", str(responses(d, "a.jsonl", "A", range(3))), str(b), "--judge", "length", "-o",
                str(d / "out.jsonl"), *P.sets("refusal=false")]

    out.append(P.cli(TAG + "eval -o onto a symlink to policy B's responses", "outputs", "exit 2; B's file kept",
                     eval_symlink, code=2, needles=("b.jsonl", "input file"),
                     inputs=untouched(lambda c, d: d / "b.jsonl"), setup=lambda c, d: responses(d, "b.jsonl", "B", range(3))))
    out.append(P.cli(TAG + "export -o onto a hard link of the pair file", "outputs", "exit 2; pair file kept",
                     lambda c, d: ["export", str(prefs(d, "prefs.jsonl")), "-o",
                                   str(linked(prefs(d, "prefs.jsonl"), d / "x.jsonl"))], code=2,
                     needles=("input file",), inputs=untouched(lambda c, d: prefs(d, "prefs.jsonl"))))

    def cache_file(c, d):
        from pofe.judges.cache import JudgeCache, cache_key

        path = d / "c.sqlite"
        if not path.exists():
            jc = JudgeCache(path)
            jc.put(cache_key("k", 0), {"lp": [0, -1.0], "raw": "x"})
            jc.close()
        return path

    out.append(P.cli(TAG + "cache export -o onto a hard link of the cache", "outputs", "exit 2; cache kept",
                     lambda c, d: ["cache", "export", "--path", str(cache_file(c, d)), "-o",
                                   str(linked(cache_file(c, d), d / "e.jsonl"))], code=2, needles=("c.sqlite", "input file"),
                     inputs=untouched(cache_file)))

    # ------------------------------------------------------------------ a live run's folder
    def live(name: str, args, needles, expected: str, watch=("labels.jsonl",)):
        def run(ctx):
            d = ctx.dir(TAG + name)
            run_dir = d / "runs" / "live"
            run_dir.mkdir(parents=True, exist_ok=True)
            (run_dir / "config.yaml").write_text("seed: 0\n")
            P.jsonl(run_dir / "labels.jsonl", [{"prompt": "kept", "p": 0.9}])
            proc = subprocess.Popen([sys.executable, "-c", HOLD, str(run_dir)], env=ctx.env, stdout=subprocess.PIPE,
                                    text=True)
            try:
                if proc.stdout.readline().strip() != "locked":
                    return P.Outcome("other", "probe could not start the lock holder", False)
                before_names = sorted(p.name for p in run_dir.iterdir())  # with the holder's .lock
                watched = [run_dir / w for w in watch]
                before = P.digest(watched)
                res = P.pofe(ctx, *args(ctx, d, run_dir))
                after = P.digest(watched)
                new = sorted(set(p.name for p in run_dir.iterdir()) - set(before_names))
                return P.judge_result(res, code=2, needles=(*needles, f"PID {proc.pid}"), inputs_before=before,
                                      inputs_after=after,
                                      check=lambda: f"wrote {new} into the live run" if new else None)
            finally:
                proc.kill()
                proc.wait(timeout=30)
        return P.Probe(TAG + name, "outputs", expected, run)

    out.append(live("judge -o onto a live label run's labels.jsonl",
                    lambda c, d, r: [*P.judge_args(c, d), "-o", str(r / "labels.jsonl")], ("-o", "running pofe process"),
                    "exit 2 naming the run folder and its PID; labels kept"))
    out.append(live("eval -o into a live run's folder",
                    lambda c, d, r: ["eval", str(responses(d, "a.jsonl", "A", range(3))),
                                     str(responses(d, "b.jsonl", "B", range(3))), "--judge", "length", "-o",
                                     str(r / "eval.jsonl"), *P.sets("refusal=false")], ("-o",),
                    "exit 2 naming the PID; nothing written there"))
    out.append(live("report --output into a live run's folder",
                    lambda c, d, r: ["report", str(report_src(d)), "--output", str(r / "report")], ("--output",),
                    "exit 2 naming the PID; no report folder there"))
    out.append(live("export --format datasets -o into a live run's folder",
                    lambda c, d, r: ["export", str(prefs(d, "prefs.jsonl")), "--format", "datasets", "-o",
                                     str(r / "ds")], ("-o",), "exit 2 naming the PID; no datasets folder there"))

    def report_src(d: Path) -> Path:
        src = d / "src"
        src.mkdir(exist_ok=True)
        (src / "config.yaml").write_text("seed: 0\n")
        P.jsonl(src / "metrics.jsonl", [{"step": 1, "loss": 0.5}, {"step": 2, "loss": 0.4}])
        return src

    def finished(c, d):
        done = d / "runs" / "done"
        done.mkdir(parents=True, exist_ok=True)
        (done / ".lock").write_text("99999999\n")
        return [*P.judge_args(c, d), "-o", str(done / "v.jsonl")]

    out.append(P.cli(TAG + "judge -o into a finished run's folder (stale lock)", "outputs",
                     "exit 0: nobody holds the lock; 6 verdicts", finished, code=0,
                     check=lambda c, d: None if len(P.read_rows(d / "runs" / "done" / "v.jsonl")) == 6 else "not 6 rows"))

    # ------------------------------------------------------------------ nothing silently dropped
    def summary(d: Path, name: str = "r") -> dict:
        return json.loads((d / "runs" / name / "summary.json").read_text())

    out.append(P.cli(TAG + "label --pairs with 40 pairs labels all 40", "silent drop",
                     "exit 0; 40 labels; summary input used 40 limited 0",
                     lambda c, d: P.label_pairs_args(c, d, pairs=pairs(d, 40)), code=0,
                     check=lambda c, d: None if (summary(d)["pairs"] == 40 and summary(d)["input"]["limited"] == 0)
                     else f"pairs {summary(d)['pairs']}, input {summary(d).get('input')}"))
    out.append(P.cli(TAG + "label --max-prompts 10 of 40 pairs is counted", "silent drop",
                     "exit 0; 10 labels; summary input available 40 used 10 limited 30",
                     lambda c, d: [*P.label_pairs_args(c, d, pairs=pairs(d, 40)), "--max-prompts", "10"], code=0,
                     check=lambda c, d: None if summary(d).get("input", {}) | {"source": None} ==
                     {"source": None, "available": 40, "used": 10, "limited": 30, "max_prompts": 10}
                     else f"input {summary(d).get('input')}"))
    out.append(P.cli(TAG + "eval: B lacks 6 of A's 10 prompts", "silent drop", "exit 2 naming 6 of the 10 and both files",
                     lambda c, d: ["eval", str(responses(d, "a.jsonl", "A", range(10))),
                                   str(responses(d, "b.jsonl", "B", range(4))), "--judge", "length",
                                   *P.sets("refusal=false")], code=2, needles=("6 of the 10", "b.jsonl", "a.jsonl")))
    out.append(P.cli(TAG + "eval: B answers 2 prompts A does not", "silent drop", "exit 2 naming 2 prompts and both files",
                     lambda c, d: ["eval", str(responses(d, "a.jsonl", "A", range(4))),
                                   str(responses(d, "b.jsonl", "B", range(6))), "--judge", "length",
                                   *P.sets("refusal=false")], code=2, needles=("2 prompts", "b.jsonl", "a.jsonl")))
    out.append(P.cli(TAG + "eval: a prompt twice in A's responses", "silent drop", "exit 2 naming the prompt and both rows",
                     lambda c, d: ["eval", str(responses(d, "a.jsonl", "A", range(3),
                                                         extra=[{"prompt": "Question 1?", "response": "other"}])),
                                   str(responses(d, "b.jsonl", "B", range(3))), "--judge", "length",
                                   *P.sets("refusal=false")], code=2, needles=("Question 1?", "a.jsonl:2", "a.jsonl:4")))

    def dup_prompts(c, d):
        (d / "p.txt").write_text("Question 0?\nQuestion 2?\nQuestion 0?\n")
        return ["eval", str(responses(d, "a.jsonl", "A", range(3))), str(responses(d, "b.jsonl", "B", range(3))),
                "--prompts", str(d / "p.txt"), "--judge", "length", *P.sets("refusal=false")]

    out.append(P.cli(TAG + "eval: a prompt twice in the prompt file", "silent drop", "exit 2 naming the prompt",
                     dup_prompts, code=2, needles=("Question 0?", "p.txt")))

    def report_of(value: float, make):
        name = TAG + f"report of a label run whose p are all {value}"

        def run(ctx):
            d = ctx.dir(name)
            r = P.pofe(ctx, *P.label_pairs_args(ctx, d, pairs=make(d)))
            if r.returncode != 0:
                return P.judge_result(r, code=0)
            ps = {row["p"] for row in P.read_rows(d / "runs" / "r" / "labels.jsonl")}
            res = P.pofe(ctx, "report", d / "runs" / "r")
            return P.judge_result(res, code=0, check=lambda: None if ps == {value} and
                                  (d / "runs" / "r" / "report" / "report.html").is_file() else f"p {ps}; no report.html")
        return P.Probe(name, "silent drop", "exit 0 and report.html", run)

    out.append(report_of(1.0, lambda d: pairs(d, 6)))
    out.append(report_of(0.5, lambda d: P.jsonl(d / "ties.jsonl", [  # equal lengths: the length judge ties
        {"prompt": f"Q{i}?", "response_a": f"aaaa{i}", "response_b": f"bbbb{i}"} for i in range(4)])))

    # ------------------------------------------------------------------ resume boundaries
    label = lambda c, d, n: P.label_pairs_args(c, d, "train.batch_size=2", name=n)  # noqa: E731
    for pt in ("2:before_metrics", "3:before_metrics"):
        out.append(P.crash_probe(TAG + f"label --pairs: SIGKILL at {pt}", pt, label,
                                 ["labels.jsonl", "preferences.jsonl", "metrics.jsonl"], final=None, steps=[1, 2, 3]))

    def cai_crash(ctx):
        d = ctx.dir(TAG + "cai revise: SIGKILL at 1:before_metrics")

        def args(n):
            return ["cai", "revise", "--model", str(ctx.tiny), "--prompts", str(P.D(ctx, "prompts.txt")),
                    "--max-prompts", "3",
                    *P.sets("train.batch_size=2", "rounds=1", "sampling.max_new_tokens=3", "critique_sampling.max_new_tokens=3",
                            "refusal.enabled=false", "log.progress=false", "log.tensorboard=false",
                            f"run.output_dir={d / 'runs'}", f"run.name={n}")]

        ref = P.pofe(ctx, *args("ref"))
        if ref.returncode != 0:
            return P.judge_result(ref, code=0)
        crashed = P.pofe(ctx, *args("crash"), POFE_FAULT="1:before_metrics")
        if crashed.returncode != -9:
            return P.Outcome("other", f"fault point not reached (exit {crashed.returncode})", False)
        run_dir = d / "runs" / "crash"
        res = P.pofe(ctx, "cai", "revise", "--resume", run_dir)
        o = P.judge_result(res, code=0)
        if not o.ok:
            return o
        got, want = (P.read_rows(x / "metrics.jsonl") for x in (run_dir, d / "runs" / "ref"))
        if len(got) < len(want):
            return P.Outcome("data lost", f"metrics steps {[r['step'] for r in got]} vs {[r['step'] for r in want]}", False)
        if got != want or P.read_rows(run_dir / "revisions.jsonl") != P.read_rows(d / "runs" / "ref" / "revisions.jsonl"):
            return P.Outcome("silent wrong", "metrics or revisions differ from the uninterrupted run", False)
        s = json.loads((run_dir / "summary.json").read_text())
        if s["input"]["limited"] != 5:
            return P.Outcome("silent wrong", f"summary input {s['input']} (8 prompts, max 3)", False)
        return P.Outcome("fine", "killed (exit -9); resume exit 0; metrics [1, 2] and revisions equal; input limited 5",
                         True)

    out.append(P.Probe(TAG + "cai revise: SIGKILL at 1:before_metrics", "crash/resume",
                       "resume writes the lost metrics row; metrics and revisions equal the uninterrupted run's",
                       cai_crash))
    return out
