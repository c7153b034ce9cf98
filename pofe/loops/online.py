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

Modes: ``online`` (the above), ``iterative`` (steps 1-3 for the next K steps at once, then K
updates: the policy that labels is up to K-1 updates stale), ``offline`` (pairs from a fixed
preference file: the baseline OAIF is compared against). Steering the objective is only a
change of ``judge.template`` (Sec. 4.6: helpful -> helpful-short -> helpful-very-short).

The run folder holds ``config.yaml``, ``metrics.jsonl``, ``ledger.jsonl`` (every annotation,
appended the moment it exists), ``eval/`` (win rates vs the initial policy),
``checkpoints/step-N`` (exact resume) and ``final/`` (``save_pretrained``).
This module reads top to bottom: config -> sample & annotate -> evaluate -> run (setup ->
loop -> save); the logic lives in small functions the tests call directly.

Data parallel (built on accelerate; each process samples and labels its own prompts, the
gradients are all-reduced, process 0 writes the run folder)::

    torchrun --nproc_per_node 2 -m pofe.cli.main online --config C.yaml --set train.device=cpu  # CPU, gloo (tested)
    accelerate launch --num_processes 8 -m pofe.cli.main online --config C.yaml                # GPUs, DDP
    accelerate launch --config_file ds_zero2.yaml -m pofe.cli.main online --config C.yaml      # DeepSpeed ZeRO-1/2

A step then uses ``processes x train.batch_size x train.grad_accum`` prompts. FSDP and
ZeRO-3 shard the parameters, and sampling from the current policy needs them whole, so
they are refused with a clear error rather than hanging.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import signal
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Literal, Sequence

import torch

from pofe.config import PofeConfig
from pofe.data.preferences import load_preferences
from pofe.data.prompts import PromptCursor, load_prompts, split_heldout
from pofe.generation import SamplingConfig, generate, make_generator
from pofe.judges.registry import JudgeConfig, build_judge
from pofe.losses import DEFAULT_BETA, get_loss
from pofe.models import apply_chat_template, resolve_model_path
from pofe.records import Completion, Judgment, Prompt
from pofe.runs import JsonlWriter, RunConfig, atomic_write_text, new_run_dir, read_jsonl, write_config
from pofe.training import (ModelConfig, OptimConfig, Reference, latest_checkpoint, load_checkpoint, load_policy,
                           make_optimizer, make_scheduler, prune_checkpoints, save_checkpoint, save_final,
                           seed_everything)
from pofe.loops.dap import TokenPair, dap_backward
from pofe.loops.metrics import step_metrics, summarise
from pofe.training.tracking import LogConfig, MetricsSink, Progress

log = logging.getLogger(__name__)


# ============================================================================ config

class LossSettings(PofeConfig):
    """The DAP loss (OAIF Eq. 1-3)."""

    name: Literal["dpo", "ipo", "slic"] = "dpo"
    beta: float | None = None
    """None = the paper's value for the loss (Sec. 4.1): DPO 0.1, IPO 1.0, SLiC 0.002."""
    labels: Literal["hard", "soft"] = "hard"
    """hard: y+ = the response the judge prefers (the paper; exact ties p = 0.5 are skipped and
    counted). soft: train towards P(y1 > y2) = p itself (Bradley-Terry cross-entropy for DPO)."""

    @property
    def beta_value(self) -> float:
        return self.beta if self.beta is not None else DEFAULT_BETA[self.name]


class TrainSettings(PofeConfig):
    steps: int = 40
    """Optimiser steps."""
    batch_size: int = 4
    """Prompts per micro-batch per process (one pair per prompt)."""
    grad_accum: int = 1
    """Micro-batches per optimiser step; prompts per step per process = batch_size * grad_accum."""
    samples_per_prompt: int = 2
    """Responses sampled per prompt (OAIF: 2). With more, all pairs are judged and the best
    vs worst (by mean win probability) is trained on."""
    iterative_every: int = 4
    """mode=iterative: regenerate and relabel every K steps (K=1 is online)."""
    seed: int = 0
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """auto = CUDA when available. Data-parallel runs come from torchrun / accelerate launch."""


