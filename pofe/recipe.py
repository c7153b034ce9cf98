"""The one driver every training command runs on (torchtune's recipe interface, nanochat's
linear loop): a command supplies a :class:`Recipe` -- how to read its data, build its models,
take one step, and what its summary adds -- and :func:`drive` owns everything around it:

* the run folder (``config.yaml``, ``run.json`` naming the command and pofe version), opened
  only after the data has been read, so a bad file fails before any folder exists;
* the ``--require-audit`` gate, before any model loads;
* resume: the latest checkpoint loaded into the recipe's model/optimiser/scheduler, and one
  rewind of ``metrics.jsonl`` and of the recipe's append-only outputs to that checkpoint
  (rows written after it are moved to ``<name>.after-crash-<time>.jsonl``, kept, never
  deleted: a resumed run recomputes them, every step reseeding from ``(seed, step)``);
* checkpoint cadence (``checkpoint.every``, and the last step) and retention
  (``checkpoint.keep_last``);
* the metrics sink (``metrics.jsonl``, TensorBoard / W&B / MLflow) and the progress bar, both
  closed in ``finally`` whatever the loop raised;
* ``final/`` (rewritten from the checkpoint when a crash tore it) and ``summary.json`` with the
  same keys in every command: ``command``, ``run_dir``, ``final_model``, ``steps``,
  ``steps_run``, ``resumed_from``, ``seconds``, then the recipe's own (and ``audit``, the
  ``--require-audit`` verdict, when the run was gated; ``hub`` after a push);
* ``final/README.md``, the model card (:func:`pofe.hub.model_card`), once ``summary.json`` is
  written, and the upload of ``final/`` to ``run.push_to_hub`` (checked before the run starts:
  a command without ``final/``, offline mode, no token; the trackers' packages likewise).

A recipe reads top to bottom as its paper's algorithm: ``setup`` → ``step`` (called for
``step = start+1 .. total_steps``) → ``summary``. Commands without weights (``label``, ``cai
revise``) leave ``model`` None: their checkpoint holds only their state and output offsets.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol

from pydantic import Field

from pofe.config import PofeConfig
from pofe.runs import (JsonlWriter, atomic_write_bytes, atomic_write_text, open_run, open_run_file, read_jsonl,
                       read_run_bytes, write_config)

log = logging.getLogger(__name__)


class CheckpointConfig(PofeConfig):
    """When to write ``checkpoints/step-N`` (everything an exact ``--resume`` needs)."""

    every: int = Field(0, ge=0)
    """Checkpoint every N steps (0 = only at the last step)."""
    keep_last: int = Field(2, ge=0)
    """Checkpoints kept on disk (0 keeps all)."""


class Meter(Protocol):
    """What the driver asks once each step's row is in ``metrics.jsonl``, before that step's
    checkpoint, on every process: :class:`pofe.judges.usage.BudgetMeter` (a spent
    ``judge.budget``), :class:`pofe.evaluation.drift.DriftMonitor` (``audit.on_drift: stop``),
    self-reward's chain (an iteration's marker, which must never exist without its row). A
    recipe registers its meters in setup with :meth:`RunContext.meter`."""

    def after_row(self, step: int) -> Any:
        """A :class:`pofe.errors.PofeError` ending the run cleanly after ``step`` (every process
        returns the same), else None: the driver writes that step's checkpoint and ``summary.json``
        (with ``stopped``), no ``final/``, then raises it, so ``--resume`` continues from it."""


@dataclass
class RunContext:
    """What a recipe sees of the run: its folder, whether it resumes, the processes."""

    dir: Path
    resumed: bool
    acc: Any = None
    """accelerate's Accelerator for data-parallel recipes (None: one process)."""
    start: int = 0
    """Steps already done (the checkpoint's step; 0 for a new run)."""
    state: dict[str, Any] = field(default_factory=dict)
    """The recipe's own checkpoint state (``Recipe.checkpoint_state`` when it was written)."""
    mean: bool = False
    """Under DeepSpeed ZeRO: the recipe's gradients are averaged over processes (``shard(mean=True)``)."""
    recipe: Any = None
    loaded: bool = False
    """Whether :meth:`restore_checkpoint` has run (a new run's has nothing to load)."""
    kept: dict[str, Any] = field(default_factory=dict)
    """Values every checkpoint keeps for the driver (:meth:`measured_before`)."""
    meters: list[Any] = field(default_factory=list)
    """What the driver asks after each step's row (:class:`Meter`), in the order registered."""
    closing: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)
    """What the driver closes when the run ends, whatever it raised: writers and engines, last first."""

    def restore_checkpoint(self) -> None:
        """Load the latest checkpoint into what setup has built (``recipe.model``, ``optimizer``,
        ``scheduler``) and rewind ``metrics.jsonl`` and the recipe's ``outputs`` to it; sets
        :attr:`start` and :attr:`state`. Setup calls it once those exist, and builds what depends
        on the resumed weights or state after it (online's engine copies the resumed weights); the
        driver calls it after a setup that did not. Under DeepSpeed ZeRO the engine is built here,
        around setup's optimiser. A new run loads nothing."""
        if self.loaded:
            raise RuntimeError(f"{self.recipe.command}: restore_checkpoint called twice")
        self.loaded = True
        _zero_engine(self, self.recipe)
        if not self.resumed:
            return
        _load(self, self.recipe)
        if self.main:
            rewind(self.dir, self.start, self.state.get("outputs", {}), self.recipe.outputs)
        self.wait()
        if self.start:
            log.info("%s: resuming %s at step %d", self.recipe.command, self.dir, self.start)

    def writer(self, name: str) -> JsonlWriter | None:
        """The append-only writer of ``name``, one of the recipe's ``outputs``, opened after the
        rewind (so a resume appends after the checkpoint's rows) and closed by the driver; None on
        processes other than rank 0, which write nothing in the run folder."""
        if name not in self.recipe.outputs:
            raise ValueError(f"{self.recipe.command}: {name!r} is not one of the recipe's outputs {self.recipe.outputs}")
        if not self.loaded:
            raise RuntimeError(f"{self.recipe.command}: open {name} after restore_checkpoint (the rewind)")
        if not self.main:
            return None
        return self.closing.enter_context(JsonlWriter(self.dir / name))

    def measured_before(self, key: str, compute) -> Any:
        """``compute()`` on a run at step 0 -- a measurement of the untrained model, such as
        ``eval_before`` -- and the checkpoint's value on a resume past it; the driver keeps it in
        every checkpoint under ``key``. Called after :meth:`restore_checkpoint`."""
        if not self.loaded:
            raise RuntimeError(f"{self.recipe.command}: {key} is read after restore_checkpoint")
        value = compute() if self.start == 0 else self.state.get(key)
        self.kept[key] = value
        return value

    def on_close(self, fn) -> None:
        """Call ``fn()`` when the run ends (engines, threads), before the writers opened earlier."""
        self.closing.callback(fn)

    def meter(self, m: "Meter") -> None:
        """Ask ``m`` after every step's row (a judge budget, a drift monitor)."""
        self.meters.append(m)

    def after_row(self, step: int):
        """Every meter asked after ``step``'s row; the first stop, else None."""
        stops = [m.after_row(step) for m in self.meters]  # each one: a meter may record as well as stop
        return next((s for s in stops if s is not None), None)

    @property
    def dp(self):
        """This process's :class:`pofe.runtime.parallel.DataParallel` (shards, sums, gradient all-reduce)."""
        from pofe.runtime.parallel import DataParallel

        return DataParallel(self.acc)

    @property
    def main(self) -> bool:
        return self.dp.main

    @property
    def rank(self) -> int:
        return self.dp.rank

    @property
    def world(self) -> int:
        return self.dp.world

    def wait(self) -> None:
        self.dp.wait()

    @property
    def sharded(self) -> bool:
        """Whether the model is sharded over the processes (an FSDP2 launch, :mod:`pofe.runtime.sharding`)."""
        return self.dp.sharded

    def shard(self, model, *, mean: bool = False):
        """``model`` sharded over the processes under an FSDP2 launch, else ``model`` itself (under
        DeepSpeed ZeRO the driver builds the engine once setup has built the optimiser): called
        once the model is on its device and before its optimiser is built (sharding replaces the
        parameters). Gradients are summed over processes (``mean``: averaged, as DDP does)."""
        self.mean = mean  # under ZeRO the driver builds the engine after setup, around the optimiser
        if not self.sharded or self.dp.zero:
            return model
        from pofe.runtime.sharding import shard_model

        return shard_model(model, mean=mean)


