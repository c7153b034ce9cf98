"""pofe rm: the soft Bradley-Terry loss, held-out metrics, margin behaviour under soft vs hard
labels, and label -> rm -> reward-model judge end to end."""

from __future__ import annotations

import json
import math

import pytest
import torch

from pofe.loops.rm import (
    RMConfig,
    hardened,
    logit,
    rewards,
    rm_eval_metrics,
    run,
    soft_bt_loss,
    tiny_reward_model,
)
from pofe.records import PreferencePair


# Tiny models run much faster single-threaded (shared fixture in conftest.py).
pytestmark = pytest.mark.usefixtures("one_torch_thread")


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


def test_eval_metrics_by_hand():
    ev = rm_eval_metrics([1.0, -1.0, 2.0, 0.0], [1.0, 1.0, 0.5, 0.0])
    # decided pairs: #0 right, #1 wrong, #3 margin 0 = miss (the p = .5 pair is not decided)
    assert ev["accuracy"] == pytest.approx(1 / 3) and ev["n_decided"] == 3
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
                   data={"train": [str(_pair_file(tmp_path))], "eval_fraction": 0.25}, epochs=3, batch_size=4,
                   optim={"lr": 3e-3 if not lora else 1e-2, "warmup_steps": 0}, run={"output_dir": str(tmp_path), "name": "rm"})
    s = run(cfg)
    assert s["train_pairs"] == 9 and s["eval_pairs"] == 3 and s["steps"] == 9
    ev = s["eval"]
    assert ev["n"] == 3 and 0 <= ev["ece"] <= 1 and ev["margin"]["label_implied_mean"] == pytest.approx(logit(0.8))
    assert ev["loss"] < s["eval_before"]["loss"]  # learned something on held-out pairs of the same kind
    from transformers import AutoModelForSequenceClassification

    m = AutoModelForSequenceClassification.from_pretrained(s["model_dir"])
    assert m.config.num_labels == 1
    from pofe.judges.registry import JudgeConfig, build_judge

    j = build_judge(JudgeConfig(kind="reward-model", reward_model=s["model_dir"]))
    v = j.judge(["Question 1?"], ["Short."], ["A long and rambling answer " * 3])[0]
    assert v.p > 0.5 and v.consistent  # sigma(r_A - r_B) with the preference it was trained on


def test_hard_label_mode_thresholds(tmp_path, tiny_model_dir):
    cfg = RMConfig(model={"name": str(tiny_model_dir)}, data={"train": [str(_pair_file(tmp_path, 4))], "labels": "hard",
                   "eval_fraction": 0.0}, epochs=1, batch_size=4, run={"output_dir": str(tmp_path), "name": "rm"})
    s = run(cfg)
    assert s["labels"] == "hard" and s["eval"] is None and s["steps"] == 1


def test_hh_rlhf_pairs_load(shared_data):
    from pofe.data.preferences import load_pairs

    pairs = load_pairs("hh-rlhf:helpful", limit=5)
    assert len(pairs) == 5 and all(q.p == 1.0 and q.chosen != q.rejected for q in pairs)
