"""Round-2 probes (tag ``r2-text:``): every text pofe writes reads back unchanged (U+2028,
U+0085, NUL, control characters, RTL marks, long fields) through pofe's own writer -> reader
pairs and from other tools' JSON Lines; data and config input is never silently misread
(null / boolean / 400-digit ``p``, two pair shapes in a row, a torn quoted CSV row, deep
JSON, ``true`` for a number, duplicated YAML keys, alias bombs, ``!!python`` tags in
templates and constitutions). Each probe states what is expected after the fix."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

TAG = "r2-text: "
HOSTILE = ["one\u2028two", "one\u2029two", "one\x85two", "a\x00b", "\x01\x0b\x0c\x1b\x1f ctl", "\u202eevil\u202c\u200f",
           "\ufeffbom\u200b", "cr\r\nlf"]
BOMB = "\n".join(["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
                 + [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 9)]) + "\n"


def _raw_jsonl(path: Path, rows) -> Path:
    """JSON Lines as other tools write it: non-ASCII raw, so U+2028 / U+0085 sit raw in strings."""
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


def _rows(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text(encoding="utf-8").split("\n") if x.strip()]


def _hostile_pairs(d: Path) -> Path:
    return _raw_jsonl(d / "pairs.jsonl", [{"prompt": f"Q{i} {t}", "response_a": f"s {t}",
                                           "response_b": f"a much longer answer {t} " * 3} for i, t in enumerate(HOSTILE)])


def probes(P) -> list:
    out = []

    def want_pairs(d: Path) -> dict:
        return {r["prompt"]: {r["response_a"], r["response_b"]} for r in _rows(d / "pairs.jsonl")}

    def exported_ok(path: Path, d: Path) -> str | None:
        if not path.exists():
            return f"{path.name} not written"
        got = {r["prompt"]: {r["chosen"], r["rejected"]} for r in _rows(path)}
        return None if got == want_pairs(d) else f"texts changed: {len(got)} rows vs {len(HOSTILE)} written"

    # ------------------------------------------------------------------ writer -> reader round trips
    def judge_then_export(ctx) -> "P.Outcome":
        d = ctx.dir(TAG + "judge -> export")
        _hostile_pairs(d)
        res = P.pofe(ctx, *P.judge_args(ctx, d, inp=d / "pairs.jsonl"), "-o", str(d / "v.jsonl"))
        if res.returncode != 0:
            return P.judge_result(res, code=0)
        res = P.pofe(ctx, "export", str(d / "v.jsonl"), "--format", "trl", "-o", str(d / "trl.jsonl"))
        return P.judge_result(res, code=0, check=lambda: exported_ok(d / "trl.jsonl", d))

    out.append(P.Probe(TAG + "judge -> export", "text round trip",
                       "judge verdicts of hostile texts exported to TRL read back equal", judge_then_export))

    def label_then_export(ctx) -> "P.Outcome":
        d = ctx.dir(TAG + "label -> export")
        _hostile_pairs(d)
        res = P.pofe(ctx, *P.label_pairs_args(ctx, d, pairs=d / "pairs.jsonl"))
        if res.returncode != 0:
            return P.judge_result(res, code=0)
        res = P.pofe(ctx, "export", str(d / "runs" / "r"), "--format", "trl", "-o", str(d / "trl.jsonl"))
        return P.judge_result(res, code=0, check=lambda: exported_ok(d / "trl.jsonl", d))

    out.append(P.Probe(TAG + "label -> export", "text round trip",
                       "label --pairs preferences of hostile texts exported read back equal", label_then_export))

    def label_resume(ctx) -> "P.Outcome":
        d = ctx.dir(TAG + "label --resume")
        _hostile_pairs(d)
        res = P.pofe(ctx, *P.label_pairs_args(ctx, d, pairs=d / "pairs.jsonl"))
        if res.returncode != 0:
            return P.judge_result(res, code=0)
        res = P.pofe(ctx, "label", "--resume", str(d / "runs" / "r"))
        n = len(_rows(d / "runs" / "r" / "preferences.jsonl"))
        return P.judge_result(res, code=0, check=lambda: None if n == len(HOSTILE) else f"{n} preferences after resume")

    out.append(P.Probe(TAG + "label --resume", "text round trip",
                       "label --resume on a run holding hostile texts: every row kept, exit 0", label_resume))

    out.append(P.cli(TAG + "rm on preferences with raw U+2028 / U+0085", "text round trip",
                     "exit 0: other tools' JSON Lines (separators raw in strings) train",
                     lambda c, d: P.rm_args(c, d, train=_raw_jsonl(d / "p.jsonl", [
                         {"prompt": f"Q{i} {t}", "chosen": f"yes {t}", "rejected": f"no, a long answer {t} " * 2}
                         for i, t in enumerate(HOSTILE)])), code=0, timeout=300))
    out.append(P.cli(TAG + "judge counts a U+2028 row once", "text round trip", "exit 0: 3 rows in, 3 verdicts",
                     lambda c, d: P.judge_args(c, d, inp=_raw_jsonl(d / "in.jsonl", [
                         {"prompt": "Q\u2028?", "response_a": "a\u2028b", "response_b": "ccc\x85"}] * 3))
                     + ["-o", str(d / "v.jsonl")], code=0,
                     check=lambda c, d: None if len(_rows(d / "v.jsonl")) == 3 else f"{len(_rows(d / 'v.jsonl'))} verdicts"))

    def csv_big(c, d):
        buf = io.StringIO(newline="")
        w = csv.writer(buf)
        w.writerow(["prompt", "chosen", "rejected"])
        w.writerow(["Q?", "x" * 300_000, "no"])
        w.writerow(["Q2 \u2028", "yes\x85", "no"])
        (d / "p.csv").write_text(buf.getvalue(), encoding="utf-8", newline="")
        return ["export", str(d / "p.csv"), "--format", "trl", "-o", str(d / "o.jsonl")]

    out.append(P.cli(TAG + "export a CSV with a 300 KB field", "text round trip", "exit 0; the field kept whole",
                     csv_big, code=0, check=lambda c, d: None if [len(r["chosen"]) for r in _rows(d / "o.jsonl")]
                     == [300_000, 4] else "field changed"))

    def surrogate_export(c, d):
        (d / "p.jsonl").write_text('{"prompt": "Q\\ud800", "chosen": "a\\udfff", "rejected": "b"}\n', encoding="utf-8")
        return ["export", str(d / "p.jsonl"), "--format", "trl", "-o", str(d / "o.jsonl")]

    out.append(P.cli(TAG + "export lone surrogates to JSON Lines", "text round trip",
                     "exit 0; the escaped surrogates read back", surrogate_export, code=0,
                     check=lambda c, d: None if _rows(d / "o.jsonl")[0]["prompt"] == "Q\ud800" else "changed"))
    out.append(P.cli(TAG + "export lone surrogates to datasets", "text round trip",
                     "exit 2, one line: Arrow cannot store them; use --format trl",
                     lambda c, d: [*surrogate_export(c, d)[:2], "--format", "datasets", "-o", str(d / "ds")],
                     code=2, needles=("surrogate", "--format trl")))

    # ------------------------------------------------------------------ data never misread
    def prefs_with(d: Path, last: str) -> Path:
        f = d / "prefs.jsonl"
        f.write_text('{"prompt": "Q?", "chosen": "a", "rejected": "bb"}\n' + last + "\n", encoding="utf-8")
        return f

    for name, last, needles in (
            ("p null", '{"prompt": "Q?", "chosen": "a", "rejected": "bb", "p": null}', ("prefs.jsonl:2", "'p'")),
            ("p true", '{"prompt": "Q?", "chosen": "a", "rejected": "bb", "p": true}', ("prefs.jsonl:2", "'p'")),
            ("p of 400 digits", '{"prompt": "Q?", "chosen": "a", "rejected": "bb", "p": 1%s}' % ("0" * 400),
             ("prefs.jsonl:2", "'p'")),
            ("two pair shapes in a row", '{"prompt": "Q?", "chosen": "a", "rejected": "bb", "response_a": "x", '
             '"response_b": "y", "p": 0.2}', ("prefs.jsonl:2", "chosen/rejected", "response_a/response_b")),
            ("deeply nested JSON row", '{"prompt": "Q?", "chosen": %s}' % ("[" * 100_000 + "]" * 100_000),
             ("prefs.jsonl:2", "nested")),
    ):
        out.append(P.cli(TAG + f"export: {name}", "bad input", f"exit 2, one line naming {', '.join(needles)}",
                         lambda c, d, last=last: ["export", str(prefs_with(d, last)), "--format", "trl", "-o",
                                                  str(d / "o.jsonl")], code=2, needles=needles,
                         check=lambda c, d: "output written" if (d / "o.jsonl").exists() else None))
    out.append(P.cli(TAG + "rm: p true", "bad input", "exit 2 naming prefs.jsonl:2 and 'p'; nothing trained",
                     lambda c, d: P.rm_args(c, d, train=prefs_with(
                         d, '{"prompt": "Q?", "chosen": "a", "rejected": "bb", "p": true}')), code=2,
                     needles=("prefs.jsonl:2", "'p'")))

    def torn_csv(c, d):
        (d / "p.csv").write_text('prompt,chosen,rejected\nQ,a,bb\nQ2,a,"a reply torn mid-write\n', encoding="utf-8")
        return ["export", str(d / "p.csv"), "--format", "trl", "-o", str(d / "o.jsonl")]

    out.append(P.cli(TAG + "export: torn quoted last CSV row", "bad input", "exit 2 naming p.csv:3",
                     torn_csv, code=2, needles=("p.csv:3", "quoted")))

    # ------------------------------------------------------------------ config and YAML
    out.append(P.cli(TAG + "online: train.steps=true", "bad input", "exit 2 naming train.steps (no 1-step run)",
                     lambda c, d: ["online", *P.online_args(c, d, "train.steps=true")], code=2,
                     needles=("train.steps", "boolean")))
    out.append(P.cli(TAG + "sft: optim.lr=true", "bad input", "exit 2 naming optim.lr",
                     lambda c, d: P.sft_args(c, d, "optim.lr=true"), code=2, needles=("optim.lr", "boolean")))

    def cfg_file(d: Path, text: str, name: str = "c.yaml") -> Path:
        (d / name).write_text(text, encoding="utf-8")
        return d / name

    out.append(P.cli(TAG + "online: duplicated key in --config", "bad input", "exit 2 naming c.yaml:3 and 'steps'",
                     lambda c, d: ["online", "--config", str(cfg_file(d, "train:\n  steps: 2\n  steps: 9\n")),
                                   *P.online_args(c, d)], code=2, needles=("c.yaml:3", "duplicated key 'steps'")))
    out.append(P.cli(TAG + "online: 640-byte alias bomb --config", "bad input", "exit 2 naming the file, at once",
                     lambda c, d: ["online", "--config", str(cfg_file(d, BOMB, "bomb.yaml")), *P.online_args(c, d)],
                     code=2, needles=("bomb.yaml", "alias"), timeout=60))

    def judge_llm(c, d, *extra):
        return P.judge_args(c, d, f"judge.model={c.tiny}", *extra, kind="llm")

    out.append(P.cli(TAG + "judge: template with a !!python tag", "bad input", "exit 2 naming t.yaml; never executed",
                     lambda c, d: judge_llm(c, d, "judge.template=" + str(cfg_file(
                         d, f"prompt: !!python/object/apply:os.system ['touch {d / 'PWNED'}']\n", "t.yaml"))),
                     code=2, needles=("t.yaml",),
                     check=lambda c, d: "the payload ran" if (d / "PWNED").exists() else None))
    out.append(P.cli(TAG + "judge: malformed template YAML", "bad input", "exit 2 naming t.yaml and the line",
                     lambda c, d: judge_llm(c, d, "judge.template=" + str(cfg_file(d, "prompt: [unclosed\n", "t.yaml"))),
                     code=2, needles=("t.yaml:2", "invalid YAML")))
    out.append(P.cli(TAG + "judge: duplicated key in a constitution", "bad input", "exit 2 naming k.yaml:4 and 'version'",
                     lambda c, d: judge_llm(c, d, "judge.template=constitution", "judge.constitution=" + str(cfg_file(
                         d, "version: 1\nprinciples:\n  - {id: a, text: Be kind.}\nversion: 2\n", "k.yaml"))),
                     code=2, needles=("k.yaml:4", "duplicated key 'version'")))
    return out
