"""Regression tests for round 3 of the outside probes (issue 45): received reports escaped and
read from regular files only (point 3), extremes refused when the config is parsed (point 5),
plugins contained (point 6), and the leftovers of the 220 (point 8)."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from _cli import error_lines, invoke

pytestmark = pytest.mark.faults

XSS = "<script>alert(1)</script>"
ESCAPED = "&lt;script&gt;alert(1)&lt;/script&gt;"


# ----------------------------------------------------------------------------- point 3: received reports

def _audit_report() -> dict:
    from pofe.evaluation.audit import AuditConfig, run_audit
    from pofe.evaluation.sim import PlantedJudge, PlantedWorld

    world = PlantedWorld(40, seed=0)
    return run_audit(PlantedJudge(world), world.items, AuditConfig(contrast_limit=5))


def _hostile_audit(rep: dict) -> dict:
    """Markup in the fields pofe writes as numbers (and in a few it writes as text)."""
    m = rep["metrics"]
    m["n"] = m["n_parsed"] = m["n_labelled"] = XSS
    m["agreement"] = XSS  # a metric row's value: was f"{v:.3f}" (an internal error) or raw
    m["ci95"]["cohen_kappa"] = [XSS, XSS]
    m["calibration"]["ece"] = XSS
    check = next(iter(rep["checks"].values()))
    check["op"], check["threshold"], check["value"] = XSS, XSS, XSS
    rep["checks"][XSS] = {"value": 0.5, "op": ">=", "threshold": 0.1, "passed": True}
    src = next(iter(m["by_source"].values()))
    src["n"] = XSS
    rep["calibration"]["length_unit"] = XSS
    rep["jury"] = {"dropped_member_verdicts": XSS, "unreadable_verdicts": XSS,
                   "rows": [{"judge": XSS, "role": XSS, "weight": XSS, "agreement": XSS, "passed": XSS}]}
    return rep


def test_report_of_a_received_audit_escapes_every_field_numbers_included(tmp_path):
    """``n``, ``op`` and ``threshold`` holding markup were written raw into report.html (stored
    XSS in a page meant to be opened in a browser); a string where a number belongs was an
    internal error (``f"{v:.3f}"``)."""
    d = tmp_path / "received"
    d.mkdir()
    (d / "audit.json").write_text(json.dumps(_hostile_audit(_audit_report())))
    # the audit.json given directly; a folder holding it renders the same page (audit_html) below its plots
    res = invoke("report", str(d / "audit.json"), "--output", str(tmp_path / "out"))
    assert res.returncode == 0, res.stderr
    page = (tmp_path / "out" / "report.html").read_text(encoding="utf-8")
    assert "<script" not in page
    # every planted field is on the page, as text: 3 of n / n_parsed / n_labelled, op, threshold,
    # value, the check's name, a metric, its interval (2), ECE, a source's n, the unit, jury (7)
    assert page.count(ESCAPED) >= 18, page.count(ESCAPED)
    assert f"<td>{ESCAPED} {ESCAPED}</td>" in page  # op and threshold of the first check
    assert f"on {ESCAPED} calibration pairs ({ESCAPED} parsed, {ESCAPED} with a human A/B label)" in page


def _hostile_run(d: Path, command: str, v) -> Path:
    """A received run folder of ``command`` whose every value is ``v`` (markup, or a type pofe never
    writes there)."""
    d.mkdir(parents=True)
    (d / "run.json").write_text(json.dumps({"format": 1, "command": command}))
    keys = ["step", "loss", "kl", "objective/kl", "reward", "winrate_vs_init", "mean_len", "judge", "p_hist"]
    (d / "metrics.jsonl").write_text("".join(json.dumps({k: v for k in keys}) + "\n" for _ in range(3)))
    (d / "summary.json").write_text(json.dumps({k: v for k in ("steps", "eval_before", "eval_after", "shaping")}))
    (d / "labels.jsonl").write_text(json.dumps({"prompt": v, "response_a": v, "response_b": v, "p": v}) + "\n")
    (d / "config.yaml").write_text(f"reward: {json.dumps(v)}\n")
    (d / "iter_1" / "data").mkdir(parents=True)
    (d / "iter_1" / "metrics.json").write_text(json.dumps({k: v for k in ("winrate", "head_to_head_vs_prev")}))
    (d / "iter_1" / "data" / "candidates.jsonl").write_text(json.dumps({"prompt": v, "scores": v, "responses": v}) + "\n")
    return d


@pytest.mark.parametrize("command", ["online", "rl", "rm", "label", "self-reward"])
@pytest.mark.parametrize("value", [XSS, {"nested": XSS}, 7])
def test_report_of_a_received_run_folder_with_values_of_any_type(tmp_path, command, value):
    """A string or a dict where pofe writes a number or a section was an internal error
    (``'str' object has no attribute 'get'`` in the flags, the rl and self-reward plots); that
    part of the page is now left out, and nothing from the folder is written unescaped."""
    d = _hostile_run(tmp_path / "r", command, value)
    res = invoke("report", str(d))
    assert res.returncode == 0, res.stderr
    page = (d / "report" / "report.html").read_text(encoding="utf-8")
    assert "<script" not in page
    assert f"<h1>pofe report: r ({command})</h1>" in page
    if value != 7:
        assert ESCAPED in page  # summary.json is shown, escaped


def test_audit_page_formats_numbers_as_before():
    from pofe.evaluation.report.audit_page import audit_html

    rep = _audit_report()
    page = audit_html(rep)
    name, c = next(iter(rep["checks"].items()))
    assert c["op"] in (">=", "<=")  # written as text now: &gt;= / &lt;=
    assert f"<tr><td>{name}</td><td>{c['value']:.3f}</td><td>{c['op'].replace('>', '&gt;').replace('<', '&lt;')} " \
           f"{c['threshold']}</td>" in page
    assert f"on {rep['metrics']['n']} calibration pairs" in page


def _fifo_watchdog(fifo: Path, after: float = 15.0) -> tuple[threading.Thread, list[bool]]:
    """Opens ``fifo`` for writing after ``after`` seconds (ending a reader blocked on it, so a hang
    fails the test instead of stalling the suite); ``hung[0]`` says whether it had to."""
    hung = [False]
    stop = threading.Event()

    def run() -> None:
        if not stop.wait(after):
            hung[0] = True
            os.close(os.open(fifo, os.O_RDWR))  # a writer: the blocked open returns, its read sees EOF

    t = threading.Thread(target=run, daemon=True)
    t.stop = stop  # type: ignore[attr-defined]
    t.start()
    return t, hung


@pytest.mark.parametrize("name", ["metrics.jsonl", "config.yaml", "run.json", "audit.json"])
def test_report_of_a_folder_with_a_fifo_is_one_line_and_never_blocks(tmp_path, name):
    """A ``metrics.jsonl`` that is a FIFO hung ``pofe report`` (open() waits for a writer)."""
    d = tmp_path / "received"
    d.mkdir()
    if name != "run.json":
        (d / "run.json").write_text(json.dumps({"format": 1, "command": "online"}))
    (d / "summary.json").write_text(json.dumps({"steps": 2}))
    os.mkfifo(d / name)
    t, hung = _fifo_watchdog(d / name)
    res = invoke("report", str(d))
    t.stop.set()  # type: ignore[attr-defined]
    assert not hung[0], "pofe report blocked on the FIFO"
    assert error_lines(res) == [f"error: {d / name}: not a regular file (a FIFO or device in a received run folder "
                                f"is never read)"], res.stderr
    assert res.returncode == 2
    assert not (d / "report" / "report.html").exists()


def test_an_audit_json_given_directly_that_is_a_fifo_is_one_line(tmp_path):
    fifo = tmp_path / "audit.json"
    os.mkfifo(fifo)
    t, hung = _fifo_watchdog(fifo)
    res = invoke("report", str(fifo), "--output", str(tmp_path / "out"))
    t.stop.set()  # type: ignore[attr-defined]
    assert not hung[0]
    assert error_lines(res) == [f"error: {fifo}: not a regular file (a FIFO or device in a received run folder "
                                f"is never read)"], res.stderr


def test_run_files_that_are_not_regular_are_refused_before_open(tmp_path):
    """The one reader of run files (``pofe.runs.open_run_file``) never opens a FIFO: it blocked
    there, in ``--resume``'s reads as in the report's."""
    from pofe.runs import RunError, guard_run_dir, read_run_bytes

    guard_run_dir(tmp_path)
    os.mkfifo(tmp_path / "config.yaml")
    t, hung = _fifo_watchdog(tmp_path / "config.yaml")
    with pytest.raises(RunError, match=r"config\.yaml: not a regular file \(a run file must be one\)$"):
        read_run_bytes(tmp_path / "config.yaml")
    t.stop.set()  # type: ignore[attr-defined]
    assert not hung[0]
    (tmp_path / "ok.json").write_text("{}")
    assert read_run_bytes(tmp_path / "ok.json") == b"{}"


def test_report_refuses_an_oversized_received_file(tmp_path, monkeypatch):
    from pofe.evaluation.report import run as report_run

    monkeypatch.setattr(report_run, "MAX_FILE_BYTES", 100)
    d = tmp_path / "received"
    d.mkdir()
    (d / "run.json").write_text(json.dumps({"format": 1, "command": "online"}))
    (d / "metrics.jsonl").write_bytes(b"{}\n" * 50)  # 3 x 50 = 150 bytes
    res = invoke("report", str(d))
    assert error_lines(res) == [f"error: {d / 'metrics.jsonl'}: 150 bytes, over the report's limit of 100 bytes per file"], \
        res.stderr


# ----------------------------------------------------------------------------- point 6: plugins contained

_JUDGE_PLUGIN = '''
from typing import ClassVar
from pofe.config import PofeConfig
from pofe.records import Judgment


class J:
    capabilities = frozenset({"pairwise"})

    def __init__(self, mode):
        self.mode, self.calls, self.id = mode, 0, "r3:" + mode

    def judge(self, prompts, a, b, *, references=None):
        self.calls += 1
        if self.mode == "raise2" and self.calls == 2:
            raise RuntimeError("backend went away")
        n = len(prompts) - (1 if self.mode == "short" else 0)
        p = float("nan") if self.mode == "nan" else 1.0
        return [Judgment(p=p, p_ab=p, p_ba=p, consistent=True, parse_ok=True, judge_id=self.id) for _ in range(n)]


class Opts(PofeConfig):
    capabilities: ClassVar[frozenset[str]] = frozenset({"pairwise"})
    mode: str = "ok"

    def build(self, **runtime):
        return J(self.mode)
'''


def _fake_dist(root: Path, name: str, entry_points: str, module: str, code: str) -> Path:
    """A minimal installed distribution (what importlib.metadata reads) and its one module."""
    d = root / f"{name.replace('-', '_')}-0.1.dist-info"
    d.mkdir(parents=True)
    (d / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (d / "entry_points.txt").write_text(entry_points)
    (root / f"{module}.py").write_text(code)
    return root


@pytest.fixture
def installed(monkeypatch):
    """Put a fake plugin package on sys.path for this test, with the plugin caches cleared around it."""
    from pofe import plugins

    plugins.clear_cache()

    def add(root: Path) -> None:
        monkeypatch.syspath_prepend(str(root))
        plugins.clear_cache()

    yield add
    plugins.clear_cache()


def _pairs(tmp_path: Path, n: int = 4) -> Path:
    p = tmp_path / "pairs.jsonl"
    p.write_text("".join(json.dumps({"prompt": f"Q{i}", "response_a": "a", "response_b": "b"}) + "\n" for i in range(n)))
    return p


def test_a_plugin_calling_sys_exit_on_import_is_one_line_naming_it(tmp_path, installed):
    """``sys.exit(0)`` in a plugin's import made ``pofe judge`` exit 0 with nothing written."""
    installed(_fake_dist(tmp_path / "site", "pofe-r3-exit", "[pofe.judges]\nr3-exit = r3_exiting:Opts\n",
                         "r3_exiting", "import sys\nsys.exit(0)\n"))
    res = invoke("judge", str(_pairs(tmp_path)), "--set", "judge.kind=r3-exit", "--set", f"run.output_dir={tmp_path / 'runs'}")
    assert error_lines(res) == [
        "error: --set judge.kind=r3-exit: bad value for 'judge.kind': judge kind plugin 'r3-exit' failed to import "
        "(entry point 'r3-exit = r3_exiting:Opts' in group pofe.judges of package pofe-r3-exit 0.1): it called "
        "sys.exit(0) (got 'r3-exit')"], res.stderr
    assert res.returncode == 2
    assert not (tmp_path / "runs").exists()