class DataSettings(PofeConfig):
    prompts: str | None = None
    """Prompt-only data (JSONL/TXT/CSV/parquet or a datasets name); None = built-in prompts."""
    prompt_field: str | None = None
    """Field holding the prompt (default: the first of prompt/instruction/question/text/input/messages)."""
    split: str | None = None
    max_prompts: int | None = None
    eval_prompts: str | None = None
    """Held-out prompts for the win rate; None = split off eval.num_prompts from data.prompts."""
    preferences: str | None = None
    """mode=offline: prompt/chosen/rejected[/p] data (a pofe ledger works too)."""


class EvalSettings(PofeConfig):
    every: int = 0
    """Win rate vs the initial policy every N steps (0 = only at the end)."""
    enabled: bool = True
    num_prompts: int = 16
    judge: JudgeConfig | None = None
    """Evaluation judge; None = the training judge. OAIF evaluates with a different model to
    avoid rewarding the annotator's quirks (Sec. 4.1: Gemini Pro judges, PaLM 2 annotates)."""
    sampling: SamplingConfig = SamplingConfig(temperature=0.0, max_new_tokens=48)
    """Greedy by default so that the win rate does not depend on sampling luck."""


class CheckpointSettings(PofeConfig):
    every: int = 0
    """Checkpoint every N steps (0 = only at the end)."""
    keep_last: int = 2


class OnlineConfig(PofeConfig):
    """``pofe online`` (OAIF Algorithm 1)."""

    mode: Literal["online", "iterative", "offline"] = "online"
    model: ModelConfig = ModelConfig()
    judge: JudgeConfig = JudgeConfig()
    """The annotator (any judge kind: llm, llamacpp, openai, length, reward-model, ...)."""
    sampling: SamplingConfig = SamplingConfig(max_new_tokens=48, temperature=0.9)
    loss: LossSettings = LossSettings()
    optim: OptimConfig = OptimConfig()
    train: TrainSettings = TrainSettings()
    data: DataSettings = DataSettings()
    eval: EvalSettings = EvalSettings()
    checkpoint: CheckpointSettings = CheckpointSettings()
    log: LogConfig = LogConfig()
    run: RunConfig = RunConfig()


# ============================================================================ sample & annotate

@dataclass
class Annotation:
    """One judged (or skipped) pair of sampled responses: a ledger row in the making."""

    pair_id: str
    step: int
    prompt: Prompt
    a: Completion
    b: Completion
    judgment: Judgment | None  # None when not judged (identical responses)
    selected: bool = True  # False: a round-robin comparison only used for ranking (n > 2)


def _prompt_input(p: Prompt):
    return list(p.messages) if p.messages else p.text


def sample_and_annotate(policy, tokenizer, judge, prompts: Sequence[Prompt], *, n: int, sampling: SamplingConfig,
                        step: int, rank: int = 0, judge_context: Callable = contextlib.nullcontext,
                        times: dict[str, float] | None = None) -> list[Annotation]:
    """Steps 2-3 of Algorithm 1 for a batch of prompts (the caller seeds the RNG).

    All ``n`` samples of all prompts come from one batched ``generate`` (KV cache), and all
    non-identical pairs go to the judge in one call (the judge scores both orders in one
    batch). Pairs with identical responses are not judged: they carry no preference and
    would give a zero DAP gradient (h = 0), so they are masked out and counted.
    """
    times = times if times is not None else {}
    t0 = time.perf_counter()
    groups = generate(policy, tokenizer, [_prompt_input(p) for p in prompts], n=n, sampling=sampling)
    times["generate"] = times.get("generate", 0.0) + time.perf_counter() - t0
    cands: list[Annotation] = []
    for i, (prompt, g) in enumerate(zip(prompts, groups)):
        for j in range(n):
            for k in range(j + 1, n):
                cands.append(Annotation(f"s{step}-r{rank}-{len(cands)}", step, prompt, g[j], g[k], None, n == 2))
    todo = [c for c in cands if c.a.text != c.b.text]
    t1 = time.perf_counter()
    if todo:
        with judge_context():
            verdicts = judge.judge([c.prompt.text for c in todo], [c.a.text for c in todo], [c.b.text for c in todo],
                                   references=[c.prompt.reference for c in todo])
        for c, v in zip(todo, verdicts):
            c.judgment = v
    times["judge"] = times.get("judge", 0.0) + time.perf_counter() - t1
    if n > 2:
        _select_best_vs_worst(cands, n)
    return cands


