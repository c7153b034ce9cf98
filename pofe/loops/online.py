"""``pofe online``: direct alignment from Online AI Feedback (OAIF, Guo et al. 2024, Sec. 3,
Algorithm 1), with the paper's offline baseline and an iterative variant.

Each step of Algorithm 1:

1. draw a batch of prompts x from D_X;
2. sample two responses y1, y2 ~ pi_theta_t(.|x) from the *current* policy (T = 0.9,
   Sec. 4.1); with more than two samples the best and worst (round-robin judged) form the pair;
3. ask the annotator which is better, in both orders (position debiasing, Sec. 3 and
   Appendix E), giving y+ / y- (hard labels, the paper) or p = P(y1 > y2) (soft labels);
4. take a gradient step on the DAP loss l(x, y+, y-, theta_t) against the reference
   pi_0 = the initial policy (DPO Eq. 1, IPO Eq. 2, SLiC Eq. 3). No gradient flows through
   sampling or annotation (the explainer's "stop_gradient").

Modes: ``online`` (the above), ``async`` (steps 1-3 of step t+1 run in a background thread while
step t trains, from the weights before step t: one update stale, recorded as ``staleness``;
needs the vllm engine), ``iterative`` (steps 1-3 for the next K steps at once, then K
updates: labels up to K-1 updates stale), ``offline`` (pairs from a fixed file: OAIF's baseline).
Steering the objective is a change of ``judge.template`` (Sec. 4.6: helpful -> helpful-short).

Run folder: ``config.yaml``, ``metrics.jsonl``, ``ledger.jsonl`` (every annotation, appended
the moment it exists; row schemas in :mod:`pofe.training.ledger`), ``eval/`` (win rates vs the
initial policy), ``checkpoints/step-N`` (exact resume), ``final/`` (``save_pretrained``).
Reads top to bottom: config -> the three modes' pairs -> run (setup -> loop -> save); the
rest lives in :mod:`pofe.training` (``online_pairs``, ``dap``, ``metrics``, ``ledger``, ``parallel``).

Data parallel (built on accelerate; each process samples and labels its own prompts, the
gradients are all-reduced, process 0 writes the run folder)::

    torchrun --nproc_per_node 2 -m pofe.cli.main online --config C.yaml --set model.device=cpu  # CPU, gloo (tested)
    accelerate launch --num_processes 8 -m pofe.cli.main online --config C.yaml                # GPUs, DDP
    accelerate launch --config_file ds_zero2.yaml -m pofe.cli.main online --config C.yaml      # DeepSpeed ZeRO-1/2

A step uses ``processes x batch_size x grad_accum`` prompts; FSDP / ZeRO-3 are refused (sampling needs whole parameters).
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Literal

import torch
from pydantic import Field, model_validator

from pofe.config import ConfigError, PofeConfig
from pofe.data.preferences import load_preferences
from pofe.data.prompts import PromptCursor, load_prompts, split_heldout
from pofe.generation import SamplingConfig, generate, make_generator
from pofe.judges.base import Capability, as_pairwise, has_capability
from pofe.judges.config import JudgeConfig, LLMJudgeConfig
from pofe.judges.registry import build_judge
from pofe.losses import LossName, default_beta, get_loss
from pofe.models import same_model
from pofe.evaluation.vs_initial import evaluate_vs_initial
from pofe.records import Completion, Prompt
from pofe.runs import JsonlWriter, RunConfig, atomic_write_text, open_run, read_jsonl, write_config
from pofe.training.allocator import keep_freed_memory
from pofe.training import (ModelConfig, OptimConfig, Reference, check_finite, fault_point, final_complete,
                           latest_checkpoint, load_checkpoint, load_policy, make_optimizer, make_scheduler,
                           prune_checkpoints, save_checkpoint, save_final, seed_everything)
from pofe.training.dap import TokenPair, dap_backward, tokenize_pair
from pofe.training.precision import Precision
from pofe.training.ledger import loss_row, offset, resume_files
from pofe.training.metrics import step_metrics, summarise
from pofe.training.online_pairs import (LabelSettings, LoopState, StepPairs, below_margin, label_annotations,
                                        prompt_input, sample_and_annotate, zero_counts)
from pofe.training.parallel import gather, make_accelerator, reduce_sum, sampling_seed, step_seed, weights_identical
from pofe.training.prefetch import Prefetch
from pofe.training.settings import CheckpointSettings
from pofe.training.tracking import LogConfig, MetricsSink, Progress

log = logging.getLogger(__name__)


# ============================================================================ config

class LossSettings(PofeConfig):
    """The DAP loss (OAIF Eq. 1-3)."""

    name: LossName = "dpo"
    """dpo (Eq. 1), ipo (Eq. 2), slic (Eq. 3), or a loss an installed plugin package adds (``pofe.losses``)."""
    beta: float | None = Field(None, gt=0)
    """None = the paper's value for the loss (Sec. 4.1): DPO 0.1, IPO 1.0, SLiC 0.002. Must be
    > 0: a negative beta trains *against* the judge while the loss looks normal."""
    labels: Literal["hard", "soft"] = "hard"
    """hard: y+ = the response the judge prefers (the paper; exact ties p = 0.5 are skipped and
    counted). soft: train towards P(y1 > y2) = p itself (Bradley-Terry cross-entropy for DPO)."""

    @property
    def beta_value(self) -> float:
        return self.beta if self.beta is not None else default_beta(self.name)


class TrainSettings(PofeConfig):
    """Optimisation loop sizes."""

    steps: int = Field(40, ge=1)
    """Optimiser steps."""
    batch_size: int = Field(4, ge=1)
    """Prompts per micro-batch per process (one pair per prompt)."""
    grad_accum: int = Field(1, ge=1)
    """Micro-batches per optimiser step; prompts per step per process = batch_size * grad_accum."""
    samples_per_prompt: int = Field(2, ge=2)
    """Responses sampled per prompt (OAIF: 2). With more, all pairs are judged and the best
    vs worst (by mean win probability) is trained on."""
    iterative_every: int = Field(4, ge=1)
    """mode=iterative: regenerate and relabel every K steps (K=1 is online)."""
    precision: Precision = "fp32"
    """bf16: policy and reference passes under bf16 autocast, fp32 master weights (AMX CPUs, GPUs)."""


class DataSettings(PofeConfig):
    """Training and held-out data."""

    prompts: str | None = None
    """Prompt-only data (JSONL/TXT/CSV/parquet or a datasets name); None = built-in prompts."""
    prompt_field: str | None = None
    """Field holding the prompt (default: the first of prompt/instruction/question/text/input/messages)."""
    split: str | None = None
    """Split of a datasets name."""
    max_prompts: int | None = Field(None, ge=1)
    """Use at most this many prompts (None = all)."""
    eval_prompts: str | None = None
    """Held-out prompts for the win rate; None = split off eval.num_prompts from data.prompts."""
    preferences: str | None = None
    """mode=offline: prompt/chosen/rejected[/p] data (a pofe ledger works too)."""


class EvalSettings(PofeConfig):
    """Win rate of the current policy against the initial one on held-out prompts."""

    every: int = Field(0, ge=0)
    """Win rate vs the initial policy every N steps (0 = only at the end)."""
    enabled: bool = True
    """false: no evaluation at all."""
    num_prompts: int = Field(16, ge=0)
    """Held-out prompts."""
    judge: JudgeConfig | None = None
    """Evaluation judge; None = the training judge. OAIF evaluates with a different model to
    avoid rewarding the annotator's quirks (Sec. 4.1: Gemini Pro judges, PaLM 2 annotates)."""
    sampling: SamplingConfig = SamplingConfig(temperature=0.0, max_new_tokens=48)
    """Greedy by default so that the win rate does not depend on sampling luck."""


