"""Running ``pofe audit``: judge the calibration set (and the contrast probes), measure, check,
and write the report JSON (what ``--require-audit`` reads) and its HTML page.

Under ``torchrun --nproc_per_node N`` each process judges its block of every pass (the verdicts
come back to every process in input order, so the report is the one-process one) and rank 0
writes the files."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Sequence

from pofe.config import ConfigError
from pofe.data.calibration import CalibrationItem, load_calibration
from pofe.evaluation.audit.checks import evaluate_checks
from pofe.evaluation.audit.config import AuditConfig
from pofe.evaluation.audit.contrasts import _judge_all, contrast_metrics, contrast_pairs
from pofe.evaluation.audit.gating import calibration_set_hash, judge_identity
from pofe.evaluation.audit.jury import jury_report
from pofe.evaluation.audit.metrics import calibration_metrics
from pofe.judges.base import as_pairwise
from pofe.judges.jury import JuryJudge
from pofe.judges.registry import judge_config_of
from pofe.judges.summary import summarize_judgments
from pofe.judges.usage import budget_of, usage_sum
from pofe.runtime.parallel import DataParallel, launched


def run_audit(judge, items: Sequence[CalibrationItem], cfg: AuditConfig | None = None, *,
              identity: dict[str, Any] | None = None, dp: DataParallel = DataParallel()) -> dict[str, Any]:
    """Judge the calibration items (and contrast pairs); return the report dict. ``dp``: the
    processes that split the judging (every one returns the same report).

    ``identity`` is what the report vouches for (default: the judge's id only;
    :func:`audit_from_config` adds :func:`judge_identity` of the config it built the judge
    from); ``require_audit`` compares it with the judge a command is about to train on."""
    cfg = cfg or AuditConfig()
    # The judge actually audited is the one passed in: its own config when build_judge made it.
    # cfg.judge says which judge audit_from_config builds; here it is only AuditConfig's
    # default (llm) unless it built this very judge, so the report never names it for another.
    built_from = judge_config_of(judge)
    judge = as_pairwise(judge)
    if not items:
        raise ValueError("audit: the calibration set is empty")
    args = ([it.prompt for it in items], [it.response_a for it in items], [it.response_b for it in items])
    spent_before = usage_sum([judge], dp)  # a live judge (drift re-audits) has judged before
    t0 = time.perf_counter()
    js = _judge_all(judge, *args, cfg.batch_size, "calibration", dp)
    t_cal = time.perf_counter() - t0
    more = [_judge_all(judge, *args, cfg.batch_size, f"calibration (seed pass {k + 2})", dp) for k in range(cfg.seeds - 1)]
    metrics = calibration_metrics(items, js, cfg.length_unit, seed_judgments=more,
                                  calibration_method=cfg.calibration_method, seed=cfg.seed)
    # the judges' shared batch summary: cache hits, tokens, truncated reads, hard-label fallbacks
    metrics["judge_summary"] = summarize_judgments(js, seconds=t_cal)
    t1 = time.perf_counter()
    if cfg.contrasts:
        metrics["contrasts"] = contrast_metrics(judge, contrast_pairs(items, cfg.contrast_limit, cfg.seed),
                                                cfg.batch_size, cfg.seed, dp)
    metrics["seconds"] = {"calibration": round(t_cal, 3), "contrasts": round(time.perf_counter() - t1, 3)}
    checks = evaluate_checks(metrics, cfg.thresholds)
    sources: dict[str, int] = {}
    for it in items:
        sources[it.source] = sources.get(it.source, 0) + 1
    jid = getattr(judge, "id", None) or (built_from.kind if built_from is not None else type(judge).__name__)
    # A judge object passed in is only known by its id; audit_from_config, which builds the
    # judge from cfg.judge, vouches for the whole config identity.
    ident = dict(identity) if identity is not None else {"judge_id": jid}
    report = {
        "judge": jid,
        "judge_identity": ident,
        "judge_config": built_from.model_dump() if built_from is not None else None,  # None: a judge made by hand
        "calibration": {"paths": list(cfg.data.calibration), "n_items": len(items), "by_source": sources,
                        "sha256": calibration_set_hash(items),
                        "limit": cfg.data.limit, "seed": cfg.seed, "length_unit": cfg.length_unit},
        "thresholds": cfg.thresholds.model_dump(),
        "metrics": metrics,
        "checks": checks,
        "passed": all(c["passed"] for c in checks.values()),
        "processes": dp.world,
        # what this audit's judging cost (every pass, contrasts included; every process)
        "judge_usage": (usage_sum([judge], dp) - spent_before).to_dict(),
    }
    if isinstance(judge, JuryJudge):  # each member measured from the same verdicts, next to the pooled jury
        report["jury"] = jury_report(judge, items, js, more, cfg, metrics, checks)
    return report


def audit_from_config(cfg: AuditConfig, judge=None) -> dict[str, Any]:
    """Load the calibration set, build the judge (unless given), run, and write ``cfg.output``."""
    if not cfg.data.calibration:
        raise ValueError("audit: give at least one calibration file or folder (pofe audit FILE, --calibration or "
                         "data.calibration)")
    if budget_of(cfg.judge) is not None:  # nothing would read it: the audit has no step to stop after
        raise ConfigError("bad value for 'judge.budget': pofe audit judges its calibration set in one pass "
                          "(budgets apply to label, judge, online and rl); remove it")
    guard_audit_outputs(cfg)
    items = load_calibration(cfg.data.calibration, limit=cfg.data.limit, seed=cfg.seed)
    dp = launched(command="pofe audit")  # before the judge's model loads: the accelerator picks this process's GPU
    if judge is None:
        from pofe.judges.registry import build_judge

        judge = build_judge(cfg.judge)
        identity = {"judge_id": getattr(judge, "id", None), **judge_identity(cfg.judge)}
    else:
        identity = None
    report = run_audit(judge, items, cfg, identity=identity, dp=dp)
    if dp.main:  # one report file whatever the processes
        write_audit(report, cfg.output, cfg.html)
    return report


def audit_outputs(cfg: AuditConfig) -> dict[str, str | Path | None]:
    """The files ``pofe audit`` writes, by the flag that names them (the page defaults to
    ``output`` with the suffix .html)."""
    page = cfg.html or (Path(cfg.output).with_suffix(".html") if cfg.output else None)
    return {"-o": cfg.output, "html" if cfg.html else "html (default: -o with .html)": page}


def guard_audit_outputs(cfg: AuditConfig) -> None:
    """Refuse outputs that would destroy a calibration file, a judge file or a live run's
    files, before the (slow) audit runs."""
    from pofe.outputs import guard_outputs, judge_inputs

    guard_outputs(audit_outputs(cfg), [*cfg.data.calibration, *judge_inputs(cfg.judge)])


def write_audit(report: dict[str, Any], output: str | Path | None, html: str | Path | None = None) -> dict[str, str]:
    """Write the report JSON (``output``) and its HTML page (``html``, default next to it)."""
    from pofe.runs import atomic_write_text

    written = {}
    if output:
        atomic_write_text(Path(output), json.dumps(report, indent=2) + "\n")
        written["json"] = str(output)
    page = html or (Path(output).with_suffix(".html") if output else None)
    if page:
        from pofe.evaluation.report import audit_html

        atomic_write_text(Path(page), audit_html(report))
        written["html"] = str(page)
    return written