def _select_best_vs_worst(cands: list[Annotation], n: int) -> None:
    """Mark, per prompt, the (best, worst) comparison by mean round-robin win probability."""
    per = n * (n - 1) // 2
    for start in range(0, len(cands), per):
        group = cands[start:start + per]
        wins = [[] for _ in range(n)]
        index = [(j, k) for j in range(n) for k in range(j + 1, n)]
        for (j, k), c in zip(index, group):
            if c.judgment is not None and c.judgment.p is not None:
                wins[j].append(c.judgment.p)
                wins[k].append(1.0 - c.judgment.p)
        score = [sum(w) / len(w) if w else None for w in wins]
        scored = [i for i in range(n) if score[i] is not None]
        if len(scored) < 2:
            group[0].selected = True  # nothing usable: keep one row so the skip is counted
            continue
        best = max(scored, key=lambda i: score[i])
        worst = min(scored, key=lambda i: score[i])
        if best == worst:
            group[0].selected = True
            continue
        j, k = min(best, worst), max(best, worst)
        group[index.index((j, k))].selected = True


def label(ann: Annotation, labels: str) -> TokenPair | str:
    """The training pair of an annotation, or why it is skipped: identical / unlabelled /
    ties (hard labels only). Labels are never invented: a judge's p=None is skipped."""
    if ann.a.text == ann.b.text:
        return "identical"
    if ann.judgment is None or ann.judgment.p is None:
        return "unlabelled"
    p = float(ann.judgment.p)
    a, b = ann.a, ann.b
    if p < 0.5:  # orient so chosen = the preferred response (the soft losses are symmetric)
        a, b, p = b, a, 1.0 - p
    if labels == "hard":
        if p == 0.5:
            return "ties"
        p = 1.0
    return TokenPair(a.prompt_token_ids, a.token_ids, b.token_ids, p, ann.pair_id)


def ledger_row(ann: Annotation, rank: int, status: str) -> dict[str, Any]:
    j = ann.judgment
    row = {
        "kind": "annotation", "pair_id": ann.pair_id, "step": ann.step, "rank": rank,
        "prompt_id": ann.prompt.id, "prompt": ann.prompt.text,
        "response_a": ann.a.text, "response_b": ann.b.text,
        "len_a": ann.a.num_tokens, "len_b": ann.b.num_tokens,
        "p": None, "p_ab": None, "p_ba": None, "consistent": None, "parse_ok": None,
        "judge_id": None, "template_id": None, "template_hash": None, "principle_id": None,
        "status": status, "selected": ann.selected,
    }
    if j is not None:
        row.update(p=j.p, p_ab=j.p_ab, p_ba=j.p_ba, consistent=j.consistent, parse_ok=j.parse_ok,
                   judge_id=j.judge_id, template_id=j.template_id, template_hash=j.template_hash,
                   principle_id=j.principle_id, cached=j.cached, latency_s=round(j.latency_s, 4))
    return row


def label_annotations(anns: Sequence[Annotation], labels: str, rank: int) -> tuple[list[TokenPair], dict[str, int], list[dict]]:
    pairs, counts, rows = [], {"annotations": len(anns), "trained": 0, "identical": 0, "unlabelled": 0, "ties": 0}, []
    for ann in anns:
        out = label(ann, labels) if ann.selected else "ranking"
        if isinstance(out, TokenPair):
            pairs.append(out)
            counts["trained"] += 1
            status = "trained"
        else:
            status = out
            if out in counts:
                counts[out] += 1
        rows.append(ledger_row(ann, rank, status))
    return pairs, counts, rows


