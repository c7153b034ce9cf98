"""pofe rm: the soft Bradley-Terry loss, held-out metrics, margin behaviour under soft vs hard
labels, and label -> rm -> reward-model judge end to end."""

from __future__ import annotations

import json
import math

import pytest
import torch

from pofe.evaluation.rm_metrics import logit
from pofe.evaluation.rm_metrics import margin_metrics as rm_eval_metrics
from pofe.losses import RM_LOSSES, soft_bt_loss
from pofe.loops.rm import RMConfig, batch_schedule, hardened, run
from pofe.records import PreferencePair
from pofe.runs import RunError
from pofe.loops.rm.reward_model import rewards, tiny_reward_model


# Tiny models run much faster single-threaded (shared fixture in conftest.py).

def test_soft_bt_loss_by_hand_and_minimiser():
    # seed worked example: p = 0.581 -> minimised at logit(0.581) = 0.33
    m = torch.tensor([0.33])
    want = -(0.581 * math.log(1 / (1 + math.exp(-0.33))) + 0.419 * math.log(1 / (1 + math.exp(0.33))))
    assert float(soft_bt_loss(m, 0.581)) == pytest.approx(want, rel=1e-6)
    assert logit(0.581) == pytest.approx(0.3269, abs=1e-4)  # ln(0.581 / 0.419); the seed rounds to 0.33
    x = torch.tensor([logit(0.581)], requires_grad=True)
    soft_bt_loss(x, 0.581).sum().backward()
    assert abs(float(x.grad)) < 1e-6  # gradient sigma(m) - p vanishes at logit(p)
    # hard label: the ordinary RM loss -log sigma(m)
    assert float(soft_bt_loss(torch.tensor([2.0]), 1.0)) == pytest.approx(math.log(1 + math.exp(-2.0)))
    with pytest.raises(ValueError):
        soft_bt_loss(m, 1.5)
    assert RM_LOSSES["soft-bt"] is soft_bt_loss  # registered with the other losses


def test_eval_metrics_by_hand():
    ev = rm_eval_metrics([1.0, -1.0, 2.0, 0.0], [1.0, 1.0, 0.5, 0.0])
    # decided pairs: #0 right, #1 wrong, #3 margin 0 = miss (the p = .5 pair is not decided)
    assert ev["accuracy"] == pytest.approx(1 / 3) and ev["n_decided"] == 3
    # Wilson, z = 1.96, 1 of 3: centre (1/3 + z²/6) / (1 + z²/3), half-width z·sqrt(2/27 + z²/36) / (1 + z²/3)
    assert ev["accuracy_ci95"] == pytest.approx([0.06149, 0.79234], abs=1e-5)
    # one pair at q = 0.9 with label 1: mirrored (0.1, 0): two bins, each off by 0.1 -> ECE 0.1
    ev = rm_eval_metrics([logit(0.9)], [1.0])
    assert ev["ece"] == pytest.approx(0.1, abs=1e-9)
    assert ev["reliability"][9]["mean_pred"] == pytest.approx(0.9) and ev["reliability"][1]["mean_label"] == 0.0
    # a perfectly calibrated soft fit: margins = logit(p)
    ps = [0.6, 0.7, 0.8]
    ev = rm_eval_metrics([logit(p) for p in ps], ps)
    assert ev["ece"] == pytest.approx(0.0, abs=1e-9)
    assert ev["margin"]["mean"] == pytest.approx(ev["margin"]["label_implied_mean"])
    assert rm_eval_metrics([1.0], [1.0])["margin"]["label_implied_mean"] is None  # hard labels: no finite target


def test_hardened():
    pairs = [PreferencePair("x", "a", "b", 0.7), PreferencePair("x", "a", "b", 0.3), PreferencePair("x", "a", "b", 0.5)]
    h = hardened(pairs)
    assert [(q.chosen, q.rejected, q.p) for q in h] == [("a", "b", 1.0), ("b", "a", 1.0)]
    assert h[1].provenance["soft_p"] == 0.3


def test_linear_rm_margin_goes_to_logit_p_under_soft_labels():
    """Synthetic features: a linear RM r = w.x + b on feature differences, every pair labelled 0.7."""
    g = torch.Generator().manual_seed(0)
    d = torch.randn(32, 4, generator=g) + 3.0  # features share a direction: a constant margin is reachable
    w = torch.zeros(4, requires_grad=True)
    b = torch.zeros(1, requires_grad=True)
    opt = torch.optim.Adam([w, b], lr=0.05)
    for _ in range(600):
        loss = soft_bt_loss(d @ w + b, 0.7).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    m = (d @ w + b).detach()
    assert float(m.mean()) == pytest.approx(logit(0.7), abs=0.02)  # 0.847


