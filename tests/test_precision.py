"""bf16 autocast keeps the DPO loss and its gradients within a stated tolerance of fp32."""

import pytest
import torch

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _dpo_loss_and_grads(model, tokenizer, precision):
    from pofe.logprobs import build_batch, sequence_logprobs
    from pofe.losses import LOSSES
    from pofe.training.precision import autocast

    enc = lambda t: tokenizer(t, add_special_tokens=False).input_ids  # noqa: E731
    prompts = [enc("Tell me a fact."), enc("Name a colour.")]
    chosen = [enc(" Water boils at 100 C."), enc(" Blue.")]
    rejected = [enc(" I do not know anything about that at all."), enc(" Colours are hard to name, sorry.")]
    b = build_batch(prompts * 2, chosen + rejected, pad_token_id=tokenizer.pad_token_id or 0, padding_side="left")
    model.zero_grad()
    with autocast(precision, "cpu"):
        lp = sequence_logprobs(model, b)
    ref = lp.detach() - 0.3  # a fixed reference offset so the loss is not at log 2
    out = LOSSES["dpo"](lp[:2], lp[2:], ref[:2] + 0.1, ref[2:], beta=0.1)
    out.losses.mean().backward()
    grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    return float(out.losses.mean()), lp.detach(), grads


def test_bf16_dpo_loss_and_gradients_close_to_fp32(tiny_model, tokenizer):
    loss32, lp32, g32 = _dpo_loss_and_grads(tiny_model, tokenizer, "fp32")
    loss16, lp16, g16 = _dpo_loss_and_grads(tiny_model, tokenizer, "bf16")
    assert all(p.dtype == torch.float32 for p in tiny_model.parameters())  # fp32 master weights
    # Stated tolerance: bf16 has an 8-bit mantissa (relative error 2^-8 = 0.4% per op).
    assert abs(loss16 - loss32) < 1e-2
    assert torch.allclose(lp16, lp32, atol=0.05)  # seen: 0.002
    cos = torch.nn.functional.cosine_similarity(g16, g32, dim=0)
    assert cos > 0.999, f"bf16 gradient direction differs from fp32 (cosine {cos:.4f})"
    assert abs(g16.norm() / g32.norm() - 1) < 0.05