class OnlineConfig(PofeConfig):
    """``pofe online`` (OAIF Algorithm 1)."""

    mode: Literal["online", "async", "iterative", "offline"] = "online"
    """online (Algorithm 1), async (Algorithm 1 with step t+1's samples and labels produced in a
    background thread while step t trains: one step stale, needs sampling.engine=vllm), iterative
    (relabel every train.iterative_every steps) or offline (pairs from data.preferences: the baseline)."""
    seed: int = 0
    """Seeds LoRA init, prompt order, held-out split and every step's sampling."""
    model: ModelConfig = ModelConfig()
    """The policy; its initial weights are the reference pi_0."""
    judge: JudgeConfig = LLMJudgeConfig()
    """The annotator (any judge kind: llm, llamacpp, openai, length, reward-model, ...)."""
    sampling: SamplingConfig = SamplingConfig(max_new_tokens=48, temperature=0.9)
    """How training responses are sampled (OAIF Sec. 4.1: T = 0.9)."""
    loss: LossSettings = LossSettings()
    """The DAP loss."""
    labels: LabelSettings = LabelSettings()
    """Label hygiene: which judge labels are trained on."""
    optim: OptimConfig = OptimConfig()
    """Optimiser and schedule (OAIF Sec. 4.1)."""
    train: TrainSettings = TrainSettings()
    """Steps and batch sizes."""
    data: DataSettings = DataSettings()
    """Prompts, held-out prompts, the offline preference file."""
    eval: EvalSettings = EvalSettings()
    """Win rate vs the initial policy."""
    checkpoint: CheckpointSettings = CheckpointSettings()
    """Resumable checkpoints."""
    log: LogConfig = LogConfig()
    """metrics.jsonl, TensorBoard / W&B / MLflow, the progress bar."""
    run: RunConfig = RunConfig()
    """Where the run folder goes."""

    @model_validator(mode="after")
    def _sampling_must_vary(self) -> "OnlineConfig":
        if self.mode != "offline" and not self.sampling.temperature > 0:
            raise ValueError("sampling.temperature must be > 0 for online feedback: greedy samples of a prompt "
                             "are identical")
        return self

    @model_validator(mode="after")
    def _async_needs_a_separate_sampler(self) -> "OnlineConfig":
        if self.mode != "async":
            return self
        if self.sampling.engine != "vllm":
            raise ValueError(f"mode=async needs sampling.engine=vllm (is {self.sampling.engine!r}): hf samples from the "
                             "very tensors the step is training")
        if self.sampling.vllm.sync_every != 1:
            raise ValueError(f"mode=async syncs the engine every step (staleness 1); sampling.vllm.sync_every="
                             f"{self.sampling.vllm.sync_every} is for semi-online mode=online")
        if _computes_on_pi0_tensors(self.judge, self):  # the evaluation judge runs on the main thread only
            where = "the LoRA policy with its adapter off" if self.model.lora.enabled else "the frozen reference"
            raise ValueError(f"mode=async: judge.kind={self.judge.kind} would read pi_0 from {where} in a background "
                             f"thread while the step trains on it; use judge.kind=vllm"
                             f"{' with model.lora.enabled=false' if self.model.lora.enabled else ''}, a judge of another "
                             "model, or mode=online")
        return self