def _train_tiny(tokenizer, p: float, steps: int, record=()):
    rm = tiny_reward_model(tokenizer, hidden_size=16, num_layers=1)
    rm.train()
    pairs = [("Say hi.", "Hello there!", "Go away."), ("Name a fruit.", "Apple.", "Rock."),
             ("Count to two.", "One, two.", "Seven.")]
    opt = torch.optim.Adam(rm.parameters(), lr=3e-3)
    seen = {}
    for s in range(1, steps + 1):
        r = rewards(rm, tokenizer, [x for x, _, _ in pairs] * 2, [a for _, a, _ in pairs] + [b for _, _, b in pairs])
        margin = r[:3] - r[3:]
        loss = soft_bt_loss(margin, p).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if s in record:
            seen[s] = margin.detach()
    return seen


@pytest.mark.slow
def test_tiny_lm_rm_soft_margin_converges_to_logit_p_and_hard_margin_grows(tokenizer):
    """Acceptance: soft labels p -> margins settle at logit(p); hard labels -> margins keep growing."""
    soft = _train_tiny(tokenizer, 0.8, 150, record=(100, 150))
    target = logit(0.8)  # 1.386
    assert soft[150] == pytest.approx(torch.full((3,), target), abs=0.05)
    assert float((soft[150] - soft[100]).abs().max()) < 0.05  # settled, not drifting
    hard = _train_tiny(tokenizer, 1.0, 150, record=(50, 100, 150))
    m50, m100, m150 = (float(hard[k].mean()) for k in (50, 100, 150))
    assert m150 > m100 > m50 > target  # passes logit(0.8) and keeps climbing
    assert m150 > 2 * target


def _pair_file(tmp_path, n=12):
    rows = []
    for i in range(n):
        rows.append(PreferencePair(prompt=f"Question {i}?", chosen="Short.", rejected="A long and rambling answer " * 3,
                                   p=0.8, provenance={"source": "test"}).to_dict())
    f = tmp_path / "prefs.jsonl"
    f.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return f


@pytest.mark.parametrize("lora", [False, True])
def test_run_saves_a_sequence_classifier_that_plugs_in_as_judge(tmp_path, tiny_model_dir, lora):
    cfg = RMConfig(model={"name": str(tiny_model_dir), "lora": {"enabled": lora, "r": 4, "alpha": 8}},
                   data={"train": [str(_pair_file(tmp_path))], "eval_fraction": 0.25}, train={"epochs": 3, "batch_size": 4},
                   eval={"every": 3}, optim={"lr": 3e-3 if not lora else 1e-2, "warmup_steps": 0},
                   run={"output_dir": str(tmp_path), "name": "rm"})
    s = run(cfg)
    assert s["train_pairs"] == 9 and s["eval_pairs"] == 3 and s["steps"] == 9
    assert s["final_model"] == str(tmp_path / "rm" / "final")
    ev = s["eval"]
    assert ev["n"] == 3 and 0 <= ev["ece"] <= 1 and ev["margin"]["label_implied_mean"] == pytest.approx(logit(0.8))
    assert ev["loss"] < s["eval_before"]["loss"]  # learned something on held-out pairs of the same kind
    rows = [json.loads(x) for x in open(tmp_path / "rm" / "metrics.jsonl")]
    assert [r["step"] for r in rows] == list(range(1, 10))
    assert {"loss", "rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies", "learning_rate",
            "grad_norm"} <= set(rows[0])
    assert rows[0]["rewards/margins"] == pytest.approx(rows[0]["rewards/chosen"] - rows[0]["rewards/rejected"], abs=1e-5)
    # eval.every = 3: held-out metrics on steps 3, 6, 9; step 9's are the final model's
    assert [r["step"] for r in rows if "eval_loss" in r] == [3, 6, 9]
    assert rows[8]["eval_loss"] == pytest.approx(ev["loss"], rel=1e-5) and rows[8]["eval_accuracy"] == ev["accuracy"]
    from transformers import AutoModelForSequenceClassification

    m = AutoModelForSequenceClassification.from_pretrained(s["final_model"])
    assert m.config.num_labels == 1
    from pofe.judges.config import RewardModelJudgeConfig
    from pofe.judges.registry import build_judge

    j = build_judge(RewardModelJudgeConfig(reward_model=s["final_model"]))
    v = j.judge(["Question 1?"], ["Short."], ["A long and rambling answer " * 3])[0]
    assert v.p > 0.5 and v.consistent  # sigma(r_A - r_B) with the preference it was trained on


def test_hard_label_mode_thresholds(tmp_path, tiny_model_dir):
    cfg = RMConfig(model={"name": str(tiny_model_dir)}, data={"train": [str(_pair_file(tmp_path, 4))], "labels": "hard",
                   "eval_fraction": 0.0}, train={"epochs": 1, "batch_size": 4}, run={"output_dir": str(tmp_path), "name": "rm"})
    s = run(cfg)
    assert s["labels"] == "hard" and s["eval"] is None and s["steps"] == 1


