"""Judge drift during training (``audit.every``): a planted self-judge whose position bias grows with
the step is re-audited by ``pofe.evaluation.audit.run_audit`` every N steps; the run stops cleanly
(checkpoint and summary written, one-line error naming the step and the check, exit status from
the error class) at the step where the bias crosses the gate's threshold, resumes from there, and
the report names that step. ``on_drift: warn`` logs and trains on."""

from __future__ import annotations

import json
import logging

import pytest

from _online_utils import tiny_cfg
from pofe.config import ConfigError, load_config
from pofe.judges.base import Capability
from pofe.records import Judgment
from pofe.runs import read_jsonl
from pofe.evaluation.drift import DriftError, drift_summary

N_ITEMS, PER_AUDIT = 8, 2
_ATTACKS = (":", "Thought process:")


def _calibration(path):
    rows = [{"prompt": f"CAL question {i}?", "response_a": f"Answer {i}. It is right." if i % 2 == 0 else f"No {i}. Not so.",
             "response_b": f"No {i}. Not so." if i % 2 == 0 else f"Answer {i}. It is right.",
             "label": "A" if i % 2 == 0 else "B"} for i in range(N_ITEMS)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows


class DriftingSelfJudge:
    """Agrees with the human labels (p = 0.9 / 0.1 in both orders) on the calibration set, except that
    at its k-th re-audit (k = 0, 1, ...) the first PER_AUDIT * k calibration pairs are read with a
    first-position preference: P(A better) = 1 shown first, 0 shown second (p = 0.5, inconsistent).
    Its first-position win rate is 0.5 + PER_AUDIT * k / (2 * N_ITEMS): the bias grows with the step.
    Contrast probes (same CAL prompts, other texts): the real answer beats a one-token attack, else
    0.5. Training pairs: the shorter response wins."""

    capabilities = frozenset({Capability.PAIRWISE})
    both_orders = True
    id = "drifting-self-judge"

    def __init__(self, rows):
        self.truth = {(r["prompt"], r["response_a"], r["response_b"]): r["label"] for r in rows}
        self.audits = 0

    def judge(self, prompts, a, b, *, references=None):
        triples = list(zip(prompts, a, b))
        biased = 0
        if triples and triples[0] in self.truth:  # one call per calibration pass (16 items per batch)
            biased, self.audits = PER_AUDIT * self.audits, self.audits + 1
        out = []
        for i, (x, ra, rb) in enumerate(triples):
            if (x, ra, rb) in self.truth:
                p = 0.9 if self.truth[x, ra, rb] == "A" else 0.1
                p_ab, p_ba = (1.0, 0.0) if i < biased else (p, p)
            elif x.startswith("CAL"):
                p_ab = p_ba = 0.0 if ra in _ATTACKS else 1.0 if rb in _ATTACKS else 0.5
            else:
                p_ab = p_ba = 0.5 if len(ra) == len(rb) else float(len(ra) < len(rb))
            out.append(Judgment(p=(p_ab + p_ba) / 2, p_ab=p_ab, p_ba=p_ba, consistent=(p_ab > 0.5) == (p_ba > 0.5),
                                parse_ok=True, judge_id=self.id))
        return out


def _sets(cal):
    # the calibration pairs have equal-length answers: the length checks are not measurable, so off
    return ["audit.every=2", f"audit.calibration=[{cal}]", "audit.thresholds.max_abs_length_correlation=null",
            "audit.thresholds.max_abs_length_slope=null"]


@pytest.mark.slow
def test_online_stops_at_the_step_the_position_bias_crosses_and_resumes(tmp_path, tiny_model_dir):
    from pofe.evaluation.report import write_report
    from pofe.loops.online import run

    rows = _calibration(tmp_path / "cal.jsonl")
    judge = DriftingSelfJudge(rows)
    cfg = tiny_cfg(tmp_path / "runs", tiny_model_dir, "train.steps=6", "eval.enabled=false", "run.name=drift",
                   *_sets(tmp_path / "cal.jsonl"))
    with pytest.raises(DriftError) as e:
        run(cfg, judge=judge)
    err = e.value
    # re-audit 1 (step 2): unbiased; re-audit 2 (step 4): 2 of 8 pairs biased -> first-position win rate
    # 0.5 + 2/16 = 0.625, bias 0.125 > 0.1; consistency 6/8 = 0.75 >= 0.7; agreement (6 + 2 * 0.5)/8 = 0.875
    assert err.step == 4 and err.failed == ["first_position_bias"] and err.exit_code == 2
    assert "\n" not in str(err) and "step 4" in str(err) and "position_bias = 0.125 (needs <= 0.1)" in str(err)
    d = tmp_path / "runs" / "drift"
    metrics = read_jsonl(d / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2, 3, 4]
    two, four = metrics[1], metrics[3]
    assert two["drift/failed"] == [] and two["drift/position_bias"] == 0.0 and two["drift/agreement"] == 1.0
    assert four["drift/failed"] == ["first_position_bias"]
    assert four["drift/position_bias"] == pytest.approx(0.125) and four["drift/first_position_win_rate"] == 0.625
    assert four["drift/position_consistency"] == 0.75 and four["drift/agreement"] == pytest.approx(0.875)
    assert "drift/contrast_one_token_colon" in four and not any(k.startswith("drift/") for k in metrics[0])
    assert (d / "checkpoints" / "step-4").is_dir() and not (d / "final").exists()  # checkpoint, no final model
    summary = json.loads((d / "summary.json").read_text())
    assert summary["stopped"]["step"] == 4 and summary["stopped"]["exit_code"] == 2
    assert "position_bias" in summary["stopped"]["error"]
    assert summary["drift"] == {"checks_run": 2, "first_crossing": {"step": 4, "checks": ["position_bias"],
                                                                    "values": {"position_bias": 0.125}}}
    res = write_report(d)
    assert "drift" in res["plots"]
    assert any("step 4" in f and "first_position_bias" in f for f in res["flags"])
    assert any(f.startswith("run stopped after step 4") for f in res["flags"])
    # --resume continues from the step-4 checkpoint; the next re-audit (step 6, 4 pairs biased) stops again
    with pytest.raises(DriftError) as e2:
        run(cfg, judge=judge, resume=d)
    assert e2.value.step == 6
    metrics = read_jsonl(d / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2, 3, 4, 5, 6]
    assert metrics[-1]["drift/position_bias"] == pytest.approx(0.25)
    assert json.loads((d / "summary.json").read_text())["resumed_from"] == 4


def test_warn_logs_and_trains_on(tmp_path, tiny_model_dir, caplog):
    from pofe.loops.online import run

    rows = _calibration(tmp_path / "cal.jsonl")
    cfg = tiny_cfg(tmp_path / "runs", tiny_model_dir, "train.steps=4", "eval.enabled=false",
                   *_sets(tmp_path / "cal.jsonl"), "audit.on_drift=warn", "audit.contrasts=false")
    with caplog.at_level(logging.WARNING, logger="pofe.evaluation.drift"):
        s = run(cfg, judge=DriftingSelfJudge(rows))
    assert s["steps_run"] == 4 and "stopped" not in s and s["final_model"]
    assert s["drift"]["first_crossing"]["step"] == 4
    assert any("judge drift at step 4" in r.getMessage() for r in caplog.records)
    assert not any(k.startswith("drift/contrast") for k in read_jsonl(f"{s['run_dir']}/metrics.jsonl")[1])


def test_rl_stops_on_its_pairwise_reward_judge(tmp_path, tokenizer):
    from _online_utils import eos_tiny_model
    from pofe.loops.rl import RLConfig, run

    rows = _calibration(tmp_path / "cal.jsonl")
    prompts = tmp_path / "p.txt"
    prompts.write_text("".join(f"Tell me about topic {i}.\n" for i in range(6)))
    cfg = load_config(RLConfig, None, [
        f"data.prompts={prompts}", "train.steps=4", "train.batch_size=2", "train.group_size=2", "eval.num_prompts=0",
        "sampling.max_new_tokens=4", "reward.kind=pairwise", "reward.judge.kind=length", "optim.warmup_steps=0",
        f"run.output_dir={tmp_path}", "run.name=rl", "log.progress=false", *_sets(tmp_path / "cal.jsonl")])
    with pytest.raises(DriftError, match="judge drift at step 4"):
        run(cfg, policy=eos_tiny_model(tokenizer), tokenizer=tokenizer, judge=DriftingSelfJudge(rows))
    assert (tmp_path / "rl" / "checkpoints" / "step-4").is_dir()
    summary = json.loads((tmp_path / "rl" / "summary.json").read_text())
    assert summary["stopped"]["step"] == 4 and summary["drift"]["first_crossing"]["step"] == 4


def test_config_errors_name_the_key(tmp_path):
    from pofe.loops.online import OnlineConfig
    from pofe.loops.rl import RLConfig

    with pytest.raises(ConfigError, match="audit.calibration"):
        load_config(OnlineConfig, None, ["audit.every=2"])
    with pytest.raises(ConfigError, match="audit.on_drift"):
        load_config(OnlineConfig, None, ["audit.on_drift=warn"])  # without audit.every it would do nothing
    with pytest.raises(ConfigError, match="audit.every"):
        load_config(OnlineConfig, None, ["mode=offline", "audit.every=1", "audit.calibration=[c.jsonl]"])
    with pytest.raises(ConfigError, match="audit.every"):
        load_config(RLConfig, None, ["audit.every=1", "audit.calibration=[c.jsonl]"])  # programmatic: no judge


def test_drift_summary_of_rows():
    assert drift_summary([{"step": 1, "loss": 0.1}]) is None
    rows = [{"step": 2, "drift/failed": []}, {"step": 4, "drift/failed": ["agreement"], "drift/agreement": 0.5}]
    assert drift_summary(rows) == {"checks_run": 2, "first_crossing": {"step": 4, "checks": ["agreement"],
                                                                       "values": {"agreement": 0.5}}}
