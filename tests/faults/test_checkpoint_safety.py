"""No code from a run folder, no torn final model, no NaN checkpoint."""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch

from _online_utils import tiny_cfg

pytestmark = [pytest.mark.faults]


class _Payload:
    """Unpickling this runs ``os.system`` (what a hostile run folder would plant)."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _run(cfg, **kw):
    from pofe.loops.online import run

    return run(cfg, **kw)


@pytest.mark.slow
def test_planted_pickle_in_a_checkpoint_is_not_executed_on_resume(tmp_path, tiny_model_dir):
    """Regression (defect 9): on main ``load_checkpoint`` did ``torch.load(trainer_state.pt,
    weights_only=False)`` and ran the planted payload."""
    cfg = tiny_cfg(tmp_path, tiny_model_dir, "run.name=r", "eval.enabled=false")
    summary = _run(cfg)
    ckpt = tmp_path / "r" / "checkpoints" / "step-2"
    assert ckpt.is_dir(), summary
    marker = tmp_path / "PWNED"
    torch.save({"step": 2, "x": _Payload(marker)}, ckpt / "trainer_state.pt")
    try:
        result = _run(cfg.model_copy(update={"train": cfg.train.model_copy(update={"steps": 3})}), resume=tmp_path / "r")
    except Exception as e:  # noqa: BLE001 - main crashes after running the payload; judged below
        result = e
    assert not marker.exists(), "the planted pickle was executed"
    assert isinstance(result, dict) and result["resumed_from"] == 2  # resumed from the safe files


@pytest.mark.slow
def test_checkpoint_in_the_old_pickled_format_is_refused_not_read(tmp_path, tiny_model_dir):
    from pofe.runtime import CheckpointError

    cfg = tiny_cfg(tmp_path, tiny_model_dir, "run.name=r", "eval.enabled=false")
    _run(cfg)
    ckpt = tmp_path / "r" / "checkpoints" / "step-2"
    for f in ("trainer_state.json", "trainer_state.safetensors"):
        (ckpt / f).unlink()
    marker = tmp_path / "PWNED"
    torch.save({"x": _Payload(marker)}, ckpt / "trainer_state.pt")
    with pytest.raises(CheckpointError, match="pickled trainer_state.pt .* refused"):
        _run(cfg, resume=tmp_path / "r")
    assert not marker.exists()


def test_no_pickle_loading_anywhere_in_pofe():
    """Acceptance: ``grep -rn "weights_only=False\\|pickle.load" pofe/`` finds nothing."""
    from pathlib import Path

    import pofe

    root = Path(pofe.__file__).parent
    hits = [f"{p}:{i}" for p in root.rglob("*.py") for i, line in enumerate(p.read_text().splitlines(), 1)
            if "weights_only=False" in line or "pickle.load" in line]
    assert hits == []


@pytest.mark.slow
def test_torn_final_is_detected_and_rewritten_on_resume(tmp_path, tiny_model_dir):
    """Regression (defect 6): a torn ``final/`` was never repaired and ``--resume`` exited 0
    leaving unloadable weights."""
    from safetensors.torch import load_file

    cfg = tiny_cfg(tmp_path, tiny_model_dir, "run.name=r", "eval.enabled=false")
    _run(cfg)
    weights = tmp_path / "r" / "final" / "model.safetensors"
    good = {k: v.clone() for k, v in load_file(str(weights)).items()}  # (a mmap of a file about to be cut)
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])  # a crash mid-write, as the old save_final allowed
    _run(cfg, resume=tmp_path / "r")
    again = load_file(str(weights))
    assert again.keys() == good.keys() and all(torch.equal(again[k], good[k]) for k in good)


def test_final_marker_detects_truncation_and_missing_files(tmp_path, tiny_model, tokenizer):
    from pofe.runtime import final_complete, save_final

    out = save_final(tiny_model, tokenizer, tmp_path / "final")
    assert final_complete(out) and not list(tmp_path.glob(".final-*"))  # no temporary left behind
    (out / "tokenizer.json").write_text("{}")
    assert not final_complete(out)
    save_final(tiny_model, tokenizer, out)  # replacing an existing final/ is atomic too
    assert final_complete(out)
    (out / "config.json").unlink()
    assert not final_complete(out) and not final_complete(tmp_path / "none")


def test_non_finite_loss_stops_before_the_step_and_the_checkpoint(tmp_path, tiny_model_dir, monkeypatch):
    """A NaN loss at step 2 must stop the run naming step 2 and a pair; the last checkpoint on
    disk is step 1's (finite), and no step-2 checkpoint or final model exists."""
    import pofe.loops.online as online
    from pofe.losses import get_loss
    from pofe.runtime import NonFiniteLoss

    real = get_loss("dpo")
    calls = {"n": 0}

    def nan_at_step_2(*a, **k):
        calls["n"] += 1
        out = real(*a, **k)
        if calls["n"] >= 2:  # one micro-batch per step here: call 2 is step 2
            out = dataclasses.replace(out, losses=out.losses * float("nan"))
        return out

    monkeypatch.setattr(online, "get_loss", lambda name: nan_at_step_2)
    cfg = tiny_cfg(tmp_path, tiny_model_dir, "run.name=r", "eval.enabled=false", "checkpoint.every=1", "train.steps=3")
    with pytest.raises(NonFiniteLoss, match=r"at step 2 on pair \S+"):
        _run(cfg)
    ckpts = sorted(p.name for p in (tmp_path / "r" / "checkpoints").iterdir())
    assert ckpts == ["step-1"] and not (tmp_path / "r" / "final").exists()


