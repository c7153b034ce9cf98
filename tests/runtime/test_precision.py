"""bf16 autocast keeps the DPO loss and its gradients within a stated tolerance of fp32."""

import pytest
import torch


def _dpo_loss_and_grads(model, tokenizer, precision):
    from pofe.logprobs import build_batch, sequence_logprobs
    from pofe.losses import LOSSES
    from pofe.runtime.precision import autocast

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


@pytest.mark.slow
def test_online_loop_in_bf16_trains_fp32_weights_close_to_fp32(tmp_path, tiny_model_dir):
    """``train.precision=bf16`` through the whole loop (offline mode: the same pairs by
    construction): the loss of each step matches fp32 within bf16's tolerance, the saved
    weights stay fp32, and they moved."""
    import json

    from safetensors.torch import load_file

    from _online_utils import tiny_cfg
    from pofe.loops.online import run

    prefs = tmp_path / "prefs.jsonl"
    prefs.write_text("".join(json.dumps({"prompt": f"question {i}?", "chosen": "ok " * (i % 3 + 1),
                                         "rejected": "no, " * (i % 4 + 2)}) + "\n" for i in range(8)))
    losses, finals = {}, {}
    for prec in ("fp32", "bf16"):
        s = run(tiny_cfg(tmp_path / prec, tiny_model_dir, "mode=offline", f"data.preferences={prefs}",
                         "train.batch_size=4", "eval.enabled=false", f"train.precision={prec}"))
        losses[prec] = [json.loads(x)["loss"] for x in open(f"{s['run_dir']}/metrics.jsonl")]
        finals[prec] = load_file(f"{s['run_dir']}/final/model.safetensors")
    assert len(losses["bf16"]) == len(losses["fp32"]) == 2
    assert losses["bf16"] == pytest.approx(losses["fp32"], abs=2e-2)
    base = load_file(str(tiny_model_dir / "model.safetensors"))
    assert all(t.dtype == torch.float32 for t in finals["bf16"].values())
    assert max(float((finals["bf16"][k] - base[k]).abs().max()) for k in base) > 1e-5


def _first_losses_and_final(run_fn, precision):
    """Run a command's loop at ``precision``: its metrics rows' losses and its saved weights."""
    import json

    from safetensors.torch import load_file

    s = run_fn(precision)
    losses = [json.loads(x)["loss"] for x in open(f"{s['run_dir']}/metrics.jsonl")]
    return losses, load_file(f"{s['run_dir']}/final/model.safetensors")


@pytest.mark.slow
@pytest.mark.parametrize("command", ["sft", "rm", "rl"])
def test_sft_rm_rl_in_bf16_train_fp32_weights_close_to_fp32(tmp_path, tokenizer, tiny_model_dir, command):
    """``train.precision=bf16`` in pofe sft, rm and rl: the first step's loss (same data and, for
    rl, the same samples: generation runs outside autocast) matches fp32 within bf16's tolerance,
    the saved weights stay fp32, and training moved them."""
    import json

    from safetensors.torch import load_file

    from pofe.config import load_config

    def run_fn(prec):
        out = tmp_path / prec
        out.mkdir(exist_ok=True)
        common = [f"train.precision={prec}", f"run.output_dir={out}", "run.name=r", f"model.name={tiny_model_dir}",
                  "optim.warmup_steps=0", "log.progress=false", "log.tensorboard=false"]
        if command == "sft":
            from pofe.loops.sft import SFTConfig, run

            data = out / "sft.jsonl"
            data.write_text("".join(json.dumps({"prompt": f"Question {i}?", "response": "An answer " * (1 + i % 3)}) + "\n"
                                    for i in range(8)))
            return run(load_config(SFTConfig, None, common + [f"data.ift=[{data}]", "train.steps=3", "train.batch_size=2",
                                                               "train.grad_accum=1", "optim.lr=1e-2"]))
        if command == "rm":
            from pofe.loops.rm import RMConfig, run

            data = out / "prefs.jsonl"
            data.write_text("".join(json.dumps({"prompt": f"Question {i}?", "chosen": "Short.",
                                                "rejected": "A long and rambling answer " * 3, "p": 0.8}) + "\n" for i in range(8)))
            return run(load_config(RMConfig, None, common + [f"data.train=[{data}]", "data.eval_fraction=0.25",
                                                              "train.batch_size=3", "optim.lr=3e-3"]))
        from pofe.loops.rl import RLConfig, run

        prompts = out / "p.txt"
        prompts.write_text("".join(f"Tell me about topic {i}.\n" for i in range(6)))
        return run(load_config(RLConfig, None, common + [f"data.prompts={prompts}", "train.steps=2", "train.batch_size=2",
                                                          "train.group_size=2", "eval.num_prompts=0", "sampling.max_new_tokens=8",
                                                          "sampling.temperature=1.0", "reward.kind=programmatic",
                                                          "reward.unit=chars", "optim.lr=1e-2"]))

    l32, f32 = _first_losses_and_final(run_fn, "fp32")
    l16, f16 = _first_losses_and_final(run_fn, "bf16")
    assert len(l16) == len(l32) >= 2
    assert l32[0] != 0  # a loss that trains (rl: rewards differ within a group)
    assert l16[0] == pytest.approx(l32[0], abs=2e-2)
    assert all(t.dtype == torch.float32 for t in f16.values())
    base = load_file(str(tiny_model_dir / "model.safetensors"))
    shared = [k for k in base if k in f16]
    assert shared and max(float((f16[k] - base[k]).abs().max()) for k in shared) > 1e-5