def test_conversational_pairs_keep_system_message_and_turns(tokenizer):
    from pofe.loops.rm.reward_model import pair_prompt, rm_text

    msgs = ({"role": "system", "content": "Be terse."}, {"role": "user", "content": "Hi."},
            {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Name a fruit."})
    q = PreferencePair(prompt="transcript", chosen="Apple.", rejected="Rock.", messages=msgs)
    text = rm_text(tokenizer, pair_prompt(q), q.chosen)
    assert all(m["content"] in text for m in msgs) and text.rstrip().endswith(("Apple.", "Apple.<|im_end|>"))
    assert "transcript" not in text
    assert rm_text(tokenizer, "Name a fruit.", "Apple.") == rm_text(tokenizer, [{"role": "user", "content": "Name a fruit."}], "Apple.")


def test_batch_schedule_epochs_steps_and_determinism():
    s = batch_schedule(5, 2, 2, seed=3)
    assert len(s) == 6 and sorted(i for b in s[:3] for i in b) == [0, 1, 2, 3, 4]  # each epoch covers every pair once
    assert s == batch_schedule(5, 2, 2, seed=3) and s[:4] == batch_schedule(5, 2, 2, seed=3, steps=4)


class Crash(Exception):
    pass


def _rm_cfg(tmp_path, tiny_model_dir, name):
    return RMConfig(model={"name": str(tiny_model_dir)}, data={"train": [str(_pair_file(tmp_path, 10))], "eval_fraction": 0.2},
                    train={"epochs": 2, "batch_size": 3}, checkpoint={"every": 2}, optim={"lr": 3e-3, "warmup_steps": 0},
                    run={"output_dir": str(tmp_path), "name": name})


@pytest.mark.slow
def test_crash_mid_run_then_resume_is_exact(tmp_path, tiny_model_dir, monkeypatch):
    """``rm --resume`` (it had none): a crash in step 4 after the step-2 checkpoint and step 3's
    metrics row; the resumed run drops step 3's row, redoes 3-6 and ends with the metrics and
    weights of an uninterrupted run."""
    import pofe.loops.rm as rm_mod

    ref = run(_rm_cfg(tmp_path, tiny_model_dir, "ref"))
    assert ref["steps"] == 6  # 8 train pairs / 3 per step = 3 steps x 2 epochs
    real = rm_mod.rm_step
    calls = {"n": 0}

    def crashing(*a, **k):
        calls["n"] += 1
        if calls["n"] == 4:
            raise Crash("injected fault")
        return real(*a, **k)

    monkeypatch.setattr(rm_mod, "rm_step", crashing)
    cfg = _rm_cfg(tmp_path, tiny_model_dir, "crash")
    with pytest.raises(Crash):
        run(cfg)
    d = tmp_path / "crash"
    assert [json.loads(x)["step"] for x in open(d / "metrics.jsonl")] == [1, 2, 3]
    monkeypatch.setattr(rm_mod, "rm_step", real)
    s = run(cfg, resume=d)
    assert s["resumed_from"] == 2 and s["steps_run"] == 4 and s["steps"] == 6
    rows = [json.loads(x) for x in open(d / "metrics.jsonl")]
    want = [json.loads(x) for x in open(tmp_path / "ref" / "metrics.jsonl")]

    def strip(r):
        return {k: v for k, v in r.items() if k != "seconds"}

    assert [strip(r) for r in rows] == [strip(r) for r in want]
    assert s["eval"] == ref["eval"] and s["eval_before"] == ref["eval_before"]
    from safetensors.torch import load_file

    a, b = load_file(str(d / "final" / "model.safetensors")), load_file(str(tmp_path / "ref" / "final" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_resume_needs_an_existing_run_folder(tmp_path, tiny_model_dir):
    with pytest.raises(RunError, match="no config.yaml"):
        run(_rm_cfg(tmp_path, tiny_model_dir, "x"), resume=tmp_path / "typo")
    assert not (tmp_path / "typo").exists() and not (tmp_path / "x").exists()


@pytest.mark.parametrize("bad", ["train.batch_size=0", "train.epochs=0", "train.steps=0", "max_length=0",
                                 "data.eval_fraction=1.0", "data.max_pairs_per_source=0", "calibration_bins=0",
                                 "loss=hinge"])
def test_nonsense_hyperparameters_are_refused_at_parse_time(bad):
    import re

    from pofe.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=re.escape(bad.split("=")[0])):
        load_config(RMConfig, None, [bad])


def test_eval_every_lives_in_the_eval_section():
    from pofe.config import ConfigError, load_config

    assert load_config(RMConfig, None, ["eval.every=3"]).eval.every == 3
    with pytest.raises(ConfigError, match="train.eval_every"):  # the old key is not an alias
        load_config(RMConfig, None, ["train.eval_every=3"])


def test_hh_rlhf_pairs_load(shared_data):
    from pofe.data.preferences import load_pairs

    pairs = load_pairs("hh-rlhf:helpful", limit=5)
    assert len(pairs) == 5 and all(q.p == 1.0 and q.chosen != q.rejected for q in pairs)