class Recipe:
    """A command's part. Subclasses set ``command`` and implement :meth:`setup` and :meth:`step`;
    everything else has a default. ``setup`` sets ``model`` (None: nothing to save),
    ``tokenizer``, ``optimizer``, ``scheduler`` and ``total_steps``."""

    command: ClassVar[str] = ""
    outputs: ClassVar[tuple[str, ...]] = ()
    """Append-only files in the run folder (e.g. ``ledger.jsonl``) rewound to their size at the checkpoint."""
    show: ClassVar[tuple[tuple[str, str, str], ...]] = ()
    """Progress-bar fields: (metrics key, label, format)."""
    step_faults: ClassVar[tuple[str, ...]] = ()
    """More names for the ``<step>:after_step`` fault point (a command's own older name for it, e.g.
    label's ``after_batch``), so crash tests written against the command keep reaching it."""
    resumable: ClassVar[bool] = True
    """False: no checkpoints (a command whose output is redone whole, e.g. ``pofe judge``)."""
    writes_final: ClassVar[bool] = True
    """False: the command writes no ``final/`` model (``run.push_to_hub`` is refused before it runs)."""
    data_parallel: ClassVar[bool] = False
    """True: the driver builds an accelerator (``model.device``), only rank 0 writes the run folder,
    and the recipe shards each step over ``run.dp`` (False: ``WORLD_SIZE > 1`` is refused)."""

    model: Any = None
    tokenizer: Any = None
    optimizer: Any = None
    scheduler: Any = None
    total_steps: int = 0

    def __init__(self, cfg: PofeConfig):
        self.cfg = cfg

    # -- phases, in the order the driver calls them
    def load_data(self) -> None:
        """Read and check the inputs (before the run folder exists and before any model loads)."""

    def audit_identity(self) -> dict[str, Any] | None:
        """The identity ``--require-audit`` checks the report against (None: nothing to gate)."""
        return None

    def setup(self, run: RunContext) -> None:
        """Build the models, optimiser and scheduler; call ``run.restore_checkpoint()`` once they exist
        (the driver calls it after a setup that did not) and build what the resumed weights or
        state decide after it. Open the ``outputs`` with ``run.writer``, register meters with
        ``run.meter`` and what must be released (engines, threads) with ``run.on_close``."""
        raise NotImplementedError

    def step(self, step: int) -> dict[str, Any]:
        """One step; returns its metrics row (without ``step``). Called on every process."""
        raise NotImplementedError

    def checkpoint_state(self) -> dict[str, Any]:
        """The recipe's own plain-JSON state an exact resume needs (called on every process)."""
        return {}

    def summary(self, history: list[dict[str, Any]]) -> dict[str, Any]:
        """The summary's command-specific keys, from the whole run's ``metrics.jsonl`` rows."""
        return {}

    def save_final(self, out: Path) -> Path | None:
        """Write ``final/`` (rank 0 only); the default saves ``model`` with ``tokenizer`` atomically,
        and nothing for a recipe without weights (returns None)."""
        if self.model is None:
            return None
        from pofe.runtime.checkpoints import save_final

        return save_final(self.model, self.tokenizer, out)


