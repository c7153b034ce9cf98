"""OAIF Appendix B's off-policy diagnostic in ``pofe online``: the mean per-token log-prob of the
policy's fresh samples and of fixed offline responses, checked against a plain forward +
log_softmax, present in metrics.jsonl for an online and an offline run, and (slow) the gap's sign
on the embedded model."""

from __future__ import annotations

import json
import math
import random

import pytest
import torch

from _online_utils import tiny_cfg
from pofe.config import ConfigError
from pofe.runs import read_jsonl
from pofe.loops.online.dap import TokenPair, dap_backward
from pofe.loops.online.diagnostics import fresh_from_update, mean_token_logp

KEYS = ("offpolicy/logp_fresh", "offpolicy/logp_offline", "offpolicy/gap", "offpolicy/logp_offline_chosen",
        "offpolicy/logp_offline_rejected", "offpolicy/fresh_tokens", "offpolicy/offline_tokens")


def plain_logps(model, prompt: list[int], response: list[int]) -> list[float]:
    """log pi(y_t | x, y_<t) of each response token: one unpadded forward, full log_softmax."""
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids).logits[0].double(), dim=-1)
    return [float(logp[len(prompt) + t - 1, tok]) for t, tok in enumerate(response)]


def test_mean_token_logp_is_a_plain_forward_and_log_softmax(tiny_model):
    g = random.Random(0)
    prompts = [[g.randrange(5, 500) for _ in range(n)] for n in (3, 7, 5)]
    responses = [[g.randrange(5, 500) for _ in range(n)] for n in (4, 1, 6)]
    total, n = mean_token_logp(tiny_model, prompts, responses, pad_token_id=0, device="cpu", chunk=2)
    want = [x for p, r in zip(prompts, responses) for x in plain_logps(tiny_model, p, r)]
    assert n == 11 == len(want)
    assert total == pytest.approx(sum(want), rel=1e-5)
    # an empty response counts nothing
    assert mean_token_logp(tiny_model, [[5, 6]], [[]], pad_token_id=0, device="cpu") == (0.0, 0)


def test_fresh_logp_reuses_the_updates_policy_pass(tiny_model):
    """The DAP update's own policy pass (before the optimiser step) gives the same numbers as a
    plain forward of every trained response."""
    from pofe.losses import dpo
    from pofe.runtime import Reference

    g = random.Random(1)
    pairs = [TokenPair(tuple(g.randrange(5, 500) for _ in range(4)), tuple(g.randrange(5, 500) for _ in range(c)),
                       tuple(g.randrange(5, 500) for _ in range(r)), 1.0, f"p{i}")
             for i, (c, r) in enumerate(((3, 5), (2, 2), (6, 1)))]
    ref = Reference(tiny_model, lora=False)
    res = dap_backward(tiny_model, ref, pairs, loss_fn=dpo, beta=0.1, micro_batches=2, normaliser=3, pad_token_id=0)
    total, n = fresh_from_update(pairs, res)
    want = [x for p in pairs for resp in (p.chosen_ids, p.rejected_ids)
            for x in plain_logps(tiny_model, list(p.prompt_ids), list(resp))]
    assert n == 19 == len(want)
    assert total == pytest.approx(sum(want), rel=1e-5)
    assert fresh_from_update(pairs, None) == (0.0, 0)