def tokenize_pair(tokenizer, pair, eos_id: int, cache: dict, labels: str = "hard") -> TokenPair | None:
    """Offline pairs: tokenise once (cached by text) in the same layout as sampled ones:
    chat-rendered prompt ids + response ids + EOS. Labels follow the same rule as online
    ones (oriented to the preferred response; hard: p -> 1, a tie p = 0.5 gives None)."""
    chosen, rejected, p = pair.chosen, pair.rejected, float(pair.p)
    if p < 0.5:
        chosen, rejected, p = rejected, chosen, 1.0 - p
    if labels == "hard":
        if p == 0.5:
            return None
        p = 1.0

    def ids(text: str, prompt: bool) -> tuple[int, ...]:
        key = (prompt, text)
        if key not in cache:
            if prompt:
                cache[key] = tuple(tokenizer(apply_chat_template(tokenizer, text), add_special_tokens=False)["input_ids"])
            else:
                cache[key] = tuple(tokenizer(text, add_special_tokens=False)["input_ids"]) + (eos_id,)
        return cache[key]
    return TokenPair(ids(pair.prompt, True), ids(chosen, False), ids(rejected, False), p,
                     str(pair.provenance.get("pair_id") or pair.provenance.get("source", "")))


# ============================================================================ evaluation

def winrate(judge, prompts: Sequence[Prompt], current: Sequence[Completion], initial: Sequence[Completion],
            judge_context: Callable = contextlib.nullcontext) -> tuple[dict[str, int], list[dict]]:
    """Win / tie / loss counts of the current policy (A) against the initial one (B); the
    judge scores both orders. Identical responses are ties without a judge call; a judge
    p=None is counted as unlabelled and left out of the rate."""
    counts = {"wins": 0, "ties": 0, "losses": 0, "unlabelled": 0}
    rows = [{"prompt": p.text, "current": c.text, "initial": i.text, "len_current": c.num_tokens,
             "len_initial": i.num_tokens, "p": None} for p, c, i in zip(prompts, current, initial)]
    todo = [k for k, r in enumerate(rows) if r["current"] != r["initial"]]
    verdicts = []
    if todo:
        with judge_context():
            verdicts = judge.judge([prompts[k].text for k in todo], [rows[k]["current"] for k in todo],
                                   [rows[k]["initial"] for k in todo], references=[prompts[k].reference for k in todo])
    for k, v in zip(todo, verdicts):
        rows[k]["p"] = v.p
    for k, r in enumerate(rows):
        if r["current"] == r["initial"]:
            counts["ties"] += 1
        elif r["p"] is None:
            counts["unlabelled"] += 1
        else:
            counts["wins" if r["p"] > 0.5 else "losses" if r["p"] < 0.5 else "ties"] += 1
    return counts, rows


def winrate_value(counts: dict[str, int]) -> float | None:
    n = counts["wins"] + counts["ties"] + counts["losses"]
    return (counts["wins"] + 0.5 * counts["ties"]) / n if n else None


# ============================================================================ helpers

def step_seed(seed: int, step: int, rank: int) -> int:
    """Every step reseeds from (seed, step, rank): a resumed run samples exactly what the
    uninterrupted one did, and each process samples different responses."""
    return int.from_bytes(hashlib.sha256(f"{seed}/{step}/{rank}".encode()).digest()[:4], "little")


def same_model(a: str, b: str) -> bool:
    try:
        return os.path.realpath(resolve_model_path(a)) == os.path.realpath(resolve_model_path(b))
    except Exception:
        return a == b


def build_annotator(jcfg: JudgeConfig, *, cfg: OnlineConfig, reference: Reference, tokenizer):
    """The judge and the context its calls run in. An LLM annotator with the same weights as
    the initial policy shares them: the reference module (the frozen copy, or the LoRA policy
    with its adapter disabled inside ``reference.model()``), so no third copy is loaded. It
    is pi_0, never the current policy: OAIF's annotator is frozen (self-rewarding is another
    command)."""
    if jcfg.kind == "llm" and same_model(jcfg.model, cfg.model.name) and jcfg.dtype == cfg.model.dtype:
        # cache_tag: these weights never change (pi_0), so the judge cache may reuse reads.
        return build_judge(jcfg, model=reference.module, tokenizer=tokenizer, cache_tag="initial-policy"), reference.model
    return build_judge(jcfg), contextlib.nullcontext


def _gather(acc, obj) -> list:
    """Objects from all processes (a list with one entry per process)."""
    if acc.num_processes == 1:
        return [obj]
    from accelerate.utils import gather_object

    return gather_object([obj])