def _judge_with(tmp_path: Path, installed, mode: str):
    installed(_fake_dist(tmp_path / "site", "pofe-r3", "[pofe.judges]\nr3 = r3_judge:Opts\n", "r3_judge", _JUDGE_PLUGIN))
    return invoke("judge", str(_pairs(tmp_path)), "--set", "batch_size=2", "--set", "judge.kind=r3",
                  "--set", f"judge.options.mode={mode}", "--set", f"run.output_dir={tmp_path / 'runs'}",
                  "--set", "run.name=j")


def test_a_plugin_judge_raising_on_its_second_batch_is_one_line_and_keeps_the_first(tmp_path, installed):
    res = _judge_with(tmp_path, installed, "raise2")
    assert error_lines(res) == ["error: judge kind plugin 'r3' (package pofe-r3 0.1) failed in judge() on a batch of 2: "
                                "RuntimeError: backend went away"], res.stderr
    assert res.returncode == 1
    rows = [json.loads(x) for x in (tmp_path / "runs" / "j" / "verdicts.jsonl").read_text().splitlines()]
    assert [(r["prompt"], r["p"]) for r in rows] == [("Q0", 1.0), ("Q1", 1.0)]  # batch 1, kept


@pytest.mark.parametrize("mode, why", [
    ("short", "failed in judge(): it returned 1 verdicts for 2 items"),
    ("nan", "failed in judge(): verdict 0 has p = nan (a finite number in [0, 1] or None)"),
])
def test_a_plugin_judge_breaking_its_contract_is_named(tmp_path, installed, mode, why):
    """N-1 verdicts was "1 results for 2 items on process 0"; a NaN p was written with exit 0."""
    res = _judge_with(tmp_path, installed, mode)
    assert error_lines(res) == [f"error: judge kind plugin 'r3' (package pofe-r3 0.1) {why}"], res.stderr
    assert res.returncode == 1
    assert (tmp_path / "runs" / "j" / "verdicts.jsonl").read_text() == ""  # no NaN row written


