"""Shared training plumbing used by ``pofe online``: schedules, the reference policy (LoRA
adapter disabled / frozen copy), optimisers, atomic checkpoints, final models."""

from __future__ import annotations

import math

import pytest
import torch

from pofe.logprobs import completion_logprobs
from pofe.runtime import (LoraSettings, ModelConfig, OptimConfig, Reference, latest_checkpoint, load_checkpoint,
                          load_policy, make_optimizer, make_scheduler, prune_checkpoints, save_checkpoint, save_final)


# Tiny models run much faster single-threaded (shared fixture in conftest.py).

def _lps(model, n=3):
    prompts = [[5, 6, 7]] * n
    comps = [[8, 9], [10, 11, 12], [13]][:n]
    return completion_logprobs(model, prompts, comps, pad_token_id=2)


def _step(model, opt):
    loss = -_lps(model).sum()
    loss.backward()
    opt.step()
    opt.zero_grad()


def test_schedule_warmup_then_constant_linear_cosine():
    p = [torch.nn.Parameter(torch.zeros(1))]
    for sched, want in [("constant", [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]), ("linear", [0.25, 0.5, 0.75, 1.0, 1.0, 2 / 3]),
                        ("cosine", [0.25, 0.5, 0.75, 1.0, 1.0, 0.75])]:
        opt = torch.optim.SGD(p, lr=2.0)
        s = make_scheduler(opt, OptimConfig(warmup_steps=4, schedule=sched), total_steps=7)
        got = []
        for _ in range(6):
            got.append(s.get_last_lr()[0] / 2.0)
            opt.step()
            s.step()
        assert got == pytest.approx(want), sched


def test_lora_reference_is_the_base_model_without_a_copy(tokenizer, tiny_model):
    base = _lps(tiny_model).detach()
    policy, _ = load_policy(ModelConfig(lora=LoraSettings(enabled=True, r=4, alpha=8)), model=tiny_model, tokenizer=tokenizer)
    ref = Reference(policy, lora=True)
    assert ref.module is policy  # no second copy of the weights
    opt = make_optimizer(policy, OptimConfig(lr=1e-2))
    for _ in range(2):
        _step(policy, opt)
    assert not torch.allclose(_lps(policy).detach(), base)  # the adapter moved the policy
    with ref.model() as m:
        torch.testing.assert_close(_lps(m), base)  # ... the reference did not


def test_full_finetuning_reference_is_a_frozen_copy(tiny_model):
    base = _lps(tiny_model).detach()
    ref = Reference(tiny_model, lora=False)
    opt = make_optimizer(tiny_model, OptimConfig(name="adafactor", lr=1e-2))
    _step(tiny_model, opt)
    assert not torch.allclose(_lps(tiny_model).detach(), base)
    with ref.model() as m:
        torch.testing.assert_close(_lps(m), base)
        assert not any(p.requires_grad for p in m.parameters())


