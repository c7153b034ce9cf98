"""``pofe online`` with ``mode: async`` on the vllm engine (tiny model): step t+1 is sampled and
judged in a background thread while step t trains. Guards: the staleness it records is the
staleness it has (1, or 0 where it must not overlap a checkpoint or an evaluation), with
weights that do not move it computes exactly what mode=online does, and a run killed while a
step is in flight resumes to the uninterrupted run's weights and ledger."""

from __future__ import annotations

import torch
import pytest

pytestmark = pytest.mark.usefixtures("vllm_ok")

VLLM = ["sampling.engine=vllm", "sampling.vllm.dtype=float32", "sampling.vllm.max_model_len=1024"]


def _run(tmp_path, model_dir, *sets):
    from pofe.loops.online import run
    from pofe.runs import read_jsonl
    from tests._online_utils import tiny_cfg

    summary = run(tiny_cfg(tmp_path, model_dir, *VLLM, *sets))
    return summary, read_jsonl(f"{summary['run_dir']}/metrics.jsonl"), read_jsonl(f"{summary['run_dir']}/ledger.jsonl")


@pytest.mark.slow
def test_async_samples_one_step_ahead_except_across_an_evaluation(tmp_path, tiny64_dir):
    _, rows, ledger = _run(tmp_path, tiny64_dir, "mode=async", "train.steps=5", "eval.every=3")
    # step 1 has nothing prefetched; 2 and 3 were drawn during 1 and 2 from the weights before
    # them; step 3 evaluates, so step 4 is drawn after it from theta_3; step 5 during step 4.
    assert [r["prefetched"] for r in rows] == [False, True, True, False, True]
    assert [r["staleness"] for r in rows] == [0, 1, 1, 0, 1]
    # syncs: first use; after each prefetched step is taken (2, 3, 5); after the evaluated step 3
    # and the last step. Never while a prefetch holds the engine (after steps 1, 2, 4).
    assert [r["engine_syncs"] for r in rows] == [1, 2, 4, 4, 6]
    assert all(r["time_wait"] >= 0 and r["time_generate"] > 0 for r in rows)
    assert [r["step"] for r in rows if "winrate_vs_init" in r] == [3, 5]
    # the ledger is written on the main thread: each step's annotations, then its losses, in step order
    kinds = [(r["step"], r["kind"]) for r in ledger]
    assert kinds == sorted(kinds, key=lambda x: (x[0], x[1] != "annotation"))
    assert {s for s, _ in kinds} == {1, 2, 3, 4, 5}


@pytest.mark.slow
def test_async_with_weights_that_do_not_move_equals_online(tmp_path, tiny64_dir):
    """lr 1e-30 leaves the fp32 weights where they were (the update is below one ulp, except on exact
    zeros, which move to ~1e-30), so staleness
    cannot change what is sampled: the two modes must then annotate and train on exactly the same
    pairs (same prompts, seeds, samples and verdicts) -- the background thread changes when the
    work runs, not what it computes."""
    from safetensors.torch import load_file

    runs = {}
    for mode in ("online", "async"):
        s, rows, ledger = _run(tmp_path / mode, tiny64_dir, f"mode={mode}", "train.steps=4", "eval.enabled=false",
                               "optim.lr=1e-30")
        runs[mode] = (rows, [{k: v for k, v in r.items() if k != "latency_s"} for r in ledger],
                      load_file(f"{s['final_model']}/model.safetensors"))
    (rows_o, led_o, w_o), (rows_a, led_a, w_a) = runs["online"], runs["async"]
    assert [r["prefetched"] for r in rows_a] == [False, True, True, True]
    assert len(led_a) > 8 and led_a == led_o
    assert [r["loss"] for r in rows_a] == [r["loss"] for r in rows_o]
    init = load_file(f"{tiny64_dir}/model.safetensors")
    assert w_a.keys() == w_o.keys() == init.keys() and all(torch.equal(w_a[k], w_o[k]) for k in init)
    assert max(float((w_a[k] - init[k]).abs().max()) for k in init) < 1e-25


@pytest.mark.slow
def test_async_run_killed_with_a_step_in_flight_resumes_exactly(tmp_path, tiny64_dir):
    """SIGKILL after step 3's judge, while step 4 is being sampled in the background. The
    checkpoint of step 2 holds nothing in flight (no prefetch across a checkpoint), so the resumed
    run samples step 3 from the same weights as the uninterrupted one: same weights, same ledger."""
    from pofe.runs import read_jsonl
    from tests._cli import pofe

    def args(name):
        sets = [f"model.name={tiny64_dir}", "mode=async", "judge.kind=length", "train.steps=5", "train.batch_size=2",
                "sampling.max_new_tokens=5", "optim.lr=1e-3", "optim.warmup_steps=0", "checkpoint.every=2",
                "eval.enabled=false", "log.progress=false", "log.tensorboard=false", *VLLM,
                f"run.output_dir={tmp_path}", f"run.name={name}"]
        return [a for s in sets for a in ("--set", s)]

    full = pofe("online", *args("full"))
    assert full.returncode == 0, full.stderr[-2000:]
    crashed = pofe("online", *args("crash"), POFE_FAULT="3:after_judge")
    assert crashed.returncode == -9, crashed.stderr[-2000:]
    resumed = pofe("online", "--resume", str(tmp_path / "crash"))
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    from safetensors.torch import load_file

    a, b = (load_file(str(tmp_path / n / "final" / "model.safetensors")) for n in ("full", "crash"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)

    def ledger(n):
        return [{k: v for k, v in r.items() if k != "latency_s"} for r in read_jsonl(tmp_path / n / "ledger.jsonl")]

    assert ledger("crash") == ledger("full")
    rows = read_jsonl(tmp_path / "crash" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]
    assert [r["staleness"] for r in rows] == [0, 1, 0, 1, 0]  # steps 3 and 5 follow checkpoints (2, 4)