def test_a_plugin_loss_that_raises_is_named(tmp_path, installed):
    import torch

    from pofe.losses import default_beta, get_loss
    from pofe.plugins import PluginCallError

    installed(_fake_dist(tmp_path / "site", "pofe-r3-loss", "[pofe.losses]\nr3-boom = r3_loss:boom\n", "r3_loss",
                         "def boom(pc, pr, rc, rr, *, beta=0.3, p=1.0):\n    raise ZeroDivisionError('oops')\n"))
    assert default_beta("r3-boom") == 0.3  # its signature is still read through the wrapper
    x = torch.zeros(2)
    with pytest.raises(PluginCallError) as e:
        get_loss("r3-boom")(x, x, x, x, beta=0.3)
    assert str(e.value) == "loss plugin 'r3-boom' (package pofe-r3-loss 0.1) failed when called: ZeroDivisionError: oops"
    assert e.value.exit_code == 1


# ----------------------------------------------------------------------------- point 5: extremes, at parse time

@pytest.mark.parametrize("command, kv, key, bound", [
    ("sft", f"train.batch_size={2**63}", "train.batch_size", "less than or equal to 1000000"),  # hung in batch_indices
    ("sft", f"train.grad_accum={2**63}", "train.grad_accum", "less than or equal to 1000000"),
    ("label", f"train.batch_size={10**7}", "train.batch_size", "less than or equal to 1000000"),
    ("online", f"sampling.max_new_tokens={10**12}", "sampling.max_new_tokens", "less than or equal to 1000000"),
    ("online", f"eval.sampling.batch_size={2**63}", "eval.sampling.batch_size", "less than or equal to 1000000"),
    ("sft", f"seed={2**64}", "seed", "less than or equal to 9223372036854775807"),  # was an internal error
    ("judge", "seed=-1", "seed", "greater than or equal to 0"),
    ("sim", "n_test=0", "n_test", "greater than or equal to 1"),  # was NaN with exit 0
])
def test_sizes_and_seeds_out_of_range_are_refused_when_parsed(command, kv, key, bound):
    res = invoke(command, "--set", kv, "--print-config")
    value = kv.split("=", 1)[1]
    assert error_lines(res) == [f"error: --set {kv}: bad value for '{key}': Input should be {bound} (got {value})"], \
        res.stderr
    assert res.returncode == 2


