"""Where ``pofe online``'s training pairs come from: one :class:`PairSource` per mode.

OAIF (Guo et al. 2024) Algorithm 1, steps 1-3 (prompts -> two samples of the current policy ->
the annotator's verdict in both orders), and its variants:

* :class:`OnlineSource` -- Algorithm 1: fresh samples from pi_theta_t, labelled now, trained on now;
* :class:`IterativeSource` -- every K steps, sample and label K steps' worth of prompts at once;
  in between train on the buffered slices (labels up to K-1 updates stale);
* :class:`OfflineSource` -- pairs from a fixed preference file (OAIF's offline baseline);
* :class:`AsyncSource` -- wraps an online source: step t+1's samples and labels are produced
  in a background thread while step t trains, from the weights before step t (one update
  stale). It owns the prefetch, the staleness it records and the engine-sync rule around it.

Every source also owns the sampling engine's sync rule (:class:`EngineSync`): the hf engine
samples from the trained tensors themselves; a vLLM copy is synced after optimiser steps
(every ``sampling.vllm.sync_every``: semi-online when > 1), at the last step and before an
evaluation. Ledger rows are written on the main thread the moment they exist, before
training (a crash loses nothing labelled); collectives never run in the background thread.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

import torch

from pofe.config import ConfigError
from pofe.data.preferences import load_preferences
from pofe.data.prompts import PromptCursor, load_prompts, split_heldout
from pofe.recipe import checkpoint_due
from pofe.records import Prompt
from pofe.runs import JsonlWriter
from pofe.loops.online.annotator import computes_on_pi0_tensors
from pofe.loops.online.dap import TokenPair, tokenize_pair
from pofe.loops.online.online_pairs import label_annotations, sample_and_annotate, zero_counts
from pofe.runtime.parallel import gather
from pofe.runtime.seeds import sampling_seed
from pofe.loops.online.prefetch import Prefetch


def load_data(cfg) -> tuple[list, list[Prompt]]:
    """Training items (prompts, or preference pairs in offline mode) and held-out prompts for
    the win rate (``data.eval_prompts``, else a seeded split of ``data.prompts`` or of the
    built-in prompts; evaluation prompts are never trained on)."""
    prompts = load_prompts(cfg.data.prompts, field=cfg.data.prompt_field, split=cfg.data.split, limit=cfg.data.max_prompts)
    if cfg.data.eval_prompts:
        eval_prompts = load_prompts(cfg.data.eval_prompts, field=cfg.data.prompt_field)[:cfg.eval.num_prompts]
        held = {p.text for p in eval_prompts}
        train_prompts = [p for p in prompts if p.text not in held]
    else:
        train_prompts, eval_prompts = split_heldout(prompts, cfg.eval.num_prompts if cfg.eval.enabled else 0, cfg.seed)
    if cfg.mode == "offline":
        if not cfg.data.preferences:
            raise ConfigError("mode=offline needs data.preferences (a prompt/chosen/rejected file)")
        return load_preferences(cfg.data.preferences).pairs, eval_prompts
    return train_prompts, eval_prompts


def eval_due(cfg, step: int) -> bool:
    """The win rate vs the initial policy runs at the last step and every ``eval.every`` steps."""
    return cfg.eval.enabled and (step == cfg.train.steps or (cfg.eval.every > 0 and step % cfg.eval.every == 0))


# ----------------------------------------------------------------------------- what a step gets

@dataclass
class LoopState:
    """What a source needs from the loop's setup (built once by the recipe)."""

    cfg: Any  # the loop's config (train.batch_size, train.grad_accum, sampling, loss, labels)
    acc: Any
    ddp_policy: Any
    tok: Any
    judge: Any
    judge_ctx: Callable
    cursor: PromptCursor
    buffer: list[list[TokenPair]]
    ledger: JsonlWriter | None
    tok_cache: dict = field(default_factory=dict)

    @property
    def n_prompts(self) -> int:
        return self.cfg.train.batch_size * self.cfg.train.grad_accum


