"""``pofe sft``: response-only loss, cosine schedule, LoRA, resume, data formats, CLI."""

from __future__ import annotations

import json
import math

import pytest
import torch

from pofe.data.prompts import DataError
from pofe.logprobs import completion_logprobs
from pofe.loops import sft as sft_mod
from pofe.data.sft import SFTExample, load_sft_data, to_example
from pofe.loops.sft import SFTConfig, SFTDataConfig
from pofe.loops.sft.step import batch_indices, response_nll, tokenize_examples
from pofe.models import tiny_causal_lm
from pofe.runs import read_jsonl

EXAMPLES = [
    SFTExample("What is 2 + 2?", "4"),
    SFTExample("Name a colour.", "Blue."),
    SFTExample("Say hello.", "Hello!"),
    SFTExample("Capital of France?", "Paris."),
]


def _cfg(tmp_path, **kw):
    base = dict(optim={"lr": 1e-2, "warmup_steps": 0, "schedule": "cosine", "min_lr_ratio": 0.1},
                train={"batch_size": 1, "grad_accum": 2, "steps": kw.pop("steps", 6)},
                checkpoint={"every": kw.pop("checkpoint_every", 0)},
                log={"progress": False, "tensorboard": False}, run={"output_dir": str(tmp_path)})
    base.update(kw)
    return SFTConfig.model_validate(base)


def test_loss_is_on_response_tokens_only(tokenizer, tiny_model):
    toks, _ = tokenize_examples(tokenizer, EXAMPLES[:2], 512)
    nll, n = response_nll(tiny_model, toks, tokenizer.pad_token_id)
    # Response tokens = the response's ids + EOS; the prompt is masked.
    assert n == sum(len(t.response_ids) for t in toks)
    assert toks[0].response_ids[-1] == tokenizer.eos_token_id
    ref = completion_logprobs(tiny_model, [t.prompt_ids for t in toks], [t.response_ids for t in toks],
                              pad_token_id=tokenizer.pad_token_id)
    assert float(nll.detach()) == pytest.approx(-float(ref.sum()), rel=1e-5)
    # Changing the prompt's *content* changes nothing about which tokens count.
    toks2, _ = tokenize_examples(tokenizer, [SFTExample("A much longer prompt " * 5, "4")], 512)
    assert response_nll(tiny_model, toks2, tokenizer.pad_token_id)[1] == len(toks[0].response_ids)


def test_too_long_and_empty_are_dropped_and_counted(tokenizer):
    toks, dropped = tokenize_examples(tokenizer, [SFTExample("x " * 400, "y"), SFTExample("q", "  "), EXAMPLES[0]], 64)
    assert len(toks) == 1 and dropped == {"too_long": 1, "empty_response": 1}


def test_batch_indices_are_epoch_permutations():
    seen = batch_indices(0, 2, 4, 0) + batch_indices(1, 2, 4, 0)
    assert sorted(seen) == [0, 1, 2, 3]  # one epoch = each example once
    assert sorted(batch_indices(2, 2, 4, 0) + batch_indices(3, 2, 4, 0)) == [0, 1, 2, 3]  # epoch 2
    assert batch_indices(5, 3, 4, 7) == batch_indices(5, 3, 4, 7)


@pytest.mark.slow
def test_sft_trains_with_cosine_schedule(tmp_path, tokenizer, tiny_model):
    cfg = _cfg(tmp_path, steps=8)
    out = sft_mod.run(cfg, model=tiny_model, tokenizer=tokenizer, examples=EXAMPLES * 2)
    assert out["loss_last"] < out["loss_first"]
    rows = read_jsonl(f"{out['run_dir']}/metrics.jsonl")
    lrs = [r["learning_rate"] for r in rows]
    # lr at step s (0-based): 1e-2 * (0.1 + 0.9 * 0.5 * (1 + cos(pi * s / 8)))
    expect = [1e-2 * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * s / 8))) for s in range(8)]
    assert lrs == pytest.approx(expect)
    assert (tmp_path / out["run_dir"].split("/")[-1] / "final" / "config.json").exists()
    assert json.loads((tmp_path / out["run_dir"].split("/")[-1] / "summary.json").read_text())["steps"] == 8