def _reduce_sum(acc, x: float) -> float:
    if acc.num_processes == 1:
        return float(x)
    t = torch.tensor([float(x)], dtype=torch.float64, device=acc.device)
    return float(acc.reduce(t, reduction="sum").item())


def _fault(step: int, phase: str) -> None:
    """Fault injection for the crash-resume tests: POFE_FAULT=STEP:PHASE sends SIGKILL to this
    process (no cleanup, no flush beyond what the loop already did)."""
    if os.environ.get("POFE_FAULT") == f"{step}:{phase}":
        os.kill(os.getpid(), signal.SIGKILL)


def resume_files(run_dir: Path, step: int, ledger_offset: int) -> None:
    """Make the run folder agree with the checkpoint at ``step``: ledger rows written after
    it (labelled but not trained when the crash came) move to ``ledger.after-crash-*.jsonl``
    (kept, never deleted); metrics rows after ``step`` are dropped (they will be recomputed
    identically)."""
    ledger = run_dir / "ledger.jsonl"
    if ledger.exists() and ledger.stat().st_size > ledger_offset:
        with open(ledger, "rb") as f:
            f.seek(ledger_offset)
            tail = f.read()
        (run_dir / f"ledger.after-crash-{int(time.time())}.jsonl").write_bytes(tail)
        with open(ledger, "rb+") as f:
            f.truncate(ledger_offset)
    metrics = run_dir / "metrics.jsonl"
    if metrics.exists():
        keep = [r for r in read_jsonl(metrics) if int(r.get("step", 0)) <= step]
        atomic_write_text(metrics, "".join(json.dumps(r) + "\n" for r in keep))


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
        train_prompts, eval_prompts = split_heldout(prompts, cfg.eval.num_prompts if cfg.eval.enabled else 0, cfg.train.seed)
    if cfg.mode == "offline":
        if not cfg.data.preferences:
            raise ValueError("mode=offline needs data.preferences (a prompt/chosen/rejected file)")
        return load_preferences(cfg.data.preferences).pairs, eval_prompts
    return train_prompts, eval_prompts


def _accelerator(cfg: OnlineConfig):
    from accelerate import Accelerator
    from accelerate.utils import DistributedType

    cpu = cfg.train.device == "cpu" or (cfg.train.device == "auto" and not torch.cuda.is_available())
    acc = Accelerator(cpu=cpu)
    ds = getattr(acc.state, "deepspeed_plugin", None)
    if acc.distributed_type == DistributedType.FSDP or (ds is not None and getattr(ds, "zero_stage", 0) == 3):
        raise NotImplementedError("pofe online samples from the current policy, which needs whole parameters: "
                                  "use DDP or DeepSpeed ZeRO-1/2 (FSDP and ZeRO-3 shard them)")
    return acc


def _eval_now(cfg: OnlineConfig, step: int) -> bool:
    return cfg.eval.enabled and (step == cfg.train.steps or (cfg.eval.every > 0 and step % cfg.eval.every == 0))


# ============================================================================ the loop

