"""lean_activations: the same losses bit for bit and the same gradients to fp32 rounding, with fewer bytes
saved for the backward."""

from __future__ import annotations

import contextlib
import copy
import random

import pytest
import torch

from pofe.runtime.activations import lean_activations
from pofe.loops.online.dap import TokenPair, pair_logps
from pofe.runtime.precision import attention_for, autocast


def _pairs(seed: int = 0, n: int = 3) -> list[TokenPair]:
    rng = random.Random(seed)
    ids = lambda k: tuple(rng.randrange(5, 400) for _ in range(k))  # noqa: E731
    return [TokenPair(ids(rng.randint(3, 9)), ids(rng.randint(1, 7)), ids(rng.randint(1, 7))) for _ in range(n)]


def _qwen2(tokenizer):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    return Qwen2ForCausalLM(cfg)


def _pass(model, pairs, pad, precision, lean, shared, eager=False):
    """Summed pair log-probs' gradient, and the bytes of activations the forward saved for the backward
    (batch-shaped tensors other than the vocabulary-wide logits; weights and their casts are 2-D)."""
    saved = {}
    vocab = model.config.vocab_size

    def pack(t):
        if t.dim() >= 3 and t.shape[-1] != vocab:  # one tensor saved by several ops (the mask) counts once
            saved[t.data_ptr()] = max(saved.get(t.data_ptr(), 0), t.numel() * t.element_size())
        return t

    model.zero_grad(set_to_none=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        with autocast(precision, "cpu"), attention_for(model, eager), (lean_activations(model) if lean else _null()):
            lp = pair_logps(model, pairs, pad, "cpu", shared=shared)
    # the backward runs after the block, as in dap_backward: the checkpoints hold the original forwards
    (lp * torch.tensor([1.0, -0.5, 2.0] * 2)).sum().backward()
    return lp.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}, sum(saved.values())


class _null:
    def __enter__(self):
        return 0

    def __exit__(self, *exc):
        return False


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("precision", ["bf16", "fp32"])
@pytest.mark.parametrize("shared", [True, False])
@pytest.mark.parametrize("eager", [False, True])
def test_same_numbers_and_fewer_saved_bytes(tiny_model, tokenizer, arch, precision, shared, eager):
    model = tiny_model if arch == "llama" else _qwen2(tokenizer)
    model.train()
    pairs = _pairs()
    lp0, g0, bytes0 = _pass(model, pairs, tokenizer.pad_token_id, precision, lean=False, shared=shared, eager=eager)
    lp1, g1, bytes1 = _pass(model, pairs, tokenizer.pad_token_id, precision, lean=True, shared=shared, eager=eager)
    assert torch.equal(lp0, lp1)
    assert g0.keys() == g1.keys()
    # The backward replays autograd's formulas; only the order in which a tensor's gradient
    # contributions are summed (the residual stream feeds the norm and the skip connection) may
    # differ: fp32 rounding, measured <= 5e-7 of each tensor's largest entry.
    for n in g0:
        scale = g0[n].abs().max().item()
        assert scale > 0, n  # every parameter gets a gradient
        torch.testing.assert_close(g1[n], g0[n], rtol=0, atol=2e-6 * scale, msg=n)
    # 2 layers x (2 norms + 1 MLP) + the final norm, each saving less than before
    assert bytes1 < 0.85 * bytes0, (bytes1, bytes0)


def test_switches_known_modules_and_restores_them(tiny_model):
    before = {n: type(m) for n, m in tiny_model.named_modules()}
    tiny_model.train()
    with lean_activations(tiny_model) as n:
        assert n == 2 * 3 + 1  # per layer: input and post-attention norms, the MLP; and the final norm
        kinds = {type(m).__name__ for m in tiny_model.modules()}
        assert {"LeanLlamaRMSNorm", "LeanLlamaMLP"} <= kinds
        # a copy taken inside (pi_0's, say) computes with its own weights, not the original's
        twin = copy.deepcopy(tiny_model)
    assert {n: type(m) for n, m in tiny_model.named_modules()} == before
    with torch.no_grad():
        twin.model.norm.weight.mul_(3.0)
        x = torch.randn(2, 32)
        assert not torch.equal(twin.model.norm(x), tiny_model.model.norm(x))


def test_no_op_without_gradients_in_eval_and_under_gradient_checkpointing(tiny_model, tokenizer):
    pairs = _pairs(1)
    tiny_model.eval()
    with torch.no_grad():
        a = pair_logps(tiny_model, pairs, tokenizer.pad_token_id, "cpu")
        with lean_activations(tiny_model):
            b = pair_logps(tiny_model, pairs, tokenizer.pad_token_id, "cpu")
    assert torch.equal(a, b)
    tiny_model.train()
    tiny_model.gradient_checkpointing_enable()
    with lean_activations(tiny_model) as n:
        assert n == 0


def test_unknown_architectures_are_left_alone(tokenizer):
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(vocab_size=len(tokenizer), n_embd=32, n_layer=1, n_head=2))
    model.train()
    with lean_activations(model) as n:
        assert n == 0


