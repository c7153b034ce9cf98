"""Sequence log-probs: batched (left or right padded) equals a naive one-at-a-time loop."""

import pytest
import torch

from pofe.logprobs import build_batch, completion_logprobs, sequence_logprobs


def naive_logprob(model, prompt_ids, completion_ids):
    ids = torch.tensor([list(prompt_ids) + list(completion_ids)])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float()
    lp = torch.log_softmax(logits, -1)
    total = 0.0
    for k in range(len(completion_ids)):
        pos = len(prompt_ids) + k  # token at pos is predicted by logits at pos - 1
        total += lp[pos - 1, ids[0, pos]].item()
    return total


@pytest.mark.parametrize("side", ["left", "right"])
def test_batched_equals_naive(tiny_model, side):
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(5, 1000, (n,), generator=g).tolist() for n in (3, 7, 5)]
    comps = [torch.randint(5, 1000, (n,), generator=g).tolist() for n in (4, 1, 6)]
    with torch.no_grad():
        got = completion_logprobs(tiny_model, prompts, comps, pad_token_id=0, padding_side=side)
    want = [naive_logprob(tiny_model, p, c) for p, c in zip(prompts, comps)]
    assert got.shape == (3,)
    assert got.tolist() == pytest.approx(want, abs=1e-4)


def test_masks_prompt_and_padding():
    b = build_batch([[1, 2], [3]], [[4], [5, 6, 7]], pad_token_id=0, padding_side="left")
    assert b.input_ids.tolist() == [[0, 1, 2, 4], [3, 5, 6, 7]]
    assert b.attention_mask.tolist() == [[0, 1, 1, 1], [1, 1, 1, 1]]
    assert b.completion_mask.tolist() == [[0, 0, 0, 1], [0, 1, 1, 1]]
    r = build_batch([[1, 2], [3]], [[4], [5, 6, 7]], pad_token_id=0, padding_side="right")
    assert r.input_ids.tolist() == [[1, 2, 4, 0], [3, 5, 6, 7]]
    assert r.completion_mask.tolist() == [[0, 0, 1, 0], [0, 1, 1, 1]]


def test_gradients_flow(tiny_model):
    b = build_batch([[10, 11]], [[12, 13]], pad_token_id=0)
    s = sequence_logprobs(tiny_model, b)
    s.sum().backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in tiny_model.parameters())


def test_length_mismatch_is_an_error():
    with pytest.raises(ValueError, match="2 prompts but 1 completions"):
        build_batch([[1], [2]], [[3]], pad_token_id=0)


def test_selective_logprobs_matches_log_softmax_values_and_gradients():
    """The chunked custom-backward reduction equals log_softmax + gather in float64 (an
    independent implementation), values and gradients, for fp32 and bf16 logits."""
    import torch

    from pofe.logprobs import selective_logprobs

    g = torch.Generator().manual_seed(0)
    base = torch.randn(3, 5, 37, generator=g, dtype=torch.float64) * 4
    targets = torch.randint(0, 37, (3, 5), generator=g)
    w = torch.randn(3, 5, generator=g, dtype=torch.float64)
    ref_in = base.clone().requires_grad_(True)
    ref = torch.log_softmax(ref_in, -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    (ref * w).sum().backward()
    for dtype, tol_v, tol_g in ((torch.float32, 1e-5, 1e-6), (torch.bfloat16, 0.0, 0.0)):
        x = base.to(dtype).requires_grad_(True)
        got = selective_logprobs(x, targets, chunk=4)  # chunk 4 over 15 rows: a ragged last chunk
        assert got.dtype == torch.float32 and got.shape == (3, 5)
        (got * w.float()).sum().backward()
        if dtype is torch.bfloat16:
            # exact maths on the bf16-rounded logits: compare against float64 on those
            xr = base.to(dtype).double().requires_grad_(True)
            r = torch.log_softmax(xr, -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
            (r * w).sum().backward()
            assert torch.allclose(got.double(), r.detach(), atol=1e-5)
            assert torch.allclose(x.grad.double(), xr.grad, atol=2e-2)  # the gradient is stored in bf16
        else:
            assert torch.allclose(got.double(), ref.detach(), atol=tol_v)
            assert torch.allclose(x.grad.double(), ref_in.grad, atol=tol_g)
    # torch's own numerical gradient check in float64
    x = base[:1, :2].clone().requires_grad_(True)
    assert torch.autograd.gradcheck(lambda t: selective_logprobs(t, targets[:1, :2], chunk=1), (x,))
