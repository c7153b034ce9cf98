"""pofe rl: group baselines, KL estimators and the policy-gradient loss by hand; reward
sources; a programmatic reward moving the measured quantity on a tiny policy; reload."""

from __future__ import annotations

import json
import math

import pytest
import torch

from pofe.loops.rl import RLConfig, run
from pofe.records import Completion, Score
from pofe.runs import RunError
from pofe.loops.rl.policy_gradient import (
    CallableReward,
    JudgeScoreReward,
    group_advantages,
    kl_terms,
    masked_group_advantages,
    pg_loss,
    score_distribution,
)


# Tiny models run much faster single-threaded (shared fixture in conftest.py).

def test_rloo_advantages_by_hand():
    r = torch.tensor([[1.0, 2.0, 3.0, 6.0]])
    # leave-one-out means: 11/3, 10/3, 9/3, 6/3
    assert group_advantages(r, "rloo")[0].tolist() == pytest.approx([1 - 11 / 3, 2 - 10 / 3, 0.0, 4.0])
    # = k/(k-1) (r - mean): mean 3 -> 4/3 * (-2, -1, 0, 3)
    assert group_advantages(r, "rloo")[0].tolist() == pytest.approx([-8 / 3, -4 / 3, 0.0, 4.0])


def test_grpo_advantages_by_hand():
    r = torch.tensor([[1.0, 2.0, 3.0, 6.0], [5.0, 5.0, 5.0, 5.0]])
    std = math.sqrt((4 + 1 + 0 + 9) / 3)  # unbiased: 2.1602
    a = group_advantages(r, "grpo")
    assert a[0].tolist() == pytest.approx([-2 / std, -1 / std, 0.0, 3 / std], rel=1e-5)
    assert a[1].tolist() == [0.0, 0.0, 0.0, 0.0]  # a constant group carries no signal
    with pytest.raises(ValueError):
        group_advantages(torch.tensor([[1.0]]), "rloo")


def test_masked_advantages_leave_unscored_samples_out():
    total = torch.tensor([1.0, 2.0, 99.0, 3.0, 5.0, 7.0])
    valid = torch.tensor([True, True, False, True, False, False])
    a = masked_group_advantages(total, valid, 3, "rloo")
    # group 0: the unscored 99 neither gets a gradient nor moves the baseline: (1 - 2, 2 - 1)
    # group 1: a single scored sample has no baseline, so no gradient at all
    assert a.tolist() == [-1.0, 1.0, 0.0, 0.0, 0.0, 0.0]