@pytest.mark.slow
def test_sft_resume_matches_uninterrupted(tmp_path, tokenizer, monkeypatch):
    ex = EXAMPLES * 2
    ref = sft_mod.run(_cfg(tmp_path / "a"), model=tiny_causal_lm(tokenizer), tokenizer=tokenizer, examples=ex)

    class Crash(RuntimeError):
        pass

    def crash(*a, **k):
        raise Crash()

    import pofe.runtime.checkpoints as ckpts

    monkeypatch.setattr(ckpts, "prune_checkpoints", crash)  # the driver prunes right after the step-3 checkpoint
    run_dir = tmp_path / "b" / "run"
    with pytest.raises(Crash):
        sft_mod.run(_cfg(tmp_path / "b", checkpoint_every=3), model=tiny_causal_lm(tokenizer), tokenizer=tokenizer,
                    examples=ex, run_dir=run_dir)
    monkeypatch.undo()
    assert (run_dir / "checkpoints" / "step-3").is_dir()
    out = sft_mod.run(_cfg(tmp_path / "b", checkpoint_every=3), model=tiny_causal_lm(tokenizer), tokenizer=tokenizer,
                      examples=ex, run_dir=run_dir)
    assert out["resumed_from"] == 3
    assert [r["step"] for r in read_jsonl(run_dir / "metrics.jsonl")] == [1, 2, 3, 4, 5, 6]
    from safetensors.torch import load_file

    a = load_file(f"{ref['final_model']}/model.safetensors")
    b = load_file(f"{out['final_model']}/model.safetensors")
    assert set(a) == set(b)
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-6)
    # A finished run is not trained again.
    assert sft_mod.run(_cfg(tmp_path / "b"), model=tiny_causal_lm(tokenizer), tokenizer=tokenizer, examples=ex,
                       run_dir=run_dir)["already_done"] is True


@pytest.mark.slow
def test_resume_of_a_finished_run_trains_nothing(tmp_path, tokenizer, tiny_model):
    """``--resume`` of a finished run loads its last-step checkpoint and trains no step: the
    checkpoints outlive ``final/`` (deleting them once it was saved made the resume start again
    from step 0, moving every metrics row aside)."""
    cfg = _cfg(tmp_path, steps=3)
    first = sft_mod.run(cfg, model=tiny_model, tokenizer=tokenizer, examples=EXAMPLES)
    run_dir = tmp_path / first["run_dir"].split("/")[-1]
    rows = read_jsonl(run_dir / "metrics.jsonl")
    weights = (run_dir / "final" / "model.safetensors").read_bytes()
    again = sft_mod.run(cfg, resume=run_dir, model=tiny_causal_lm(tokenizer), tokenizer=tokenizer, examples=EXAMPLES)
    assert again["resumed_from"] == 3 and again["steps_run"] == 0 and again["steps"] == 3
    assert read_jsonl(run_dir / "metrics.jsonl") == rows and not list(run_dir.glob("*after-crash*"))
    assert (run_dir / "final" / "model.safetensors").read_bytes() == weights
    assert again["loss_first"] == first["loss_first"] and again["loss_last"] == first["loss_last"]


@pytest.mark.slow
def test_sft_lora_only_trains_adapter(tmp_path, tokenizer, tiny_model):
    cfg = _cfg(tmp_path, model={"lora": {"enabled": True, "r": 4, "alpha": 8}}, steps=3)
    before = {k: v.clone() for k, v in tiny_model.state_dict().items()}
    out = sft_mod.run(cfg, model=tiny_model, tokenizer=tokenizer, examples=EXAMPLES)
    assert (tmp_path / out["run_dir"].split("/")[-1] / "final" / "adapter").is_dir()
    base_names = [k for k in before if "embed" in k]
    assert base_names  # the base embedding was frozen under LoRA
    sd = tiny_model.get_base_model().state_dict() if hasattr(tiny_model, "get_base_model") else tiny_model.state_dict()
    for k in base_names:
        torch.testing.assert_close(sd[k], before[k])


def test_data_formats(tmp_path):
    assert to_example({"prompt": "p", "response": "r"}, "f:1") == SFTExample("p", "r")
    assert to_example({"instruction": "Add", "input": "1 2", "output": "3"}, "f:1").prompt == "Add\n\n1 2"
    si = {"instruction": "Sort", "instances": [{"input": "b a", "output": "a b"}], "is_classification": False}
    assert to_example(si, "f:1") == SFTExample("Sort\n\nb a", "a b")
    msgs = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
    assert to_example(msgs, "f:1").response == "hello"
    with pytest.raises(DataError, match="f:3"):
        to_example({"prompt": "p"}, "f:3")
    ift = tmp_path / "ift.jsonl"
    eft = tmp_path / "eft.jsonl"
    ift.write_text("".join(json.dumps({"prompt": f"p{i}", "response": "r"}) + "\n" for i in range(4)))
    eft.write_text("".join(json.dumps({"prompt": f"judge {i}", "response": "ok\nScore: 4"}) + "\n" for i in range(5)))
    ex, stats = load_sft_data(SFTDataConfig(ift=[str(ift)], eft=[str(eft)], eft_max_ratio=0.5))
    assert stats == {"ift": 4, "eft": 5, "eft_capped": 3}
    assert sum(e.source == "eft" for e in ex) == 2
    with pytest.raises(DataError, match="not found"):
        load_sft_data(SFTDataConfig(ift=[str(tmp_path / "missing.jsonl")]))