# ----------------------------------------------------------------------------- resume

def checkpoint_due(every: int, step: int, total: int) -> bool:
    """A checkpoint at the last step (``final/`` can be rewritten from it) and every ``every`` steps."""
    return step == total or bool(every and step % every == 0)


def output_sizes(run_dir: Path, names: tuple[str, ...]) -> dict[str, int]:
    """Bytes of each append-only output now: what a checkpoint records."""
    return {n: (os.path.getsize(run_dir / n) if os.path.lexists(run_dir / n) else 0) for n in names}


def rewind_output(path: Path, size: int) -> int:
    """Cut ``path`` back to ``size`` bytes; the cut tail goes to ``<stem>.after-crash-<time><suffix>``
    (kept, never deleted). Returns the bytes moved."""
    if not os.path.lexists(path):
        return 0
    fd = open_run_file(path, os.O_RDWR)  # never through a link: its target is not the run's
    with os.fdopen(fd, "rb+") as f:
        have = os.fstat(f.fileno()).st_size
        if have <= size:
            return 0
        f.seek(size)
        tail = f.read()
        atomic_write_bytes(path.with_name(f"{path.stem}.after-crash-{int(time.time())}{path.suffix}"), tail)
        f.truncate(size)
        f.flush()
        os.fsync(f.fileno())
    return len(tail)