def test_kl_terms_by_hand():
    pol = torch.tensor([[-1.0, -2.0, 0.0]])
    ref = torch.tensor([[-1.5, -1.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])  # third position is padding
    kt = kl_terms(pol, ref, mask)
    # k1 = (−1 + 1.5) + (−2 + 1) = −0.5; k3 = Σ e^{d} − d − 1 with d = ref − pol = (−0.5, 1.0)
    assert float(kt["k1"]) == pytest.approx(-0.5)
    assert float(kt["k3"]) == pytest.approx((math.exp(-0.5) + 0.5 - 1) + (math.exp(1.0) - 1.0 - 1))
    assert float(kl_terms(pol, pol, mask)["k3"]) == 0.0


def test_pg_loss_direction():
    """The gradient step raises log pi of the positive-advantage sample and lowers the other."""
    lp = torch.tensor([[-1.0, -1.0], [-1.0, -1.0]], requires_grad=True)
    mask = torch.ones(2, 2)
    adv = torch.tensor([1.0, -1.0])
    pg_loss(lp, mask, adv, "rloo").sum().backward()
    assert lp.grad[0].tolist() == [-1.0, -1.0] and lp.grad[1].tolist() == [1.0, 1.0]  # descent raises row 0
    lp.grad = None
    pg_loss(lp, mask, adv, "grpo").sum().backward()  # per-token mean: 1/|y|
    assert lp.grad[0].tolist() == [-0.5, -0.5]


class FakePointwise:
    id = "fake-expected"

    def score(self, prompts, responses, references=None):
        out = []
        for y in responses:
            if y == "bad":
                out.append(Score(score=None, parse_ok=False, judge_id=self.id))
            else:
                d = {str(i): (0.5 if i in (9, 10) else 0.0) for i in range(1, 11)}
                out.append(Score(score=(9.5 - 1) / 9, parse_ok=True, judge_id=self.id, extra={"distribution": d, "expected": 9.5}))
        return out


def test_judge_score_reward_and_distribution():
    rf = JudgeScoreReward(FakePointwise())
    comps = [Completion(prompt="x", text=t) for t in ("good", "bad")]
    vals, info = rf(["x", "x"], comps)
    assert vals[0] == pytest.approx(8.5 / 9) and vals[1] is None
    sd = info["score_distribution"]
    assert sd["mean_distribution"][8:] == [0.5, 0.5] and sd["top_of_scale_share"] == 1.0
    assert sd["expected_score_mean"] == 9.5
    assert score_distribution([Score(score=0.1, parse_ok=True, judge_id="j")]) is None
    with pytest.raises(ValueError):
        JudgeScoreReward(object())


def stopping_lm(tokenizer, p_eos: float = 0.12, seed: int = 0):
    """A tiny random policy that stops at a realistic rate: a bias of log(p_eos * V) on the EOS
    logit (random logits are ~0), so lengths vary and "shorter" is learnable in a few steps."""
    from transformers import LlamaConfig, LlamaForCausalLM

    V = len(tokenizer)
    torch.manual_seed(seed)
    m = LlamaForCausalLM(LlamaConfig(vocab_size=V, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                     num_attention_heads=2, num_key_value_heads=2, pad_token_id=tokenizer.pad_token_id,
                                     bos_token_id=1, eos_token_id=tokenizer.eos_token_id, tie_word_embeddings=False))
    head = torch.nn.Linear(16, V, bias=True)
    with torch.no_grad():
        head.weight.copy_(m.lm_head.weight)
        head.bias.zero_()
        head.bias[tokenizer.eos_token_id] = math.log(p_eos * V)
    m.lm_head = head
    return m.eval()


def _prompts(tmp_path, n=12):
    f = tmp_path / "p.txt"
    f.write_text("\n".join(f"Tell me about topic {i}." for i in range(n)) + "\n")
    return str(f)


@pytest.mark.slow
@pytest.mark.parametrize("algo,kl_in", [("rloo", "reward"), ("grpo", "loss")])
def test_prefer_shorter_moves_length_down_and_kl_is_positive(tmp_path, tokenizer, algo, kl_in):
    """Acceptance: a programmatic reward (prefer shorter) moves the measured length down within
    a few dozen steps; the KL to the reference is logged and positive."""
    cfg = RLConfig(data={"prompts": _prompts(tmp_path)}, train={"steps": 16, "batch_size": 2, "group_size": 4},
                   eval={"num_prompts": 4, "samples": 8}, sampling={"max_new_tokens": 8, "temperature": 1.0}, algo=algo, kl_in=kl_in, beta=0.01,
                   reward={"kind": "programmatic", "prefer": "shorter", "unit": "tokens"},
                   optim={"lr": 1e-2, "warmup_steps": 0}, run={"output_dir": str(tmp_path), "name": "rl"})
    s = run(cfg, policy=stopping_lm(tokenizer), tokenizer=tokenizer)
    before, after = s["eval_before"], s["eval_after"]
    # seeds 0-2 measured: RLOO 5.9->3.6, 5.7->4.4, 5.3->3.5; GRPO 5.7->1.6, 5.3->1.2 tokens
    assert after["length"] < before["length"] - 1.0, (before, after)
    assert after["reward"] > before["reward"]
    rows = [json.loads(x) for x in open(f"{s['run_dir']}/metrics.jsonl")]
    assert len(rows) == 16 and all({"objective/scores", "objective/kl", "objective/kl_k3", "length"} <= set(r) for r in rows)
    assert s["last5"]["objective/kl"] > 0 and s["last5"]["objective/kl_k3"] > 0


def test_run_smoke_monitor_unscored_and_reload(tmp_path, tokenizer):
    """Two steps with a callable reward that abstains on some samples, a monitor, a checkpoint and a reload."""
    calls = {"n": 0}

    def f(x, c):
        calls["n"] += 1
        return None if calls["n"] % 3 == 0 else -c.num_tokens / 8

    cfg = RLConfig(data={"prompts": _prompts(tmp_path, 6)}, train={"steps": 2, "batch_size": 2, "group_size": 3},
                   eval={"num_prompts": 2, "samples": 2}, sampling={"max_new_tokens": 4, "temperature": 1.0}, algo="grpo", kl_in="loss",
                   checkpoint={"every": 1, "keep_last": 0},
                   monitor={"kind": "programmatic", "prefer": "longer", "unit": "chars"},
                   optim={"lr": 1e-3, "warmup_steps": 0}, run={"output_dir": str(tmp_path), "name": "rl"})
    s = run(cfg, policy=stopping_lm(tokenizer), tokenizer=tokenizer, reward_fn=CallableReward(f))
    rows = [json.loads(x) for x in open(f"{s['run_dir']}/metrics.jsonl")]
    assert rows[0]["unscored"] >= 1 and "monitor" in rows[0]
    # TRL's metric names, so rl runs overlay with TRL's
    assert {"loss", "objective/scores", "objective/kl", "objective/entropy", "learning_rate", "grad_norm", "step"} <= set(rows[0])
    assert rows[0]["objective/entropy"] > 0  # −Σ log π of sampled tokens
    assert (tmp_path / "rl" / "checkpoints" / "step-1" / "trainer_state.json").exists()
    assert (tmp_path / "rl" / "checkpoints" / "step-2" / "trainer_state.json").exists()
    assert s["final_model"] == str(tmp_path / "rl" / "final")
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(s["final_model"])
    assert m.config.vocab_size == len(tokenizer)


class Crash(Exception):
    pass


def _rl_cfg(tmp_path, name):
    return RLConfig(data={"prompts": _prompts(tmp_path, 6)}, train={"steps": 4, "batch_size": 2, "group_size": 2}, eval={"num_prompts": 0},
                    sampling={"max_new_tokens": 3, "temperature": 1.0}, checkpoint={"every": 2},
                    optim={"lr": 1e-2, "warmup_steps": 0}, reward={"kind": "programmatic"},
                    run={"output_dir": str(tmp_path), "name": name})


def _crashing_reward(after_calls: int):
    """The length reward, raising on its ``after_calls + 1``-th call: a crash in the middle of a step."""
    calls = {"n": 0}

    def f(x, c):
        calls["n"] += 1
        if calls["n"] > after_calls:
            raise Crash("injected fault")
        return -c.num_tokens / 3

    return f


def test_crash_mid_run_then_resume_is_exact_and_never_duplicates_metrics(tmp_path, tokenizer):
    """A resume must never write a metrics row twice (a clean stop alone would not show it). A crash in step 4 after the step-2 checkpoint and step 3's metrics row; the
    resumed run rewinds metrics to step 2, redoes 3 and 4, and ends exactly where an
    uninterrupted run ends: same metrics, same weights."""
    run(_rl_cfg(tmp_path, "ref"), policy=stopping_lm(tokenizer), tokenizer=tokenizer,
        reward_fn=CallableReward(_crashing_reward(10**9)))
    cfg = _rl_cfg(tmp_path, "crash")
    with pytest.raises(Crash):  # 4 samples per step: steps 1-3 score 12 samples, step 4 crashes
        run(cfg, policy=stopping_lm(tokenizer), tokenizer=tokenizer, reward_fn=CallableReward(_crashing_reward(12)))
    d = tmp_path / "crash"
    assert [json.loads(x)["step"] for x in open(d / "metrics.jsonl")] == [1, 2, 3]
    assert sorted(p.name for p in (d / "checkpoints").iterdir()) == ["step-2"]
    s = run(cfg, resume=d, policy=stopping_lm(tokenizer), tokenizer=tokenizer,
            reward_fn=CallableReward(_crashing_reward(10**9)))
    assert s["resumed_from"] == 2 and s["steps_run"] == 2
    rows = [json.loads(x) for x in open(d / "metrics.jsonl")]
    want = [json.loads(x) for x in open(tmp_path / "ref" / "metrics.jsonl")]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]

    def strip(r):
        return {k: v for k, v in r.items() if k != "seconds"}

    assert [strip(r) for r in rows] == [strip(r) for r in want]
    from safetensors.torch import load_file

    a, b = load_file(str(d / "final" / "model.safetensors")), load_file(str(tmp_path / "ref" / "final" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_resume_of_a_typod_run_folder_is_an_error_not_a_fresh_run(tmp_path, tokenizer):
    """``rl`` resume with a wrong run name is an error, never a silent fresh run."""
    with pytest.raises(RunError, match="no config.yaml"):
        run(_rl_cfg(tmp_path, "x"), resume=tmp_path / "rl-typo", policy=stopping_lm(tokenizer), tokenizer=tokenizer)
    assert not (tmp_path / "rl-typo").exists() and not (tmp_path / "x").exists()


def test_cli_resume_uses_the_saved_config_and_refuses_overrides(tmp_path):
    from typer.testing import CliRunner

    from pofe.cli.main import app

    runner = CliRunner()
    res = runner.invoke(app, ["rl", "--resume", str(tmp_path / "nope")])
    assert res.exit_code == 2 and "no config.yaml" in res.output
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "config.yaml").write_text("train: {steps: 3}\n")
    res = runner.invoke(app, ["rl", "--resume", str(tmp_path / "r"), "--steps", "5"])
    assert res.exit_code == 2 and "refused" in res.output
    res = runner.invoke(app, ["rl", "--resume", str(tmp_path / "r"), "--print-config"])
    assert res.exit_code == 0 and "steps: 3" in res.output


@pytest.mark.parametrize("bad", ["beta=0", "beta=-0.1", "train.steps=0", "train.batch_size=0", "train.group_size=1",
                                 "train.micro_batch=0", "eval.samples=0", "reward.scale=0", "sampling.temperature=0",
                                 "checkpoint.every=-1", "data.max_prompts=0"])
def test_nonsense_hyperparameters_are_refused_at_parse_time(bad):
    from pofe.config import ConfigError, load_config

    import re

    with pytest.raises(ConfigError, match=re.escape(bad.split("=")[0])):
        load_config(RLConfig, None, [bad])


def test_reward_model_reward_from_a_pofe_rm_directory(tmp_path, tokenizer):
    from pofe.loops.rl import build_reward
    from pofe.loops.rm.reward_model import tiny_reward_model

    d = tmp_path / "rm"
    tiny_reward_model(tokenizer).save_pretrained(d)
    tokenizer.save_pretrained(d)
    rf = build_reward(RLConfig(reward={"kind": "reward-model", "model": str(d)}).reward, max_new_tokens=8)
    vals, _ = rf(["x", "y"], [Completion(prompt="x", text="a"), Completion(prompt="y", text="b")])
    assert len(vals) == 2 and all(isinstance(v, float) for v in vals)
    with pytest.raises(ValueError):
        build_reward(RLConfig(reward={"kind": "reward-model"}).reward, max_new_tokens=8)


def test_shipped_examples_parse():
    from pathlib import Path

    from pofe.config import load_config
    from pofe.loops.cai_revise import CaiReviseConfig
    from pofe.loops.label import LabelConfig
    from pofe.loops.rm import RMConfig

    root = Path(__file__).resolve().parents[2] / "examples"
    kinds = {"cai": CaiReviseConfig, "label": LabelConfig, "rm": RMConfig, "rl": RLConfig}
    seen = 0
    for prefix, cls in kinds.items():
        for f in sorted(root.glob(f"{prefix}-*.yaml")):
            load_config(cls, f)
            seen += 1
    assert seen >= 6


def test_direct_rlaif_with_the_expected_score_judge_logs_the_score_distribution(tmp_path, tokenizer, tiny_model_dir):
    """reward.kind = judge with the expected-score judge (direct RLAIF) on a tiny judge model."""
    cfg = RLConfig(data={"prompts": _prompts(tmp_path, 4)}, train={"steps": 1, "batch_size": 1, "group_size": 2}, eval={"num_prompts": 0},
                   sampling={"max_new_tokens": 3, "temperature": 1.0},
                   reward={"kind": "judge", "judge": {"kind": "expected-score", "model": str(tiny_model_dir),
                                                      "cache": {"enabled": False}}},
                   optim={"lr": 1e-3, "warmup_steps": 0}, run={"output_dir": str(tmp_path), "name": "rl"})
    s = run(cfg, policy=stopping_lm(tokenizer), tokenizer=tokenizer)
    row = json.loads(open(f"{s['run_dir']}/metrics.jsonl").readline())
    assert 0.0 <= row["objective/scores"] <= 1.0  # normalised expected score
    dist = row["judge"]["mean_distribution"]
    assert len(dist) == 10 and sum(dist) == pytest.approx(1.0, abs=1e-3)
    assert 0.0 <= row["judge"]["top_of_scale_share"] <= 1.0


def test_token_logprobs_over_the_completions_only_equal_a_full_forward(tiny_model, tokenizer):
    """rl's per-token log-probs come from a left-padded batch whose logits cover only the
    completions; summed under their mask they equal log p(completion | prompt) from a plain
    forward of each sequence alone, and each row keeps its own tokens (mask counts)."""
    import torch

    from pofe.records import Completion
    from pofe.loops.rl.policy_gradient import token_logprobs

    comps = [Completion(prompt="a", text="", token_ids=(11, 12, 13), prompt_token_ids=(5, 6, 7, 8, 9)),
             Completion(prompt="b", text="", token_ids=(21,), prompt_token_ids=(5,)),
             Completion(prompt="c", text="", token_ids=(31, 32, 33, 34, 35), prompt_token_ids=(7, 8))]
    tiny_model.eval()
    with torch.no_grad():
        lp, mask = token_logprobs(tiny_model, comps, tokenizer.pad_token_id)
        got = (lp * mask).sum(-1)
        want = []
        for c in comps:
            ids = torch.tensor([list(c.prompt_token_ids) + list(c.token_ids)])
            full = torch.log_softmax(tiny_model(input_ids=ids).logits[0, :-1].float(), -1)
            tgt = ids[0, 1:]
            want.append(float(full.gather(-1, tgt[:, None])[-len(c.token_ids):].sum()))
    assert lp.shape == mask.shape == (3, 5) and mask.sum(-1).tolist() == [3, 1, 5]
    assert torch.allclose(got, torch.tensor(want), atol=1e-5), (got, want)
