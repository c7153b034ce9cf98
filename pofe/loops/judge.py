"""``pofe judge``: label a file of (prompt, response_a, response_b) rows with any judge (its
config and run; the CLI in :mod:`pofe.cli.judge` maps options to keys and prints).

Writes ``verdicts.jsonl`` (one verdict per row, with the prompt and responses it judged and
its provenance) and ``summary.json`` into a run folder. Pointwise kinds (rubric,
expected-score) score ``response_a`` (or a ``response`` column) instead.

Data parallel (``torchrun --nproc_per_node N``): each process judges its block of every batch
(:meth:`~pofe.runtime.parallel.DataParallel.map`, its own judge and cache connection) and rank 0
writes the gathered verdicts in input order.
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field

from pofe.config import MAX_BATCH_SIZE, PofeConfig, Seed
from pofe.errors import DataError
from pofe.judges.config import JudgeConfig, LLMJudgeConfig
from pofe.judges.usage import BudgetMeter, budget_of, usage_summary
from pofe.recipe import Recipe, RunContext, drive
from pofe.runs import JsonlWriter, RunConfig
from pofe.runtime.tracking import LogConfig
from pofe.stats import mean

log = logging.getLogger(__name__)


class JudgeDataConfig(PofeConfig):
    """The rows to label and the columns they are read from."""

    input: str | None = None
    """Rows to label: any source the data layer reads (JSONL / JSON / CSV / Parquet / Arrow,
    ``.gz``, a ``save_to_disk`` folder, a named source, a Hub id)."""
    prompt_field: str = "prompt"
    """A string, or chat messages (judged as their transcript, every turn kept)."""
    a_field: str = "response_a"
    """Column of response A (pointwise kinds read ``response`` when a row has no such column)."""
    b_field: str = "response_b"
    """Column of response B (pairwise kinds)."""
    reference_field: str = "reference"
    """Optional column with a reference answer (reference-overlap judge)."""
    limit: Annotated[int, Field(ge=0)] | None = None
    """Label only the first N rows."""
    skip_bad_rows: bool = False
    """Skip (and count) malformed input rows instead of stopping at the first one."""


class JudgeCommandConfig(PofeConfig):
    data: JudgeDataConfig = JudgeDataConfig()
    """The rows to label and their columns (``data.input``, ``data.prompt_field``, ...)."""
    output: str | None = None
    """Verdicts file; default ``<run folder>/verdicts.jsonl``. Never the input file."""
    batch_size: Annotated[int, Field(ge=1, le=MAX_BATCH_SIZE)] = 64
    """Rows per judge call (verdicts are written after each batch)."""
    judge: JudgeConfig = LLMJudgeConfig()
    """The judge (any kind; pointwise kinds score ``response_a``)."""
    log: LogConfig = LogConfig(tensorboard=False)
    """metrics.jsonl (one row per batch), progress bar; trackers off unless asked (a labelling job has no curves)."""
    seed: Seed = 0
    """Seeds a judge that samples (CoT at temperature > 0)."""
    run: RunConfig = RunConfig()
    """Where the run folder goes."""


def load_rows(cfg: JudgeCommandConfig, pointwise: bool) -> list[dict[str, Any]]:
    """The rows to judge as ``{prompt, response_a[, response_b], reference, id}``, read by the
    data layer; a missing field or a bad row is a located error (or, with ``data.skip_bad_rows``,
    counted)."""
    from pofe.data.io import read_located
    from pofe.errors import DataError
    from pofe.data.prompts import to_prompt

    data = cfg.data

    def to_row(r: dict[str, Any], where: str) -> dict[str, Any]:
        a_field = data.a_field if (data.a_field in r or not pointwise) else "response"
        need = [a_field] + ([] if pointwise else [data.b_field])
        missing = [k for k in [data.prompt_field, *need] if k not in r]
        if missing:
            raise DataError(f"{where}: missing field(s) {missing} (fields: {sorted(r)}); "
                            "set --set data.prompt_field=... / data.a_field=... / data.b_field=...")
        for k in need:
            if not isinstance(r[k], str):
                raise DataError(f"{where}: {k!r} must be a string, got {type(r[k]).__name__}")
        ref = r.get(data.reference_field)
        row = {"prompt": to_prompt(r, where, data.prompt_field).text, "response_a": r[a_field],
               "reference": ref if isinstance(ref, str) else None}
        if not pointwise:
            row["response_b"] = r[data.b_field]
        if "id" in r:
            row["id"] = r["id"]
        return row

    rows = read_located(data.input, skip_bad_rows=data.skip_bad_rows).map(to_row, limit=data.limit)
    if not rows and data.limit != 0:  # judging nothing is never a silent success
        raise DataError(f"{data.input}: no rows to judge")
    return rows


class JudgeRecipe(Recipe):
    """Rows judged in batches of ``batch_size`` (one driver step each), verdicts written after each batch."""

    command = "judge"
    writes_final = False  # no weights: nothing for run.push_to_hub
    data_parallel = True
    resumable = False  # a verdicts file is one run's output: a new run relabels (the judge cache makes it cheap)
    show = (("mean_p", "p", "{:.2f}"),)

    def __init__(self, cfg: JudgeCommandConfig, **runtime):
        super().__init__(cfg)
        self.runtime = runtime

    def load_data(self) -> None:
        from pofe.judges.base import Capability, has_capability
        from pofe.outputs import guard_outputs, judge_inputs

        cfg = self.cfg
        if not cfg.data.input:
            raise DataError("no input file: pofe judge FILE (or data.input)")
        guard_outputs({"-o": cfg.output}, [cfg.data.input, *judge_inputs(cfg.judge)])
        self.pointwise = not has_capability(cfg.judge, Capability.PAIRWISE)
        self.rows = load_rows(cfg, self.pointwise)

    def setup(self, run: RunContext) -> None:
        from pofe.judges import build_judge

        cfg, self.dp = self.cfg, run.dp
        self.out_path = Path(cfg.output) if cfg.output else run.dir / "verdicts.jsonl"
        if run.main and self.out_path.exists():
            self.out_path.unlink()  # one run's output, never appended to (never an input: checked in load_data)
        self.judge = build_judge(cfg.judge, **self.runtime)  # every process its own (and its own cache connection)
        if callable(getattr(self.judge, "close", None)):
            run.on_close(self.judge.close)
        self.meter = BudgetMeter(budget_of(cfg.judge), [self.judge], dp=self.dp)  # tokens, cost, judge.budget's stop
        run.meter(self.meter)  # a spent budget: the verdicts so far are kept, summary.stopped
        # rank 0 writes the gathered verdicts; not one of the run's outputs (a judge run is redone whole)
        self.writer = run.closing.enter_context(JsonlWriter(self.out_path)) if run.main else None
        self.verdicts: list = []
        self.t0 = time.perf_counter()
        self.total_steps = math.ceil(len(self.rows) / cfg.batch_size)

    def step(self, step: int) -> dict[str, Any]:
        size = self.cfg.batch_size
        s = (step - 1) * size
        chunk = self.rows[s:s + size]
        res = self.dp.map(self._verdicts, chunk)
        for k, (r, v) in enumerate(zip(chunk, res)):
            # The judged texts travel with the verdict, so verdicts.jsonl is itself a labelled pair
            # file (pofe export, pofe online mode=offline read it).
            row = {"index": s + k, **({"id": r["id"]} if "id" in r else {}), "prompt": r["prompt"],
                   "response_a": r["response_a"], **({"response_b": r["response_b"]} if not self.pointwise else {})}
            if self.writer is not None:
                self.writer.write({**row, **v.to_dict()})
        self.verdicts.extend(res)
        log.info("judged %d/%d rows", min(s + len(chunk), len(self.rows)), len(self.rows))
        vals = [getattr(v, "p", getattr(v, "score", None)) for v in res]
        vals = [x for x in vals if x is not None]
        return {"rows": len(chunk), "unreadable": len(res) - len(vals),
                "mean_p" if not self.pointwise else "mean_score": mean(vals),
                **self.meter.row(step)}

    def _verdicts(self, part: list[dict[str, Any]]) -> list:
        """This process's block of a batch, judged (pairwise) or scored (pointwise)."""
        prompts, refs = [r["prompt"] for r in part], [r["reference"] for r in part]
        if self.pointwise:
            return self.judge.score(prompts, [r["response_a"] for r in part], references=refs)
        return self.judge.judge(prompts, [r["response_a"] for r in part], [r["response_b"] for r in part],
                                references=refs)

    def summary(self, history: list[dict[str, Any]]) -> dict[str, Any]:
        from pofe.judges import summarize_judgments, summarize_scores

        cfg, seconds = self.cfg, time.perf_counter() - self.t0
        # every process's model calls (verdicts are already gathered)
        calls = int(self.dp.sum(getattr(getattr(getattr(self.judge, "backend", None), "stats", None), "calls", 0)))
        summarize = summarize_scores if self.pointwise else summarize_judgments
        out = summarize(self.verdicts, seconds=round(seconds, 3), model_calls=calls)
        out.update(judge_id=getattr(self.judge, "id", cfg.judge.kind), kind=cfg.judge.kind,
                   template_hash=getattr(getattr(self.judge, "template", None), "hash", None),
                   items_per_s=round(len(self.rows) / seconds, 3) if seconds > 0 else None, output=str(self.out_path),
                   judge_usage=usage_summary(history))
        return out


def run_judge(cfg: JudgeCommandConfig, **runtime) -> dict[str, Any]:
    """Setup -> label in batches -> save. Returns the summary (also ``summary.json``)."""
    return drive(JudgeRecipe(cfg, **runtime))