def rewind_metrics(path: Path, step: int) -> int:
    """Keep only the rows of ``metrics.jsonl`` whose ``step`` is at most ``step`` (and cut a torn last
    line); returns how many were dropped. A resumed run recomputes them identically."""
    from pofe.jsonl import json_lines

    if not os.path.lexists(path):  # a planted link is refused by read_jsonl, never skipped or followed
        return 0
    rows = read_jsonl(path)
    keep = [r for r in rows if int(r.get("step", 0)) <= step]
    if len(keep) != len(rows) or read_run_bytes(path)[-1:] not in (b"\n", b""):
        atomic_write_text(path, json_lines(keep))
    return len(rows) - len(keep)


def rewind(run_dir: Path, step: int, sizes: dict[str, int], names: tuple[str, ...]) -> None:
    """Make the run folder agree with the checkpoint at ``step``: metrics rows after it dropped,
    each append-only output cut back to its recorded size (0 when the checkpoint predates it)."""
    for n in names:
        rewind_output(run_dir / n, int(sizes.get(n, 0)))
    rewind_metrics(run_dir / "metrics.jsonl", step)


def _load(run: RunContext, recipe: Recipe) -> None:
    from pofe.runtime.checkpoints import check_outputs, check_processes, load_checkpoint, resume_point

    # the newest checkpoint that matches its manifest (a damaged one is passed over, saying so), and
    # the outputs it counted still whole: checked before anything is loaded or rewound
    ckpt = resume_point(run.dir)
    if ckpt is None:
        return
    run_cfg = getattr(recipe.cfg, "run", None)
    check_processes(ckpt, run.world, allow=bool(getattr(run_cfg, "allow_world_change", False)))
    check_outputs(run.dir, ckpt, recipe.outputs)
    info = load_checkpoint(ckpt, model=recipe.model, optimizer=recipe.optimizer, scheduler=recipe.scheduler,
                           verify=False)
    run.start, run.state = int(info["step"]), dict(info["state"])


def _full_state(run: RunContext, recipe: Recipe) -> dict[str, Any]:
    """Under sharding, the whole trained weights and optimiser state, gathered by every process (a
    collective) and kept by rank 0 to write in the one checkpoint format; else nothing (read at save)."""
    if not run.sharded or recipe.model is None:
        return {}
    if run.dp.zero:
        from pofe.runtime import zero

        names = {n for n, p in recipe.model.module.named_parameters() if p.requires_grad}
        out = {"model_state": zero.full_model_state(recipe.model, names, keep=run.main, master=True)}
        if recipe.optimizer is not None:
            out["optimizer_state"] = zero.full_optimizer_state(recipe.optimizer, keep=run.main)
        return out
    from pofe.runtime.sharding import full_model_state, full_optimizer_state

    model = recipe.model
    names = {n for n, p in model.named_parameters() if p.requires_grad}
    out: dict[str, Any] = {"model_state": full_model_state(model, names, keep=run.main)}
    if recipe.optimizer is not None:
        out["optimizer_state"] = full_optimizer_state(model, recipe.optimizer, keep=run.main)
    return out


