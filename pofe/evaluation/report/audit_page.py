"""The audit's own HTML page (:func:`audit_html`, written by ``pofe audit``): metrics with their
intervals, a jury's member rows, checks, per-source and per-principle agreement, contrast
probes, the reliability diagram and the length plot. ``pofe report`` of an audit folder
embeds it below its plots."""

from __future__ import annotations

import base64
import html
import json
import logging
from typing import Any

from pofe.labels import T_MAX
from pofe.evaluation.report.figures import _figure, _png, _yerr

log = logging.getLogger(__name__)

# The style of both pages, this one and the run report (page.py).
_CSS = """body{font-family:system-ui,sans-serif;max-width:960px;margin:2em auto;padding:0 1em;color:#222}
figure{margin:1.5em 0}img{max-width:100%;border:1px solid #ddd}figcaption{color:#555;font-size:.9em}
table{border-collapse:collapse}td,th{border:1px solid #ddd;padding:.2em .6em;text-align:left;font-size:.9em;vertical-align:top}
pre{background:#f6f6f6;padding:.8em;overflow:auto;font-size:.8em;white-space:pre-wrap}
.flag{background:#fff3cd;border:1px solid #e0c060;padding:.4em .8em;margin:.3em 0}"""


def reliability_png(cal: dict[str, Any]) -> bytes | None:
    """Reliability diagram: per bin of the judge's p, the share of human "A" labels (Wilson
    95% bars), raw and after the fitted calibration map; the diagonal is perfect calibration."""
    rows = [r for r in cal.get("reliability") or [] if r["n"]]
    if not rows:
        return None
    fig, ax = _figure()
    ax.plot([0, 1], [0, 1], color="grey", ls="--", lw=1, label="perfectly calibrated")
    xs = [r["mean_p"] for r in rows]
    ys = [r["frac_human_a"] for r in rows]
    ax.errorbar(xs, ys, yerr=_yerr(ys, [r["frac_human_a_ci95"] for r in rows]), fmt="o-", capsize=3,
                label=f"judge p (ECE {cal['ece']:.3f})")
    # A fit at the temperature's bound has no calibrated series (calibrate.no_information): the
    # page says "no information" in words instead of drawing a flat line as an improvement.
    after = [] if cal.get("no_information") else [r for r in cal.get("calibrated_reliability") or [] if r["n"]]
    if after:
        m = cal.get("map") or {}
        what = f"T = {m['temperature']:.2f}" if m.get("method") == "temperature" else m.get("method", "")
        held = ((cal.get("held_out") or {}).get(m.get("method", "")) or {}).get("ece")
        ax.errorbar([r["mean_p"] for r in after], [r["frac_human_a"] for r in after],
                    yerr=_yerr([r["frac_human_a"] for r in after], [r["frac_human_a_ci95"] for r in after]),
                    fmt="s-", capsize=3, alpha=0.8,
                    label=f"calibrated ({what}; held-out ECE {held:.3f})" if held is not None else f"calibrated ({what})")
    for x, y, r in zip(xs, ys, rows):
        ax.annotate(f"n={r['n']}", (x, y), textcoords="offset points", xytext=(4, -10), fontsize=7)
    ax.set_xlim(0, 1)
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("judge p = P(A better), binned")
    ax.set_ylabel("share of human labels 'A'")
    ax.set_title(f"Reliability diagram ({cal['n']} human-labelled pairs)")
    # Below the axes, never over them: "upper left" inside covered the low-p bins' points.
    fig.set_size_inches(6.4, 4.6)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=1, frameon=False)
    return _png(fig)


MIN_PAIRS = 30
"""Below this many human-labelled pairs the page says its numbers are indicative: at n = 30 a
Wilson 95% interval around 0.7 is already [0.52, 0.83]."""


