"""The audit's verdict: thresholds turn the metrics into named checks
(``checks: {name: {value, threshold, op, passed}}``), and the report as a readable table."""

from __future__ import annotations

from typing import Any

from pofe.evaluation.audit.config import AuditThresholds
from pofe.evaluation.audit.contrasts import ATTACK_KINDS
from pofe.labels import T_MAX


def evaluate_checks(metrics: dict[str, Any], th: AuditThresholds) -> dict[str, dict[str, Any]]:
    """Named pass/fail checks. A metric that could not be measured (``None``) fails: an audit
    that cannot vouch for the judge does not let training proceed."""
    checks: dict[str, dict[str, Any]] = {}

    def add(name, value, threshold, op):
        if threshold is None:
            return
        if value is None:
            passed = False
        elif op == ">=":
            passed = value >= threshold
        else:
            passed = value <= threshold
        checks[name] = {"value": value, "threshold": threshold, "op": op, "passed": bool(passed)}

    def absval(x):
        return None if x is None else abs(x)

    add("agreement", metrics.get("agreement"), th.min_agreement, ">=")
    # agreement beyond chance: a constant verdict agrees with unbalanced labels at their rate
    add("cohen_kappa", metrics.get("cohen_kappa"), th.min_kappa, ">=")
    add("position_consistency", metrics.get("position_consistency"), th.min_position_consistency, ">=")
    fp = metrics.get("first_position_win_rate")
    add("first_position_bias", None if fp is None else abs(fp - 0.5), th.max_first_position_bias, "<=")
    add("length_correlation", absval(metrics.get("length_correlation")), th.max_abs_length_correlation, "<=")
    add("length_slope", absval(metrics.get("length_slope")), th.max_abs_length_slope, "<=")
    add("parse_failure_rate", metrics.get("parse_failure_rate"), th.max_parse_failure_rate, "<=")
    for kind, c in (metrics.get("contrasts") or {}).items():
        if not c.get("n"):
            continue
        m = c.get("mean_p_variant")
        if kind in ATTACK_KINDS:
            add(f"contrast_{kind}", c.get("variant_win_rate"), th.max_attack_win_rate, "<=")
        elif kind == "answer_for_judge":
            add(f"contrast_{kind}", None if m is None else m - 0.5, th.max_contrast_bias, "<=")
        else:
            add(f"contrast_{kind}", None if m is None else abs(m - 0.5), th.max_contrast_bias, "<=")
    return checks


def failed_checks(report: dict[str, Any]) -> list[str]:
    return [name for name, c in (report.get("checks") or {}).items() if not c.get("passed")]


def describe_check(name: str, c: dict[str, Any]) -> str:
    v = c.get("value")
    vs = "not measured" if v is None else f"{v:.3f}"
    want = ">=" if c.get("op") == ">=" else "<="
    return f"{name} = {vs} (needs {want} {c.get('threshold')})"


