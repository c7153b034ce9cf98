"""Invariants of the ``pofe online`` update (TRL ``tests/invariant`` style):

* gradient accumulation: batch 8 x accumulation 1 == batch 1 x accumulation 8 (loss and
  gradients within 1e-5, same pairs);
* exact resume of the iterative label buffer (SIGKILL then resume of every command, online
  included, is ``tests/invariants/test_resume.py``);
* data parallel: 2 CPU processes (torchrun, gloo) keep identical weights.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from _online_utils import tiny_cfg
from pofe.loops.online.dap import TokenPair, dap_backward
from pofe.losses import LOSSES, default_beta
from pofe.runs import read_jsonl
from pofe.runtime import Reference

REPO = Path(__file__).resolve().parents[2]


# Tiny models run much faster single-threaded (shared fixture in conftest.py).

def _pairs(n=8):
    g = torch.Generator().manual_seed(0)
    out = []
    for i in range(n):  # different prompt / response lengths so micro-batches pad differently
        r = lambda k: tuple(int(x) for x in torch.randint(10, 5000, (k,), generator=g))  # noqa: E731
        out.append(TokenPair(r(3 + i % 4), r(2 + i % 5) + (2,), r(1 + (i * 3) % 6) + (2,), p=[1.0, 0.8, 0.6][i % 3],
                             pair_id=str(i)))
    return out


@pytest.mark.parametrize("loss", ["dpo", "ipo", "slic"])
def test_grad_accumulation_equivalence(tokenizer, loss):
    from pofe.models import tiny_causal_lm

    results = []
    for micro in (1, 8, 3):  # batch 8 x accum 1, batch 1 x accum 8, and an uneven split
        # float64 isolates the invariant (the loss normalisation over micro-batches) from fp32
        # summation-order noise; the fp32 end-to-end version is the next test
        model = tiny_causal_lm(tokenizer, seed=0).double()
        # a policy that differs from the reference, so margins (and IPO/SLiC gradients) are not trivial
        with torch.no_grad():
            ref = Reference(model, lora=False)
            for p in model.parameters():
                p.add_(0.01 * torch.randn_like(p, generator=torch.Generator().manual_seed(1)))
        res = dap_backward(model, ref, _pairs(), loss_fn=LOSSES[loss], beta=default_beta(loss),  # paper betas
                           micro_batches=micro, normaliser=8, pad_token_id=2)
        grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        results.append((sum(ps.loss for ps in res.pairs) / 8, grads, [ps.pair_id for ps in res.pairs]))
    (l1, g1, ids1) = results[0]
    for lk, gk, idsk in results[1:]:
        assert idsk == ids1
        assert abs(lk - l1) < 1e-5
        for n in g1:
            torch.testing.assert_close(gk[n], g1[n], atol=1e-5, rtol=0)
    assert any(float(g.abs().max()) > 1e-4 for g in g1.values())  # the test is not vacuous


@pytest.mark.slow
def test_grad_accumulation_equivalence_through_the_loop(tmp_path, tiny_model_dir):
    """The whole loop in offline mode (same pairs by construction): batch 8 x accum 1 vs
    batch 1 x accum 8 end in the same weights after two AdamW steps."""
    from safetensors.torch import load_file

    prefs = tmp_path / "prefs.jsonl"
    prefs.write_text("".join(json.dumps({"prompt": f"question {i}?", "chosen": "ok " * (i % 3 + 1),
                                         "rejected": "no, " * (i % 4 + 2)}) + "\n" for i in range(16)))
    finals = []
    for bs, acc in ((8, 1), (1, 8)):
        s = __import__("pofe.loops.online", fromlist=["run"]).run(tiny_cfg(
            tmp_path / f"{bs}x{acc}", tiny_model_dir, "mode=offline", f"data.preferences={prefs}",
            f"train.batch_size={bs}", f"train.grad_accum={acc}", "eval.enabled=false", "optim.lr=1e-4"))
        finals.append(load_file(f"{s['run_dir']}/final/model.safetensors"))
        assert s["trained_pairs"] == 16
    base = load_file(str(tiny_model_dir / "model.safetensors"))
    moved = 0.0
    for k in finals[0]:
        torch.testing.assert_close(finals[1][k], finals[0][k], atol=1e-5, rtol=0)
        moved = max(moved, float((finals[0][k] - base[k]).abs().max()))
    assert moved > 1e-5


def _ledger_rows(run_dir):
    # timing fields differ between runs by nature; everything else must match
    return [{k: v for k, v in r.items() if k not in ("latency_s",)} for r in read_jsonl(Path(run_dir) / "ledger.jsonl")]


# ------------------------------------------------------------------ data parallel

@pytest.mark.slow
def test_two_cpu_processes_keep_identical_weights(tmp_path, tiny_model_dir):
    """``torchrun --nproc_per_node 2`` on CPU/gloo (``Accelerator(cpu=True)``): each process
    samples and labels its own prompts, gradients are all-reduced, weights stay identical."""
    sets = [f"model.name={tiny_model_dir}", "judge.kind=length", "train.steps=3", "train.batch_size=2",
            "sampling.max_new_tokens=6", "optim.lr=1e-3", "optim.warmup_steps=0", f"run.output_dir={tmp_path}",
            "run.name=mp", "eval.num_prompts=2", "eval.sampling.max_new_tokens=6", "log.progress=false",
            "log.tensorboard=false", "model.device=cpu", "checkpoint.every=2"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                          "-m", "pofe.cli.main", "online", "--json", *[a for x in sets for a in ("--set", x)]],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads(out.stdout[out.stdout.index("{"):])
    assert summary["processes"] == 2 and summary["steps"] == 3
    assert summary["weights_identical_across_processes"] is True
    ledger = read_jsonl(tmp_path / "mp" / "ledger.jsonl")
    ann = [r for r in ledger if r["kind"] == "annotation"]
    assert {r["rank"] for r in ann} == {0, 1} and len(ann) == 3 * 2 * 2  # each process labels its own prompts
    assert len({(r["step"], r["prompt"]) for r in ann}) == len(ann)  # ... different prompts
    from safetensors.torch import load_file

    base, final = load_file(str(tiny_model_dir / "model.safetensors")), load_file(str(tmp_path / "mp" / "final" / "model.safetensors"))
    assert any(not torch.equal(base[k], final[k]) for k in base)


def test_completion_logps_matches_the_full_vocabulary_reference(tokenizer, tiny_model):
    """The logits_to_keep shortcut gives the same log-probs as pofe.logprobs (all positions)."""
    from pofe.logprobs import completion_logprobs
    from pofe.loops.online.dap import completion_logps, pairs_batch

    pairs = _pairs(5)
    batch, width = pairs_batch(pairs, 2, "cpu")
    fast = completion_logps(tiny_model, batch, width)
    slow = completion_logprobs(tiny_model, [p.prompt_ids for p in pairs] * 2,
                               [p.chosen_ids for p in pairs] + [p.rejected_ids for p in pairs], pad_token_id=2)
    torch.testing.assert_close(fast, slow, atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_packed_pass_equals_the_joint_batch(tokenizer, precision, attention):
    """Each pair's prompt and both responses in one row (rejected masked from chosen) gives the
    joint batch's log-probs and the same gradient, with each attention's own mask type; also when
    every response is one token long and with gradient checkpointing."""
    from pofe.models import tiny_causal_lm
    from pofe.loops.online.dap import TokenPair, completion_logps, packed_pair_logps, pairs_batch
    from pofe.runtime.precision import autocast

    model = tiny_causal_lm(tokenizer)
    model.set_attn_implementation(attention)
    tol = dict(atol=1e-4, rtol=1e-5) if precision == "fp32" else dict(atol=0.15, rtol=0.02)  # bf16: per-sum rounding
    for pairs in (_pairs(5), [TokenPair((5, 6, 7), (9,), (11,)), TokenPair((8,), (12,), (13,))], "checkpointing"):
        if pairs == "checkpointing":
            model.gradient_checkpointing_enable()
            model.train()
            pairs = _pairs(3)
        grads = []
        for packed in (True, False):
            model.zero_grad()
            with autocast(precision, "cpu"):
                if packed:
                    lp = packed_pair_logps(model, pairs, 2, "cpu")
                else:
                    lp = completion_logps(model, *pairs_batch(pairs, 2, "cpu"))
            (lp * torch.linspace(-1, 1, len(lp))).sum().backward()  # distinct weight per response
            grads.append(([p.grad.clone() for p in model.parameters()], lp.detach()))
        (g_packed, lp_packed), (g_joint, lp_joint) = grads
        torch.testing.assert_close(lp_packed, lp_joint, **tol)
        for a, b in zip(g_packed, g_joint):
            torch.testing.assert_close(a, b, atol=1e-4 if precision == "fp32" else 5e-2, rtol=1e-3 if precision == "fp32" else 0.1)


def test_packed_pass_hand_built_row_and_mask():
    """The packed layout for one pair, by hand: prompt (5, 6) left-padded to the other pair's 3 tokens,
    chosen[:-1] then rejected[:-1] each padded to its longest; the rejected tokens see the prompt and
    themselves, never the chosen ones, at the positions they have in their own sequence."""
    from pofe.loops.online.dap import TokenPair, _pack, _pair_mask

    layout = _pack([TokenPair((5, 6), (7, 8, 9), (10, 11)), TokenPair((1, 2, 3), (4,), (12, 13, 14))], pad_token_id=0)
    assert layout.input_ids.tolist() == [[0, 5, 6, 7, 8, 10, 0], [1, 2, 3, 0, 0, 12, 13]]
    assert layout.position_ids.tolist() == [[0, 0, 1, 2, 3, 2, 0], [0, 1, 2, 0, 0, 3, 4]]
    # logits of the last 1 + 2 + 2 columns: column 0 predicts chosen[0] (and rejected[0], first_rejected)
    assert layout.targets.tolist() == [[7, 8, 9, 11, 0], [4, 0, 0, 13, 14]]
    assert layout.counts.tolist() == [[1, 1, 1, 1, 0], [1, 0, 0, 1, 1]]
    assert layout.first_rejected.tolist() == [10, 12]
    seen = _pair_mask(layout.segment, boolean=True, dtype=torch.float32)[0, 0].int().tolist()
    assert seen == [[1, 0, 0, 0, 0, 0, 0],  # padding: itself only
                    [0, 1, 0, 0, 0, 0, 0],
                    [0, 1, 1, 0, 0, 0, 0],
                    [0, 1, 1, 1, 0, 0, 0],  # chosen: prompt and chosen so far
                    [0, 1, 1, 1, 1, 0, 0],
                    [0, 1, 1, 0, 0, 1, 0],  # rejected: prompt and itself, not the chosen tokens
                    [0, 0, 0, 0, 0, 0, 1]]
    additive = _pair_mask(layout.segment, boolean=False, dtype=torch.bfloat16)
    assert additive.dtype == torch.bfloat16 and additive[0, 0, 5, 3] == torch.finfo(torch.bfloat16).min
    assert additive[0, 0, 5, 2] == 0


def test_pair_logps_falls_back_to_the_joint_batch_when_the_model_cannot_pack(tokenizer, monkeypatch):
    """A mask over the budget, a sliding window shorter than the packed row, and a forward that does
    not honour the custom mask (found by the once-per-model check) each give None; pair_logps then
    gives the joint batch's numbers."""
    from pofe.models import tiny_causal_lm
    from pofe.loops.online import dap
    from pofe.loops.online.dap import completion_logps, packed_pair_logps, pair_logps, pairs_batch

    pairs = _pairs(3)
    model = tiny_causal_lm(tokenizer)
    assert packed_pair_logps(model, pairs, 2, "cpu") is not None
    monkeypatch.setattr(dap, "PACKED_MASK_BUDGET", 3 * 4 * 4)  # (3, 1, L, L) with L > 2 is over it
    assert packed_pair_logps(model, pairs, 2, "cpu") is None
    monkeypatch.undo()
    windowed = tiny_causal_lm(tokenizer)
    windowed.config.sliding_window = 4
    assert packed_pair_logps(windowed, pairs, 2, "cpu") is None
    torch.testing.assert_close(pair_logps(windowed, pairs, 2, "cpu"), completion_logps(windowed, *pairs_batch(pairs, 2, "cpu")))

    deaf = tiny_causal_lm(tokenizer)
    forward = deaf.forward

    def plain_causal(*args, attention_mask=None, **kwargs):  # drops a 4D mask: rejected would see chosen
        return forward(*args, attention_mask=None if attention_mask is not None and attention_mask.dim() == 4
                       else attention_mask, **kwargs)

    deaf.forward = plain_causal
    assert packed_pair_logps(deaf, pairs, 2, "cpu") is None
    torch.testing.assert_close(pair_logps(deaf, pairs, 2, "cpu"), completion_logps(deaf, *pairs_batch(pairs, 2, "cpu")))


