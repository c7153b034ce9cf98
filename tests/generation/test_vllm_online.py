"""``pofe online`` sampling on the vllm engine (tiny model): the run folder records the
engine, every sync and the policy staleness of semi-online training (sync_every)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.usefixtures("vllm_ok")

VLLM = ["sampling.engine=vllm", "sampling.vllm.dtype=float32", "sampling.vllm.max_model_len=1024"]


def _run(tmp_path, model_dir, *sets):
    from pofe.loops.online import run
    from pofe.runs import read_jsonl
    from tests._online_utils import tiny_cfg

    summary = run(tiny_cfg(tmp_path, model_dir, "eval.enabled=false", "train.steps=3", *VLLM, *sets))
    return summary, read_jsonl(f"{summary['run_dir']}/metrics.jsonl")


@pytest.mark.slow
def test_semi_online_lora_records_syncs_and_staleness(tmp_path, tiny64_dir):
    summary, rows = _run(tmp_path, tiny64_dir, "model.lora.enabled=true", "model.lora.r=8",
                         "sampling.vllm.sync_every=2")
    # step 1 syncs on first use; then after step 2 (every 2) and after the last step
    assert [r["engine"] for r in rows] == ["vllm"] * 3
    assert [r["staleness"] for r in rows] == [0, 1, 0]
    assert [r["engine_syncs"] for r in rows] == [1, 2, 3]
    assert rows[0]["time_sync"] == 0.0 and rows[1]["time_sync"] > 0 and rows[2]["time_sync"] > 0
    assert summary["engine"] == "vllm" and summary["engine_syncs"] == 3 and summary["engine_sync_seconds"] > 0
    assert all(r["pairs"] + r["identical_pairs"] + r["tie_pairs"] + r["unlabelled_pairs"] == r["annotations"] == 2
               and r["mean_len"] > 0 for r in rows)


@pytest.mark.slow
def test_online_full_finetuning_syncs_every_step(tmp_path, tiny64_dir):
    _, rows = _run(tmp_path, tiny64_dir)
    assert [r["staleness"] for r in rows] == [0, 0, 0]
    assert [r["engine_syncs"] for r in rows] == [2, 3, 4]  # first use + one after each step
    assert all(r["time_sync"] > 0 for r in rows)


@pytest.mark.slow
def test_online_with_a_vllm_annotator_of_the_policy_model(tmp_path, tiny64_dir):
    """judge.kind=vllm on the policy's own model: the annotator is pi_0 read on vLLM (both
    orders labelled), the run finishes and every annotation has a probability."""
    from pofe.runs import read_jsonl

    summary, rows = _run(tmp_path, tiny64_dir, "judge.kind=vllm", f"judge.model={tiny64_dir}",
                         "judge.vllm.dtype=float32", "judge.vllm.max_model_len=1024", "judge.cache.enabled=false")
    ann = [r for r in read_jsonl(f"{summary['run_dir']}/ledger.jsonl") if r["kind"] == "annotation"]
    assert len(ann) == 6 and all(r["p_ab"] is not None and r["p_ba"] is not None for r in ann)
    assert summary["judge"].startswith("vllm") and [r["step"] for r in rows] == [1, 2, 3]