@dataclass
class StepPairs:
    """One step's training pairs, outcome counts, ledger rows, generation sizes and timings."""

    pairs: list[TokenPair]
    counts: dict[str, int]
    rows: list[dict] = field(default_factory=list)  # ledger rows of all processes
    gen: tuple[int, int, int] = (0, 0, 0)  # tokens, characters, samples (this process)
    times: dict[str, float] = field(default_factory=dict)
    slices: list[list[TokenPair]] = field(default_factory=list)  # labelled, not yet in the buffer (see publish)
    staleness: int = 0  # optimiser steps the sampling weights lag behind the weights trained on
    extra: dict[str, Any] = field(default_factory=dict)  # the source's own metrics keys


class PairSource(Protocol):
    """A mode of ``pofe online``: this process's pairs for a step, the engine-sync rule after
    the optimiser step, and the plain-JSON state an exact resume needs."""

    sync: EngineSync

    def pairs(self, step: int) -> StepPairs: ...

    def after_update(self, step: int, times: dict[str, float]) -> None: ...

    def state(self) -> dict[str, Any]: ...

    def after_row(self, step: int): ...  # judge.budget spent (pofe.judges.usage.BudgetError), else None

    def summary(self, history: list[dict[str, Any]]) -> dict[str, Any]: ...  # judge_usage

    def close(self) -> None: ...


@dataclass
class EngineSync:
    """Which weights the sampling engine holds: ``last`` is the step whose update it has seen."""

    engine: Any
    cfg: Any
    last: int = 0

    def staleness(self, step: int) -> int:
        """Updates the weights sampling at ``step`` lag behind (0 for hf: its own tensors)."""
        return step - 1 - self.last

    def sync(self, step: int, times: dict[str, float]) -> None:
        times["sync"] = self.engine.sync() if self.engine.stale else 0.0  # raises EngineSyncError: the run stops
        self.last = step

    def row(self, acc, res) -> dict[str, Any]:
        """The step row's engine keys: its name and syncs, a served engine's ``sync/...`` keys, and
        with ``sampling.sync_check`` the sampled tokens' ``sync/mismatch_kl`` (a collective)."""
        engine = self.engine
        row = {"engine": engine.name, "engine_syncs": getattr(engine, "syncs", 0)}
        row.update(getattr(engine, "sync_metrics", dict)())  # a served engine's sync/... keys (version, staleness)
        if getattr(getattr(engine, "sync_check", None), "enabled", False):  # the same on every process
            from pofe.generation.sync_check import mismatch_kl
            from pofe.runtime.parallel import reduce_sum

            row["sync/mismatch_kl"] = mismatch_kl(reduce_sum(acc, res.mismatch if res else 0.0),
                                                  reduce_sum(acc, res.mismatch_tokens if res else 0))
        return row

    def summary(self) -> dict[str, Any]:
        engine = self.engine
        return {"engine": engine.name, "engine_syncs": getattr(engine, "syncs", 0),
                "engine_sync_seconds": round(getattr(engine, "sync_seconds", 0.0), 3)}

    def after_update(self, step: int, times: dict[str, float]) -> None:
        cfg = self.cfg
        if self.engine.name == "hf":
            self.last = step  # samples from the updated tensors themselves
        elif step % cfg.sampling.vllm.sync_every == 0 or step == cfg.train.steps or eval_due(cfg, step):
            self.sync(step, times)


# ----------------------------------------------------------------------------- the modes

class _Metered:
    """The annotator's judging metered (:mod:`pofe.judges.usage`): each step's ``judge/*`` keys
    (this step's calls, cache hits, tokens in and out and cost, and the run's totals), the totals
    kept in the checkpoint across resumes, and ``judge.budget``'s stop. A separate evaluation
    judge (``eval.judge``) is not metered; without one the annotator judges the win rate too, and
    that judging is counted (in the next step's row)."""

    meter = None  # a BudgetMeter, set by make_source (None without a judge: mode=offline)

    def metered(self, step: int, sp: StepPairs) -> StepPairs:
        if self.meter is not None:  # a collective under data parallel: the main thread of every process
            sp.extra.update(self.meter.row(step))
        return sp

    def after_row(self, step: int):
        return self.meter.after_row(step) if self.meter is not None else None

    def meter_state(self) -> dict[str, Any]:
        return self.meter.state() if self.meter is not None else {}

    def summary(self, history: list[dict[str, Any]]) -> dict[str, Any]:
        """``judge_usage``: the run's judging total at its end -- the last win rate included when the
        annotator judges it (no ``eval.judge``) -- or None in mode=offline. A collective."""
        from pofe.judges.usage import usage_summary

        return {"judge_usage": self.meter.summary() if self.meter is not None else usage_summary(history)}