def run(cfg: OnlineConfig, *, resume: str | Path | None = None, model=None, tokenizer=None, judge=None,
        eval_judge=None, require_audit: str | Path | None = None) -> dict[str, Any]:
    """Run OAIF Algorithm 1 (or its offline / iterative variants); returns the summary.

    Args:
        resume: a run folder to continue from its latest checkpoint (config from ``cfg``).
        model, tokenizer: an in-memory policy instead of loading ``cfg.model.name``.
        judge, eval_judge: in-memory judges instead of building ``cfg.judge`` / ``cfg.eval.judge``.
        require_audit: an audit report of the annotator; refuse to train (``AuditError``)
            unless it passed for this very judge.
    """
    # ------------------------------------------------------------------ setup
    if cfg.mode != "offline" and cfg.sampling.temperature <= 0:
        raise ValueError("sampling.temperature must be > 0 for online feedback: greedy samples of a prompt are identical")
    offline = cfg.mode == "offline"
    items, eval_prompts = load_data(cfg)  # first: a bad file fails in a second, before any run folder
    acc = _accelerator(cfg)
    rank, world, main = acc.process_index, acc.num_processes, acc.is_main_process
    if resume is not None:
        run_dir = Path(resume)
    else:
        run_dir = _gather(acc, str(new_run_dir(cfg.run, "online")) if main else None)[0]
        run_dir = Path(run_dir)
    if main:
        write_config(run_dir, cfg)
    seed_everything(cfg.train.seed)  # same LoRA init on every process
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
    loss_fn, beta, n_prompts = get_loss(cfg.loss.name), cfg.loss.beta_value, cfg.train.batch_size * cfg.train.grad_accum

    cursor = PromptCursor(items, cfg.train.seed, int(state.get("cursor", 0)))  # each process slices every draw
    eos_id = tok.eos_token_id
    tok_cache: dict = {}
    buffer: list[list[TokenPair]] = [[TokenPair.from_dict(d) for d in s] for s in state.get("buffer", {}).get(str(rank), [])]

    # judges: the annotator (not needed offline) and the evaluation judge
    judge_ctx = eval_ctx = contextlib.nullcontext
    if judge is None and not offline:
        judge, judge_ctx = build_annotator(cfg.judge, cfg=cfg, reference=reference, tokenizer=tok)
    if require_audit is not None and judge is not None:
        from pofe.evaluation.audit import require_audit as _require_audit

        _require_audit(require_audit, judge_id=judge.id)
    if eval_judge is None and cfg.eval.enabled:
        if cfg.eval.judge is None and judge is not None:
            eval_judge, eval_ctx = judge, judge_ctx
        else:
            eval_judge, eval_ctx = build_annotator(cfg.eval.judge or cfg.judge, cfg=cfg, reference=reference, tokenizer=tok)
    my_eval = eval_prompts[rank::world] if cfg.eval.enabled else []
    init_responses: list[Completion] = []
    if my_eval:  # the initial policy's responses, once (greedy: identical after a resume)
        seed_everything(cfg.train.seed)
        with reference.model() as pi0:
            init_responses = [g[0] for g in generate(pi0, tok, [_prompt_input(p) for p in my_eval], n=1, sampling=cfg.eval.sampling)]

    sink = MetricsSink(run_dir, cfg.log, config=cfg.model_dump(mode="json")) if main else None
    ledger = JsonlWriter(run_dir / "ledger.jsonl") if main and not offline else None
    bar = Progress(cfg.log, total=cfg.train.steps, initial=start, desc=f"pofe {cfg.mode}", main=main,
                   show=(("loss", "loss", "{:.3f}"), ("mean_len", "len", "{:.1f}"), ("mean_p", "p", "{:.2f}"),
                         ("winrate_vs_init", "win", "{:.2f}")))

    # ------------------------------------------------------------------ loop (Algorithm 1)
    step = start
    for step in range(start + 1, cfg.train.steps + 1):
        seed_everything(step_seed(cfg.train.seed, step, rank))
        t_step = time.perf_counter()
        times: dict[str, float] = {}
        anns_rows: list[dict] = []
        counts = {"annotations": 0, "trained": 0, "identical": 0, "unlabelled": 0, "ties": 0}
        gen_tokens = gen_chars = samples = 0
        staleness = step - 1 - last_sync  # optimiser steps the sampling weights lag behind (hf: 0)

        # 1-3. prompts -> two samples from pi_theta_t -> AI feedback (or pairs from the file)
        if offline:
            drawn = [tokenize_pair(tok, pp, eos_id, tok_cache, cfg.loss.labels) for pp in cursor.take(world * n_prompts)[rank::world]]
            pairs = [pp for pp in drawn if pp is not None]
            counts.update(trained=len(pairs), ties=len(drawn) - len(pairs))
        else:
            if not buffer:
                k = cfg.train.iterative_every if cfg.mode == "iterative" else 1
                batch = cursor.take(world * n_prompts * k)[rank * n_prompts * k:(rank + 1) * n_prompts * k]
                anns = sample_and_annotate(acc.unwrap_model(ddp_policy), tok, judge, batch, n=cfg.train.samples_per_prompt,
                                           sampling=cfg.sampling, step=step, rank=rank, judge_context=judge_ctx, times=times)
                per = len(anns) // k
                for s in range(k):  # one slice of annotations per coming step
                    p_s, c_s, rows_s = label_annotations(anns[s * per:(s + 1) * per], cfg.loss.labels, rank)
                    buffer.append(p_s)
                    counts = {key: counts[key] + c_s[key] for key in counts}
                    anns_rows.extend(rows_s)
                samples = len(batch) * cfg.train.samples_per_prompt
                gen_tokens, gen_chars = _unique_lengths(anns)
                # the ledger gets every annotation now, before training: a crash loses nothing labelled
                rows_all = [r for rs in _gather(acc, anns_rows) for r in rs]
                if ledger is not None:
                    for r in rows_all:
                        ledger.write(r)
                anns_rows = rows_all
            pairs = buffer.pop(0)
            counts["trained"] = len(pairs)
        _fault(step, "after_judge")

        # 4. the DAP update on this process's pairs; gradients averaged over processes
        n_global = _reduce_sum(acc, len(pairs))
        grad_norm, res = None, None
        if n_global > 0:
            res = dap_backward(ddp_policy, reference, pairs, loss_fn=loss_fn, beta=beta, micro_batches=cfg.train.grad_accum,
                               normaliser=n_global / world, pad_token_id=tok.pad_token_id, backward=acc.backward,
                               no_sync=lambda: acc.no_sync(ddp_policy), lockstep=world > 1, device=acc.device)
            t_opt = time.perf_counter()
            if cfg.optim.grad_clip:
                grad_norm = float(acc.clip_grad_norm_(ddp_policy.parameters(), cfg.optim.grad_clip))
            optimizer.step()
            times.update(reference=res.time_ref, policy=res.time_policy, optimizer=time.perf_counter() - t_opt)
        optimizer.zero_grad(set_to_none=True)
        if engine.name == "hf":
            last_sync = step  # samples from the updated tensors themselves
        elif step % sync_every == 0 or step == cfg.train.steps or _eval_now(cfg, step):
            times["sync"] = engine.sync() if engine.stale else 0.0  # raises EngineSyncError: the run stops
            last_sync = step
        lr = scheduler.get_last_lr()[0]
        with warnings.catch_warnings():  # a step with no labelled pair skips optimizer.step(), not the schedule
            warnings.simplefilter("ignore", UserWarning)
            scheduler.step()
        times["step"] = time.perf_counter() - t_step

        # log: per-pair losses to the ledger, one metrics row, the progress bar
        pair_stats = [ps for r in _gather(acc, res.pairs if res else []) for ps in r]
        g_counts = {k: int(_reduce_sum(acc, v)) for k, v in counts.items()}
        g_tokens, g_chars, g_samples = (_reduce_sum(acc, x) for x in (gen_tokens, gen_chars, samples))
        if main:
            if ledger is not None:
                for ps in pair_stats:
                    ledger.write({"kind": "loss", "pair_id": ps.pair_id, "step": step, "loss": ps.loss,
                                  "margin": ps.margin, "p": ps.p})
            row = step_metrics(step=step, annotations=anns_rows, pairs=pair_stats, counts=g_counts, times=times,
                               gen_tokens=int(g_tokens), gen_chars=int(g_chars), num_samples=int(g_samples), lr=lr,
                               grad_norm=grad_norm)
            row.update(engine=engine.name, time_sync=times.get("sync", 0.0), staleness=max(0, staleness),
                       engine_syncs=getattr(engine, "syncs", 0))
        if _eval_now(cfg, step):
            ev = _evaluate(cfg, acc, ddp_policy, tok, eval_judge, eval_ctx, my_eval, init_responses, run_dir, step)
            if main:
                row.update(ev)
        if main:
            sink.write(row)
            bar.update(row)

        # checkpoint: everything an exact resume needs, written atomically
        if step == cfg.train.steps or (cfg.checkpoint.every > 0 and step % cfg.checkpoint.every == 0):
            buffers = _gather(acc, [[p.to_dict() for p in s] for s in buffer])
            if main:
                save_checkpoint(run_dir / "checkpoints" / f"step-{step}", model=acc.unwrap_model(ddp_policy),
                                optimizer=optimizer, scheduler=scheduler, step=step,
                                state={"cursor": cursor.position, "ledger_offset": _offset(run_dir / "ledger.jsonl"),
                                       "buffer": {str(r): b for r, b in enumerate(buffers)}, "mode": cfg.mode})
                prune_checkpoints(run_dir, cfg.checkpoint.keep_last)
            acc.wait_for_everyone()
            _fault(step, "after_checkpoint")

    # ------------------------------------------------------------------ save
    bar.close()
    final_dir = run_dir / "final"
    if main:
        if step > start or not final_dir.exists():
            save_final(acc.unwrap_model(ddp_policy), tok, final_dir)
        sink.close()
        if ledger is not None:
            ledger.close()
    acc.wait_for_everyone()
    # data parallel: every process must end with the same weights (gradients all-reduced)
    digests = _gather(acc, weights_digest(acc.unwrap_model(ddp_policy))) if world > 1 else None
    rows = read_jsonl(run_dir / "metrics.jsonl") if (run_dir / "metrics.jsonl").exists() else []
    summary = summarise(rows, [r for r in rows if r.get("winrate_vs_init") is not None or "eval_wins" in r])
    summary.update(run_dir=str(run_dir), final_model=str(final_dir), mode=cfg.mode, loss=cfg.loss.name, beta=beta,
                   labels=cfg.loss.labels, judge=None if offline else getattr(judge, "id", cfg.judge.kind),
                   processes=world, resumed_from=start if resume is not None else None, engine=engine.name,
                   engine_syncs=getattr(engine, "syncs", 0), engine_sync_seconds=round(getattr(engine, "sync_seconds", 0.0), 3))
    if digests is not None:
        summary["weights_identical_across_processes"] = len(set(digests)) == 1
        if len(set(digests)) != 1:
            log.error("processes ended with different weights: %s", digests)
    if main:
        atomic_write_text(run_dir / "summary.json", json.dumps(summary, indent=2, default=str))
    return summary


