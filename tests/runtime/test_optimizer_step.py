"""The one optimiser step (pofe.runtime.step.optimizer_step): hand-computed update and clipping,
and a NaN loss in every training command stops before the optimiser touches a weight, with one
line naming the step."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from pofe.runtime.guards import NonFiniteLoss
from pofe.runtime.step import optimizer_step

ROOT = Path(__file__).resolve().parents[2]

def _sgd(w0, lr=0.1):
    w = torch.nn.Parameter(torch.tensor(w0))
    opt = torch.optim.SGD([w], lr=lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5 ** s)  # halves each step: shows it advanced
    return w, opt, sched


def test_clip_step_schedule_by_hand():
    w, opt, sched = _sgd([1.0, 1.0])
    w.grad = torch.tensor([3.0, 4.0])  # norm 5, clipped to 1 -> (0.6, 0.8)
    done = optimizer_step(opt, sched, [w], losses={"": 0.25}, step=1, grad_clip=1.0)
    assert done.lr == pytest.approx(0.1) and done.grad_norm == pytest.approx(5.0)
    assert w.detach().tolist() == pytest.approx([1 - 0.1 * 0.6, 1 - 0.1 * 0.8])
    assert w.grad is None  # zeroed for the next step
    assert sched.get_last_lr()[0] == pytest.approx(0.05)
    # no clip: the raw gradient, no norm reported
    w.grad = torch.tensor([3.0, 4.0])
    done = optimizer_step(opt, sched, [w], losses={"": 1.0}, step=2)
    assert done.lr == pytest.approx(0.05) and done.grad_norm is None
    assert w.detach().tolist() == pytest.approx([0.94 - 0.15, 0.92 - 0.2])


def test_nothing_trained_advances_only_the_schedule():
    w, opt, sched = _sgd([1.0])
    w.grad = torch.tensor([2.0])
    done = optimizer_step(opt, sched, [w], losses={}, step=1, trained=False, grad_clip=1.0)
    assert w.item() == 1.0 and done.grad_norm is None and done.lr == pytest.approx(0.1)
    assert sched.get_last_lr()[0] == pytest.approx(0.05)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), torch.tensor([0.5, float("nan")])])
def test_non_finite_loss_stops_before_the_update_and_the_schedule(bad):
    w, opt, sched = _sgd([1.0, 2.0])
    w.grad = torch.tensor([1.0, 1.0])
    with pytest.raises(NonFiniteLoss, match=r"at step 7 on pair 3; stopped before the optimiser step"):
        optimizer_step(opt, sched, [w], losses={"pair 2": 0.1, "pair 3": bad}, step=7, grad_clip=1.0)
    assert w.detach().tolist() == [1.0, 2.0] and sched.get_last_lr()[0] == pytest.approx(0.1)


def test_one_place_calls_optimizer_step():
    """Only pofe/runtime/step.py calls ``<optimizer>.step()`` (ZeRO's wrapper calls its engine's)."""
    calls = []
    for f in sorted((ROOT / "pofe").rglob("*.py")):
        for node in ast.walk(ast.parse(f.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "step"
                    and "optim" in ast.unparse(node.func.value).lower()):
                calls.append(f"{f.relative_to(ROOT)}:{node.lineno}")
    assert calls == [f"pofe/runtime/step.py:{_line_of('pofe/runtime/step.py', 'optimizer.step()')}"]


def _line_of(rel: str, text: str) -> int:
    return next(i for i, line in enumerate((ROOT / rel).read_text().splitlines(), 1) if line.strip() == text)


# ---- a NaN loss in each command: the run stops at that step, nothing stepped or checkpointed after it

def _nan_on_call(real, from_call: int, *, field=None):
    """``real`` whose result is multiplied by NaN from its ``from_call``-th call on."""
    calls = {"n": 0}

    def f(*a, **k):
        calls["n"] += 1
        out = real(*a, **k)
        if calls["n"] < from_call:
            return out
        if field is None:
            return out * float("nan") if not isinstance(out, tuple) else (out[0] * float("nan"), *out[1:])
        import dataclasses

        return dataclasses.replace(out, **{field: getattr(out, field) * float("nan")})

    return f


def _checkpoints(run_dir: Path) -> list[str]:
    d = run_dir / "checkpoints"
    return sorted(p.name for p in d.iterdir()) if d.is_dir() else []


def test_nan_loss_stops_rm(tmp_path, tiny_model_dir, monkeypatch):
    import pofe.loops.rm as rm_mod
    from pofe.losses import soft_bt_loss

    from tests.loops.test_rm import _rm_cfg

    monkeypatch.setattr(rm_mod, "get_rm_loss", lambda name: _nan_on_call(soft_bt_loss, 3))
    with pytest.raises(NonFiniteLoss, match=r"non-finite loss \(nan\) at step 3; stopped before the optimiser step"):
        rm_mod.run(_rm_cfg(tmp_path, tiny_model_dir, "r"))
    assert _checkpoints(tmp_path / "r") == ["step-2"] and not (tmp_path / "r" / "final").exists()


def test_nan_loss_stops_rl(tmp_path, monkeypatch):
    import pofe.loops.rl.step as rl_step_mod
    from pofe.loops.rl import run

    from tests.loops.test_rl import _rl_cfg

    # batch 2 x group 2 = 4 samples in one micro-batch: pg_loss is called once per step
    monkeypatch.setattr(rl_step_mod, "pg_loss", _nan_on_call(rl_step_mod.pg_loss, 3))
    with pytest.raises(NonFiniteLoss, match=r"non-finite loss \(nan\) at step 3; stopped before the optimiser step"):
        run(_rl_cfg(tmp_path, "r"))
    assert _checkpoints(tmp_path / "r") == ["step-2"] and not (tmp_path / "r" / "final").exists()


def test_nan_loss_stops_sft(tmp_path, tiny_model_dir, monkeypatch):
    import pofe.loops.sft.step as sft_step_mod
    from pofe.loops.sft import run

    from tests.loops.test_sft import EXAMPLES, _cfg

    # grad_accum 2 x batch 1: two micro-batches per step, so call 5 is step 3's first
    monkeypatch.setattr(sft_step_mod, "response_nll", _nan_on_call(sft_step_mod.response_nll, 5))
    cfg = _cfg(tmp_path, model={"name": str(tiny_model_dir)}, steps=4, checkpoint_every=2, run={"output_dir": str(tmp_path), "name": "r"})
    with pytest.raises(NonFiniteLoss, match=r"non-finite loss \(nan\) at step 3 .*stopped before the optimiser step"):
        run(cfg, examples=EXAMPLES)
    assert _checkpoints(tmp_path / "r") == ["step-2"] and not (tmp_path / "r" / "final").exists()


@pytest.mark.slow
def test_nan_loss_stops_self_reward_dpo_stage(tmp_path, tiny_model_dir, monkeypatch):
    """Self-reward's DPO stage is a ``pofe online`` run on its AIFT pairs: a NaN there stops the
    whole chain naming the stage's step and pair, and no M2 is written."""
    import pofe.loops.online as online
    from pofe.losses import get_loss
    from pofe.data.prompts import DEFAULT_PROMPTS
    from pofe.loops.self_reward import SelfRewardConfig, run

    monkeypatch.setattr(online, "get_loss", lambda name: _nan_on_call(get_loss("dpo"), 2, field="losses"))
    pool = tmp_path / "pool.txt"
    pool.write_text("\n".join(DEFAULT_PROMPTS))
    cfg = SelfRewardConfig.model_validate({
        "model": {"name": str(tiny_model_dir)}, "iterations": 2,
        "judge": {"kind": "length", "prefer": "shorter"},
        "data": {"prompts": str(pool), "per_iteration": 8},
        "candidates": {"n": 2, "chunk": 8, "sampling": {"max_new_tokens": 6, "temperature": 1.0, "batch_size": 8}},
        "dpo": {"optim": {"lr": 1e-2, "warmup_steps": 0}, "batch_size": 2, "grad_accum": 1, "epochs": 1},
        "selection": {"enabled": False},
        "eval": {"num_prompts": 0},
        "run": {"output_dir": str(tmp_path / "runs"), "name": "sr"},
    })
    with pytest.raises(NonFiniteLoss, match=r"non-finite loss \(nan\) at step 2 on pair \S+; stopped before the optimiser step"):
        run(cfg)
    it2 = tmp_path / "runs" / "sr" / "iter_2"
    assert _checkpoints(tmp_path / "runs" / "sr") == ["step-1"]  # iteration 1 (M1) done; iteration 2 never checkpointed
    assert _checkpoints(it2 / "dpo") == []
    assert not (it2 / "dpo" / "final").exists() and not (it2 / "model").exists()  # no M2
