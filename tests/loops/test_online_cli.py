"""``pofe online`` command line: --json summary, config errors (exit 2), --resume,
--require-audit, the example configs, and a short run on the embedded model (slow)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pofe.cli.main import app
from pofe.runs import read_jsonl
from pofe.config import load_config

REPO = Path(__file__).resolve().parents[2]


# Tiny models run much faster single-threaded (shared fixture in conftest.py).

def _sets(tmp_path, model_dir, *extra):
    base = [f"model.name={model_dir}", "judge.kind=length", "train.steps=2", "train.batch_size=2",
            "sampling.max_new_tokens=6", "optim.warmup_steps=0", f"run.output_dir={tmp_path}", "eval.num_prompts=2",
            "eval.sampling.max_new_tokens=6", "log.progress=false", "log.tensorboard=false", *extra]
    return [a for s in base for a in ("--set", s)]


def _json(stdout: str) -> dict:
    return json.loads(stdout[stdout.index("{"):])


@pytest.mark.slow
def test_cli_json_summary_and_resume(tmp_path, tiny_model_dir):
    r = CliRunner().invoke(app, ["online", "--json", *_sets(tmp_path, tiny_model_dir, "run.name=r")])
    assert r.exit_code == 0, r.output
    s = _json(r.stdout)
    for key in ("steps", "annotations", "mean_len_first", "mean_len_last", "winrate_vs_init", "seconds_per_step",
                "time_split", "run_dir"):
        assert key in s
    assert s["steps"] == 2 and s["annotations"] == 4 and 0.0 <= s["winrate_vs_init"] <= 1.0
    # resume reads the run's own config: a finished run resumes at its last step, same folder,
    # config.yaml untouched; changing settings on resume is refused (exit 2, one line)
    saved = (Path(s["run_dir"]) / "config.yaml").read_text()
    r2 = CliRunner().invoke(app, ["online", "--resume", s["run_dir"], "--json"])
    assert r2.exit_code == 0, r2.output
    s2 = _json(r2.stdout)
    assert s2["run_dir"] == s["run_dir"] and s2["steps"] == 2 and s2["resumed_from"] == 2
    assert (Path(s["run_dir"]) / "config.yaml").read_text() == saved
    assert len(read_jsonl(Path(s["run_dir"]) / "metrics.jsonl")) == 2  # no duplicated rows
    r3 = CliRunner().invoke(app, ["online", "--resume", s["run_dir"], "--steps", "3"])
    assert r3.exit_code == 2 and "refused" in r3.output


def test_cli_human_output_says_what_it_did(tmp_path, tiny_model_dir):
    r = CliRunner().invoke(app, ["online", *_sets(tmp_path, tiny_model_dir)])
    assert r.exit_code == 0, r.output
    assert "2 steps of DPO" in r.stdout and "mean response length" in r.stdout and "run folder" in r.stdout


def test_cli_bad_config_exits_2(tmp_path):
    r = CliRunner().invoke(app, ["online", "--set", "judge.tempalte=helpful"])
    assert r.exit_code == 2 and "judge.tempalte" in r.output
    r = CliRunner().invoke(app, ["online", "--resume", str(tmp_path)])
    assert r.exit_code == 2 and "config.yaml" in r.output
    r = CliRunner().invoke(app, ["online", "--set", "data.prompts=/nonexistent.jsonl"])
    assert r.exit_code == 2 and "not found" in r.output
    r = CliRunner().invoke(app, ["online", "--mode", "async"])  # the default hf engine samples the trained tensors
    assert r.exit_code == 2 and "mode=async needs sampling.engine=vllm" in r.output


def test_cli_require_audit_refuses_a_failed_or_missing_audit(tmp_path, tiny_model_dir):
    r = CliRunner().invoke(app, ["online", "--require-audit", str(tmp_path / "none.json"), *_sets(tmp_path, tiny_model_dir)])
    assert r.exit_code == 2 and "audit report not found" in r.output


def test_print_config_and_example_configs_validate(tmp_path):
    from pofe.loops.online import OnlineConfig

    r = CliRunner().invoke(app, ["online", "--print-config", "--template", "helpful-short"])
    assert r.exit_code == 0 and "template: helpful-short" in r.stdout
    for name in ("online-default.yaml", "online-length.yaml"):
        cfg = load_config(OnlineConfig, REPO / "examples" / name)
        assert cfg.mode == "online"
    assert load_config(OnlineConfig, REPO / "examples" / "online-length.yaml").judge.kind == "length"


@pytest.mark.slow
def test_embedded_model_llm_judge_two_steps(tmp_path):
    """The README configuration shrunk to 2 steps: embedded SmolLM2 as policy and as its own
    (frozen, shared-weights) annotator, both orders; leaves a complete run folder."""
    r = CliRunner().invoke(app, ["online", "--config", str(REPO / "examples" / "online-default.yaml"), "--json",
                                 "--set", "train.steps=2", "--set", "train.batch_size=2", "--set", "sampling.max_new_tokens=16",
                                 "--set", "eval.num_prompts=2", "--set", "eval.sampling.max_new_tokens=16",
                                 "--set", f"run.output_dir={tmp_path}", "--set", "log.progress=false",
                                 "--set", "judge.cache.enabled=false", "--set", "checkpoint.every=1"])
    assert r.exit_code == 0, r.output
    s = _json(r.stdout)
    assert s["steps"] == 2 and "smollm2" in s["judge"]
    d = Path(s["run_dir"])
    for f in ("config.yaml", "metrics.jsonl", "ledger.jsonl", "checkpoints/step-2", "final/config.json"):
        assert (d / f).exists(), f
    rows = [json.loads(x) for x in (d / "ledger.jsonl").read_text().splitlines()]
    judged = [x for x in rows if x["kind"] == "annotation" and x["p"] is not None]
    assert judged and all(x["p_ab"] is not None and x["p_ba"] is not None for x in judged)  # both orders