# ============================================================================ the three modes' pairs

def offline_pairs(lp: LoopState, step: int) -> StepPairs:
    """Pairs from the fixed preference file (the OAIF baseline); min_margin applies to soft p."""
    world, rank = lp.acc.num_processes, lp.acc.process_index
    counts = zero_counts()
    drawn = lp.cursor.take(world * lp.n_prompts)[rank::world]
    kept = [pp for pp in drawn if not below_margin(pp.p, lp.cfg.labels.min_margin)]
    toks = [tokenize_pair(lp.tok, pp, lp.tok.eos_token_id, lp.tok_cache, lp.cfg.loss.labels) for pp in kept]
    pairs = [t for t in toks if t is not None]
    counts.update(trained=len(pairs), ties=len(toks) - len(pairs), low_margin=len(drawn) - len(kept))
    return StepPairs(pairs, counts)


def label_fresh(lp: LoopState, step: int, k: int, seed: int | None = None) -> StepPairs:
    """Sample and annotate prompts for the next ``k`` steps from the current policy and label
    them into ``k`` slices. This process only: no collectives, no ledger, no buffer, so that
    mode=async can run it in a background thread; :func:`publish` does the rest."""
    cfg, acc = lp.cfg, lp.acc
    rank, world, n = acc.process_index, acc.num_processes, lp.n_prompts * k
    batch = lp.cursor.take(world * n)[rank * n:(rank + 1) * n]
    out = StepPairs([], zero_counts())
    anns = sample_and_annotate(acc.unwrap_model(lp.ddp_policy), lp.tok, lp.judge, batch, n=cfg.train.samples_per_prompt,
                               sampling=cfg.sampling, step=step, rank=rank, judge_context=lp.judge_ctx, times=out.times,
                               seed=seed)
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


