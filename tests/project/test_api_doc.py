"""The Python API (``pofe/__init__.py``, ``pofe/api.py``) and its page ``docs/api.md``: the page's
``python`` blocks run in order in one namespace (a notebook), on a tiny random model; ``import
pofe`` stays free of torch; every public name resolves; the README points to the page."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "api.md"
MODEL_LINE = 'MODEL = "smollm2-135m-instruct"'


def python_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)


@pytest.mark.slow  # a label and an online run on a tiny model: 3 s to 23 s on the shared 2-core machine
def test_the_api_page_runs_as_a_notebook(tmp_path, tiny_model_dir, monkeypatch):
    blocks = python_blocks(PAGE.read_text(encoding="utf-8"))
    assert len(blocks) >= 8
    # the page's one model is the embedded default; here the tiny random model's folder
    assert sum(MODEL_LINE in b for b in blocks) == 1
    blocks = [b.replace(MODEL_LINE, f"MODEL = {str(tiny_model_dir)!r}") for b in blocks]
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "__api_page__"}
    for i, block in enumerate(blocks):
        exec(compile(block, f"docs/api.md python block {i + 1}", "exec"), namespace)
    # what the blocks left behind: the audit file the gate read, a run folder, the export
    assert (tmp_path / "audit.json").is_file() and (tmp_path / "audit.html").is_file()
    assert namespace["run_dir"].parent.resolve() == (tmp_path / "runs").resolve()
    assert (tmp_path / "pairs.jsonl").is_file()


def test_public_names_resolve():
    import pofe

    assert len(pofe.__all__) > 20 and "__version__" in pofe.__all__
    for name in pofe.__all__:
        assert getattr(pofe, name) is not None, name
    assert set(pofe.__all__) <= set(dir(pofe))
    with pytest.raises(AttributeError, match="module 'pofe' has no attribute 'nothing_here'"):
        pofe.nothing_here  # noqa: B018


def test_every_command_has_its_runner_and_config_class():
    import inspect

    import pofe
    from pofe.api import NOT_RUN, runner
    from pofe.config_docs import COMMANDS

    assert set(NOT_RUN) == {"chat", "annotate"}
    for command in set(COMMANDS) - set(NOT_RUN):  # a new command on the driver is run without an edit here
        assert next(iter(inspect.signature(runner(command)).parameters)) in ("cfg", "config"), command
    assert "resume" in inspect.signature(runner("sft")).parameters  # run(..., resume=) reaches it
    assert "require_audit" not in inspect.signature(runner("sft")).parameters
    # the classes exported by name are the commands' own (none stale)
    classes = {getattr(pofe, n) for n in pofe.__all__ if n.endswith("Config") and n != "ConfigError"}
    assert classes <= {pofe.config_class(c) for c in COMMANDS}
    assert pofe.config_class("online") is pofe.OnlineConfig


def test_run_refuses_what_the_command_line_refuses(tmp_path):
    import pofe

    cases = [
        (lambda: pofe.run("online", {"train.stpes": 2}), "config: unknown key 'train.stpes'"),
        (lambda: pofe.run("online", {"judge": {"kind": "lenght"}}),
         "config: bad value for 'judge.kind': unknown kind 'lenght'; choose one of"),
        (lambda: pofe.run("sft", require_audit="a.json"), "run('sft'): require_audit= is not an option of sft"),
        (lambda: pofe.run("train"), "run: unknown command 'train'; choose one of online, sft,"),
        (lambda: pofe.run("chat"), "run: 'chat' is not run from Python: it answers prompts typed on the command line"),
        (lambda: pofe.run("online", {}, resume=tmp_path),
         f"run('online', resume={str(tmp_path)!r}): config= is refused; a resumed run keeps its saved config.yaml"),
        (lambda: pofe.run("online", resume=tmp_path),
         f"run('online', resume={str(tmp_path)!r}): no config.yaml there (not a pofe run folder)"),
        (lambda: pofe.make_config("sft", pofe.OnlineConfig()),
         "make_config('sft'): config is a OnlineConfig; sft takes a SFTConfig (or a dict of its keys)"),
        (lambda: pofe.export(tmp_path / "nowhere", tmp_path / "out.jsonl", format="csv"),
         "config: bad value for 'format': Input should be 'trl', 'trl-conversational', 'alpaca_eval' or 'datasets'"),
    ]
    for call, line in cases:
        with pytest.raises(pofe.PofeError) as e:
            call()
        assert str(e.value).startswith(line), str(e.value)
        assert "\n" not in str(e.value)


def test_a_config_dict_takes_sections_and_dotted_keys_and_is_not_changed():
    import pofe

    given = {"judge.prefer": "longer", "judge": {"kind": "length"}, "train": {"steps": 3}}
    cfg = pofe.make_config("online", given)
    assert (cfg.judge.kind, cfg.judge.prefer, cfg.train.steps) == ("length", "longer", 3)
    # the other keys keep their defaults (a section given in part is merged, as from a YAML file)
    assert cfg.train.batch_size == pofe.OnlineConfig().train.batch_size
    assert given == {"judge.prefer": "longer", "judge": {"kind": "length"}, "train": {"steps": 3}}


def test_judge_pairs_and_audit_in_memory(tmp_path):
    import pofe

    verdicts = pofe.judge_pairs({"kind": "length", "prefer": "longer"}, ["q"] * 3, ["aa", "a", "abc"], ["a", "aa", "abc"],
                                batch_size=2)
    assert [v.p for v in verdicts] == [1.0, 0.0, 0.5]
    items = [{"prompt": "q", "response_a": "aa", "response_b": "a", "label": "A"},
             {"prompt": "q", "response_a": "a", "response_b": "aa", "label": "A"}]
    report = pofe.audit({"kind": "length", "prefer": "longer"}, items, {"contrasts": False})
    assert report["metrics"]["agreement"] == 0.5  # right on the first, wrong on the second
    # a judge built from a config here is vouched for by that config, as `pofe audit --judge` does
    assert report["judge_identity"]["kind"] == "length" and report["judge_identity"]["prefer"] == "longer"
    # the same pairs from a file, and `pofe audit` itself through run(): the same numbers
    import json

    calibration = tmp_path / "calibration.jsonl"
    calibration.write_text("".join(json.dumps(x) + "\n" for x in items))
    assert pofe.audit({"kind": "length", "prefer": "longer"}, calibration, {"contrasts": False})["metrics"]["agreement"] == 0.5
    run_dir, same = pofe.run("audit", {"data.calibration": [str(calibration)], "judge": {"kind": "length", "prefer": "longer"},
                                       "contrasts": False})
    assert run_dir is None and same["metrics"]["agreement"] == 0.5 and same["judge_config"]["prefer"] == "longer"
    assert same["judge_identity"] == report["judge_identity"]  # what --require-audit compares: the same judge
    with pytest.raises(pofe.PofeError, match=r"^judge_pairs: one of each per pair, got 2 prompts, 2 responses_a, "
                                             r"1 responses_b$"):
        pofe.judge_pairs({"kind": "length"}, ["q", "q"], ["a", "b"], ["c"])
    with pytest.raises(pofe.PofeError, match=r"^audit: no labelled pairs given \(items is empty\)$"):
        pofe.audit({"kind": "length"}, [])
    with pytest.raises(pofe.PofeError, match=r"^items\[1\]: missing 'label'$"):
        pofe.audit({"kind": "length"}, [items[0], {"prompt": "q", "response_a": "a", "response_b": "b"}])


def test_readme_points_to_the_api_page_and_names_only_exported_functions():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "(docs/api.md)" in readme
    import pofe

    # every `pofe.<name>(` the README shows is a public name (the old section listed three
    # functions under `from pofe.<module> import`, none of them importable from pofe)
    shown = set(re.findall(r"\bpofe\.([a-z_]+)\(", readme))
    assert shown and shown <= set(pofe.__all__), shown - set(pofe.__all__)


@pytest.mark.slow  # two short runs of a tiny model: 5 s to 13 s on the shared 2-core machine
def test_run_resumes_a_run_with_its_own_config(tmp_path, tiny_model_dir, monkeypatch):
    import pofe

    # a judge that runs code named in the config: a resumed run must not run it unasked
    (tmp_path / "shorter_value.py").write_text("def value(prompt, response, reference=None):\n    return -len(response)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = {"model.name": str(tiny_model_dir), "judge": {"kind": "callable", "callable": "shorter_value:value"},
           "train": {"steps": 2, "batch_size": 2}, "sampling.max_new_tokens": 4, "eval.enabled": False,
           "log": {"progress": False, "tensorboard": False}, "run.output_dir": str(tmp_path / "runs"),
           "checkpoint.every": 1}
    run_dir, summary = pofe.run("online", cfg)
    assert (summary["steps"], summary["steps_run"], summary["resumed_from"]) == (2, 2, None)
    with pytest.raises(pofe.PofeError) as e:
        pofe.run("online", resume=run_dir)
    assert str(e.value) == (f"run('online', resume={str(run_dir)!r}): the run folder's config.yaml sets judge.callable: "
                            f"shorter_value:value, which runs code or sends the run's data out; a run folder is not "
                            f"trusted: pass trust_run_config=True")
    again, resumed = pofe.run("online", resume=run_dir, trust_run_config=True)
    assert again == run_dir and (resumed["steps"], resumed["steps_run"], resumed["resumed_from"]) == (2, 0, 2)


@pytest.mark.slow  # a fresh interpreter: the only way to see what `import pofe` alone imports
def test_import_pofe_imports_no_torch():
    code = ("import sys, pofe; heavy = [m for m in ('torch', 'transformers', 'pofe.api', 'pofe.models') "
            "if m in sys.modules]; print(heavy, len(pofe.__all__))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("[] "), out.stdout