@pytest.mark.parametrize("args, key, why", [
    (["--dim", "0"], "dim", "Input should be greater than or equal to 1 (got 0)"),
    (["--dim", "-3"], "dim", "Input should be greater than or equal to 1 (got -3)"),
    (["--n-train", "0"], "n_train", "Input should be greater than or equal to 1 (got 0)"),
    (["--position-bias", "1e308"], "position_bias", "Input should be less than or equal to 20 (got 1e+308)"),
    (["--seed", str(2**64)], "seed", f"Input should be less than or equal to {2**63 - 1} (got {2**64})"),
])
def test_sim_arguments_are_validated(args, key, why):
    """``--dim 0`` / ``-3``, ``--n-train 0``, ``--position-bias 1e308`` were internal errors."""
    res = invoke("sim", *args)
    assert error_lines(res) == [f"error: option {key}: bad value for '{key}': {why}"], res.stderr
    assert res.returncode == 2


def test_sim_refuses_arrays_beyond_its_memory_bound():
    res = invoke("sim", "--dim", "1000", "--set", "n_agreement=1000000")
    assert error_lines(res) == [
        "error: sim: 1000000 pairs x dim 1000 = 1000000000 features per array, over the 20000000 limit; lower "
        "n_agreement / n_train / n_test or dim"], res.stderr
    assert res.returncode == 2