def _zero_engine(run: RunContext, recipe: Recipe) -> None:
    """Under DeepSpeed ZeRO, the recipe's model and optimiser become the engine (forward passes
    through it) and its :class:`pofe.runtime.zero.ZeroOptimizer`, built from what setup made
    (the scheduler stays on the torch optimiser inside). Nothing otherwise."""
    if not run.dp.zero or recipe.model is None or recipe.optimizer is None:
        return
    from pofe.runtime import zero

    clip = getattr(getattr(recipe.cfg, "optim", None), "grad_clip", None)
    recipe.model, recipe.optimizer = zero.initialize(recipe.model, recipe.optimizer, grad_clip=clip, mean=run.mean)


def _save(run: RunContext, recipe: Recipe, step: int, keep_last: int) -> None:
    from pofe.runtime.checkpoints import output_record, prune_checkpoints, save_checkpoint

    own = recipe.checkpoint_state()  # every process: a recipe may gather here
    full = _full_state(run, recipe)
    if run.main:
        outputs = output_record(run.dir, recipe.outputs)  # bytes, rows, sha256: a resume refuses one cut short
        state = {**own, **run.kept, "outputs": {n: r["bytes"] for n, r in outputs.items()}}
        save_checkpoint(run.dir / "checkpoints" / f"step-{step}", model=recipe.model, optimizer=recipe.optimizer,
                        scheduler=recipe.scheduler, step=step, state=state, processes=run.world, outputs=outputs, **full)
        prune_checkpoints(run.dir, keep_last)
    run.wait()


# ----------------------------------------------------------------------------- the driver

def _accelerator(recipe: Recipe):
    if not recipe.data_parallel:
        from pofe.runtime.guards import require_single_process

        # under torchrun a loop that neither shards data nor all-reduces gradients would run N
        # independent copies into N run folders (the CLI refuses earlier; a library caller here)
        require_single_process(recipe.command)
        return None
    from pofe.runtime.parallel import make_accelerator
    from pofe.runtime.sharding import refuse_unsupported

    refuse_unsupported(recipe.command, recipe.cfg)  # what a sharded launch cannot run: one line, no model loaded
    model = getattr(recipe.cfg, "model", None)  # labelling commands have no policy: the device is auto
    run_cfg = getattr(recipe.cfg, "run", None)
    return make_accelerator(getattr(model, "device", "auto"), command=f"pofe {recipe.command}", sharded=True,
                            collective_timeout_s=getattr(run_cfg, "collective_timeout_s", None))


def _open(recipe: Recipe, acc, *, resume, run_dir) -> Path:
    cfg = recipe.cfg
    main = acc is None or acc.is_main_process
    if run_dir is not None:  # a stage of a larger run (self-reward's SFT and DPO): its folder is given
        path = Path(run_dir)
        if main:
            path.mkdir(parents=True, exist_ok=True)
            write_config(path, cfg)
        if acc is not None:
            acc.wait_for_everyone()
        return path
    path = open_run(cfg.run, recipe.command, resume=resume) if main else None
    if acc is not None and acc.num_processes > 1:
        from pofe.runtime.parallel import gather

        path = gather(acc, str(path) if main else None)[0]
    path = Path(path)
    if resume is None and main:
        write_config(path, cfg)
    return path


def _processes(run: RunContext, recipe: Recipe) -> dict[str, Any]:
    """How many processes ran, and with several, whether they ended with the same weights
    (gradients are all-reduced: a difference is a bug, logged as an error). A collective: every
    process calls it."""
    if run.acc is None:
        return {}
    out: dict[str, Any] = {"processes": run.world}
    if run.sharded:
        out["sharding"] = run.dp.sharding  # one copy of the weights, split: nothing to compare
    elif run.world > 1 and recipe.model is not None:
        from pofe.runtime.parallel import weights_identical

        out["weights_identical_across_processes"] = weights_identical(run.acc, recipe.model)
    return out