def publish(lp: LoopState, out: StepPairs) -> StepPairs:
    """Main thread: gather every process's annotation rows, write them to the ledger now, before
    training (a crash loses nothing labelled), and queue the labelled slices in the buffer."""
    out.rows = [r for rs in gather(lp.acc, out.rows) for r in rs]
    if lp.ledger is not None:
        for r in out.rows:
            lp.ledger.write(r)
    lp.buffer.extend(out.slices)
    out.slices = []
    return out


def online_pairs(lp: LoopState, step: int) -> StepPairs:
    """Algorithm 1: fresh samples from pi_theta_t, labelled now, trained on now."""
    return _train_next(publish(lp, label_fresh(lp, step, 1)), lp)


def iterative_pairs(lp: LoopState, step: int) -> StepPairs:
    """Every K steps: sample and label K steps' worth of prompts at once; in between, train on
    the buffered slices (the labelling policy is up to K-1 updates stale)."""
    out = publish(lp, label_fresh(lp, step, lp.cfg.train.iterative_every)) if not lp.buffer else StepPairs([], zero_counts())
    return _train_next(out, lp)


def _train_next(out: StepPairs, lp: LoopState) -> StepPairs:
    out.pairs = lp.buffer.pop(0)
    out.counts["trained"] = len(out.pairs)
    return out


# async: Algorithm 1 whose samples for step t+1 are drawn while step t trains (see the loop);
# a step with nothing prefetched (the first, or after a checkpoint or evaluation) samples as online does.
MODES: dict[str, Callable[[LoopState, int], StepPairs]] = {"online": online_pairs, "async": online_pairs,
                                                        "iterative": iterative_pairs, "offline": offline_pairs}


# ============================================================================ setup helpers

def build_annotator(jcfg: JudgeConfig, *, cfg: OnlineConfig, reference: Reference, tokenizer):
    """The judge and the context its calls run in. An LLM annotator with the same weights as
    the initial policy shares them: the reference module (the frozen copy, or the LoRA policy
    with its adapter disabled inside ``reference.model()``), so no third copy is loaded. It
    is pi_0, never the current policy: OAIF's annotator is frozen (self-rewarding is another
    command)."""
    # a transformers judge shares only weights of its own dtype; a vLLM judge has no dtype of its own
    # here (its engine's is jcfg.vllm.dtype) and reads pi_0's weights whatever their dtype
    if _shares_pi0(jcfg, cfg):
        # cache_tag: these weights never change (pi_0), so the judge cache may reuse reads;
        # the cache fingerprint is a hash of the weights themselves, not the model's name.
        judge = build_judge(jcfg, model=reference.module, tokenizer=tokenizer, cache_tag="initial-policy")
        return as_pairwise(judge), reference.model
    return as_pairwise(build_judge(jcfg)), contextlib.nullcontext