def _notes(m: Any, cal: Any) -> list[str]:
    """Warnings above the metrics: too few pairs to measure, and a calibration with no information."""
    out = []
    n = _get(m, "n_labelled") if _is_num(_get(m, "n_labelled")) else _get(m, "n")
    if _is_num(n) and n < MIN_PAIRS:
        out.append(f"<p class='flag'>Only {int(n)} human-labelled pairs (fewer than {MIN_PAIRS}): the 95% intervals "
                   "are wide and every number on this page is indicative, not a measurement.</p>")
    if _get(cal, "no_information") is True:
        t = _get(cal, "temperature")
        tt = f"T = {t:.2f}" if _is_num(t) else "T"
        out.append(f"<p class='flag'>Calibration: <b>no information</b>. The fitted temperature ({tt}) is at its bound "
                   f"({T_MAX:.0f}): the judge's p carries no information about the human labels (every calibrated p "
                   "would be about 0.5). No map is saved, and <code>labels.calibration</code> refuses this report.</p>")
    return out


def length_curve_png(curve: list[dict[str, Any]], unit: str) -> bytes | None:
    if not curve:
        return None
    fig, ax = _figure()
    xs = [c["dlen_mean"] for c in curve]
    for key, label in (("judge_a", "judge chose A"), ("human_a", "humans chose A")):
        ys = [c[key] for c in curve]
        ax.errorbar(xs, ys, yerr=_yerr(ys, [c[key + "_ci95"] for c in curve]), fmt="o-", capsize=3, label=label)
    for x, c in zip(xs, curve):
        ax.annotate(f"n={c['n']}", (x, 0.02), fontsize=7, ha="center")
    ax.axhline(0.5, color="grey", ls="--", lw=1)
    ax.axvline(0, color="grey", ls=":", lw=1)
    ax.set_ylim(0, 1)
    ax.set_xlabel(f"len(A) - len(B) ({unit}), mean of each quantile bin")
    ax.set_ylabel("share choosing A (Wilson 95%)")
    ax.set_title("Length preference: judge vs humans")
    ax.legend(fontsize=8)
    return _png(fig)


def _text(v: Any) -> str:
    """A value of the report as page text, escaped. ``pofe report`` renders an ``audit.json`` it
    did not compute (a received folder): any field may hold markup, the numeric ones included."""
    return "-" if v is None else html.escape(str(v))


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _fmt(v: Any, spec: str = ".3f") -> str:
    """A number formatted with ``spec``; anything else (a received file's string) as escaped text."""
    return format(v, spec) if _is_num(v) else _text(v)


def _fmt_ci(v, ci) -> str:
    if v is None:
        return "-"
    if not isinstance(ci, (list, tuple)) or len(ci) != 2 or not all(_is_num(c) for c in ci):
        return _fmt(v)
    return f"{_fmt(v)} [{ci[0]:.3f}, {ci[1]:.3f}]"


def _get(d: Any, key: str) -> Any:
    """``d[key]`` of a dict, else None (a received report's section may be any JSON value)."""
    return d.get(key) if isinstance(d, dict) else None


def _items(d: Any) -> list[tuple[Any, dict]]:
    """The (key, dict) entries of a mapping section; anything else in a received report is skipped."""
    return [(k, v) for k, v in d.items() if isinstance(v, dict)] if isinstance(d, dict) else []


def _safe_png(draw, *args) -> bytes | None:
    """A plot of the report, or None where its numbers are not what pofe writes (a received file):
    the page still renders, without that plot."""
    try:
        return draw(*args)
    except (TypeError, ValueError, KeyError, IndexError, AttributeError) as e:
        log.warning("report: a plot of the audit skipped: its data is malformed (%s: %s)", type(e).__name__, e)
        return None