class _Source(_Metered):
    """What every mode shares: the loop state, the engine sync, the resume state."""

    def __init__(self, lp: LoopState, sync: EngineSync):
        self.lp, self.sync = lp, sync

    def after_update(self, step: int, times: dict[str, float]) -> None:
        self.sync.after_update(step, times)

    def state(self) -> dict[str, Any]:
        """Called on every process: the buffers of all processes are gathered here."""
        lp = self.lp
        buffers = gather(lp.acc, [[p.to_dict() for p in s] for s in lp.buffer])
        return {"cursor": lp.cursor.position, "buffer": {str(r): b for r, b in enumerate(buffers)}, "mode": lp.cfg.mode,
                **self.meter_state()}

    def close(self) -> None:
        pass


def _check_pair_lengths(model, kept, toks) -> None:
    """A file's pair longer than the model's context is one line naming it, before the policy pass
    sizes its batch from it (a 10 MB prompt asked for terabytes; the sampled path checks its
    prompts in ``check_prompt_lengths``)."""
    from pofe.errors import DataError
    from pofe.generation.sampling import context_length

    ctx = context_length(model)
    if ctx is None:
        return
    for pp, t in zip(kept, toks):
        if t is None:
            continue
        n = len(t.prompt_ids) + max(len(t.chosen_ids), len(t.rejected_ids))
        if n > ctx:
            words = " ".join(str(pp.prompt)[:40].split())
            raise DataError(f"a preference pair ({words!r}...) is {n} tokens (prompt {len(t.prompt_ids)} + its longer "
                            f"response): over the model's context of {ctx} tokens; shorten it or leave it out of the file")


class OfflineSource(_Source):
    """Pairs from the fixed preference file (the OAIF baseline); ``labels.min_margin`` applies to
    the file's soft p (no calibration map: that maps a judge's p), hard labels drop exact ties."""

    def pairs(self, step: int) -> StepPairs:
        lp = self.lp
        world, rank = lp.acc.num_processes, lp.acc.process_index
        counts = zero_counts()
        kept = []
        for pp in lp.cursor.take(world * lp.n_prompts)[rank::world]:
            why = lp.cfg.labels.drop_reason(pp.p, None)
            if why is None:
                kept.append(pp)
            else:
                counts[why] += 1
        toks = [tokenize_pair(lp.tok, pp, lp.tok.eos_token_id, lp.tok_cache, lp.cfg.loss.labels) for pp in kept]
        pairs = [t for t in toks if t is not None]
        _check_pair_lengths(lp.acc.unwrap_model(lp.ddp_policy), kept, toks)
        counts.update(trained=len(pairs), ties=len(toks) - len(pairs))
        return StepPairs(pairs, counts, staleness=self.sync.staleness(step))