def _final(run: RunContext, recipe: Recipe, step: int) -> Path | None:
    """Write ``final/`` (rank 0; a torn one, from a crash while saving, is rewritten from the
    checkpoint's weights). Under sharding every process first gathers the whole weights into an
    unsharded copy that rank 0 saves (a collective)."""
    from pofe.runtime.checkpoints import final_complete

    plain = None
    if run.dp.zero and recipe.model is not None:
        from pofe.runtime import zero

        plain = zero.plain_copy(recipe.model, main=run.main)
    elif run.sharded and recipe.model is not None:
        from pofe.runtime.sharding import plain_copy

        plain = plain_copy(recipe.model, main=run.main)
    if not run.main:
        return None
    final = run.dir / "final"
    if not (step > run.start or not final_complete(final)):
        return final
    if plain is None:
        return recipe.save_final(final)
    sharded, recipe.model = recipe.model, plain  # the recipe saves its model its own way (rm: with its reward card)
    try:
        return recipe.save_final(final)
    finally:
        recipe.model = sharded


_RETIRED = {"restore": "setup, after run.restore_checkpoint()", "after_row": "a meter (run.meter)",
            "stop_after": "a meter (run.meter)", "close": "run.on_close / run.writer in setup",
            "unwrapped": "recipe.model"}


def _refuse_retired_hooks(recipe: Recipe) -> None:
    """A recipe written against the older twelve-hook interface would have its hook silently never
    called (a resume that restores nothing): refused, naming the replacement."""
    for name, instead in _RETIRED.items():
        if any(name in vars(k) for k in type(recipe).__mro__ if k is not Recipe and issubclass(k, Recipe)):
            raise TypeError(f"{type(recipe).__name__}.{name}: the driver no longer calls this hook; use {instead}")