_AUDIT_ROWS = [
    ("agreement with humans", "agreement"), ("bias (1 - modal agreement)", "bias"), ("variance across seeds", "variance"),
    ("P(prefers longer)", "p_prefers_longer"), ("P(prefers lists)", "p_prefers_lists"),
    ("P(prefers first)", "p_prefers_first"), ("position consistency", "position_consistency"),
    ("accuracy, order A-B", "accuracy_order_ab"), ("accuracy, order B-A", "accuracy_order_ba"),
    ("both orders correct", "both_orders_correct"), ("Cohen's kappa", "cohen_kappa"),
    ("parse failure rate", "parse_failure_rate"),
]


def audit_html(report: dict[str, Any]) -> str:
    """One offline page for an audit report: metrics with intervals, checks, per-source and
    per-principle agreement, contrast probes, the reliability diagram and the length plot.
    Every value from the report is escaped or formatted as a number (:func:`_text`, :func:`_fmt`):
    ``pofe report`` renders reports it did not compute."""
    report = report if isinstance(report, dict) else {}
    m = _get(report, "metrics") or {}
    ci = _get(m, "ci95") or {}
    cal = _get(m, "calibration") or {}
    unit = str(_get(_get(report, "calibration"), "length_unit") or "chars")
    title = f"pofe audit: {report.get('judge')}"
    parts = [f"<!DOCTYPE html>\n<html><head><meta charset='utf-8'><title>{html.escape(title)}</title>",
             f"<style>{_CSS}</style></head><body>", f"<h1>{html.escape(title)}</h1>",
             f"<p><b>{'PASSED' if report.get('passed') is True else 'FAILED'}</b> on {_text(_get(m, 'n'))} calibration pairs "
             f"({_text(_get(m, 'n_parsed'))} parsed, {_text(_get(m, 'n_labelled'))} with a human A/B label); calibration "
             f"set sha256 <code>{html.escape(str(_get(_get(report, 'calibration'), 'sha256') or '?')[:16])}</code>; "
             f"lengths in {html.escape(unit)}.</p>", *_notes(m, cal)]
    parts.append("<h2>Metrics (95% intervals: Wilson for rates, bootstrap for kappa)</h2><table>"
                 "<tr><th>metric</th><th>value [95% CI]</th></tr>")
    for label, key in _AUDIT_ROWS:
        parts.append(f"<tr><td>{html.escape(label)}</td><td>{_fmt_ci(_get(m, key), _get(ci, key))}</td></tr>")
    hh = _get(m, "human_human") or {}
    if _get(hh, "n_label_pairs"):
        parts.append(f"<tr><td>human-human agreement ({_text(_get(hh, 'n_pairs_multi'))} pairs)</td>"
                     f"<td>{_fmt_ci(_get(hh, 'agreement'), _get(hh, 'ci95'))}</td></tr>")
    if _get(cal, "ece") is not None:
        parts.append(f"<tr><td>ECE / Brier (raw)</td><td>{_fmt(cal['ece'])} / {_fmt(_get(cal, 'brier'))}</td></tr>")
        for k, v in _items(_get(cal, "held_out")):
            parts.append(f"<tr><td>held-out ECE / Brier ({_text(k)})</td><td>{_fmt(v.get('ece'))} / "
                         f"{_fmt(v.get('brier'))}</td></tr>")
    parts.append("</table>")
    jury = _get(report, "jury")
    if isinstance(jury, dict) and jury:
        cols = (("agreement", "agreement"), ("position consistency", "position_consistency"),
                ("first-position win rate", "first_position_win_rate"), ("|position bias|", "position_bias"),
                ("length (Somers D)", "length_correlation"), ("Cohen's kappa", "cohen_kappa"),
                ("parse failures", "parse_failure_rate"), ("ECE", "ece"))
        parts.append(f"<h2>Jury: members and the pooled verdict</h2><p>Pooled in log-odds; "
                     f"{_text(jury.get('dropped_member_verdicts'))} unreadable member verdicts left out of their pair's "
                     f"pool, {_text(jury.get('unreadable_verdicts'))} pairs with no readable member. A member's row is "
                     "its own reads (before its calibration map), as an audit of it alone measures them.</p><table><tr>"
                     "<th>judge</th><th>role</th><th>weight</th>" + "".join(f"<th>{html.escape(c)}</th>" for c, _ in cols)
                     + "<th>checks</th></tr>")
        for r in [r for r in jury.get("rows") or [] if isinstance(r, dict)]:
            cells = "".join(f"<td>{_fmt(r.get(k))}</td>" for _, k in cols)
            role = _text(r.get("role")) + (" (calibrated)" if r.get("calibrated") else "")
            parts.append(f"<tr><td>{_text(r.get('judge'))}</td><td>{role}</td><td>{_fmt(r.get('weight'))}</td>{cells}"
                         f"<td>{'pass' if r.get('passed') is True else '<b>FAIL</b>'}</td></tr>")
        parts.append("</table>")
    parts.append("<h2>Checks</h2><table><tr><th>check</th><th>value</th><th>threshold</th><th></th></tr>")
    for name, c in _items(_get(report, "checks")):
        parts.append(f"<tr><td>{_text(name)}</td><td>{_fmt(c.get('value'))}</td>"
                     f"<td>{_text(c.get('op'))} {_text(c.get('threshold'))}</td>"
                     f"<td>{'pass' if c.get('passed') is True else '<b>FAIL</b>'}</td></tr>")
    parts.append("</table>")
    for title_, png in (("Reliability diagram", _safe_png(reliability_png, cal)),
                        ("Length preference", _safe_png(length_curve_png, _get(m, "length_curve") or [], unit))):
        if png is not None:
            b64 = base64.b64encode(png).decode("ascii")
            parts.append(f"<figure><h2>{title_}</h2><img alt='{title_}' src='data:image/png;base64,{b64}'></figure>")
    if by_source := _items(_get(m, "by_source")):
        parts.append("<h2>By source</h2><table><tr><th>source</th><th>n</th><th>agreement [95% CI]</th>"
                     "<th>position consistency</th></tr>")
        for src, r in by_source:
            parts.append(f"<tr><td>{_text(src)}</td><td>{_text(r.get('n'))}</td>"
                         f"<td>{_fmt_ci(r.get('agreement'), r.get('agreement_ci95'))}</td>"
                         f"<td>{_fmt(r.get('position_consistency'))}</td></tr>")
        parts.append("</table>")
    if by_principle := _items(_get(m, "by_principle")):
        parts.append("<h2>By constitution principle</h2><table><tr><th>principle</th><th>n</th>"
                     "<th>agreement [95% CI]</th><th>other principles</th><th>flag</th></tr>")
        for pid, r in by_principle:
            parts.append(f"<tr><td>{_text(pid)}</td><td>{_text(r.get('n'))}</td><td>{_fmt_ci(r.get('agreement'), r.get('ci95'))}</td>"
                         f"<td>{_fmt(r.get('others_agreement'))}</td>"
                         f"<td>{'<b>disagrees more than the others</b>' if r.get('flagged') is True else ''}</td></tr>")
        parts.append("</table>")
    if contrasts := _items(_get(m, "contrasts")):
        parts.append("<h2>Contrast probes</h2><table><tr><th>probe</th><th>n</th><th>mean P(variant better)</th>"
                     "<th>variant win rate [95% CI]</th></tr>")
        for kind, c in contrasts:
            parts.append(f"<tr><td>{_text(kind)}</td><td>{_text(c.get('n'))}</td><td>{_fmt(c.get('mean_p_variant'))}</td>"
                         f"<td>{_fmt_ci(c.get('variant_win_rate'), c.get('variant_win_rate_ci95'))}</td></tr>")
        parts.append("</table>")
    ident = _get(report, "judge_identity") or {}
    parts.append("<h2>Judge identity</h2><pre>" + html.escape(json.dumps(ident, indent=2, default=str)) + "</pre>")
    parts.append("</body></html>\n")
    return "\n".join(parts)