def test_a_class_whose_forward_changed_is_left_alone(tokenizer):
    """The class name is not trusted: a forward that no longer computes Llama's norm is not switched."""
    from transformers.models.llama import modeling_llama

    import pofe.runtime.activations as act

    class LlamaRMSNorm(modeling_llama.LlamaRMSNorm):  # same name, a Gemma-style (1 + w) scale
        def forward(self, x):
            x32 = x.float()
            return ((1.0 + self.weight) * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))).to(x.dtype)

    norm = LlamaRMSNorm(16)
    norm.train()
    with lean_activations(norm) as n:
        assert n == 0 and type(norm) is LlamaRMSNorm
    assert act._AGREES[LlamaRMSNorm] is False


def test_the_probe_leaves_the_global_rng_alone(tokenizer):
    """Resumed runs replay torch's RNG stream; a check that only runs in some processes must not draw from it."""
    import pofe.runtime.activations as act
    from pofe.models import tiny_causal_lm

    act._AGREES.clear()
    model = tiny_causal_lm(tokenizer)
    model.train()
    torch.manual_seed(7)
    expected = torch.rand(3)
    torch.manual_seed(7)
    with lean_activations(model) as n:
        assert n == 7
    assert torch.equal(torch.rand(3), expected)


def test_eager_attention_saves_less_with_the_same_gradients(tiny_model, tokenizer):
    """The attention alone: with eager attention, the lean pass saves less than with the norms and the
    MLP switched only (the modeling module's function left as it is), and its numbers are unchanged."""
    import transformers.models.llama.modeling_llama as modeling

    tiny_model.train()
    pairs = _pairs(1)
    own = modeling.eager_attention_forward
    with pytest.MonkeyPatch.context() as mp:
        import pofe.runtime.activations as A

        mp.setattr(A, "_attention_agrees", lambda modeling: False)
        lp0, g0, bytes0 = _pass(tiny_model, pairs, tokenizer.pad_token_id, "bf16", lean=True, shared=True, eager=True)
    assert modeling.eager_attention_forward is own
    _pass(tiny_model, pairs, tokenizer.pad_token_id, "bf16", lean=True, shared=True, eager=True)  # the probe, once
    lp1, g1, bytes1 = _pass(tiny_model, pairs, tokenizer.pad_token_id, "bf16", lean=True, shared=True, eager=True)
    assert modeling.eager_attention_forward is own  # given back after the block
    assert torch.equal(lp0, lp1)
    for n in g0:
        assert torch.equal(g0[n], g1[n]), n  # the attention's gradients are bit for bit the original's
    # the tiny model (4 heads over 2, head dim 8, ~15 positions) is mostly norms and MLP: ~6% of its saves
    assert bytes1 < 0.95 * bytes0, (bytes1, bytes0)


def test_an_eager_attention_that_changed_is_left_alone(tiny_model, monkeypatch):
    import pofe.runtime.activations as A
    import transformers.models.llama.modeling_llama as modeling

    own = modeling.eager_attention_forward

    def changed(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
        return own(module, query, key, value, attention_mask, scaling=scaling * 1.001, dropout=dropout, **kwargs)

    monkeypatch.setattr(modeling, "eager_attention_forward", changed)
    monkeypatch.setattr(A, "_ATT_AGREES", {})
    tiny_model.train()
    with lean_activations(tiny_model):
        assert modeling.eager_attention_forward is changed
    assert A._ATT_AGREES == {(modeling.__name__, None): False}
    monkeypatch.setattr(modeling, "eager_attention_forward", own)
    monkeypatch.setattr(A, "_ATT_AGREES", {})
    with lean_activations(tiny_model):
        assert modeling.eager_attention_forward.pofe_original is own
    assert modeling.eager_attention_forward is own and A._ATT_AGREES == {(modeling.__name__, None): True}


def test_sparse_tied_embedding_gives_the_dense_gradient_as_one_dense_tensor(tokenizer):
    """A tied embedding switched to sparse for a pass: the weight's gradient (embedding rows plus the
    LM head) is one dense tensor, equal to the dense backward's up to fp32 summation order, and the
    fused AdamW steps on it; the switch is undone after the block. Frozen or untied weights, and no
    grad, are left alone."""
    from pofe.models import tiny_causal_lm
    from pofe.runtime.activations import sparse_tied_embedding

    model = tiny_causal_lm(tokenizer)
    pairs = _pairs(n=4)
    grads = []
    for sparse in (False, True):
        model.zero_grad(set_to_none=True)
        with sparse_tied_embedding(model) if sparse else contextlib.nullcontext(False) as on:
            lp = pair_logps(model, pairs, tokenizer.pad_token_id, "cpu")
        assert on is sparse
        (lp * torch.linspace(-1, 1, len(lp))).sum().backward()
        grads.append(model.get_input_embeddings().weight.grad)
    dense, sparse_grad = grads
    assert sparse_grad.layout == torch.strided and not model.get_input_embeddings().sparse
    torch.testing.assert_close(sparse_grad, dense, atol=1e-6, rtol=1e-5)
    torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True).step()

    with torch.no_grad(), sparse_tied_embedding(model) as on:
        assert not on
    model.get_input_embeddings().weight.requires_grad_(False)
    with sparse_tied_embedding(model) as on:
        assert not on
    untied = tiny_causal_lm(tokenizer)
    untied.lm_head.weight = torch.nn.Parameter(untied.lm_head.weight.detach().clone())
    with sparse_tied_embedding(untied) as on:
        assert not on and not untied.get_input_embeddings().sparse