def test_check_finite():
    from pofe.runtime import NonFiniteLoss, check_finite

    check_finite(0.5, step=1)
    check_finite(torch.tensor([0.1, 2.0]), step=1)
    for bad in (float("nan"), float("inf"), torch.tensor(float("-inf")), torch.tensor([1.0, float("nan")])):
        with pytest.raises(NonFiniteLoss, match="at step 7 on pair p3"):
            check_finite(bad, step=7, detail="pair p3")


@pytest.mark.parametrize("optim", ["adamw", "adafactor"])
def test_checkpoint_roundtrip_restores_optimizer_scheduler_and_rng_exactly(tmp_path, tiny_model, optim):
    import random

    import numpy as np

    from pofe.runtime import (OptimConfig, load_checkpoint, make_optimizer, make_scheduler, save_checkpoint,
                              seed_everything)

    def train(model, opt, sched, n):
        for _ in range(n):
            loss = model(torch.randint(0, 100, (2, 5))).logits.float().pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            sched.step()

    cfg = OptimConfig(name=optim, lr=1e-2, warmup_steps=2, schedule="cosine")
    seed_everything(0)
    opt = make_optimizer(tiny_model, cfg)
    sched = make_scheduler(opt, cfg, 6)
    train(tiny_model, opt, sched, 2)
    save_checkpoint(tmp_path / "c", model=tiny_model, optimizer=opt, scheduler=sched, step=2, state={"cursor": 5})
    draws = (random.random(), float(np.random.rand()), torch.rand(1).item())
    train(tiny_model, opt, sched, 2)
    ref = {k: v.clone() for k, v in tiny_model.state_dict().items()}

    from pofe.models import tiny_causal_lm
    from pofe.models import load_tokenizer

    fresh = tiny_causal_lm(load_tokenizer(), seed=1)
    opt2 = make_optimizer(fresh, cfg)
    sched2 = make_scheduler(opt2, cfg, 6)
    seed_everything(123)
    info = load_checkpoint(tmp_path / "c", model=fresh, optimizer=opt2, scheduler=sched2)
    assert info == {"step": 2, "state": {"cursor": 5}}
    assert (random.random(), float(np.random.rand()), torch.rand(1).item()) == draws
    train(fresh, opt2, sched2, 2)
    assert all(torch.equal(ref[k], v) for k, v in fresh.state_dict().items())
    assert sched2.get_last_lr() == sched.get_last_lr()


def test_checkpoint_writes_the_models_own_tensors_and_copies_only_shared_or_strided_ones(tmp_path):
    """No whole-model copy at save time (it was the online loop's memory peak), yet a parameter
    that shares storage with another, or is not contiguous, still saves (safetensors refuses both
    as they are) and every value reads back exactly."""
    from safetensors.torch import load_file

    from pofe.runtime.checkpoints import _trainable_state_dict

    m = torch.nn.Module()
    m.a = torch.nn.Parameter(torch.arange(12.0).reshape(3, 4))
    m.b = torch.nn.Parameter(m.a.data)  # another Parameter object over a's storage
    m.c = torch.nn.Parameter(torch.arange(6.0).reshape(2, 3).t())  # transposed: not contiguous
    m.d = torch.nn.Parameter(torch.ones(2), requires_grad=False)  # frozen: not checkpointed
    sd = _trainable_state_dict(m)
    assert sorted(sd) == ["a", "b", "c"]
    assert sd["a"].data_ptr() == m.a.data_ptr()  # the model's own tensor, not a copy
    assert sd["b"].data_ptr() != m.a.data_ptr() and sd["c"].is_contiguous()

    from pofe.runtime import save_checkpoint

    save_checkpoint(tmp_path / "c", model=m, step=1)
    back = load_file(str(tmp_path / "c" / "model.safetensors"))
    assert sorted(back) == ["a", "b", "c"]
    assert torch.equal(back["a"], torch.arange(12.0).reshape(3, 4)) and torch.equal(back["b"], back["a"])
    assert torch.equal(back["c"], torch.tensor([[0.0, 3.0], [1.0, 4.0], [2.0, 5.0]]))
