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