def test_sim_at_its_bounds_still_runs():
    from pofe.evaluation.sim import SimConfig, run_sim

    out = run_sim(SimConfig(dim=1, n_agreement=50, n_train=50, n_test=1, position_bias=20.0))
    assert out["config"]["position_bias"] == 20.0 and out["rm"]["human_hard"]["agreement_with_truth"] in (0.0, 1.0)


def _judge_run(tmp_path: Path, name: str):
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(json.dumps({"prompt": "Q?", "response_a": "a", "response_b": "bb"}) + "\n")
    return invoke("judge", str(pairs), "--set", "judge.kind=length", "--set", f"run.output_dir={tmp_path / 'runs'}",
                  "--set", f"run.name={name}")


def test_a_unicode_run_name_is_the_folder_name(tmp_path):
    """``run.name=naïve-日本-💥`` was an internal error ("surrogates not allowed"): the name was
    re-quoted with ASCII escapes and YAML read the emoji's UTF-16 pair as two lone surrogates."""
    name = "naïve-日本-💥"
    res = _judge_run(tmp_path, name)
    assert res.returncode == 0, res.stderr
    assert [p.name for p in (tmp_path / "runs").iterdir()] == [name]
    rows = [json.loads(x) for x in (tmp_path / "runs" / name / "verdicts.jsonl").read_text().splitlines()]
    assert [r["p"] for r in rows] == [1.0]  # the length judge prefers the shorter: A


@pytest.mark.parametrize("name, why", [
    ("a" * 300, "is 300 bytes long in UTF-8; a run folder name is at most 200"),  # was "File name too long", exit 1
    ("日" * 67, "is 201 bytes long in UTF-8; a run folder name is at most 200"),  # 3 bytes each
])
def test_a_run_name_too_long_for_a_file_system_is_one_line(tmp_path, name, why):
    res = _judge_run(tmp_path, name)
    # the --set is shown as the CLI passed it on: quoted, so that YAML keeps the typed text
    assert error_lines(res) == [f"error: --set run.name=\"{name}\": bad value for 'run.name': {why} (got {name!r})"], \
        res.stderr
    assert res.returncode == 2
    assert not (tmp_path / "runs").exists()


def test_max_new_tokens_is_checked_against_the_models_context(tiny_model, tokenizer):
    from pofe.config import ConfigError
    from pofe.generation import SamplingConfig, make_generator

    assert tiny_model.config.max_position_embeddings == 1024
    with pytest.raises(ConfigError) as e:
        make_generator(tiny_model, tokenizer, SamplingConfig(max_new_tokens=5000))
    assert str(e.value) == ("sampling.max_new_tokens=5000 does not fit the model's context of 1024 tokens "
                            "(max_position_embeddings in its config.json); lower it below 1024")


def test_a_prompt_longer_than_the_context_is_one_line_naming_it(tiny_model, tokenizer):
    """A 10 MB prompt in ``pofe online`` tried to allocate 4 TB (no bound on prompt length)."""
    from pofe.errors import DataError
    from pofe.generation import SamplingConfig, generate

    long = "word " * 3000
    with pytest.raises(DataError) as e:
        generate(tiny_model, tokenizer, ["short one", long], sampling=SamplingConfig(max_new_tokens=4))
    msg = str(e.value)
    assert msg.startswith("a prompt ('word word word word word word word word'...) is ")
    n = int(msg.split(" is ")[1].split(" tokens")[0])
    assert n > 3000  # 3000 words, plus the chat template's tokens
    assert msg.endswith(f"is {n} tokens: with sampling.max_new_tokens=4 that is over the model's context of 1024 "
                        f"tokens; shorten it or leave it out of the prompts")
    out = generate(tiny_model, tokenizer, ["short one"], sampling=SamplingConfig(max_new_tokens=4))
    assert len(out) == 1 and len(out[0][0].token_ids) <= 4  # a prompt that fits still samples