def test_checkpoint_roundtrip_is_exact(tmp_path, tokenizer):
    from pofe.models import tiny_causal_lm

    a = tiny_causal_lm(tokenizer, seed=1)
    opt = make_optimizer(a, OptimConfig(lr=1e-3))
    sched = make_scheduler(opt, OptimConfig(warmup_steps=3), 10)
    _step(a, opt)
    sched.step()
    torch.manual_seed(123)
    ck = save_checkpoint(tmp_path / "checkpoints" / "step-1", model=a, optimizer=opt, scheduler=sched, step=1,
                         state={"cursor": 4, "buffer": {"0": [[1, 2]]}})
    expected_rand = torch.rand(3)
    b = tiny_causal_lm(tokenizer, seed=2)
    opt_b = make_optimizer(b, OptimConfig(lr=1e-3))
    sched_b = make_scheduler(opt_b, OptimConfig(warmup_steps=3), 10)
    info = load_checkpoint(ck, model=b, optimizer=opt_b, scheduler=sched_b)
    assert info == {"step": 1, "state": {"cursor": 4, "buffer": {"0": [[1, 2]]}}}
    assert torch.equal(torch.rand(3), expected_rand)  # RNG restored
    for (n, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.equal(x, y), n
    assert sched_b.get_last_lr() == sched.get_last_lr()
    _step(a, opt)
    _step(b, opt_b)  # identical optimiser state -> identical next update
    for (n, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.equal(x, y), n
    assert '"buffer"' not in (ck / "meta.json").read_text()  # meta.json stays small
    assert latest_checkpoint(tmp_path) == ck


def test_checkpoint_write_is_atomic(tmp_path, tiny_model, monkeypatch):
    import safetensors.torch

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(safetensors.torch, "save_file", boom)
    with pytest.raises(OSError):
        save_checkpoint(tmp_path / "checkpoints" / "step-3", model=tiny_model, step=3)
    assert list((tmp_path / "checkpoints").iterdir()) == []  # nothing half-written
    assert latest_checkpoint(tmp_path) is None


def test_prune_keeps_the_last_checkpoints(tmp_path, tiny_model):
    for s in (1, 2, 10):
        save_checkpoint(tmp_path / "checkpoints" / f"step-{s}", model=tiny_model, step=s)
    prune_checkpoints(tmp_path, 2)
    assert sorted(d.name for d in (tmp_path / "checkpoints").iterdir()) == ["step-10", "step-2"]
    assert latest_checkpoint(tmp_path).name == "step-10"


def test_save_final_lora_is_loadable_by_plain_transformers(tmp_path, tokenizer, tiny_model):
    from transformers import AutoModelForCausalLM

    policy, _ = load_policy(ModelConfig(lora=LoraSettings(enabled=True, r=4)), model=tiny_model, tokenizer=tokenizer)
    opt = make_optimizer(policy, OptimConfig(lr=1e-2))
    _step(policy, opt)
    want = _lps(policy).detach()
    out = save_final(policy, tokenizer, tmp_path / "final")
    assert (out / "adapter" / "adapter_config.json").exists()
    loaded = AutoModelForCausalLM.from_pretrained(out)
    torch.testing.assert_close(_lps(loaded).detach(), want, rtol=1e-4, atol=1e-4)
    assert math.isfinite(float(want.sum()))


def test_fused_adamw_equals_the_per_tensor_update():
    """make_optimizer's fused AdamW takes the decoupled-weight-decay Adam step (Loshchilov & Hutter,
    Alg. 2), written out here by hand, for three steps on two tensors of different shapes."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 3), torch.nn.Linear(3, 2))
    cfg = OptimConfig(lr=1e-2, weight_decay=0.1)
    opt = make_optimizer(model, cfg)
    assert opt.defaults["fused"] is True
    b1, b2, eps = cfg.betas[0], cfg.betas[1], 1e-8
    want = {n: p.detach().clone() for n, p in model.named_parameters()}
    m = {n: torch.zeros_like(p) for n, p in want.items()}
    v = {n: torch.zeros_like(p) for n, p in want.items()}
    for t in range(1, 4):
        x = torch.randn(4, 5)
        opt.zero_grad()
        model(x).pow(2).sum().backward()
        for n, p in model.named_parameters():
            g = p.grad
            want[n] = want[n] * (1 - cfg.lr * cfg.weight_decay)
            m[n] = b1 * m[n] + (1 - b1) * g
            v[n] = b2 * v[n] + (1 - b2) * g * g
            mhat, vhat = m[n] / (1 - b1**t), v[n] / (1 - b2**t)
            want[n] = want[n] - cfg.lr * mhat / (vhat.sqrt() + eps)
        versions = [p._version for p in model.parameters()]
        opt.step()
        # an update is visible to fingerprint() (engines resync on it) even through the fused kernel
        assert all(p._version > v for p, v in zip(model.parameters(), versions))
        for n, p in model.named_parameters():
            torch.testing.assert_close(p.detach(), want[n], rtol=1e-5, atol=1e-6)