class OnlineSource(_Source):
    """Algorithm 1: every step samples and labels fresh pairs from the current policy (``k`` = 1)."""

    k = 1

    def pairs(self, step: int) -> StepPairs:
        staleness = self.sync.staleness(step)
        out = self.publish(self.fresh(step, self.k)) if not self.lp.buffer else StepPairs([], zero_counts())
        out.staleness = staleness
        return self.metered(step, self.train_next(out))

    def fresh(self, step: int, k: int, seed: int | None = None) -> StepPairs:
        """Sample and annotate prompts for the next ``k`` steps from the current policy and label
        them into ``k`` slices. This process only: no collectives, no ledger, no buffer, so that
        mode=async can run it in a background thread; :meth:`publish` does the rest."""
        lp, cfg, acc = self.lp, self.lp.cfg, self.lp.acc
        rank, world, n = acc.process_index, acc.num_processes, lp.n_prompts * k
        batch = lp.cursor.take(world * n)[rank * n:(rank + 1) * n]
        out = StepPairs([], zero_counts())
        anns = sample_and_annotate(acc.unwrap_model(lp.ddp_policy), lp.tok, lp.judge, batch, n=cfg.train.samples_per_prompt,
                                   sampling=cfg.sampling, step=step, rank=rank, judge_context=lp.judge_ctx,
                                   times=out.times, seed=seed)
        per = len(anns) // k
        for s in range(k):  # one slice of annotations per coming step
            p_s, c_s, rows_s = label_annotations(anns[s * per:(s + 1) * per], cfg.loss.labels, rank, cfg.labels)
            out.slices.append(p_s)
            out.counts = {key: out.counts[key] + c_s[key] for key in out.counts}
            out.rows.extend(rows_s)
        distinct = {id(c): c for a in anns for c in (a.a, a.b)}.values()  # n > 2 repeats samples in pairs
        out.gen = (sum(c.num_tokens for c in distinct), sum(len(c.text) for c in distinct),
                   len(batch) * cfg.train.samples_per_prompt)
        return out

    def publish(self, out: StepPairs) -> StepPairs:
        """Main thread: gather every process's annotation rows, write them to the ledger now,
        before training, and queue the labelled slices in the buffer."""
        lp = self.lp
        out.rows = [r for rs in gather(lp.acc, out.rows) for r in rs]
        if lp.ledger is not None:
            for r in out.rows:
                lp.ledger.write(r)
        lp.buffer.extend(out.slices)
        out.slices = []
        return out

    def train_next(self, out: StepPairs) -> StepPairs:
        out.pairs = self.lp.buffer.pop(0)
        out.counts["trained"] = len(out.pairs)
        return out


class IterativeSource(OnlineSource):
    """Relabel every ``train.iterative_every`` steps (K = 1 is online)."""

    def __init__(self, lp: LoopState, sync: EngineSync):
        super().__init__(lp, sync)
        self.k = lp.cfg.train.iterative_every


class AsyncSource(_Metered):
    """Algorithm 1 with step t+1's samples and labels drawn in a background thread while step t
    trains (one update stale, recorded as ``staleness``). Nothing is drawn ahead across a
    checkpoint (its state then holds nothing in flight, so a resumed run samples step t+1 from
    the same weights the uninterrupted one does) nor an evaluation (it samples on the same
    engine from the updated weights); such a step samples as online does. The engine is synced
    only while nothing is in flight, never from the background thread."""

    def __init__(self, inner: OnlineSource):
        self.inner, self.lp, self.sync = inner, inner.lp, inner.sync
        self.sync.engine.allow_stale = True  # syncs only where this source says
        self.prefetch = Prefetch()

    def pairs(self, step: int) -> StepPairs:
        got = self.prefetch.take(step)
        if got is None:
            sp = self.inner.pairs(step)
        else:  # drawn during the last step from the weights before it
            sp = self.inner.train_next(self.inner.publish(got.value))
            sp.staleness, sp.times["wait"] = got.staleness, got.wait_s
            self.sync.sync(step - 1, sp.times)  # the engine was busy until now: bring it to theta_{step-1}
        sp.extra.update(prefetched=got is not None, time_wait=sp.times.get("wait", 0.0))
        if self.ahead(step):  # step+1's samples, from theta_{step-1}
            self.prefetch.submit(step + 1, self._job(step + 1), staleness=step - self.sync.last)
        return self.metered(step, sp)  # what was judged by now (step+1's judging counts when it lands)

    def ahead(self, step: int) -> bool:
        cfg = self.lp.cfg
        return step < cfg.train.steps and not checkpoint_due(cfg.checkpoint.every, step, cfg.train.steps) \
            and not eval_due(cfg, step)

    def _job(self, step: int) -> Callable[[], StepPairs]:
        seed = sampling_seed(self.lp.cfg.seed, step, self.lp.acc.process_index)  # off torch's global RNG

        def job() -> StepPairs:
            with torch.no_grad():  # grad mode is per thread; nothing sampled or judged needs a graph
                return self.inner.fresh(step, 1, seed=seed)
        return job

    def after_update(self, step: int, times: dict[str, float]) -> None:
        if not self.prefetch.pending:  # else the engine is sampling step+1 from theta_{step-1}: synced once taken
            self.sync.after_update(step, times)

    def state(self) -> dict[str, Any]:
        return {**self.inner.state(), **self.meter_state()}

    def close(self) -> None:
        self.prefetch.close()