def drive(recipe: Recipe, *, resume: str | Path | None = None, require_audit: str | Path | None = None,
          run_dir: str | Path | None = None) -> dict[str, Any]:
    """Run ``recipe`` from setup to ``summary.json``; returns the summary.

    ``resume``: a run folder to continue from its latest checkpoint (the CLI has already read its
    config into ``recipe.cfg``). ``run_dir``: write here instead of a new folder under ``cfg.run``
    (an existing checkpoint there is resumed; a finished folder returns its summary)."""
    from pofe.evaluation.audit import gate
    from pofe.preload import allocator
    from pofe.runtime.allocator import bound_primitive_cache, keep_freed_memory
    from pofe.runtime.checkpoints import final_complete
    from pofe.runtime.seeds import seed_everything
    from pofe.runtime.guards import fault_point
    from pofe.runtime.tracking import MetricsSink, Progress, check_trackers

    cfg = recipe.cfg
    _refuse_retired_hooks(recipe)
    t0 = time.perf_counter()
    bound_primitive_cache()  # before any bf16 matmul (vLLM's warm-up included): memory that levels off
    check_trackers(getattr(cfg, "log", None))  # a missing tracker package: before any folder or model
    push = _push_target(recipe) if run_dir is None else None  # a stage of a larger run never pushes
    report = gate(require_audit, recipe.audit_identity)  # refused before any data or model loads
    recipe.load_data()  # a bad file fails in a second, before any run folder or model
    acc = _accelerator(recipe)
    path = _open(recipe, acc, resume=resume, run_dir=run_dir)
    if run_dir is not None and (path / "summary.json").exists() and final_complete(path / "final"):
        log.info("%s: %s already finished; returning its summary", recipe.command, path)
        return {**json.loads((path / "summary.json").read_text()), "already_done": True}
    # a given stage folder resumes whatever checkpoint it holds; a new run has none to load
    run = RunContext(dir=path, resumed=resume is not None or run_dir is not None, acc=acc, recipe=recipe)
    keep_freed_memory()  # glibc: reuse freed buffers instead of page-faulting them in every step
    log.info("%s: memory allocator %s", recipe.command, allocator())
    seed_everything(cfg.seed)
    sink = bar = stopped = None
    step = 0
    try:
        recipe.setup(run)
        if not run.loaded:
            run.restore_checkpoint()
        total, step = recipe.total_steps, run.start
        if run.main:
            sink = MetricsSink(run.dir, cfg.log, config=cfg.model_dump(mode="json"))
        bar = Progress(cfg.log, total=total, initial=run.start, desc=f"pofe {recipe.command}", main=run.main,
                       show=recipe.show)
        for step in range(run.start + 1, total + 1):
            row = {"step": step, **recipe.step(step)}
            if sink is not None:
                sink.write(row)
            bar.update(row)
            stopped = run.after_row(step)  # the recipe's meters: a spent judge budget, a drift stop
            for name in ("after_step", *recipe.step_faults):
                fault_point(f"{step}:{name}")  # crash/resume suite: metrics row written, no checkpoint yet
            if recipe.resumable and (stopped is not None or checkpoint_due(cfg.checkpoint.every, step, total)):
                _save(run, recipe, step, cfg.checkpoint.keep_last)
                fault_point(f"{step}:after_checkpoint")
            if stopped is not None:
                break
        step = max(step, run.start)
        out = _final(run, recipe, step) if stopped is None else None
        run.wait()
    finally:
        if bar is not None:
            bar.close()
        if sink is not None:
            sink.close()
        run.closing.close()  # the recipe's engines, threads and writers, last opened first
    history = read_jsonl(run.dir / "metrics.jsonl") if (run.dir / "metrics.jsonl").exists() else []
    summary = {"command": recipe.command, "run_dir": str(run.dir), "final_model": str(out) if out else None,
               "steps": total, "steps_run": step - run.start, "resumed_from": run.start if resume is not None or run.start else None,
               "seconds": round(time.perf_counter() - t0, 2), **_processes(run, recipe), **recipe.summary(history)}
    if stopped is not None:
        summary["stopped"] = {"step": step, "error": str(stopped), "exit_code": stopped.exit_code}
    if report is not None:
        # "audit_gate", not "audit": a command's own summary may carry an "audit" (rl: its judge's length bias)
        summary["audit_gate"] = {"report": str(require_audit), "passed": bool(report.get("passed")),
                            "judge": report.get("judge"),
                            "calibration_sha256": (report.get("calibration") or {}).get("sha256")}
    if run.main:
        atomic_write_text(run.dir / "summary.json", json.dumps(summary, indent=2, default=str))
    if stopped is not None:
        raise stopped
    if run.main and out is not None:
        write_card(run.dir, Path(out), recipe.command, cfg, summary)
        if push:
            from pofe.hub import push as upload

            # after summary.json and the card: a failed upload (one line, exit 1) loses nothing local
            summary["hub"] = upload(out, push, message=f"pofe {recipe.command}: {run.dir.name}")
            atomic_write_text(run.dir / "summary.json", json.dumps(summary, indent=2, default=str))
    return summary


def _push_target(recipe: Recipe) -> str | None:
    """``run.push_to_hub``, checked before anything runs: a command with a ``final/`` to push, and a
    push that can happen (not offline, a token found)."""
    repo = getattr(getattr(recipe.cfg, "run", None), "push_to_hub", None)
    if not repo:
        return None
    from pofe.hub import HubConfigError, check_push

    if not recipe.writes_final:
        raise HubConfigError(f"run.push_to_hub {repo}: pofe {recipe.command} writes no final/ model to push")
    check_push(repo)
    return repo


def write_card(run_dir: Path, final: Path, command: str, cfg: PofeConfig, summary: dict[str, Any]) -> Path:
    """``final/README.md``: the model card of this run (:func:`pofe.hub.model_card`) from its config,
    ``run.json`` and summary (the audit verdict is the summary's ``audit_gate``)."""
    from pofe.hub import CARD, model_card

    manifest_path = run_dir / "run.json"
    manifest = json.loads(read_run_bytes(manifest_path)) if manifest_path.exists() else {}
    text = model_card(command=command, config=cfg.model_dump(mode="json"), manifest=manifest, summary=summary,
                      audit=summary.get("audit_gate"))
    path = final / CARD
    atomic_write_text(path, text)
    return path
