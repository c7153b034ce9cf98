"""Invariant (b), every command that accumulates gradients: one micro-batch of 8 equals 8
micro-batches of 1 (the same global batch), through the real command.

What is compared, after 2 optimiser steps on CPU fp32:

* ``final/`` weights to ``ATOL`` (fp32 sums in another order differ in the last bits; a wrong
  split -- a micro-batch weighted differently, one dropped or seen twice, another batch -- moves
  weights by orders of magnitude more: the test also requires the weights to have moved by
  ``MOVED`` from the initial model, so that it can fail);
* each step's ``loss`` and pre-clip ``grad_norm`` to ``RTOL``: Adam's update is nearly
  invariant to a global gradient scale, so a split that sums where it should average would pass
  the weight check; the logged loss and gradient norm are not scale-invariant.

The commands and their knobs: ``online`` train.batch_size x train.grad_accum, ``sft`` the same,
``self-reward`` dpo.batch_size x dpo.grad_accum (its DPO stage), ``rl`` train.micro_batch
(sequences per forward/backward within a step: 4 prompts x 2 samples = 8 sequences).
``rm`` takes one forward per step (no accumulation) and ``label`` / ``cai revise`` train nothing.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import configs
from harness import final_weights, max_abs_diff, rows, run_pofe, weights

ATOL = 1e-6
RTOL = 1e-5
MOVED = 1e-4
# RLOO's loss is a mean of advantage x log-prob terms whose advantages sum to zero within each
# group: the loss is a small difference of O(1e-2) terms, so fp32 reordering moves it by ~1e-7
# absolute, which is 1e-5 *relative* to a 4e-3 loss; at step 2 it is also taken on weights that
# may already differ by ATOL, which moved it by 1.4e-6 on an AVX-512 CPU (AMD EPYC). An absolute
# bound of 1e-5 still fails a wrong split by an order of magnitude or more (a sum instead of a
# mean is 8x the loss; a dropped micro-batch removes a whole O(1e-2)/8 term).
LOSS_ABS = {"rl": 1e-5}

# command -> (config function, settings common to both runs, the 8x1 split, the 1x8 split, metrics file)
CASES = {
    "online": (configs.online, {"train.steps": 2, "eval.enabled": False},
               {"train.batch_size": 8, "train.grad_accum": 1}, {"train.batch_size": 1, "train.grad_accum": 8},
               "metrics.jsonl"),
    "sft": (configs.sft, {"train.steps": 2},
            {"train.batch_size": 8, "train.grad_accum": 1}, {"train.batch_size": 1, "train.grad_accum": 8},
            "metrics.jsonl"),
    "self-reward": (configs.self_reward, {"dpo.steps": 2, "selection.enabled": False, "data.per_iteration": 8},
                    {"dpo.batch_size": 8, "dpo.grad_accum": 1}, {"dpo.batch_size": 1, "dpo.grad_accum": 8},
                    "iter_2/dpo/metrics.jsonl"),
    "rl": (configs.rl, {"train.steps": 2, "train.batch_size": 4, "train.group_size": 2},
           {"train.micro_batch": 8}, {"train.micro_batch": 1}, "metrics.jsonl"),
}


def _data(command: str, work: Path) -> dict:
    """Enough data for 2 steps of 8."""
    if command == "online":
        return {"data.prompts": configs.prompts_file(work, 16)}
    if command == "sft":
        return {"data.ift": [configs.ift_file(work, 16)]}
    if command == "self-reward":
        return {"data.prompts": configs.prompts_file(work, 16)}
    return {"data.prompts": configs.prompts_file(work, 12)}


@pytest.mark.slow
@pytest.mark.parametrize("command", list(CASES))
def test_one_micro_batch_of_8_equals_8_micro_batches_of_1(command, tmp_path, tiny_model_dir):
    fn, common, a, b, metrics = CASES[command]
    # a smaller step than the resume configs': the fp32 reordering error of an update scales with lr
    lr = {"self-reward": "dpo.optim.lr"}.get(command, "optim.lr")
    over = {**common, **_data(command, tmp_path), lr: 1e-3}
    with ThreadPoolExecutor(2) as pool:
        runs = [pool.submit(run_pofe, (*configs.COMMANDS[command].argv,),
                            config=fn(tmp_path, tiny_model_dir, name, {**over, **split}))
                for name, split in (("8x1", a), ("1x8", b))]
        one, eight = (f.result() for f in runs)
    for r in (one, eight):
        assert r.rc == 0, (command, r.run_dir.name, r.stderr[-3000:])
    wa, wb = weights(final_weights(one.run_dir)), weights(final_weights(eight.run_dir))
    diff = max_abs_diff(wa, wb)
    moved = max_abs_diff(wa, weights(Path(tiny_model_dir) / "model.safetensors"))
    assert moved > MOVED, f"{command}: the weights barely moved ({moved:.3g}); the comparison would prove nothing"
    assert diff <= ATOL, f"{command}: 8x1 vs 1x8 final weights differ by {diff:.3g} (> {ATOL}); moved {moved:.3g}"
    ra, rb = rows(one.run_dir / metrics), rows(eight.run_dir / metrics)
    assert [r["step"] for r in ra] == [r["step"] for r in rb] == [1, 2], command
    for x, y in zip(ra, rb):
        for k in ("loss", "grad_norm"):
            tol = LOSS_ABS.get(command, 0) if k == "loss" else 0
            assert x[k] is not None and y[k] == pytest.approx(x[k], rel=RTOL, abs=tol), (command, x["step"], k, x[k], y[k])