def _shares_pi0(jcfg: JudgeConfig, cfg: OnlineConfig) -> bool:
    """Whether :func:`build_annotator` hands this annotator the reference module (pi_0's weights)."""
    return (has_capability(jcfg, Capability.SHARES_WEIGHTS) and same_model(jcfg.model, cfg.model.name)
            and getattr(jcfg, "dtype", cfg.model.dtype) == cfg.model.dtype)


def _computes_on_pi0_tensors(jcfg: JudgeConfig, cfg: OnlineConfig) -> bool:
    """A shared annotator that runs on pi_0's torch tensors: a transformers judge, or any judge of a
    LoRA policy (its context switches the adapter off on the policy itself). A vLLM judge of a
    full model reads the frozen copy's weights once into its engine."""
    return _shares_pi0(jcfg, cfg) and (cfg.model.lora.enabled or jcfg.kind != "vllm")


def _reads_pi0_in_bf16_only(jcfg: JudgeConfig, ctx, reference: Reference) -> bool:
    """Whether an annotator built by :func:`build_annotator` leaves pi_0's weights to bf16 passes:
    it does not share them (its context is not ``reference.model``), or it reads them through a
    bf16 vLLM engine. A transformers judge computes on the very tensors, in its own dtype."""
    if ctx != reference.model:  # bound methods: equal, never identical
        return True
    return jcfg.kind == "vllm" and jcfg.vllm.dtype == "bfloat16"


def load_data(cfg: OnlineConfig) -> tuple[list, list[Prompt]]:
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


def _eval_now(cfg: OnlineConfig, step: int) -> bool:
    return cfg.eval.enabled and (step == cfg.train.steps or (cfg.eval.every > 0 and step % cfg.eval.every == 0))


def _checkpoint_now(cfg: OnlineConfig, step: int) -> bool:
    return step == cfg.train.steps or (cfg.checkpoint.every > 0 and step % cfg.checkpoint.every == 0)


def _prefetch_now(cfg: OnlineConfig, step: int) -> bool:
    """mode=async: whether step+1's samples are drawn during this step. Not across a checkpoint
    (its state then holds nothing in flight, and the resumed run samples step+1 from the same
    weights the uninterrupted one does), nor an evaluation (it samples on the same engine from
    the updated weights)."""
    return step < cfg.train.steps and not _checkpoint_now(cfg, step) and not _eval_now(cfg, step)


def _prefetch_job(lp: LoopState, step: int, seed: int) -> Callable[[], StepPairs]:
    def job() -> StepPairs:
        with torch.no_grad():  # grad mode is per thread; nothing sampled or judged needs a graph
            return label_fresh(lp, step, 1, seed=seed)
    return job


# ============================================================================ run: setup -> loop -> save

