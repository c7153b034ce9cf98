"""``reward.shaping`` of ``pofe rl``: length and list-item terms centred within each prompt's group
(hand-computed), the zero-centring invariant, config errors naming the key, and the run's metrics
and summary (the gating audit's length bias kept next to the coefficients)."""

from __future__ import annotations

import json

import pytest
import torch

from _online_utils import eos_tiny_model
from pofe.config import ConfigError, load_config
from pofe.records import Completion
from pofe.loops.rl.rewards import RewardShapingConfig, audit_length_bias
from pofe.loops.rl.policy_gradient import group_shaping, list_items, masked_group_advantages
from pofe.loops.rl.step import shape_rewards, shaping_metrics
from pofe.runtime.parallel import DataParallel


def _c(text: str, n_tokens: int) -> Completion:
    return Completion(prompt="x", text=text, token_ids=tuple(range(5, 5 + n_tokens)), prompt_token_ids=(1, 2))


def test_list_items_counts_markdown_items_only():
    assert list_items("- a\n- b") == 2
    assert list_items("Steps:\n1. x\n  2) y\n* z\n+ w") == 4
    assert list_items("-not an item\n1.5 is a number\n*emphasis*\n- ") == 0
    assert list_items("plain text") == 0


def test_shaped_rewards_by_hand():
    """Two groups of k = 3; the middle sample of group 2 is unscored (no term, not in the mean)."""
    comps = [_c("one", 10), _c("- a\n- b", 20), _c("1. x", 30),
             _c("- a\n* b\n+ c", 5), _c("- q", 99), _c("plain", 8)]
    r = torch.tensor([1.0, 2.0, 3.0, 0.5, 0.0, 0.25])
    valid = torch.tensor([True, True, True, True, False, True])
    shaped, terms = shape_rewards(r, comps, valid, 3, RewardShapingConfig(length=-0.01, lists=-0.1))
    # group 1: lengths 10, 20, 30 (mean 20) -> -0.01 * (-10, 0, 10); lists 0, 2, 1 (mean 1) -> -0.1 * (-1, 1, 0)
    # group 2 (scored 1st and 3rd): lengths 5, 8 (mean 6.5) -> -0.01 * (-1.5, 1.5); lists 3, 0 (mean 1.5) -> -0.1 * (1.5, -1.5)
    assert terms["length"].tolist() == pytest.approx([0.1, 0.0, -0.1, 0.015, 0.0, -0.015])
    assert terms["lists"].tolist() == pytest.approx([0.1, -0.1, 0.0, -0.15, 0.0, 0.15])
    assert shaped.tolist() == pytest.approx([1.2, 1.9, 2.9, 0.365, 0.0, 0.385])
    m = shaping_metrics(terms, valid, DataParallel())
    assert m["reward/shaping_abs"] == pytest.approx((0.2 + 0.1 + 0.1 + 0.135 + 0.135) / 5)
    assert m["reward/shaping_length_abs"] == pytest.approx((0.1 + 0.1 + 0.015 + 0.015) / 5)
    assert m["reward/shaping_lists_abs"] == pytest.approx((0.1 + 0.1 + 0.15 + 0.15) / 5)
    # off: the reward itself, nothing logged
    same, none = shape_rewards(r, comps, valid, 3, RewardShapingConfig())
    assert torch.equal(same, r) and none == {} and shaping_metrics(none, valid, DataParallel()) == {}
    # only the length term: no lists key
    _, only = shape_rewards(r, comps, valid, 3, RewardShapingConfig(length=0.5))
    assert set(only) == {"length"}


@pytest.mark.parametrize("seed", range(5))
def test_group_means_are_unchanged_and_rloo_sees_only_the_ranking_shift(seed):
    g = torch.Generator().manual_seed(seed)
    k, groups = 4, 6
    r = torch.randn(groups * k, generator=g, dtype=torch.float64)
    valid = torch.rand(groups * k, generator=g) > 0.25
    feats = {"length": torch.randint(1, 60, (groups * k,), generator=g).double(),
             "lists": torch.randint(0, 5, (groups * k,), generator=g).double()}
    terms = group_shaping(feats, {"length": -0.02, "lists": 0.3}, valid, k)
    shaped = r + sum(terms.values())
    centred = 0
    for i in range(groups):
        sl = slice(i * k, (i + 1) * k)
        v = valid[sl]
        if v.any():  # a group with no scored sample has no mean to keep
            assert shaped[sl][v].mean().item() == pytest.approx(r[sl][v].mean().item(), abs=1e-12)
            centred += 1
        assert (shaped[sl][~v] == r[sl][~v]).all()  # unscored samples get no term
    assert centred >= groups // 2, f"seed {seed}: only {centred} groups had a scored sample; the check saw too little"
    # RLOO's advantages move by exactly k/(k-1) times the centred term on scored samples of full groups
    adv0, adv1 = (masked_group_advantages(x, valid, k, "rloo") for x in (r, shaped))
    compared = 0
    for i in range(groups):
        sl = slice(i * k, (i + 1) * k)
        v = valid[sl]
        n = int(v.sum())
        if n >= 2:  # RLOO's leave-one-out baseline needs two scored samples
            term = sum(t[sl] for t in terms.values())[v]
            assert (adv1[sl][v] - adv0[sl][v]).tolist() == pytest.approx((n / (n - 1) * term).tolist(), abs=1e-9)
            compared += 1
    assert compared >= groups // 2, f"seed {seed}: only {compared} groups had two scored samples"


