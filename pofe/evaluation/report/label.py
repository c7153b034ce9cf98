"""Plots of a ``pofe label`` run (``labels.jsonl``): the judge's p, its fitness on these pairs
(position consistency, first-shown and longer-response preference) and confidence per principle."""

from __future__ import annotations

from pofe.evaluation.report.figures import _bars_png, _hist_png, _rate_points
from pofe.evaluation.report.run import RunData, _num


def _label_plots(run: RunData, add) -> None:
    rows = [r for r in run.labels if _num(r.get("p")) is not None]
    add("p_hist", "Histogram of p", f"The judge's debiased p over {len(rows)} labelled pairs (labels.jsonl); a pile "
        "at 0 and 1 is the overconfident-labels failure mode.", _hist_png([float(r["p"]) for r in rows],
                                                                     "Judge preference p", "p = P(A better)"))
    both = [r for r in rows if _num(r.get("p_ab")) is not None and _num(r.get("p_ba")) is not None]
    if both:
        cons = sum(((r["p_ab"] > 0.5) == (r["p_ba"] > 0.5)) for r in both)
        first = sum(0.5 * ((r["p_ab"] > 0.5) + (r["p_ba"] < 0.5)) for r in both)
        longer = [r for r in rows if len(r.get("response_a", "")) != len(r.get("response_b", "")) and r["p"] != 0.5]
        k_long = sum((len(r["response_a"]) > len(r["response_b"])) == (r["p"] > 0.5) for r in longer)
        add("judge_fitness", "Judge fitness on these labels",
            "Position consistency, P(first shown wins) over both orders, and P(picks the longer response, in "
            "characters), each with its Wilson 95% interval and n.",
            _rate_points("Judge fitness (Wilson 95%)", [0, 1, 2], [(cons, len(both)), (first, len(both)), (k_long, len(longer))],
                         "", "rate", bar=True, labels=["position consistency", "P(first wins)", "P(picks longer)"]))
    pr: dict[str, list[float]] = {}
    for r in rows:
        if r.get("principle_id"):
            pr.setdefault(r["principle_id"], []).append(abs(float(r["p"]) - 0.5))
    if pr:
        names = sorted(pr)
        add("principles", "Labels per principle", "Mean confidence |p - 1/2| of the labels under each sampled principle "
            f"(n per principle: {', '.join(f'{k} {len(pr[k])}' for k in names)}).",
            _bars_png(names, [sum(pr[k]) / len(pr[k]) for k in names], "Mean |p - 1/2| by principle", "|p - 1/2|"))