def _prefs(path, n=3):
    rows = [{"prompt": f"Name a colour number {i}.", "chosen": f"Blue is colour {i}.", "rejected": "I do not know."}
            for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows


def _independent_offline(model_dir, tokenizer, rows) -> float:
    from transformers import AutoModelForCausalLM

    from pofe.models import apply_chat_template

    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    logps = []
    for r in rows:
        prompt = tokenizer(apply_chat_template(tokenizer, r["prompt"]), add_special_tokens=False)["input_ids"]
        for text in (r["chosen"], r["rejected"]):
            resp = tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
            logps += plain_logps(model, prompt, resp)
    return sum(logps) / len(logps)


@pytest.mark.slow
def test_online_run_logs_the_gap_every_step(tmp_path, tiny_model_dir, tokenizer):
    from pofe.loops.online import run

    rows = _prefs(tmp_path / "prefs.jsonl")
    s = run(tiny_cfg(tmp_path / "run", tiny_model_dir, "diagnostics.offpolicy=true", "eval.enabled=false",
                     f"diagnostics.offline_responses={tmp_path / 'prefs.jsonl'}"))
    metrics = read_jsonl(f"{s['run_dir']}/metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2]
    for m in metrics:
        assert set(KEYS) <= set(m)
        assert m["offpolicy/gap"] == pytest.approx(m["offpolicy/logp_fresh"] - m["offpolicy/logp_offline"])
        assert m["offpolicy/fresh_tokens"] > 0 and m["offpolicy/offline_tokens"] > 0
    # step 1 measures the initial weights (all 3 rows: offline_rows 8 > 3), an independent forward
    assert metrics[0]["offpolicy/logp_offline"] == pytest.approx(_independent_offline(tiny_model_dir, tokenizer, rows),
                                                                 rel=1e-4)
    assert s["offpolicy"]["steps"] == 2


@pytest.mark.slow
def test_offline_run_samples_fresh_responses_and_keeps_training_identical(tmp_path, tiny_model_dir):
    from pofe.loops.online import run

    _prefs(tmp_path / "prefs.jsonl", n=4)
    base = ("mode=offline", f"data.preferences={tmp_path / 'prefs.jsonl'}", "eval.enabled=false")
    plain = run(tiny_cfg(tmp_path / "a", tiny_model_dir, *base))
    probed = run(tiny_cfg(tmp_path / "b", tiny_model_dir, *base, "diagnostics.offpolicy=true",
                          "diagnostics.offline_rows=2"))
    ma, mb = (read_jsonl(f"{s['run_dir']}/metrics.jsonl") for s in (plain, probed))
    for m in mb:
        assert set(KEYS) <= set(m) and m["offpolicy/fresh_tokens"] > 0
        assert math.isfinite(m["offpolicy/logp_fresh"]) and math.isfinite(m["offpolicy/logp_offline"])
    assert not any(k.startswith("offpolicy/") for m in ma for k in m)
    # the probe samples off the training RNG and never touches the weights: training is the same run
    assert [m["loss"] for m in ma] == pytest.approx([m["loss"] for m in mb], rel=1e-6)


def test_config_errors_name_the_key(tmp_path, tiny_model_dir):
    with pytest.raises(ConfigError, match="diagnostics.offline_rows"):
        tiny_cfg(tmp_path, tiny_model_dir, "diagnostics.offline_rows=4")  # without offpolicy it would do nothing
    with pytest.raises(ConfigError, match="diagnostics.offline_responses"):
        tiny_cfg(tmp_path, tiny_model_dir, "diagnostics.offpolicy=true")  # mode=online has no offline set
    with pytest.raises(ConfigError, match="diagnostics.offpolicy_every"):
        tiny_cfg(tmp_path, tiny_model_dir, "diagnostics.offpolicy=true", "diagnostics.offpolicy_every=0",
                 "diagnostics.offline_responses=x.jsonl")


@pytest.mark.slow
def test_embedded_model_assigns_offline_responses_less_probability(tmp_path, shared_data):
    """Appendix B on the embedded SmolLM2-135M-Instruct: offline responses (human-written HH-RLHF
    replies) get a lower mean per-token log-prob than the policy's own samples, at every step."""
    from pofe.config import load_config
    from pofe.loops.online import OnlineConfig, run

    hh = shared_data / "hh-rlhf" / "helpful-base" / "test.jsonl.gz"
    cfg = load_config(OnlineConfig, None, [
        "model.name=smollm2-135m-instruct", "judge.kind=length", "train.steps=3", "train.batch_size=2",
        "sampling.max_new_tokens=24", "eval.enabled=false", f"run.output_dir={tmp_path}", "log.progress=false",
        "diagnostics.offpolicy=true", f"diagnostics.offline_responses={hh}", "diagnostics.offline_rows=8"])
    s = run(cfg)
    rows = read_jsonl(f"{s['run_dir']}/metrics.jsonl")
    gaps = [r["offpolicy/gap"] for r in rows]
    print("offpolicy:", [(r["offpolicy/logp_fresh"], r["offpolicy/logp_offline"]) for r in rows])
    assert len(gaps) == 3 and all(g > 0 for g in gaps), rows
