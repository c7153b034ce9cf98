"""Round-2 class "a run folder is untrusted input" (probe tag ``r2-run:``): ``--resume`` of a
received folder never runs code its config names (callable judges and rewards,
``trust_remote_code``, endpoint URLs) unless the command line says so; no run file is read or
written through a planted link (``.lock``, ledger, metrics, labels, checkpoints, report); a
changed config or input is refused by name (``run.json``); files follow the umask; a
bad-input error leaves no run folder; ``run.name`` is the text that was typed."""

from __future__ import annotations

import json
import stat
from pathlib import Path

CLS = "untrusted run folder"


def probes(P) -> list:
    out = []

    def plant(d: Path, cls_path: str, data: dict, name: str = "r") -> Path:
        """A received run folder: a valid config.yaml only (like a folder of an older pofe)."""
        import importlib

        from pofe.config import dump_config

        mod, _, cls = cls_path.rpartition(".")
        run_dir = d / "runs" / name
        run_dir.mkdir(parents=True, exist_ok=True)
        data = {"log": {"progress": False, "tensorboard": False},
                "run": {"output_dir": str(d / "runs"), "name": name}, **data}
        (run_dir / "config.yaml").write_text(dump_config(getattr(importlib.import_module(mod), cls).model_validate(data)))
        return run_dir

    def victim(d: Path) -> Path:
        v = d / "victim"
        v.mkdir(exist_ok=True)
        (v / "precious.txt").write_text("keep me\n")
        return v

    def intact(d: Path) -> str | None:
        v = d / "victim" / "precious.txt"
        return None if v.is_file() and v.read_text() == "keep me\n" else "a file outside the run folder was changed or deleted"

    # ------------------------------------------------------------------ code named by the folder
    def callable_online(c, d):
        v = victim(d)
        prompts = d / "prompts.txt"
        prompts.write_text(f"{v}\n{v}\n")
        plant(d, "pofe.loops.online.OnlineConfig", {
            "model": {"name": str(c.tiny)}, "judge": {"kind": "callable", "callable": "shutil:rmtree"},
            "data": {"prompts": str(prompts)}, "train": {"steps": 1, "batch_size": 2}, "sampling": {"max_new_tokens": 2},
            "eval": {"enabled": False}})

    out.append(P.cli("r2-run: online --resume of a folder whose judge is callable shutil:rmtree", CLS,
                     "exit 2 naming judge.callable and --trust-run-config; nothing deleted",
                     lambda c, d: ["online", "--resume", d / "runs" / "r"], code=2,
                     needles=("judge.callable", "--trust-run-config"), setup=callable_online, check=lambda c, d: intact(d)))

    def callable_rl(c, d):
        victim(d)
        plant(d, "pofe.loops.rl.RLConfig", {
            "model": {"name": str(c.tiny)}, "data": {"prompts": str(P.D(c, "prompts.txt"))},
            "reward": {"kind": "judge", "judge": {"kind": "callable", "callable": "shutil:rmtree"}},
            "train": {"steps": 1, "batch_size": 2, "group_size": 2}, "eval": {"num_prompts": 2, "samples": 1}})

    out.append(P.cli("r2-run: rl --resume of a folder whose reward judge is callable", CLS,
                     "exit 2 naming reward.judge.callable", lambda c, d: ["rl", "--resume", d / "runs" / "r"], code=2,
                     needles=("reward.judge.callable", "--trust-run-config"), setup=callable_rl))

    def remote_code(c, d):
        import shutil

        model = d / "model"
        if not model.exists():
            shutil.copytree(c.tiny, model)
        cfg = json.loads((model / "config.json").read_text())
        cfg["auto_map"] = {"AutoConfig": "evil.EvilConfig"}
        (model / "config.json").write_text(json.dumps(cfg))
        (model / "evil.py").write_text("from pathlib import Path\nPath(__file__).with_name('RAN').write_text('ran')\n"
                                       "from transformers import LlamaConfig\nclass EvilConfig(LlamaConfig):\n"
                                       "    model_type = 'llama'\n")
        plant(d, "pofe.loops.label.LabelConfig", {
            "model": {"name": str(model), "trust_remote_code": True},
            "data": {"prompts": str(P.D(c, "prompts.txt")), "max_prompts": 2}, "judge": {"kind": "length"},
            "sampling": {"max_new_tokens": 2}})

    out.append(P.cli("r2-run: label --resume of a folder with model.trust_remote_code: true", CLS,
                     "exit 2 naming model.trust_remote_code; the model folder's Python never runs",
                     lambda c, d: ["label", "--resume", d / "runs" / "r"], code=2,
                     needles=("model.trust_remote_code", "--trust-run-config"), setup=remote_code,
                     check=lambda c, d: "the model folder's Python ran" if (d / "model" / "RAN").exists() else None))

    def endpoint(c, d):
        plant(d, "pofe.loops.label.LabelConfig", {
            "data": {"pairs": str(P.D(c, "pairs.jsonl"))},
            "judge": {"kind": "openai", "endpoint": {"base_url": "http://127.0.0.1:9/v1", "max_retries": 0,
                                                     "identify": False, "api_key_env": "OPENAI_API_KEY"}}})

    out.append(P.cli("r2-run: label --resume of a folder whose judge endpoint is a foreign URL", CLS,
                     "exit 2 naming judge.endpoint.base_url (prompts and the API key never sent)",
                     lambda c, d: ["label", "--resume", d / "runs" / "r"], code=2,
                     needles=("judge.endpoint.base_url", "127.0.0.1:9", "--trust-run-config"), setup=endpoint))
    out.append(P.cli("r2-run: the same folder with --trust-run-config", CLS,
                     "the setting is accepted; exit 1 naming the (closed) endpoint",
                     lambda c, d: ["label", "--resume", d / "runs" / "r", "--trust-run-config"], code=1,
                     needles=("127.0.0.1:9",), setup=endpoint, env={"OPENAI_API_KEY": "sk-probe"}))
    out.append(P.cli("r2-run: the same folder, URL repeated with --set", CLS,
                     "the setting comes from the command line; exit 1 naming the (closed) endpoint",
                     lambda c, d: ["label", "--resume", d / "runs" / "r", "--set", "judge.endpoint.base_url=http://127.0.0.1:9/v1"],
                     code=1, needles=("127.0.0.1:9",), setup=endpoint, env={"OPENAI_API_KEY": "sk-probe"}))
    out.append(P.cli("r2-run: the same folder, another URL with --set", CLS,
                     "exit 2: a resumed run keeps its config (the URL differs)",
                     lambda c, d: ["label", "--resume", d / "runs" / "r", "--set", "judge.endpoint.base_url=http://other:1/v1"],
                     code=2, needles=("judge.endpoint.base_url", "differs"), setup=endpoint))

    # ------------------------------------------------------------------ links planted in the folder
    def first_label(c, d):
        r = P.pofe(c, *P.label_pairs_args(c, d))
        assert r.returncode == 0, r.stderr[-500:]
        victim(d)

    def link(rel: str, target: str = "victim/precious.txt"):
        def setup(c, d):
            first_label(c, d)
            p = d / "runs" / "r" / rel
            if p.is_dir() and not p.is_symlink():
                import shutil

                shutil.rmtree(p)
            elif p.exists() or p.is_symlink():
                p.unlink()
            p.parent.mkdir(parents=True, exist_ok=True)
            p.symlink_to(d / target)
        return setup

    for rel, needle in ((".lock", ".lock"), ("labels.jsonl", "labels.jsonl"), ("metrics.jsonl", "metrics.jsonl"),
                        ("preferences.jsonl", "preferences.jsonl"), ("config.yaml", "config.yaml")):
        out.append(P.cli(f"r2-run: label --resume with a planted {rel} link", CLS,
                         f"exit 2 naming {needle} as a link; its target untouched",
                         lambda c, d: ["label", "--resume", d / "runs" / "r"], code=2, needles=(needle, "link"),
                         setup=link(rel), check=lambda c, d: intact(d)))

    def online_then(rel: str, target: str, is_dir: bool = False):
        def setup(c, d):
            r = P.pofe(c, "online", *P.online_args(c, d, "checkpoint.every=1"))
            assert r.returncode == 0, r.stderr[-500:]
            v = victim(d)
            p = d / "runs" / "r" / rel
            if is_dir:
                import shutil

                shutil.copytree(p, v / "copied", dirs_exist_ok=True)
                shutil.rmtree(p)
                p.symlink_to(v, target_is_directory=True)
            else:
                p.unlink()
                p.symlink_to(d / target)
        return setup

    out.append(P.cli("r2-run: online --resume with a planted ledger.jsonl link", CLS,
                     "exit 2 naming ledger.jsonl; no row appended to / truncated from its target",
                     lambda c, d: ["online", "--resume", d / "runs" / "r"], code=2, needles=("ledger.jsonl", "link"),
                     setup=online_then("ledger.jsonl", "victim/precious.txt"), check=lambda c, d: intact(d)))
    out.append(P.cli("r2-run: online --resume with checkpoints/ linked to another folder", CLS,
                     "exit 2 naming checkpoints; nothing outside written or pruned",
                     lambda c, d: ["online", "--resume", d / "runs" / "r"], code=2, needles=("checkpoints", "link"),
                     setup=online_then("checkpoints", "", is_dir=True),
                     check=lambda c, d: intact(d) or (None if sorted(p.name for p in (d / "victim").iterdir()) == ["copied", "precious.txt"]
                                                      else "files appeared in the linked folder")))

    def report_setup(rel: str):
        def setup(c, d):
            first_label(c, d)
            r = P.pofe(c, "report", d / "runs" / "r", "--json")
            assert r.returncode == 0, r.stderr[-500:]
            pngs = json.loads(r.stdout)["pngs"]
            p = Path(pngs[0]) if rel == "png" else d / "runs" / "r" / rel
            if p.is_dir():
                import shutil

                shutil.rmtree(p)
                p.symlink_to(d / "victim", target_is_directory=True)
            else:
                p.unlink()
                p.symlink_to(d / "victim" / "precious.txt")
        return setup

    for rel in ("png", "report/report.html", "report"):
        out.append(P.cli(f"r2-run: report with a planted {rel} link", CLS, "exit 2 naming the link; nothing written through it",
                         lambda c, d: ["report", d / "runs" / "r"], code=2, needles=("link",), setup=report_setup(rel),
                         check=lambda c, d: intact(d) or (None if sorted(p.name for p in (d / "victim").iterdir()) == ["precious.txt"]
                                                          else "the report wrote into the linked folder")))

    def secret_config(c, d):
        first_label(c, d)
        (d / "secret.yaml").write_text("api_key: sk-do-not-leak\n")
        cfg = d / "runs" / "r" / "config.yaml"
        cfg.unlink()
        cfg.symlink_to(d / "secret.yaml")

    out.append(P.cli("r2-run: report with config.yaml linked to a secret file", CLS,
                     "exit 2 naming config.yaml; the secret never lands in report.html",
                     lambda c, d: ["report", d / "runs" / "r"], code=2, needles=("config.yaml", "link"), setup=secret_config,
                     check=lambda c, d: "the secret was copied into the report" if any(
                         "sk-do-not-leak" in p.read_text(errors="replace") for p in (d / "runs" / "r").rglob("*.html")) else None))

    # ------------------------------------------------------------------ run.json
    def grown(c, d):
        pairs = d / "pairs.jsonl"
        pairs.write_text(P.D(c, "pairs.jsonl").read_text())
        r = P.pofe(c, *P.label_pairs_args(c, d, pairs=pairs))
        assert r.returncode == 0, r.stderr[-500:]
        with pairs.open("a") as f:
            f.write(json.dumps({"prompt": "new?", "response_a": "a", "response_b": "bb"}) + "\n")

    out.append(P.cli("r2-run: label --resume after its pairs file grew", CLS, "exit 2 naming the input pairs and the file",
                     lambda c, d: ["label", "--resume", d / "runs" / "r"], code=2, needles=("pairs", "pairs.jsonl", "changed"),
                     setup=grown))

    def edited(c, d):
        first_label(c, d)
        cfg = d / "runs" / "r" / "config.yaml"
        cfg.write_text(cfg.read_text().replace("prefer: shorter", "prefer: longer"))

    out.append(P.cli("r2-run: label --resume after its config.yaml was edited (another judge)", CLS,
                     "exit 2 naming config.yaml (never two judges in one run)",
                     lambda c, d: ["label", "--resume", d / "runs" / "r"], code=2, needles=("config.yaml", "changed"),
                     setup=edited))

    def legacy(c, d):
        first_label(c, d)
        (d / "runs" / "r" / "run.json").unlink()

    out.append(P.cli("r2-run: label --resume of a folder without run.json (older pofe)", CLS,
                     "exit 0 with a warning that it cannot be verified",
                     lambda c, d: ["label", "--resume", d / "runs" / "r"], code=0, setup=legacy))

    def manifest_ok(c, d):
        m = json.loads((d / "runs" / "r" / "run.json").read_text())
        keys = [i["key"] for i in m.get("inputs", [])]
        return None if m.get("command") == "label" and m.get("pofe_version") and keys == ["data.pairs"] else f"run.json: {m}"

    out.append(P.cli("r2-run: label writes run.json (version, command, config and input hashes)", CLS,
                     "exit 0; run.json names the command and hashes the pairs file",
                     lambda c, d: P.label_pairs_args(c, d), code=0, check=manifest_ok))

    # ------------------------------------------------------------------ umask
    def modes(c, d):
        r = d / "runs" / "r"
        got = {p.name: oct(stat.S_IMODE(p.stat().st_mode)) for p in (r / "config.yaml", r / "run.json", r / ".lock",
                                                                      r / "labels.jsonl", r / "summary.json")}
        bad = {k: v for k, v in got.items() if v != "0o640"}
        return f"modes under umask 027: {bad}" if bad else None

    out.append(P.cli("r2-run: label under umask 027", CLS, "exit 0; run files are 0640 (the umask is respected)",
                     lambda c, d: P.label_pairs_args(c, d), code=0, check=modes,
                     prefix=lambda c, d: ("sh", "-c", 'umask 027 && exec "$0" "$@"')))

    # ------------------------------------------------------------------ bad input leaves no folder
    def no_folder(c, d):
        runs = d / "runs"
        return f"a run folder was left: {[p.name for p in runs.iterdir()]}" if runs.is_dir() and any(runs.iterdir()) else None

    bad_callable = "judge.callable=no_such_module_xyz:score"
    for cmd, args in (
            ("label", lambda c, d: P.label_pairs_args(c, d, "judge.kind=callable", bad_callable)),
            ("online", lambda c, d: ["online", *P.online_args(c, d, "judge.kind=callable", bad_callable)]),
            ("judge", lambda c, d: P.judge_args(c, d, bad_callable, kind="callable")),
            ("rl", lambda c, d: P.rl_args(c, d, "reward.kind=judge", "reward.judge.kind=callable",
                                           "reward.judge.callable=no_such_module_xyz:score"))):
        out.append(P.cli(f"r2-run: {cmd} with a callable judge that cannot be imported", CLS,
                         "exit 2 naming the module; no run folder left", args, code=2, needles=("no_such_module_xyz",),
                         check=no_folder))

    # ------------------------------------------------------------------ run.name
    for typed in ("123", "2024-12-01"):
        out.append(P.cli(f"r2-run: label with run.name={typed}", CLS, f"exit 0; the run folder is named {typed!r}",
                         lambda c, d, typed=typed: P.label_pairs_args(c, d, name=typed), code=0,
                         check=lambda c, d, typed=typed: None if (d / "runs" / typed / "labels.jsonl").is_file()
                         else f"no folder {typed!r}: {[p.name for p in (d / 'runs').iterdir()] if (d / 'runs').is_dir() else []}"))
    for label, bad in (("a newline", "a\nb"), ("an escape sequence", "x\x1b[31my")):
        out.append(P.cli(f"r2-run: label with run.name holding {label}", CLS, "exit 2 naming run.name; no folder",
                         lambda c, d, bad=bad: P.label_pairs_args(c, d, name=bad), code=2,
                         needles=("run.name", "control characters"), check=no_folder))
    return out
