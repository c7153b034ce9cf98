"""Judge cost in the commands: ``judge/*`` metrics per step and ``judge_usage`` in the summaries, and
``judge.budget`` stopping a run cleanly, resumed with a larger budget (``--resume --set judge.budget...``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests._cli import error_lines, invoke

KEYS = ("judge/calls", "judge/cached", "judge/tokens_in", "judge/tokens_out", "judge/cost",
        "judge/calls_total", "judge/cached_total", "judge/tokens_in_total", "judge/tokens_out_total", "judge/cost_total",
        "judge/unmetered_total")


def _pairs(tmp_path, n=6):
    f = tmp_path / "pairs.jsonl"
    f.write_text("".join(json.dumps({"prompt": f"Question {i}?", "response_a": "yes " * (1 + i % 3),
                                     "response_b": "no, because " * (1 + i % 2)}) + "\n" for i in range(n)))
    return f


def _rows(path):
    return [json.loads(x) for x in open(path)]


def _label(tmp_path, name, judge_dir, *more):
    return invoke("label", "--pairs", str(_pairs(tmp_path)), "--output-dir", str(tmp_path), "--name", name,
                  "--set", "judge.kind=llm", "--set", f"judge.model={judge_dir}", "--set", "judge.cache.enabled=false",
                  "--set", "judge.price.input_per_million=3", "--set", "judge.price.output_per_million=15",
                  "--set", "train.batch_size=2", "--set", "log.progress=false", *more, "--json")


@pytest.mark.slow
def test_label_budget_stops_cleanly_and_a_resume_with_a_larger_budget_equals_the_unlimited_run(tmp_path,
                                                                                             tiny_model_dir):
    full = _label(tmp_path, "full", tiny_model_dir)
    assert full.returncode == 0, full.stderr
    metrics = _rows(tmp_path / "full" / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2, 3] and all(k in m for m in metrics for k in KEYS)
    steps = [m["judge/tokens_in"] for m in metrics]
    assert all(s > 0 for s in steps) and [m["judge/calls"] for m in metrics] == [4, 4, 4]  # 2 pairs x 2 orders
    assert [m["judge/tokens_in_total"] for m in metrics] == [steps[0], steps[0] + steps[1], sum(steps)]
    assert all(m["judge/tokens_out"] == 0 and m["judge/cached"] == 0 for m in metrics)  # reads only, cache off
    assert metrics[-1]["judge/cost_total"] == pytest.approx(sum(steps) * 3 / 1e6)
    summary = json.loads((tmp_path / "full" / "summary.json").read_text())
    assert summary["judge_usage"] == {"calls": 12, "cached": 0, "tokens_in": sum(steps), "tokens_out": 0,
                                      "cost": pytest.approx(sum(steps) * 3 / 1e6), "unmetered": 0, "tokens": sum(steps)}

    # a budget that step 1 stays within and step 2 goes past: stopped after step 2's checkpoint
    budget = steps[0] + 1
    cut = _label(tmp_path, "cut", tiny_model_dir, "--set", f"judge.budget.tokens={budget}")
    assert cut.returncode == 2
    line = error_lines(cut)[-1]
    assert line.startswith("error: judge budget spent at step 2: ") and f"judge.budget.tokens={budget}" in line
    d = tmp_path / "cut"
    stopped = json.loads((d / "summary.json").read_text())["stopped"]
    assert stopped["step"] == 2 and stopped["exit_code"] == 2
    assert len(_rows(d / "labels.jsonl")) == 4 and (d / "checkpoints").exists()

    # resuming with the same budget stops again at once; a changed template is still refused
    assert invoke("label", "--resume", str(d), "--set", "judge.template=default").returncode == 2
    more = invoke("label", "--resume", str(d), "--set", f"judge.budget.tokens={10 * sum(steps)}", "--json")
    assert more.returncode == 0, more.stderr
    assert [(r["prompt"], r["p"], r["p_ab"], r["p_ba"]) for r in _rows(d / "labels.jsonl")] == \
        [(r["prompt"], r["p"], r["p_ab"], r["p_ba"]) for r in _rows(tmp_path / "full" / "labels.jsonl")]
    resumed = _rows(d / "metrics.jsonl")
    assert [m["step"] for m in resumed] == [1, 2, 3]
    assert resumed[-1]["judge/tokens_in_total"] == sum(steps)  # the total carried over the resume
    # the new budget is the run's now: a later resume keeps it (the folder still verifies)
    again = invoke("label", "--resume", str(d), "--json")
    assert again.returncode == 0, again.stderr
    assert f"tokens: {10 * sum(steps)}" in (d / "config.yaml").read_text()


@pytest.mark.slow
def test_judge_command_reports_usage_and_stops_at_its_budget(tmp_path, tiny_model_dir):
    f = _pairs(tmp_path)
    args = ("judge", str(f), "--set", f"run.output_dir={tmp_path}", "--set", "judge.kind=llm", "--set",
            f"judge.model={tiny_model_dir}", "--set", "judge.cache.enabled=false", "--set", "batch_size=3")
    ok = invoke(*args, "--set", "run.name=j1", "--json")
    assert ok.returncode == 0, ok.stderr
    metrics = _rows(tmp_path / "j1" / "metrics.jsonl")
    assert all(k in m for m in metrics for k in KEYS) and [m["judge/calls"] for m in metrics] == [6, 6]
    summary = json.loads((tmp_path / "j1" / "summary.json").read_text())
    assert summary["judge_usage"]["tokens_in"] == sum(m["judge/tokens_in"] for m in metrics)
    assert summary["judge_usage"]["cost"] is None  # no price
    cut = invoke(*args, "--set", "run.name=j2", "--set", "judge.budget.tokens=1")
    assert cut.returncode == 2 and "judge budget spent at step 1" in error_lines(cut)[-1]
    assert len(_rows(tmp_path / "j2" / "verdicts.jsonl")) == 3


def test_programmatic_judge_rows_are_zero(tmp_path):
    res = invoke("label", "--pairs", str(_pairs(tmp_path)), "--output-dir", str(tmp_path), "--name", "len",
                 "--set", "judge.kind=length", "--json")
    assert res.returncode == 0, res.stderr
    m = _rows(tmp_path / "len" / "metrics.jsonl")[-1]
    assert (m["judge/tokens_in_total"], m["judge/tokens_out_total"], m["judge/calls_total"]) == (0, 0, 0)


def _online(tmp_path, model_dir, name, *extra):
    sets = [f"model.name={model_dir}", "judge.kind=llm", f"judge.model={model_dir}", "judge.cache.enabled=false",
            "train.steps=2", "train.batch_size=2", "sampling.max_new_tokens=4", "optim.warmup_steps=0",
            f"run.output_dir={tmp_path}", f"run.name={name}", "eval.enabled=false", "log.progress=false",
            "log.tensorboard=false", *extra]
    return invoke("online", *[a for s in sets for a in ("--set", s)], "--json")


@pytest.mark.slow
def test_online_budget_stop_and_resume_keep_the_running_total(tmp_path, tiny_model_dir):
    full = _online(tmp_path, tiny_model_dir, "full")
    assert full.returncode == 0, full.stderr
    rows = _rows(tmp_path / "full" / "metrics.jsonl")
    assert all(k in m for m in rows for k in KEYS) and [m["judge/calls"] for m in rows] == [4, 4]  # 2 pairs x 2 orders
    steps = [m["judge/tokens_in"] for m in rows]
    summary = json.loads((tmp_path / "full" / "summary.json").read_text())
    assert summary["judge_usage"]["tokens_in"] == sum(steps) and summary["judge_usage"]["calls"] == 8

    cut = _online(tmp_path, tiny_model_dir, "cut", "judge.budget.tokens=1")
    assert cut.returncode == 2 and error_lines(cut)[-1].startswith("error: judge budget spent at step 1: ")
    d = tmp_path / "cut"
    assert json.loads((d / "summary.json").read_text())["stopped"]["step"] == 1
    more = invoke("online", "--resume", str(d), "--set", f"judge.budget.tokens={10 * sum(steps)}", "--json")
    assert more.returncode == 0, more.stderr
    resumed = _rows(d / "metrics.jsonl")
    assert [m["step"] for m in resumed] == [1, 2]
    # the same samples and reads as the uninterrupted run (seeded per step), the total carried over the resume
    assert [m["judge/tokens_in"] for m in resumed] == steps
    assert resumed[-1]["judge/tokens_in_total"] == sum(steps)


@pytest.mark.slow
def test_rl_pairwise_judge_reward_meters_and_stops(tmp_path, tokenizer, tiny_model_dir):
    from pofe.judges.usage import BudgetError
    from pofe.loops.rl import RLConfig, run
    from tests.loops.test_rl import _prompts, stopping_lm

    def cfg(budget):
        return RLConfig(data={"prompts": _prompts(tmp_path, 4)}, train={"steps": 2, "batch_size": 1, "group_size": 2},
                        eval={"num_prompts": 0}, sampling={"max_new_tokens": 3, "temperature": 1.0},
                        reward={"kind": "pairwise", "judge": {"kind": "llm", "model": str(tiny_model_dir),
                                                              "cache": {"enabled": False}, "budget": {"tokens": budget}}},
                        optim={"lr": 1e-3, "warmup_steps": 0}, run={"output_dir": str(tmp_path), "name": "rl"})

    with pytest.raises(BudgetError, match="judge budget spent at step 1"):
        run(cfg(1), policy=stopping_lm(tokenizer), tokenizer=tokenizer)
    d = tmp_path / "rl"
    assert json.loads((d / "summary.json").read_text())["stopped"]["step"] == 1
    s = run(cfg(10**9), resume=d, policy=stopping_lm(tokenizer), tokenizer=tokenizer)
    rows = _rows(d / "metrics.jsonl")
    assert [m["step"] for m in rows] == [1, 2] and all(k in m for m in rows for k in KEYS)
    assert [m["judge/calls"] for m in rows] == [2, 2]  # one pair of 2 samples, both orders
    assert rows[1]["judge/tokens_in_total"] == rows[0]["judge/tokens_in"] + rows[1]["judge/tokens_in"]
    assert s["judge_usage"]["tokens_in"] == rows[1]["judge/tokens_in_total"]


@pytest.mark.slow
def test_eval_and_audit_report_what_their_judging_cost(tmp_path, tiny_model_dir):
    from pofe.data.calibration import CalibrationItem
    from pofe.evaluation.audit import AuditConfig, run_audit
    from pofe.evaluation.eval import EvalConfig, run_eval
    from pofe.judges.registry import build_judge

    judge_cfg = {"kind": "llm", "model": str(tiny_model_dir), "cache": {"enabled": False},
                 "price": {"input_per_million": 1.0, "output_per_million": 0.0}}
    files = []
    for side, text in (("a", "short"), ("b", "a longer answer")):
        f = tmp_path / f"{side}.jsonl"
        f.write_text("".join(json.dumps({"prompt": f"q{i}", "response": text * (1 + i)}) + "\n" for i in range(3)))
        files.append(str(f))
    res = run_eval(EvalConfig(policy_a=files[0], policy_b=files[1], judge=judge_cfg, n_boot=20))
    u = res["judge_usage"]
    assert u["calls"] == 6 and u["tokens_in"] > 0 and u["tokens_out"] == 0 and u["cost"] == pytest.approx(u["tokens_in"] / 1e6)
    with pytest.raises(Exception, match="judge.budget"):
        run_eval(EvalConfig(policy_a=files[0], policy_b=files[1], judge={**judge_cfg, "budget": {"tokens": 5}}))

    items = [CalibrationItem(f"q{i}", "yes " * (1 + i), "no", "A", "synthetic") for i in range(4)]
    judge = build_judge(judge_cfg)
    judge.judge(["warm"], ["a"], ["b"])  # judged before: not this audit's cost
    rep = run_audit(judge, items, AuditConfig(contrasts=False))
    assert rep["judge_usage"]["calls"] == 8 and rep["judge_usage"]["cached"] == 0  # 4 items x 2 orders
    assert judge.usage().calls == 10


@pytest.mark.slow
def test_label_two_processes_sum_their_judges_and_stop_together(tmp_path, tiny_model_dir):
    """Under torchrun each process judges its block of a batch with its own judge: the metrics row
    carries both processes' tokens (the one-process numbers), and the budget stop is the same on
    both, so neither waits for the other in a collective."""
    from tests._cli import torchrun

    one = _label(tmp_path, "one", tiny_model_dir)
    assert one.returncode == 0, one.stderr
    pairs = str(tmp_path / "pairs.jsonl")
    base = ["label", "--pairs", pairs, "--output-dir", str(tmp_path), "--set", "judge.kind=llm",
            "--set", f"judge.model={tiny_model_dir}", "--set", "judge.cache.enabled=false",
            "--set", "judge.price.input_per_million=3", "--set", "judge.price.output_per_million=15",
            "--set", "train.batch_size=2", "--set", "log.progress=false", "--set", "model.device=cpu"]
    two = torchrun(*base, "--name", "two", nproc=2, timeout=600)
    assert two.returncode == 0, two.stderr[-3000:]
    keys = ("judge/calls", "judge/tokens_in", "judge/tokens_in_total")
    want = [{k: m[k] for k in keys} for m in _rows(tmp_path / "one" / "metrics.jsonl")]
    got = [{k: m[k] for k in keys} for m in _rows(tmp_path / "two" / "metrics.jsonl")]
    assert got == want and len(got) == 3
    # the processes' costs are summed: equal up to float rounding
    assert [m["judge/cost_total"] for m in _rows(tmp_path / "two" / "metrics.jsonl")] == \
        pytest.approx([m["judge/cost_total"] for m in _rows(tmp_path / "one" / "metrics.jsonl")])
    budget = want[0]["judge/tokens_in"] + 1
    cut = torchrun(*base, "--name", "cut", "--set", f"judge.budget.tokens={budget}", nproc=2, timeout=600)
    assert cut.returncode != 0 and "judge budget spent at step 2" in cut.stderr
    assert json.loads((tmp_path / "cut" / "summary.json").read_text())["stopped"]["step"] == 2


def test_self_reward_refuses_a_budget_it_would_not_read():
    """pofe self-reward does not meter its self-judge: a judge.budget there would be ignored
    silently, so it is a config error naming the key (exit 2, before any model loads)."""
    cfg = str(Path(__file__).resolve().parents[2] / "examples" / "self-reward-tiny.yaml")
    res = invoke("self-reward", "--config", cfg, "--set", "judge.budget.tokens=10",
                 "--print-config")
    assert res.returncode == 2
    assert "judge.budget is not read by pofe self-reward" in res.stderr + res.stdout
    ok = invoke("self-reward", "--config", cfg, "--print-config")
    assert ok.returncode == 0, ok.stderr