def weights_digest(model) -> str:
    """sha256 of the trainable weights (to check that data-parallel copies agree)."""
    h = hashlib.sha256()
    for name, p in sorted(model.named_parameters()):
        if p.requires_grad:
            h.update(name.encode())
            h.update(p.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def _unique_lengths(anns: Sequence[Annotation]) -> tuple[int, int]:
    """Total (tokens, characters) of the distinct sampled responses (n > 2 repeats them in pairs)."""
    seen: dict[int, Completion] = {}
    for a in anns:
        seen[id(a.a)], seen[id(a.b)] = a.a, a.b
    return sum(c.num_tokens for c in seen.values()), sum(len(c.text) for c in seen.values())


def _offset(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


def _evaluate(cfg, acc, ddp_policy, tok, judge, judge_ctx, prompts, init_responses, run_dir: Path, step: int) -> dict:
    """Win rate of the current policy vs the initial one on held-out prompts (sharded over
    processes, counts summed). Rows go to ``eval/step-N.jsonl``."""
    t0 = time.perf_counter()
    counts, rows = {"wins": 0, "ties": 0, "losses": 0, "unlabelled": 0}, []
    mean_len = 0.0
    if prompts:
        with torch.random.fork_rng(devices=[]):  # evaluation must not move the training RNG
            torch.manual_seed(cfg.train.seed + 1)
            current = [g[0] for g in generate(acc.unwrap_model(ddp_policy), tok, [_prompt_input(p) for p in prompts],
                                              n=1, sampling=cfg.eval.sampling)]
        counts, rows = winrate(judge, prompts, current, init_responses, judge_context=judge_ctx)
        mean_len = sum(c.num_tokens for c in current)
    g = {k: int(_reduce_sum(acc, v)) for k, v in counts.items()}
    n_eval, tot_len = _reduce_sum(acc, len(prompts)), _reduce_sum(acc, mean_len)
    all_rows = [r for rs in _gather(acc, rows) for r in rs]
    if acc.is_main_process:
        path = run_dir / "eval" / f"step-{step}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        with JsonlWriter(path) as w:
            for r in all_rows:
                w.write(r)
    return {"winrate_vs_init": winrate_value(g), "eval_wins": g["wins"], "eval_ties": g["ties"],
            "eval_losses": g["losses"], "eval_unlabelled": g["unlabelled"],
            "eval_mean_len": tot_len / n_eval if n_eval else None, "time_eval": time.perf_counter() - t0}