SOURCES: dict[str, Callable[[LoopState, EngineSync], PairSource]] = {
    "online": OnlineSource, "iterative": IterativeSource, "offline": OfflineSource,
    "async": lambda lp, sync: AsyncSource(OnlineSource(lp, sync))}


def make_source(cfg, acc, ddp_policy, tokenizer, judges, items: list, state: dict[str, Any], *, ledger, engine,
                start: int) -> PairSource:
    """The source of ``cfg.mode``, resumed from a checkpoint's ``state`` (this process's label
    buffer and the prompt cursor; empty for a new run) at step ``start``."""
    rank = acc.process_index
    buffer = [[TokenPair.from_dict(d) for d in s] for s in state.get("buffer", {}).get(str(rank), [])]
    lp = LoopState(cfg, acc, ddp_policy, tokenizer, judges.judge, judges.ctx,
                   PromptCursor(items, cfg.seed, int(state.get("cursor", 0))), buffer, ledger)
    source = SOURCES[cfg.mode](lp, EngineSync(engine, cfg, last=start))
    if judges.judge is not None:
        from pofe.judges.usage import BudgetMeter, budget_of
        from pofe.runtime.parallel import DataParallel

        source.meter = BudgetMeter(budget_of(cfg.judge), [judges.judge], dp=DataParallel(acc), state=state)
    return source


def mode_refusal(cfg) -> str | None:
    """Why ``cfg.mode`` cannot run with ``cfg`` (None: it can)."""
    if cfg.mode != "offline" and not cfg.sampling.temperature > 0:
        return "sampling.temperature must be > 0 for online feedback: greedy samples of a prompt are identical"
    if cfg.mode == "async" and (why := async_refusal(cfg)):
        return why
    if cfg.mode == "offline" and cfg.audit.every:  # the file's labels were given, not judged during the run
        return "bad value for 'audit.every': mode=offline has no annotator to re-audit during training; remove it"
    if cfg.mode == "async" and cfg.audit.every:  # the re-audit would read the judge the background thread is using
        return ("bad value for 'audit.every': mode=async judges in a background thread while the step trains; use "
                "mode=online")
    from pofe.judges.usage import budget_of

    if budget_of(cfg.eval.judge) is not None:  # only the annotator is metered
        return "bad value for 'eval.judge.budget': the budget is the annotator's (judge.budget); remove it"
    if cfg.mode == "offline" and budget_of(cfg.judge) is not None:
        return "bad value for 'judge.budget': mode=offline judges nothing; remove it"
    if cfg.mode != "offline" and cfg.diagnostics.offpolicy and not cfg.diagnostics.offline_responses:
        return (f"bad value for 'diagnostics.offline_responses': mode={cfg.mode} has no offline responses to compare "
                "the policy's samples with; give a prompt/chosen/rejected file")
    return None


def async_refusal(cfg) -> str | None:
    """Why mode=async cannot run with ``cfg`` (None: it can). Its background thread samples and
    judges while the step trains, so neither may compute on tensors the step updates."""
    if cfg.sampling.engine != "vllm":
        return (f"mode=async needs sampling.engine=vllm (is {cfg.sampling.engine!r}): hf samples from the very tensors "
                "the step is training")
    if cfg.sampling.vllm.sync_every != 1:
        return (f"mode=async syncs the engine every step (staleness 1); sampling.vllm.sync_every="
                f"{cfg.sampling.vllm.sync_every} is for semi-online mode=online")
    if computes_on_pi0_tensors(cfg.judge, cfg):  # the evaluation judge runs on the main thread only
        lora = cfg.model.lora.enabled
        where = "the LoRA policy with its adapter off" if lora else "the frozen reference"
        return (f"mode=async: judge.kind={cfg.judge.kind} would read pi_0 from {where} in a background thread while "
                f"the step trains on it; use judge.kind=vllm{' with model.lora.enabled=false' if lora else ''}, a judge "
                "of another model, or mode=online")
    return None


__all__ = ["PairSource", "OnlineSource", "IterativeSource", "OfflineSource", "AsyncSource", "EngineSync", "LoopState",
           "StepPairs", "make_source", "mode_refusal", "async_refusal", "load_data", "eval_due"]