def run(cfg: OnlineConfig, *, resume: str | Path | None = None, model=None, tokenizer=None, judge=None,
        eval_judge=None, require_audit: str | Path | None = None) -> dict[str, Any]:
    """Run OAIF Algorithm 1 (or its offline / iterative variants); returns the summary.

    Args:
        resume: a run folder to continue from its latest checkpoint (the CLI reads its config).
        model, tokenizer: an in-memory policy instead of loading ``cfg.model.name``.
        judge, eval_judge: in-memory judges instead of building ``cfg.judge`` / ``cfg.eval.judge``.
        require_audit: an audit report of the annotator; refuse to train (``AuditError``)
            unless it passed for this very judge.
    """
    # ------------------------------------------------------------------ setup
    offline = cfg.mode == "offline"
    items, eval_prompts = load_data(cfg)  # first: a bad file fails in a second, before any run folder
    acc = make_accelerator(cfg.model.device)  # data-parallel runs come from torchrun / accelerate launch
    rank, world, main = acc.process_index, acc.num_processes, acc.is_main_process
    run_dir = Path(gather(acc, str(open_run(cfg.run, "online", resume=resume)) if main else None)[0])
    if main:
        write_config(run_dir, cfg)
    keep_freed_memory()  # glibc: reuse freed buffers instead of page-faulting them in every step
    seed_everything(cfg.seed)  # same LoRA init on every process
    policy, tok = load_policy(cfg.model, model=model, tokenizer=tokenizer)
    policy.to(acc.device)
    policy.train()
    reference = Reference(policy, lora=cfg.model.lora.enabled)  # pi_0, before any update or resume
    optimizer = make_optimizer(policy, cfg.optim)
    scheduler = make_scheduler(optimizer, cfg.optim, cfg.train.steps)
    start, state = 0, {}
    ckpt = latest_checkpoint(run_dir) if resume is not None else None
    if ckpt is not None:
        info = load_checkpoint(ckpt, model=policy, optimizer=optimizer, scheduler=scheduler)
        start, state = info["step"], info["state"]
    if resume is not None and main:
        resume_files(run_dir, start, int(state.get("ledger_offset", 0)))
    acc.wait_for_everyone()
    ddp_policy, optimizer = acc.prepare(policy, optimizer)
    # The sampling engine. hf samples from the policy's own tensors; vllm keeps a copy that is
    # synced after optimiser steps (every sampling.vllm.sync_every: semi-online when > 1).
    # Built before the judges so that a vLLM judge of the same model shares its engine.
    engine = make_generator(acc.unwrap_model(ddp_policy), tok, cfg.sampling)
    sync_every, last_sync = cfg.sampling.vllm.sync_every, start
    if cfg.mode == "async":  # syncs only where the loop says (nothing in flight), never from the background thread
        engine.allow_stale = True
    loss_fn, beta = get_loss(cfg.loss.name), cfg.loss.beta_value

    # judges: the annotator (not needed offline) and the evaluation judge
    judge_ctx = eval_ctx = contextlib.nullcontext
    if judge is None and not offline:
        judge, judge_ctx = build_annotator(cfg.judge, cfg=cfg, reference=reference, tokenizer=tok)
    if require_audit is not None and judge is not None:
        from pofe.evaluation.audit import judge_identity
        from pofe.evaluation.audit import require_audit as _require_audit

        # the full identity (endpoint URL, both orders, CoT, choices, template hash, ...), not only the id
        _require_audit(require_audit, judge_identity(cfg.judge), judge_id=judge.id)
    if eval_judge is None and cfg.eval.enabled:
        if cfg.eval.judge is None and judge is not None:
            eval_judge, eval_ctx = judge, judge_ctx
        else:
            eval_judge, eval_ctx = build_annotator(cfg.eval.judge or cfg.judge, cfg=cfg, reference=reference, tokenizer=tok)
    my_eval = eval_prompts[rank::world] if cfg.eval.enabled else []
    init_responses: list[Completion] = []
    if my_eval:  # the initial policy's responses, once (greedy: identical after a resume)
        seed_everything(cfg.seed)
        with reference.model() as pi0:
            init_responses = [g[0] for g in generate(pi0, tok, [prompt_input(p) for p in my_eval], n=1, sampling=cfg.eval.sampling)]
    # From here on only bf16 passes read pi_0 (dap_backward under autocast), unless an annotator shares it
    if cfg.train.precision == "bf16" and not reference.lora and all(
            _reads_pi0_in_bf16_only(j, c, reference) for j, c in ((cfg.judge, judge_ctx), (cfg.eval.judge or cfg.judge, eval_ctx))):
        reference.linear_weights_to(torch.bfloat16)  # bit-identical under autocast, no weight cast per pass

    buffer = [[TokenPair.from_dict(d) for d in s] for s in state.get("buffer", {}).get(str(rank), [])]
    lp = LoopState(cfg, acc, ddp_policy, tok, judge, judge_ctx, PromptCursor(items, cfg.seed, int(state.get("cursor", 0))),
               buffer, JsonlWriter(run_dir / "ledger.jsonl") if main and not offline else None)
    sink = MetricsSink(run_dir, cfg.log, config=cfg.model_dump(mode="json")) if main else None
    bar = Progress(cfg.log, total=cfg.train.steps, initial=start, desc=f"pofe {cfg.mode}", main=main,
                   show=(("loss", "loss", "{:.3f}"), ("mean_len", "len", "{:.1f}"), ("mean_p", "p", "{:.2f}"),
                         ("winrate_vs_init", "win", "{:.2f}")))

    # ------------------------------------------------------------------ loop (Algorithm 1)
    prefetch = Prefetch() if cfg.mode == "async" else None
    step = start
    try:
        for step in range(start + 1, cfg.train.steps + 1):
            seed_everything(step_seed(cfg.seed, step, rank))
            t_step = time.perf_counter()
            got = prefetch.take(step) if prefetch is not None else None
            if got is not None:  # async: drawn during the last step from the weights before it
                sp, staleness = _train_next(publish(lp, got.value), lp), got.staleness
                sp.times["wait"] = got.wait_s
                sp.times["sync"] = engine.sync() if engine.stale else 0.0  # the engine was busy until now: bring it to theta_{step-1}
                last_sync = step - 1
            else:
                staleness = step - 1 - last_sync  # optimiser steps the sampling weights lag behind (hf: 0)
                sp = MODES[cfg.mode](lp, step)  # 1-3. prompts -> samples -> AI feedback (or pairs from the file)
            if prefetch is not None and _prefetch_now(cfg, step):  # step+1's samples, from theta_{step-1}
                prefetch.submit(step + 1, _prefetch_job(lp, step + 1, sampling_seed(cfg.seed, step + 1, rank)),
                                staleness=step - last_sync)
            times, pairs = sp.times, sp.pairs
            fault_point(f"{step}:after_judge")

            # 4. the DAP update on this process's pairs; gradients averaged over processes
            n_global = reduce_sum(acc, len(pairs))
            grad_norm, res = None, None
            if n_global > 0:
                res = dap_backward(ddp_policy, reference, pairs, loss_fn=loss_fn, beta=beta, micro_batches=cfg.train.grad_accum,
                                   normaliser=n_global / world, pad_token_id=tok.pad_token_id, backward=acc.backward, device=acc.device,
                                   no_sync=lambda: acc.no_sync(ddp_policy), lockstep=world > 1, precision=cfg.train.precision)
                for ps in res.pairs:  # a NaN/inf loss stops the run before the optimiser step and any checkpoint
                    check_finite(ps.loss, step=step, detail=f"pair {ps.pair_id}")
                t_opt = time.perf_counter()
                if cfg.optim.grad_clip:
                    grad_norm = float(acc.clip_grad_norm_(ddp_policy.parameters(), cfg.optim.grad_clip))
                optimizer.step()
                times.update(reference=res.time_ref, policy=res.time_policy, optimizer=time.perf_counter() - t_opt)
            optimizer.zero_grad(set_to_none=True)
            if engine.name == "hf":
                last_sync = step  # samples from the updated tensors themselves
            elif prefetch is not None and prefetch.pending:
                pass  # the engine is sampling step+1 from theta_{step-1}: synced once that is taken
            elif step % sync_every == 0 or step == cfg.train.steps or _eval_now(cfg, step):
                times["sync"] = engine.sync() if engine.stale else 0.0  # raises EngineSyncError: the run stops
                last_sync = step
            lr = scheduler.get_last_lr()[0]
            with warnings.catch_warnings():  # a step with no labelled pair skips optimizer.step(), not the schedule
                warnings.simplefilter("ignore", UserWarning)
                scheduler.step()
            times["step"] = time.perf_counter() - t_step

            # log: per-pair losses to the ledger, one metrics row, the progress bar
            pair_stats = [ps for r in gather(acc, res.pairs if res else []) for ps in r]
            g_counts = {k: int(reduce_sum(acc, v)) for k, v in sp.counts.items()}
            g_tokens, g_chars, g_samples = (int(reduce_sum(acc, x)) for x in sp.gen)
            if main:
                for ps in pair_stats if lp.ledger is not None else ():
                    lp.ledger.write(loss_row(ps, step))
                row = step_metrics(step=step, annotations=sp.rows, pairs=pair_stats, counts=g_counts, times=times,
                                   gen_tokens=g_tokens, gen_chars=g_chars, num_samples=g_samples, lr=lr, grad_norm=grad_norm)
                row.update(engine=engine.name, time_sync=times.get("sync", 0.0), staleness=max(0, staleness),
                           engine_syncs=getattr(engine, "syncs", 0))
                if prefetch is not None:  # async: generate/judge ran during the last step; wait = what showed
                    row.update(prefetched=got is not None, time_wait=times.get("wait", 0.0))
            if _eval_now(cfg, step):
                ev = evaluate_vs_initial(acc, acc.unwrap_model(ddp_policy), tok, eval_judge, eval_ctx, my_eval, init_responses,
                                         sampling=cfg.eval.sampling, seed=cfg.seed, run_dir=run_dir, step=step)
                if main:
                    row.update(ev)
            if main:
                sink.write(row)
                bar.update(row)

            # checkpoint: everything an exact resume needs, written atomically
            if _checkpoint_now(cfg, step):
                buffers = gather(acc, [[p.to_dict() for p in s] for s in lp.buffer])
                if main:
                    save_checkpoint(run_dir / "checkpoints" / f"step-{step}", model=acc.unwrap_model(ddp_policy),
                                    optimizer=optimizer, scheduler=scheduler, step=step,
                                    state={"cursor": lp.cursor.position, "ledger_offset": offset(run_dir / "ledger.jsonl"),
                                           "buffer": {str(r): b for r, b in enumerate(buffers)}, "mode": cfg.mode})
                    prune_checkpoints(run_dir, cfg.checkpoint.keep_last)
                acc.wait_for_everyone()
                fault_point(f"{step}:after_checkpoint")
    finally:
        if prefetch is not None:
            prefetch.close()

    # ------------------------------------------------------------------ save
    bar.close()
    final_dir = run_dir / "final"
    if main:
        if step > start or not final_complete(final_dir):  # a torn final/ is rewritten from the checkpoint
            save_final(acc.unwrap_model(ddp_policy), tok, final_dir)
        sink.close()
        if lp.ledger is not None:
            lp.ledger.close()
    acc.wait_for_everyone()
    identical = weights_identical(acc, acc.unwrap_model(ddp_policy))  # data parallel: all-reduced -> equal
    rows = read_jsonl(run_dir / "metrics.jsonl") if (run_dir / "metrics.jsonl").exists() else []
    summary = summarise(rows, [r for r in rows if r.get("winrate_vs_init") is not None or "eval_wins" in r])
    summary.update(run_dir=str(run_dir), final_model=str(final_dir), mode=cfg.mode, loss=cfg.loss.name, beta=beta,
                   labels=cfg.loss.labels, label_filter=cfg.labels.model_dump(),
                   judge=None if offline else getattr(judge, "id", cfg.judge.kind),
                   processes=world, resumed_from=start if resume is not None else None, engine=engine.name,
                   engine_syncs=getattr(engine, "syncs", 0), engine_sync_seconds=round(getattr(engine, "sync_seconds", 0.0), 3))
    if identical is not None:
        summary["weights_identical_across_processes"] = identical
    if main:
        atomic_write_text(run_dir / "summary.json", json.dumps(summary, indent=2, default=str))
    return summary