# ----------------------------------------------------------------------------- point 8: leftovers of the 220

def _saved_dataset(tmp_path: Path) -> Path:
    import datasets

    d = tmp_path / "ds"
    datasets.Dataset.from_list([{"prompt": "Q?", "response_a": "a", "response_b": "bb"}] * 3).save_to_disk(str(d))
    return d


def test_a_save_to_disk_folder_with_a_damaged_json_file_names_the_file(tmp_path):
    """Random bytes in a save_to_disk folder's state.json were a bare UnicodeDecodeError."""
    d = _saved_dataset(tmp_path)
    (d / "state.json").write_bytes(b"\xff" * 64)
    res = invoke("judge", str(d), "--set", "judge.kind=length", "--set", f"run.output_dir={tmp_path / 'runs'}")
    assert error_lines(res) == [f"error: {d / 'state.json'}: not UTF-8 text (byte 0); a damaged file of the datasets "
                                f"folder {d}"], res.stderr
    assert res.returncode == 2


def test_a_save_to_disk_shard_of_random_bytes_names_the_shard(tmp_path):
    d = _saved_dataset(tmp_path)
    (shard,) = d.glob("*.arrow")
    shard.write_bytes(b"\xff" * 4096)
    res = invoke("judge", str(d), "--set", "judge.kind=length", "--set", f"run.output_dir={tmp_path / 'runs'}")
    assert error_lines(res) == [f"error: {shard}: not a readable Arrow shard (OSError: Invalid IPC message: negative "
                                f"metadata length); a damaged file of the datasets folder {d}"], res.stderr
    assert res.returncode == 2


def test_a_run_folder_deleted_mid_run_is_one_line_and_never_recreated(tmp_path, monkeypatch):
    """The summary said "0/0 pairs labelled" with exit 0 (rows went to unlinked files, and the
    final writes re-created an empty folder); in other commands a TypeError formatting it."""
    import shutil

    import pofe.loops.label as label_loop

    run_dir = tmp_path / "runs" / "gone"

    def delete_the_folder(name: str) -> None:
        if name == "2:before_metrics":  # batch 2's rows written, its metrics row not
            shutil.rmtree(run_dir)

    monkeypatch.setattr(label_loop, "fault_point", delete_the_folder)
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"prompt": f"Q{i}?", "response_a": "x" * (i + 1), "response_b": "y" * (2 * i + 3)})
                             + "\n" for i in range(6)))
    res = invoke("label", "--pairs", str(pairs), "--set", "judge.kind=length", "--set", "train.batch_size=2",
                 "--set", "log.progress=false", "--set", "log.tensorboard=false",
                 "--set", f"run.output_dir={tmp_path / 'runs'}", "--set", "run.name=gone")
    assert error_lines(res) == [f"error: {run_dir / 'metrics.jsonl'}: deleted while this run was writing it (was the "
                                f"run folder removed?); the rows written to it are lost"], res.stderr
    assert res.returncode == 1
    assert not run_dir.exists()


def test_atomic_writes_never_recreate_a_deleted_run_folder(tmp_path):
    from pofe.runs import RunFolderGone, atomic_write_text, guard_run_dir

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    guard_run_dir(run_dir)
    atomic_write_text(run_dir / "final" / "a.json", "{}")
    run_dir.rename(tmp_path / "moved")
    with pytest.raises(RunFolderGone) as e:
        atomic_write_text(run_dir / "final" / "summary.json", "{}")
    assert str(e.value) == (f"{run_dir}: the run folder was deleted while this run was writing it; summary.json and "
                            f"what the folder held are lost")
    assert not run_dir.exists()


class _Evil:
    def __reduce__(self):
        return (os.system, ("touch PWNED",))


