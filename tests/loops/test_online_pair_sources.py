"""``pofe online``'s pair sources without a model or an engine: the engine-sync rule and the
staleness it records (semi-online sync_every, async's one-step-ahead prefetch that never
crosses a checkpoint or an evaluation), offline pairs under the label policy, and when the
frozen reference may be cast to bf16. The numbers are worked out by hand in each test."""

from __future__ import annotations

import contextlib
import threading

import pytest
import torch

from pofe.config import load_config
from pofe.loops.online import OnlineConfig
from pofe.records import PreferencePair
from pofe.loops.online.dap import TokenPair
from pofe.loops.online.online_pairs import zero_counts
from pofe.loops.online.pair_sources import (
    AsyncSource,
    EngineSync,
    IterativeSource,
    OfflineSource,
    OnlineSource,
    StepPairs,
    make_source,
)


class FakeEngine:
    """A vLLM-like engine: always stale after an update; counts its syncs."""

    name = "vllm"
    stale = True

    def __init__(self):
        self.syncs = 0
        self.allow_stale = False

    def sync(self) -> float:
        self.syncs += 1
        return 0.25


class OneProcess:
    num_processes, process_index, is_main_process = 1, 0, True

    def unwrap_model(self, m):
        return m


class Judges:
    judge, ctx = None, contextlib.nullcontext


class ScriptedOnline(OnlineSource):
    """fresh() without a model: one pair per coming step, named after the step it was drawn at,
    and the thread that drew it."""

    def fresh(self, step, k, seed=None):
        out = StepPairs([], zero_counts())
        for s in range(k):
            out.slices.append([TokenPair((1,), (2,), (3,), 1.0, f"drawn@{step}+{s}:{threading.current_thread().name}")])
        out.rows = [{"kind": "annotation", "step": step}]
        return out


class ScriptedIterative(IterativeSource):
    fresh = ScriptedOnline.fresh


def _cfg(*sets):
    return load_config(OnlineConfig, None, ["judge.kind=length", *sets])


def _source(cfg, engine):
    return ScriptedOnline(_lp(cfg), EngineSync(engine, cfg))


def _lp(cfg):
    from pofe.data.prompts import PromptCursor
    from pofe.loops.online.pair_sources import LoopState

    return LoopState(cfg, OneProcess(), None, None, None, contextlib.nullcontext, PromptCursor(["x", "y"], 0), [], None)


def _drive(src, steps):
    """What the recipe does around a source each step: pairs, (the update), the sync rule."""
    out = []
    for step in range(1, steps + 1):
        sp = src.pairs(step)
        src.after_update(step, sp.times)
        out.append((sp, src.sync.engine.syncs))
    return out


def test_semi_online_syncs_every_k_steps_and_at_the_last_and_records_staleness():
    # sync_every=2, 3 steps: synced after step 2 and after the last step 3 -> the weights sampling
    # step 2 are one update old (theta_0 after step 1), steps 1 and 3 sample current weights
    cfg = _cfg("sampling.engine=vllm", "sampling.vllm.sync_every=2", "train.steps=3", "eval.enabled=false")
    got = _drive(_source(cfg, FakeEngine()), 3)
    assert [sp.staleness for sp, _ in got] == [0, 1, 0]
    assert [n for _, n in got] == [0, 1, 2]
    assert [sp.times.get("sync") for sp, _ in got] == [None, 0.25, 0.25]


def test_an_evaluation_step_syncs_before_the_win_rate_samples():
    cfg = _cfg("sampling.engine=vllm", "sampling.vllm.sync_every=4", "train.steps=5", "eval.every=3")
    got = _drive(_source(cfg, FakeEngine()), 5)
    assert [n for _, n in got] == [0, 0, 1, 2, 3]  # step 3 (eval), 4 (every 4), 5 (last)
    assert [sp.staleness for sp, _ in got] == [0, 1, 2, 0, 0]


def test_the_hf_engine_is_never_stale_and_never_synced():
    class HF(FakeEngine):
        name = "hf"

    cfg = _cfg("train.steps=3")
    got = _drive(_source(cfg, HF()), 3)
    assert [sp.staleness for sp, _ in got] == [0, 0, 0] and got[-1][1] == 0


def test_async_samples_one_step_ahead_never_across_an_evaluation():
    """5 steps, eval.every=3: step 1 has nothing prefetched; 2 and 3 were drawn during 1 and 2 from
    the weights before them (staleness 1); step 3 evaluates, so step 4 is drawn at step 4 from
    theta_3; step 5 during step 4. Syncs: when a prefetched step is taken (2: theta_1, 3: theta_2,
    5: theta_4), after the evaluated step 3 and after the last step -- never while a prefetch holds
    the engine (after steps 1, 2 and 4)."""
    cfg = _cfg("mode=async", "sampling.engine=vllm", "train.steps=5", "eval.every=3")
    engine = FakeEngine()
    src = AsyncSource(ScriptedOnline(_lp(cfg), EngineSync(engine, cfg)))
    try:
        assert engine.allow_stale  # only the source decides when the engine syncs
        got = _drive(src, 5)
    finally:
        src.close()
    assert [sp.extra["prefetched"] for sp, _ in got] == [False, True, True, False, True]
    assert [sp.staleness for sp, _ in got] == [0, 1, 1, 0, 1]
    assert [n for _, n in got] == [0, 1, 3, 3, 5]
    drawn = [sp.pairs[0].pair_id for sp, _ in got]
    assert [d.split(":")[0] for d in drawn] == ["drawn@1+0", "drawn@2+0", "drawn@3+0", "drawn@4+0", "drawn@5+0"]
    main = threading.current_thread().name
    assert [d.split(":")[1] == main for d in drawn] == [True, False, False, True, False]  # prefetched off the main thread