@pytest.mark.parametrize("bad,key", [("reward.shaping.length=abc", "reward.shaping.length"),
                                     ("reward.shaping.length=inf", "reward.shaping.length"),
                                     ("reward.shaping.lists=nan", "reward.shaping.lists"),
                                     ("reward.shaping.lenght=-0.01", "reward.shaping.lenght")])
def test_config_errors_name_the_key(bad, key):
    from pofe.loops.rl import RLConfig

    with pytest.raises(ConfigError) as e:
        load_config(RLConfig, None, [bad])
    assert key in str(e.value)
    with pytest.raises(ConfigError, match="monitor.shaping"):
        load_config(RLConfig, None, ["monitor.kind=programmatic", "monitor.shaping.length=-0.01"])
    assert load_config(RLConfig, None, ["reward.shaping.length=-0.01"]).reward.shaping.length == -0.01


def _prompts(tmp_path, n=6):
    f = tmp_path / "p.txt"
    f.write_text("\n".join(f"Tell me about topic {i}." for i in range(n)) + "\n")
    return str(f)


def _cfg(tmp_path, name, **reward):
    from pofe.loops.rl import RLConfig

    return RLConfig(data={"prompts": _prompts(tmp_path)}, train={"steps": 2, "batch_size": 2, "group_size": 3},
                    eval={"num_prompts": 0}, sampling={"max_new_tokens": 8, "temperature": 1.0},
                    reward={"kind": "pairwise", "judge": {"kind": "length"}, **reward},
                    optim={"lr": 1e-3, "warmup_steps": 0}, run={"output_dir": str(tmp_path), "name": name})


def _report(path, judge_cfg, length_correlation=0.31):
    """A passing audit report for ``judge_cfg`` (what --require-audit reads), with a length bias measured."""
    rep = {"passed": True, "checks": {}, "judge": "length", "judge_identity": dict(judge_cfg.identity()),
           "calibration": {"sha256": "0" * 64}, "metrics": {"length_correlation": length_correlation,
                                                            "length_slope": 1.25, "longer_preferred_rate": 0.8,
                                                            "human_longer_preferred_rate": 0.55,
                                                            "p_prefers_lists": 0.6}}
    path.write_text(json.dumps(rep))
    return path


def test_rl_run_logs_shaping_and_keeps_the_audits_length_bias(tmp_path, tokenizer):
    from pofe.loops.rl import run
    from pofe.runs import read_jsonl

    plain = run(_cfg(tmp_path, "plain"), policy=eos_tiny_model(tokenizer), tokenizer=tokenizer)
    cfg = _cfg(tmp_path, "shaped", shaping={"length": -0.01, "lists": -0.05})
    report = _report(tmp_path / "audit.json", cfg.reward.judge)
    shaped = run(cfg, policy=eos_tiny_model(tokenizer), tokenizer=tokenizer, require_audit=report)
    a, b = (read_jsonl(f"{s['run_dir']}/metrics.jsonl") for s in (plain, shaped))
    # step 1 samples the same responses from the same weights: the reward's own scores are the same,
    # shaping only re-ranks inside each group
    assert b[0]["objective/scores"] == pytest.approx(a[0]["objective/scores"])
    assert all(r["reward/shaping_abs"] >= 0 for r in b) and any(r["reward/shaping_abs"] > 0 for r in b)
    assert "reward/shaping_lists_abs" in b[0] and not any("reward/shaping_abs" in r for r in a)
    assert shaped["shaping"] == {"length": -0.01, "lists": -0.05} and "shaping" not in plain
    assert shaped["audit"] == {"path": str(report), "judge": "length", "length_correlation": 0.31, "length_slope": 1.25,
                               "longer_preferred_rate": 0.8, "human_longer_preferred_rate": 0.55,
                               "p_prefers_lists": 0.6}
    assert audit_length_bias(None) is None