def test_a_pickle_holding_code_is_refused_without_advising_weights_only_false(tmp_path, tokenizer, monkeypatch):
    """torch's refusal says "Re-running torch.load with weights_only set to False will likely
    succeed" -- which would run the planted code; the line was torch's."""
    import torch

    from pofe.models import ModelError, load_model, tiny_causal_lm

    monkeypatch.chdir(tmp_path)
    d = tmp_path / "model"
    model = tiny_causal_lm(tokenizer)
    model.save_pretrained(d)
    tokenizer.save_pretrained(d)
    (d / "model.safetensors").unlink()
    torch.save({**model.state_dict(), "x": _Evil()}, d / "pytorch_model.bin")
    with pytest.raises(ModelError) as e:
        load_model(str(d))
    assert str(e.value) == (f"{d / 'pytorch_model.bin'}: a pickle file holding more than tensors (it names "
                            f"{os.system.__module__}.system); pofe loads only plain tensors from a pickle and never runs "
                            f"code from one: get a safetensors copy of the model from a source you trust")
    assert "weights_only" not in str(e.value)
    assert not (tmp_path / "PWNED").exists()


def test_an_adapter_pickle_holding_code_is_refused_the_same_way(tmp_path, tokenizer, monkeypatch):
    import torch
    from peft import LoraConfig, get_peft_model

    from pofe.models import ModelError, load_model, tiny_causal_lm

    monkeypatch.chdir(tmp_path)
    base = tmp_path / "base"
    tiny_causal_lm(tokenizer).save_pretrained(base)
    tokenizer.save_pretrained(base)
    a = tmp_path / "adapter"
    get_peft_model(tiny_causal_lm(tokenizer), LoraConfig(r=2, target_modules=["q_proj"])).save_pretrained(a)
    cfg = json.loads((a / "adapter_config.json").read_text())
    assert cfg["base_model_name_or_path"] is None  # a model built in memory names no base
    with pytest.raises(ModelError) as e:
        load_model(str(a))
    assert str(e.value) == (f"{a / 'adapter_config.json'}: base_model_name_or_path is None, not the base model's name "
                            f"or folder")  # was an AttributeError on None
    (a / "adapter_config.json").write_text(json.dumps({**cfg, "base_model_name_or_path": str(base)}))
    (a / "adapter_model.safetensors").unlink()
    torch.save({"x": _Evil()}, a / "adapter_model.bin")
    with pytest.raises(ModelError) as e:
        load_model(str(a))
    assert str(e.value).startswith(f"{a / 'adapter_model.bin'}: a pickle file holding more than tensors (it names ")
    assert "weights_only" not in str(e.value)
    assert not (tmp_path / "PWNED").exists()


def test_a_model_folder_that_needs_remote_code_says_so(tmp_path, tokenizer):
    from pofe.models import ModelError, load_model, tiny_causal_lm

    d = tmp_path / "remote"
    tiny_causal_lm(tokenizer).save_pretrained(d)
    tokenizer.save_pretrained(d)
    cfg = json.loads((d / "config.json").read_text())
    cfg.update(model_type="xmodel", architectures=["XForCausalLM"],
               auto_map={"AutoConfig": "configuration_x.XConfig", "AutoModelForCausalLM": "modeling_x.XForCausalLM"})
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelError) as e:
        load_model(str(d))
    assert str(e.value) == (f"{d / 'config.json'}: model_type 'xmodel' needs the folder's own Python code (auto_map), "
                            f"which pofe runs only with trust_remote_code: true (model.trust_remote_code, or the "
                            f"judge's): read that code first")