def test_eager_attention_only_for_short_bf16_cpu_passes(tiny_model):
    """eager_attention_pays: bf16 on CPU with the attention weights inside the budget; never in
    fp32, on CUDA, past the budget, or when the model does not run SDPA (a user's own choice)."""
    from pofe.runtime.precision import EAGER_ATTENTION_BUDGET, eager_attention_pays

    assert tiny_model.config._attn_implementation == "sdpa"
    assert eager_attention_pays(tiny_model, "bf16", "cpu", 8, 100)
    assert not eager_attention_pays(tiny_model, "fp32", "cpu", 8, 100)
    assert not eager_attention_pays(tiny_model, "bf16", "cuda", 8, 100)
    c = tiny_model.config  # 2 layers x 4 heads x T^2 x 6 bytes per sequence
    per_seq = c.num_hidden_layers * c.num_attention_heads * 1000 * 1000 * 6
    assert eager_attention_pays(tiny_model, "bf16", "cpu", EAGER_ATTENTION_BUDGET // per_seq, 1000)
    assert not eager_attention_pays(tiny_model, "bf16", "cpu", EAGER_ATTENTION_BUDGET // per_seq + 1, 1000)
    tiny_model.set_attn_implementation("eager")
    assert not eager_attention_pays(tiny_model, "bf16", "cpu", 8, 100)


def test_bf16_dap_pass_on_cpu_runs_eager_attention_and_gives_sdpa_back(tiny_model, tokenizer, monkeypatch):
    """dap_backward in bf16 on CPU: every forward (reference and policy, the packed pass and its
    once-per-model check) runs eager attention; the models run SDPA again afterwards; the loss and
    gradient equal those of the SDPA packed pass (budget 0) within bf16 tolerance."""
    from pofe.losses import get_loss
    from pofe.runtime import Reference
    from pofe.runtime import precision
    from pofe.loops.online.dap import TokenPair, dap_backward

    enc = lambda t: tuple(tokenizer(t, add_special_tokens=False).input_ids)  # noqa: E731
    pairs = [TokenPair(enc("Tell me a fact."), enc(" Water boils at 100 C."), enc(" I do not know at all."), 1.0, "a"),
             TokenPair(enc("Name a colour, please."), enc(" Blue."), enc(" Colours are hard to name."), 0.8, "b")]
    seen: list[str] = []
    tiny_model.register_forward_pre_hook(lambda m, a: seen.append(m.config._attn_implementation))
    reference = Reference(tiny_model, lora=False)  # the deep copy keeps the hook
    with torch.no_grad():  # a reference apart from the policy, so the DPO loss is not at log 2
        for p in reference.module.parameters():
            p.add_(0.01 * torch.randn_like(p))

    def step():
        seen.clear()
        tiny_model.zero_grad()
        res = dap_backward(tiny_model, reference, pairs, loss_fn=get_loss("dpo"), beta=0.1, micro_batches=1,
                           normaliser=2, pad_token_id=tokenizer.pad_token_id, device="cpu", precision="bf16")
        grads = torch.cat([p.grad.flatten() for p in tiny_model.parameters() if p.grad is not None])
        return [ps.loss for ps in res.pairs], grads, list(seen)

    loss_e, g_e, seen_e = step()
    monkeypatch.setattr(precision, "EAGER_ATTENTION_BUDGET", 0)
    loss_s, g_s, seen_s = step()
    assert seen_e == ["eager"] * 6  # per model: the packing check (packed, joint), then the packed pass
    assert seen_s == ["sdpa"] * 2  # packed pass: one forward each, reference then policy
    assert tiny_model.config._attn_implementation == reference.module.config._attn_implementation == "sdpa"
    assert loss_e == pytest.approx(loss_s, abs=1e-2)
    assert torch.nn.functional.cosine_similarity(g_e, g_s, dim=0) > 0.999
    assert abs(g_e.norm() / g_s.norm() - 1) < 0.05


def test_reference_linear_weights_in_bf16_are_bit_identical_under_autocast(tiny_model, tokenizer):
    """Reference.linear_weights_to(bf16): the reference pass under bf16 autocast gives exactly the
    same log-probs as with fp32 weights (autocast rounds them the same way at every call);
    embeddings, norms and a LM head tied to the embedding stay fp32."""
    from pofe.runtime import Reference
    from pofe.loops.online.dap import TokenPair, pair_logps
    from pofe.runtime.precision import autocast

    enc = lambda t: tuple(tokenizer(t, add_special_tokens=False).input_ids)  # noqa: E731
    pairs = [TokenPair(enc("Tell me a fact."), enc(" Water boils at 100 C."), enc(" No idea.")),
             TokenPair(enc("Name a colour, please."), enc(" Blue."), enc(" Colours are hard to name."))]
    tiny_model.tie_weights()
    reference = Reference(tiny_model, lora=False)

    def ref_logps(shared):
        with reference.model() as m, autocast("bf16", "cpu"):
            return pair_logps(m, pairs, tokenizer.pad_token_id, "cpu", shared=shared)

    before = [ref_logps(s) for s in (False, True)]
    n_linear = sum(isinstance(m, torch.nn.Linear) for m in reference.module.modules())
    tied = reference.module.get_output_embeddings().weight is reference.module.get_input_embeddings().weight
    assert reference.linear_weights_to(torch.bfloat16) == n_linear - tied  # weights only: the tiny Llama has no biases
    after = [ref_logps(s) for s in (False, True)]
    assert all(torch.equal(a, b) for a, b in zip(before, after))
    assert reference.module.get_input_embeddings().weight.dtype == torch.float32
    assert reference.module.model.layers[0].self_attn.q_proj.weight.dtype == torch.bfloat16
    assert all(p.dtype == torch.float32 for p in tiny_model.parameters())  # the policy is untouched
    with pytest.raises(ValueError, match="LoRA"):
        Reference(tiny_model, lora=True).linear_weights_to(torch.bfloat16)