def test_cli_sft(tmp_path, tiny_model_dir):
    from typer.testing import CliRunner

    from pofe.cli.main import app

    ift = tmp_path / "ift.jsonl"
    ift.write_text("".join(json.dumps({"prompt": f"Question {i}?", "response": f"Answer {i}."}) + "\n" for i in range(4)))
    r = CliRunner().invoke(app, ["sft", "--ift", str(ift), "--model", str(tiny_model_dir), "--steps", "2",
                                 "--output-dir", str(tmp_path / "runs"), "--set", "train.batch_size=2",
                                 "--set", "train.grad_accum=1", "--set", "log.progress=false", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout[r.stdout.index("{"):])
    assert out["steps"] == 2 and out["examples"] == 4 and out["examples_per_step"] == 2
    assert (tmp_path / "runs" / out["run_dir"].split("/")[-1] / "final" / "config.json").exists()


@pytest.mark.slow
def test_cli_sft_resume_keeps_the_runs_own_config(tmp_path, tiny_model_dir):
    """``pofe sft --resume RUN`` without --config must not overwrite the run's config.yaml
    with defaults (the run would then fail: no data). The run's own config is the truth."""
    from typer.testing import CliRunner

    from pofe.cli.main import app

    ift = tmp_path / "ift.jsonl"
    ift.write_text("".join(json.dumps({"prompt": f"Question {i}?", "response": f"Answer {i}."}) + "\n" for i in range(4)))
    args = ["sft", "--ift", str(ift), "--model", str(tiny_model_dir), "--steps", "3", "--output-dir",
            str(tmp_path / "runs"), "--set", "train.batch_size=2", "--set", "train.grad_accum=1",
            "--set", "checkpoint.every=1", "--set", "log.progress=false", "--json"]
    first = CliRunner().invoke(app, args)
    assert first.exit_code == 0, first.output
    run_dir = tmp_path / "runs" / json.loads(first.stdout[first.stdout.index("{"):])["run_dir"].split("/")[-1]
    saved = (run_dir / "config.yaml").read_text()
    # simulate a crash after step 2: the final model, the summary and step 3's checkpoint are not there yet
    import shutil

    shutil.rmtree(run_dir / "final")
    (run_dir / "summary.json").unlink()
    shutil.rmtree(run_dir / "checkpoints")  # step 2's is planted below
    from pofe.config import load_config
    from pofe.loops.sft import SFTConfig
    from pofe.runtime import make_optimizer, make_scheduler, save_checkpoint

    model, _ = __import__("pofe.models", fromlist=["load_model"]).load_model(str(tiny_model_dir))
    optim = load_config(SFTConfig, run_dir / "config.yaml").optim
    opt = make_optimizer(model, optim)  # a resume restores the optimiser too: a checkpoint without it is refused
    save_checkpoint(run_dir / "checkpoints" / "step-2", model=model, optimizer=opt,
                    scheduler=make_scheduler(opt, optim, 3), step=2)
    r = CliRunner().invoke(app, ["sft", "--resume", str(run_dir), "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout[r.stdout.index("{"):])
    assert (run_dir / "config.yaml").read_text() == saved
    assert out["resumed_from"] == 2 and out["steps"] == 3 and out["examples"] == 4
    assert [row["step"] for row in read_jsonl(run_dir / "metrics.jsonl")] == [1, 2, 3]
    assert (run_dir / "final" / "config.json").exists()
    # settings cannot change on resume: exit 2 naming the refused option
    r2 = CliRunner().invoke(app, ["sft", "--resume", str(run_dir), "--steps", "5"])
    assert r2.exit_code == 2 and "refused" in r2.output
    bad = CliRunner().invoke(app, ["sft", "--set", "optim.lrr=1"])
    assert bad.exit_code == 2 and "optim.lrr" in bad.output


@pytest.mark.parametrize("key,value", [("train.steps", "0"), ("train.batch_size", "0"), ("train.grad_accum", "0"),
                                       ("train.epochs", "0"), ("data.max_length", "0"), ("checkpoint.every", "-1"),
                                       ("data.limit", "0")])
def test_nonsense_hyperparameters_are_refused_at_parse_time(key, value):
    from pofe.config import ConfigError, load_config

    with pytest.raises(ConfigError) as e:
        load_config(SFTConfig, None, [f"{key}={value}"])
    assert key in str(e.value)


def test_example_configs_validate():
    from pathlib import Path

    from pofe.config import load_config

    root = Path(__file__).resolve().parents[2] / "examples"
    for name in ("sft-ift.yaml", "sft-ift-eft.yaml"):
        cfg = load_config(SFTConfig, root / name)
        assert cfg.train.batch_size * cfg.train.grad_accum == 16  # the paper's batch