def format_audit(report: dict[str, Any]) -> str:
    """A readable table of the report."""
    m = report["metrics"]

    def f(x, nd=3):
        return "-" if x is None else f"{x:.{nd}f}"

    cal = report["calibration"]
    lines = [
        f"judge audit: {report['judge']} on {cal['n_items']} calibration pairs "
        f"({', '.join(f'{k} {v}' for k, v in cal['by_source'].items())})",
        "",
        f"  {'metric':<34}{'value':>10}",
        f"  {'agreement with humans':<34}{f(m['agreement']):>10}   (strict {f(m['agreement_strict'])}, "
        f"first order only {f(m['agreement_single_order'])}, n={m['n_labelled']})",
        f"  {'human ties: judge tie rate':<34}{f(m['human_ties']['judge_tie_rate']):>10}   (n={m['human_ties']['n']})",
        f"  {'position consistency':<34}{f(m['position_consistency']):>10}",
        f"  {'first-position win rate':<34}{f(m['first_position_win_rate']):>10}   (mean P(first) {f(m['mean_p_first'])})",
        f"  {'length correlation (Somers D)':<34}{f(m['length_correlation']):>10}   (Spearman {f(m['length_spearman'])})",
        f"  {'length slope (logit per sd)':<34}{f(m['length_slope'], 2):>10}",
        f"  {'picks the longer response':<34}{f(m['longer_preferred_rate']):>10}   "
        f"(humans {f(m['human_longer_preferred_rate'])})",
        f"  {'parse failures':<34}{m['parse_failures']:>10}   (orders {m['order_parse_failures']})",
        f"  {'p histogram (10 bins 0..1)':<34}{'':>10}   {m['p_histogram']['counts']}",
    ]
    ci = m.get("ci95") or {}

    def fci(key, value=None):
        v = m.get(key) if value is None else value
        lo, hi = ci.get(key) or (None, None)
        return f"{f(v):>10}   [{f(lo)}, {f(hi)}]" if lo is not None else f"{f(v):>10}"

    lines += ["", "  alpaca_eval / LLMBar columns (95% intervals: Wilson; kappa: bootstrap)"]
    for label, key in (("bias (1 - modal agreement)", "bias"), ("variance across seeds", "variance"),
                       ("P(prefers longer)", "p_prefers_longer"), ("P(prefers lists)", "p_prefers_lists"),
                       ("P(prefers first)", "p_prefers_first"), ("accuracy, order A-B", "accuracy_order_ab"),
                       ("accuracy, order B-A", "accuracy_order_ba"), ("both orders correct", "both_orders_correct"),
                       ("positional agreement", "positional_agreement"), ("Cohen's kappa", "cohen_kappa")):
        if key in m:
            lines.append(f"  {label:<34}{fci(key)}")
    hh = m.get("human_human") or {}
    if hh.get("n_label_pairs"):
        lines.append(f"  {'human-human agreement':<34}{f(hh['agreement']):>10}   [{f(hh['ci95'][0])}, {f(hh['ci95'][1])}]"
                     f"   ({hh['n_pairs_multi']} pairs with 2+ labels)")
    cal = m.get("calibration") or {}
    if cal.get("ece") is not None:
        held = cal.get("held_out") or {}
        t = cal.get("temperature")
        lines.append(f"  {'ECE / Brier':<34}{f(cal['ece']):>10}   / {f(cal['brier'])}"
                     + (f"   fitted T = {t:.3f}" if t is not None else ""))
        if cal.get("no_information"):
            lines.append(f"  {'calibration':<34}{'no information':>10}   (T at its bound {T_MAX:.0f}: every calibrated "
                         "p would be ~0.5; no map saved, labels.calibration refuses this report)")
        if held:
            lines.append(f"  {'held-out ECE raw -> temperature':<34}{f(held['raw']['ece']):>10}   -> {f(held['temperature']['ece'])}"
                         f"   (isotonic {f(held['isotonic']['ece'])}; 2-fold cross-fit)")
    for pid, r in (m.get("by_principle") or {}).items():
        lines.append(f"  {'principle ' + pid:<34}{f(r['agreement']):>10}   [{f(r['ci95'][0])}, {f(r['ci95'][1])}] n={r['n']}"
                     + ("   FLAGGED: disagrees more than the others" if r["flagged"] else ""))
    for kind, c in (m.get("contrasts") or {}).items():
        lines.append(f"  {'contrast: ' + kind:<34}{f(c['mean_p_variant']):>10}   (P(variant better), n={c['n']})")
    jury = report.get("jury")
    if jury:
        lines += ["", f"  jury: members and the pool (log-odds; {jury['dropped_member_verdicts']} unreadable member "
                      f"verdicts left out, {jury['unreadable_verdicts']} pairs with none readable)",
                  f"    {'judge':<40}{'weight':>7}{'agree':>7}{'pos.cons':>9}{'first':>7}{'|bias|':>7}{'len D':>7}"
                  f"{'parse':>7}"]
        for r in jury["rows"]:
            name = r["judge"] if len(r["judge"]) <= 38 else r["judge"][:35] + "..."
            lines.append(f"    {name + (' *' if r['calibrated'] else ''):<40}{f(r['weight']):>7}{f(r['agreement']):>7}"
                         f"{f(r['position_consistency']):>9}{f(r['first_position_win_rate']):>7}"
                         f"{f(r['position_bias']):>7}{f(r['length_correlation']):>7}{f(r['parse_failure_rate']):>7}")
        lines.append("    (* calibrated before pooling; a member's row measures its own reads, as an audit of it alone would)")
    lines += ["", "  checks:"]
    for name, c in report["checks"].items():
        lines.append(f"    [{'pass' if c['passed'] else 'FAIL'}] {describe_check(name, c)}")
    lines.append(f"\n  {verdict_line(report)}")
    return "\n".join(lines)


def verdict_line(report: dict[str, Any]) -> str:
    """The audit's verdict in one line: agreement with its Wilson interval, how often the
    first-shown reply wins, the failed checks, and what ``--require-audit`` does with it.
    A judge that always picks the first-shown reply agrees ~0.5 whatever it reads: the
    first-position rate says why, the interval says how sure the agreement is."""
    m = report["metrics"]

    def f(x, fmt):
        return "-" if x is None else format(x, fmt)

    lo, hi = (m.get("ci95") or {}).get("agreement") or (None, None)
    failed = failed_checks(report)
    return (f"audit {'PASSED' if report['passed'] else 'FAILED'}: agreement {f(m.get('agreement'), '.3f')} "
            f"[{f(lo, '.3f')}, {f(hi, '.3f')}] (n={m.get('n_labelled')}), first-shown reply picked in "
            f"{f(m.get('first_position_win_rate'), '.0%')} of reads, position consistency "
            f"{f(m.get('position_consistency'), '.3f')}"
            + (f"; failed: {', '.join(failed)}; --require-audit refuses this judge" if failed or not report["passed"]
               else "; --require-audit accepts this judge"))