@pytest.mark.slow
def test_iterative_resume_restores_the_label_buffer(tmp_path, tiny_model_dir):
    """mode=iterative, K=2: a run stopped after step 3 holds step 4's pairs (labelled at step
    3) in its checkpoint; resuming to step 4 trains on exactly those and ends bit-identical."""
    from safetensors.torch import load_file

    from pofe.loops.online import run

    sets = ("mode=iterative", "train.iterative_every=2", "eval.enabled=false", "loss.labels=soft", "judge.temperature=20")
    full = run(tiny_cfg(tmp_path, tiny_model_dir, *sets, "train.steps=4", "run.name=full"))
    part = run(tiny_cfg(tmp_path, tiny_model_dir, *sets, "train.steps=3", "run.name=part"))
    resumed = run(tiny_cfg(tmp_path, tiny_model_dir, *sets, "train.steps=4", "run.name=part"), resume=part["run_dir"])
    assert resumed["resumed_from"] == 3
    a, b = load_file(f"{full['run_dir']}/final/model.safetensors"), load_file(f"{resumed['run_dir']}/final/model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert _ledger_rows(full["run_dir"]) == _ledger_rows(resumed["run_dir"])


def test_packed_pass_mask_in_the_autocast_dtype_changes_no_bit(tokenizer, monkeypatch):
    """bf16 autocast, eager attention: the packed pass's mask in bf16 gives the log-probs and the
    gradient that an fp32 mask (transformers' own choice under autocast) gives, bit for bit."""
    from pofe.models import tiny_causal_lm
    from pofe.loops.online import dap
    from pofe.runtime.activations import lean_activations
    from pofe.runtime.precision import autocast

    model = tiny_causal_lm(tokenizer)
    model.set_attn_implementation("eager")
    model.train()
    pairs = _pairs(4)
    own = dap._pair_mask
    results = []
    for dtype in (None, torch.float32):
        monkeypatch.setattr(dap, "_pair_mask", lambda seg, boolean, d, force=dtype: own(seg, boolean, force or d))
        model.zero_grad()
        with autocast("bf16", "cpu"), lean_activations(model):
            lp = dap.packed_pair_logps(model, pairs, 2, "cpu")
        (lp * torch.linspace(-1, 1, len(lp))).sum().backward()
        results.append((lp.detach(), [p.grad.clone() for p in model.parameters()]))
    (lp_a, g_a), (lp_b, g_b) = results
    assert torch.equal(lp_a, lp_b)
    assert all(torch.equal(a, b) for a, b in zip(g_a, g_b))