def test_audit_of_an_empty_file_names_the_file(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    res = invoke("audit", str(empty), "--judge", "length")
    assert error_lines(res) == [f"error: {empty}: no calibration pairs (an empty file)"], res.stderr  # was "the calibration set is empty"
    assert res.returncode == 2


def test_eval_of_empty_responses_files_names_the_file(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    res = invoke("eval", str(empty), str(empty), "--judge", "length")
    assert error_lines(res) == [f"error: {empty}: no prompts to compare on (an empty file?)"], res.stderr  # named none
    assert res.returncode == 2


def test_a_plugin_backend_or_reward_that_raises_is_named(tmp_path, installed):
    """A backend's or reward's raise was an internal error naming neither the plugin nor its package."""
    from pofe.judges.config import parse_judge_config
    from pofe.judges.registry import build_judge
    from pofe.plugins import PluginCallError
    from pofe.records import Completion
    from pofe.loops.rl.policy_gradient import plugin_reward

    code = ("from pofe.judges.base import BackendStats\n"
            "class Backend:\n    kind, fingerprint, cacheable, special_strings = 'r3-be', 'r3', False, ()\n"
            "    def __init__(self, cfg, **runtime):\n        self.stats = BackendStats()\n"
            "    def validate_choices(self, *a, **k):\n        pass\n"
            "    def close(self):\n        pass\n"
            "    def read_choices(self, *a, **k):\n        raise OSError('socket closed')\n"
            "    def generate(self, *a, **k):\n        raise OSError('socket closed')\n"
            "def reward(prompts, completions):\n    raise KeyError('score')\n")
    installed(_fake_dist(tmp_path / "site", "pofe-r3-be", "[pofe.judge_backends]\nr3-be = r3_be:Backend\n"
                         "[pofe.rewards]\nr3-reward = r3_be:reward\n", "r3_be", code))
    judge = build_judge(parse_judge_config({"kind": "rubric", "backend": "r3-be"}))
    with pytest.raises(PluginCallError) as e:
        judge.score(["q"], ["a"])
    assert str(e.value) == ("judge backend plugin 'r3-be' (package pofe-r3-be 0.1) failed when called: "
                            "OSError: socket closed")
    comps = [Completion(prompt="q", text="a", token_ids=[1], prompt_token_ids=[2])]
    with pytest.raises(PluginCallError) as e:
        plugin_reward("r3-reward")(["q"], comps)
    assert str(e.value) == "reward function plugin 'r3-reward' (package pofe-r3-be 0.1) failed on 1 completions: KeyError: 'score'"


@pytest.mark.slow  # a tiny model's online run on a CLI: ~5 s on a shared 2-core CPU
def test_online_with_a_prompt_longer_than_the_context_is_one_line(tmp_path, tiny_model_dir):
    """A 10 MB prompt in ``pofe online`` tried to allocate 4 TB; 200 KB shows the same bound."""
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("A short question?\n" + "word " * 40000 + "\nAnother one?\n")
    res = invoke("online", "--set", f"data.prompts={prompts}", "--set", f"model.name={tiny_model_dir}",
                 "--set", "judge.kind=length", "--set", "train.steps=2", "--set", "train.batch_size=2",
                 "--set", "eval.enabled=false", "--set", "sampling.max_new_tokens=4", "--set", "log.progress=false",
                 "--set", "log.tensorboard=false", "--set", f"run.output_dir={tmp_path / 'runs'}", "--set", "run.name=o")
    lines = error_lines(res)
    assert len(lines) == 1 and res.returncode == 2, res.stderr
    assert lines[0].startswith("error: a prompt ('word word word word word word word word'...) is ")
    assert lines[0].endswith(" tokens: with sampling.max_new_tokens=4 that is over the model's context of 1024 tokens; "
                             "shorten it or leave it out of the prompts")


@pytest.mark.slow  # a tiny model's online run in-process: a few seconds
def test_offline_online_with_a_pair_longer_than_the_context_is_one_line(tmp_path, tiny_model_dir):
    """The same bound in ``mode=offline``: a preference file's 200 KB prompt went to the policy pass
    (tokenised whole, no bound); now one line naming the pair, exit 2."""
    prefs = tmp_path / "prefs.jsonl"
    rows = [{"prompt": "A short question?", "chosen": "Yes.", "rejected": "No, not at all."},
            {"prompt": "word " * 40000, "chosen": "Yes.", "rejected": "No."}]
    prefs.write_text("".join(json.dumps(r) + "\n" for r in rows))
    res = invoke("online", "--set", "mode=offline", "--set", f"data.preferences={prefs}",
                 "--set", f"model.name={tiny_model_dir}", "--set", "train.steps=2", "--set", "train.batch_size=2",
                 "--set", "eval.enabled=false", "--set", "log.progress=false", "--set", "log.tensorboard=false",
                 "--set", f"run.output_dir={tmp_path / 'runs'}", "--set", "run.name=o")
    lines = error_lines(res)
    assert len(lines) == 1 and res.returncode == 2, res.stderr
    assert lines[0].startswith("error: a preference pair ('word word word word word word word word'...) is "), lines
    # 40000 words and the chat template's tokens, + "Yes." and EOS (the longer response)
    assert lines[0] == ("error: a preference pair ('word word word word word word word word'...) is 40034 tokens (prompt "
                        "40031 + its longer response): over the model's context of 1024 tokens; shorten it or leave it "
                        "out of the file")
    assert not (tmp_path / "runs" / "o" / "checkpoints").exists()  # nothing trained on it