def test_async_never_prefetches_across_a_checkpoint():
    """checkpoint.every=2 of 4 steps: the checkpoints after steps 2 and 4 must hold nothing in flight,
    so steps 3 (after a checkpoint) and 1 sample on the spot; 2 and 4 are prefetched."""
    cfg = _cfg("mode=async", "sampling.engine=vllm", "train.steps=4", "eval.enabled=false", "checkpoint.every=2")
    src = AsyncSource(ScriptedOnline(_lp(cfg), EngineSync(FakeEngine(), cfg)))
    try:
        got = _drive(src, 4)
        assert not src.prefetch.pending
    finally:
        src.close()
    assert [sp.extra["prefetched"] for sp, _ in got] == [False, True, False, True]
    assert [sp.staleness for sp, _ in got] == [0, 1, 0, 1]


def test_iterative_labels_k_steps_at_once_and_the_buffer_is_the_resume_state():
    cfg = _cfg("mode=iterative", "train.iterative_every=3", "train.steps=4", "eval.enabled=false")
    src = ScriptedIterative(_lp(cfg), EngineSync(FakeEngine(), cfg))
    ids = []
    for step in (1, 2):
        ids.append(src.pairs(step).pairs[0].pair_id.split(":")[0])
    # drawn at step 1 for steps 1, 2 and 3: one slice (step 3's) is still in the buffer
    assert ids == ["drawn@1+0", "drawn@1+1"]
    state = src.state()
    assert state["mode"] == "iterative" and [[p["pair_id"].split(":")[0] for p in s] for s in state["buffer"]["0"]] == [
        ["drawn@1+2"]]


def test_make_source_resumes_the_buffer_and_cursor_of_this_process():
    cfg = _cfg("mode=iterative", "train.iterative_every=2", "eval.enabled=false")
    pair = TokenPair((1,), (2,), (3,), 1.0, "left-over").to_dict()
    src = make_source(cfg, OneProcess(), None, None, Judges(), ["x", "y"], {"cursor": 5, "buffer": {"0": [[pair]]}},
                      ledger=None, engine=FakeEngine(), start=3)
    assert isinstance(src, IterativeSource) and src.lp.cursor.position == 5 and src.sync.last == 3
    sp = src.pairs(4)  # trains on the buffered slice, draws nothing
    assert [p.pair_id for p in sp.pairs] == ["left-over"] and src.lp.cursor.position == 5
    assert sp.staleness == 0  # the engine was synced at the checkpoint's step 3


def _offline(tokenizer, margin, ps):
    from pofe.data.prompts import PromptCursor

    cfg = _cfg("mode=offline", "data.preferences=unused", f"labels.min_margin={margin}", "train.batch_size=4")
    lp = _lp(cfg)
    lp.tok, lp.cursor = tokenizer, PromptCursor([PreferencePair(prompt="q", chosen="a", rejected="b", p=p) for p in ps],
                                                0, shuffle=False)
    return OfflineSource(lp, EngineSync(FakeEngine(), cfg)).pairs(1)


def test_offline_pairs_follow_the_label_policy(tokenizer):
    """min_margin 0.1 drops p = 0.55 and p = 0.5 as low_margin; without a margin hard labels drop the
    exact tie as a tie; kept pairs are oriented to the preferred response (p = 0.2: 'b' is chosen)."""
    sp = _offline(tokenizer, 0.1, (0.9, 0.55, 0.5, 0.2))
    assert (sp.counts["trained"], sp.counts["low_margin"], sp.counts["ties"]) == (2, 2, 0)
    b = tuple(tokenizer("b", add_special_tokens=False)["input_ids"]) + (tokenizer.eos_token_id,)
    assert [p.p for p in sp.pairs] == [1.0, 1.0] and sp.pairs[1].chosen_ids == b
    sp = _offline(tokenizer, 0.0, (0.9, 0.55, 0.5, 0.2))
    assert (sp.counts["trained"], sp.counts["low_margin"], sp.counts["ties"]) == (3, 0, 1)


@pytest.mark.parametrize("sets,lora,shared,cast", [
    (["train.precision=fp32"], False, (False, False), False),  # fp32 passes read pi_0 in fp32
    (["train.precision=bf16"], False, (False, False), True),  # only bf16 autocast passes read it
    (["train.precision=bf16"], True, (False, False), False),  # LoRA: the reference is the trained policy itself
    (["train.precision=bf16", "judge.kind=llm"], False, (True, True), False),  # a transformers annotator computes on it
    (["train.precision=bf16"], False, (False, True), False),  # ... or only the evaluation judge does
])
def test_the_frozen_reference_goes_bf16_only_when_nothing_else_reads_it(tiny_model, sets, lora, shared, cast):
    from pofe.runtime import Reference
    from pofe.loops.online.annotator import Judges as J
    from pofe.loops.online.annotator import reference_to_bf16

    cfg = _cfg(*sets)
    if lora:
        from pofe.runtime import LoraSettings, ModelConfig, load_policy

        model, _ = load_policy(ModelConfig(lora=LoraSettings(enabled=True, r=4)), model=tiny_model)
    else:
        model = tiny_model
    ref = Reference(model, lora=lora)
    ctx, eval_ctx = (ref.model if x else contextlib.nullcontext for x in shared)
    assert reference_to_bf16(cfg, ref, J(ctx=ctx, eval_ctx=eval_ctx)) is cast
    if not lora:
        dtypes = {m.weight.dtype for m in ref.module.modules() if isinstance(m, torch.nn.Linear)
                  and m.weight is not ref.module.get_input_embeddings().weight}
        assert dtypes == {torch.bfloat16 if cast else torch.float32}
