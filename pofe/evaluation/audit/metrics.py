"""The audit's calibration-set measurements, pure functions of the items and the judge's
verdicts.

rlaif-constitutional-ai, "Choices that matter": *validate the judge before you validate
anything else* -- agreement with humans, position consistency and the correlation of its
preference with length "tell you whether the judge is fit to train on"; its toy run shows a
judge can match human-human agreement and still pass a length bias to every reward model
(``pofe sim``). The audit measures, on a calibration set in random order:

* **agreement** with the human label on non-tie items (a judge tie counts one half;
  human ties are reported separately), from the debiased p and from the first order alone;
* **position consistency**: both orders prefer the same response;
* **first-position win rate** over every query (each item is asked in both orders, so
  content cancels and only position is left; 0.5 is unbiased);
* **length**: Somers' D of the length difference given the judge's preference (+1: its
  preference orders pairs exactly by length), the Spearman correlation, the slope of a
  logistic regression of its choice on the standardised length difference, and how often it
  picks the longer response next to how often the humans did;
* a **histogram of p** and **parse failures** (judges never invent a value, so an unreadable
  answer is counted, not guessed).

Audit v2 adds, next to those:

* the columns of alpaca_eval's ``analyze_evaluators``: agreement with humans, **bias**
  (1 - agreement of the judge's modal verdict over seeds with the human label), **variance**
  (how often a single seed's verdict differs from the modal one; needs ``seeds >= 2``),
  P(prefers longer), **P(prefers lists)**, P(prefers first), number parsed;
* LLMBar's statistics (Zeng et al. 2024): accuracy in each order, both orders correct,
  positional agreement, **Cohen's kappa** of the judge's verdict against the human label;
* a Wilson interval (rates) or a bootstrap interval over items (kappa) for every rate, in
  ``metrics.ci95``: right at small n, where 12 of 12 is [0.757, 1], not [1, 1];
* agreement per source and **per constitution principle**, flagging principles whose
  agreement is below the other principles' beyond its interval (the seed: retire the
  principles that disagree with the calibration set more than the others);
* **human-human agreement** when a pair carries two or more human labels;
* **calibration** of p against the human labels (``pofe.evaluation.calibrate``): ECE, Brier,
  reliability bins, a fitted temperature (and isotonic map), and the held-out ECE
  before/after by 2-fold cross-fitting; the map is what labelling commands apply.

The contrast probes are in :mod:`pofe.evaluation.audit.contrasts`.
"""

from __future__ import annotations

import re
from typing import Any, Sequence

import numpy as np

from pofe.data.calibration import CalibrationItem
from pofe.evaluation.calibrate import calibration_report
from pofe.stats import fit_logistic, somers_d, spearman, wilson_interval
from pofe.evaluation.winrate import outcome_value, verdict
from pofe.records import Judgment
from pofe.stats import mean


def _verdict(p: float | None) -> float | None:
    """1 = A preferred, 0 = B preferred, 0.5 = an exact tie (the win-rate module's verdict)."""
    return None if p is None else outcome_value(verdict(p))


def _length(text: str, unit: str) -> int:
    return len(text.split()) if unit == "words" else len(text)


def _v1_metrics(items: Sequence[CalibrationItem], judgments: Sequence[Judgment], length_unit: str = "chars") -> dict[str, Any]:
    n = len(items)
    p = [j.p for j in judgments]
    parsed = [i for i in range(n) if p[i] is not None]
    order_fail = sum((j.p_ab is None) + (j.p_ba is None) for j in judgments)

    # Agreement: human A/B items with a verdict; the judge's tie counts one half.
    lab = [i for i in parsed if items[i].label != "tie"]
    human = {i: 1.0 if items[i].label == "A" else 0.0 for i in lab}
    hits = [1.0 - abs(_verdict(p[i]) - human[i]) for i in lab]
    hits_strict = [float(_verdict(p[i]) == human[i]) for i in lab]
    single = [i for i in lab if judgments[i].p_ab is not None]
    hits_single = [1.0 - abs(_verdict(judgments[i].p_ab) - human[i]) for i in single]
    ties = [i for i in parsed if items[i].label == "tie"]

    # Position: both orders, each already expressed as P(A better).
    both = [i for i in range(n) if judgments[i].p_ab is not None and judgments[i].p_ba is not None]
    consistent = [float(_verdict(judgments[i].p_ab) == _verdict(judgments[i].p_ba)) for i in both]
    first_wins: list[float] = []  # per query: did the first-shown response win (ties one half)?
    p_first: list[float] = []
    for j in judgments:
        if j.p_ab is not None:  # order (A, B): first = A
            first_wins.append(_verdict(j.p_ab))
            p_first.append(j.p_ab)
        if j.p_ba is not None:  # order (B, A): first = B, P(B better) = 1 - p_ba
            first_wins.append(1.0 - _verdict(j.p_ba))
            p_first.append(1.0 - j.p_ba)

    # Length: difference A - B against the judge's (debiased) preference for A.
    pp = np.array([p[i] for i in parsed], dtype=float)
    dlen = np.array([_length(items[i].response_a, length_unit) - _length(items[i].response_b, length_unit)
                     for i in parsed], dtype=float)
    choice = np.array([_verdict(x) for x in pp]) if len(pp) else np.zeros(0)
    slope = None
    if len(pp) >= 2 and np.std(dlen) > 0 and 0 < choice.mean() < 1:
        # Tiny ridge: a judge whose choice is a threshold on length is separable, and its
        # slope should come out large, not infinite.
        slope = float(fit_logistic(dlen / np.std(dlen), choice, l2=1e-2).coef[0])
    longer = [i for i, (d, c) in enumerate(zip(dlen, choice)) if d != 0 and c != 0.5]
    human_all = np.array([{"A": 1.0, "B": 0.0, "tie": 0.5}[items[i].label] for i in range(n)])
    dlen_all = np.array([_length(it.response_a, length_unit) - _length(it.response_b, length_unit) for it in items], dtype=float)
    hl = [i for i in range(n) if dlen_all[i] != 0 and human_all[i] != 0.5]

    counts, edges = np.histogram(pp, bins=10, range=(0.0, 1.0))
    by_source: dict[str, dict[str, Any]] = {}
    both_set = set(both)
    for src in sorted({it.source for it in items}):
        idx = [i for i in range(n) if items[i].source == src]
        lab_s = [i for i in idx if i in human]
        by_source[src] = {
            "n": len(idx),
            "agreement": mean(1.0 - abs(_verdict(p[i]) - human[i]) for i in lab_s),
            "position_consistency": mean(float(_verdict(judgments[i].p_ab) == _verdict(judgments[i].p_ba))
                                          for i in idx if i in both_set),
            "parse_failures": sum(p[i] is None for i in idx),
        }

    return {
        "n": n,
        "n_parsed": len(parsed),
        "parse_failures": n - len(parsed),
        "parse_failure_rate": (n - len(parsed)) / n if n else None,
        "order_parse_failures": order_fail,
        "n_labelled": len(lab),
        "agreement": mean(hits),
        "agreement_strict": mean(hits_strict),
        "agreement_single_order": mean(hits_single),
        "judge_tie_rate": mean(float(p[i] == 0.5) for i in parsed),
        "human_ties": {
            "n": len(ties),
            "judge_tie_rate": mean(float(p[i] == 0.5) for i in ties),
            "mean_abs_p_minus_half": mean(abs(p[i] - 0.5) for i in ties),
        },
        "position_consistency": mean(consistent),
        "first_position_win_rate": mean(first_wins),
        "mean_p_first": mean(p_first),
        "length_correlation": somers_d(pp, dlen) if len(pp) >= 2 else None,
        "length_spearman": spearman(pp, dlen),
        "length_slope": slope,
        "longer_preferred_rate": mean(float((dlen[i] > 0) == (choice[i] == 1.0)) for i in longer),
        "human_longer_preferred_rate": mean(float((dlen_all[i] > 0) == (human_all[i] == 1.0)) for i in hl),
        "human_length_correlation": somers_d(human_all, dlen_all) if n >= 2 else None,
        "p_histogram": {"edges": [float(e) for e in edges], "counts": [int(c) for c in counts]},
        "mean_p": mean(p),
        "by_source": by_source,
    }


_LIST_LINE = re.compile(r"^\s*(?:[-*\u2022]|\d+[.)])\s+", re.M)


def has_list(text: str) -> bool:
    """At least two lines that start like a bullet or numbered list item."""
    return len(_LIST_LINE.findall(text)) >= 2


def _rate_ci(hits: Sequence[float]) -> list[float | None]:
    """Wilson 95% interval of a mean of [0, 1] values (ties count one half)."""
    return list(wilson_interval(float(sum(hits)), len(hits))) if hits else [None, None]


def cohen_kappa(judge: Sequence[str], human: Sequence[str]) -> float | None:
    """Cohen's kappa of two raters' categorical labels: (p_o - p_e) / (1 - p_e)."""
    n = len(judge)
    if n == 0:
        return None
    cats = sorted(set(judge) | set(human))
    po = sum(a == b for a, b in zip(judge, human)) / n
    pe = sum((sum(a == c for a in judge) / n) * (sum(b == c for b in human) / n) for c in cats)
    if pe >= 1.0:
        return None  # both raters constant and equal: kappa is undefined
    return float((po - pe) / (1 - pe))


def _pair_key(it: CalibrationItem) -> tuple[str, frozenset]:
    return it.prompt, frozenset((it.response_a, it.response_b))


def human_human_agreement(items: Sequence[CalibrationItem]) -> dict[str, Any]:
    """Agreement between humans on pairs labelled more than once (the same prompt and
    responses, in either order): the share of agreeing label pairs within each pair,
    ties counting one half against A/B, pooled."""
    groups: dict[tuple[str, frozenset], list[float]] = {}
    for it in items:
        # canonical orientation: 1 = the lexicographically first response is better
        first = min(it.response_a, it.response_b)
        v = {"A": 1.0, "B": 0.0, "tie": 0.5}[it.label]
        groups.setdefault(_pair_key(it), []).append(v if it.response_a == first else 1.0 - v)
    hits: list[float] = []
    multi = 0
    for labels in groups.values():
        if len(labels) < 2:
            continue
        multi += 1
        for x in range(len(labels)):
            for y in range(x + 1, len(labels)):
                hits.append(1.0 - abs(labels[x] - labels[y]) if 0.5 in (labels[x], labels[y]) else float(labels[x] == labels[y]))
    return {"n_pairs_multi": multi, "n_label_pairs": len(hits), "agreement": mean(hits), "ci95": _rate_ci(hits)}


def calibration_metrics(items: Sequence[CalibrationItem], judgments: Sequence[Judgment], length_unit: str = "chars",
                        *, seed_judgments: Sequence[Sequence[Judgment]] = (), calibration_method: str = "temperature",
                        seed: int = 0) -> dict[str, Any]:
    """Every calibration-set metric of the audit from items and the judge's verdicts (pure).

    ``seed_judgments`` are further passes of the judge over the same items (other seeds),
    for alpaca_eval's bias and variance."""
    m = _v1_metrics(items, judgments, length_unit)
    n = len(items)
    p = [j.p for j in judgments]
    lab = [i for i in range(n) if p[i] is not None and items[i].label != "tie"]
    human = {i: 1.0 if items[i].label == "A" else 0.0 for i in lab}
    ci: dict[str, list[float | None]] = {}

    hits = [1.0 - abs(_verdict(p[i]) - human[i]) for i in lab]
    ci["agreement"] = _rate_ci(hits)
    ci["agreement_strict"] = _rate_ci([float(_verdict(p[i]) == human[i]) for i in lab])
    ci["agreement_single_order"] = _rate_ci([1.0 - abs(_verdict(judgments[i].p_ab) - human[i]) for i in lab
                                             if judgments[i].p_ab is not None])
    ci["judge_tie_rate"] = _rate_ci([float(p[i] == 0.5) for i in range(n) if p[i] is not None])
    hl_all = [i for i in range(n) if items[i].label != "tie"
              and _length(items[i].response_a, length_unit) != _length(items[i].response_b, length_unit)]
    ci["human_longer_preferred_rate"] = _rate_ci(
        [float((_length(items[i].response_a, length_unit) > _length(items[i].response_b, length_unit)) == (items[i].label == "A"))
         for i in hl_all])

    # LLMBar: accuracy of each order alone, both orders right, positional agreement, kappa.
    def order_hits(attr):
        return [float(_verdict(getattr(judgments[i], attr)) == human[i]) for i in lab if getattr(judgments[i], attr) is not None]

    acc_ab, acc_ba = order_hits("p_ab"), order_hits("p_ba")
    both_ok = [float(_verdict(judgments[i].p_ab) == human[i] and _verdict(judgments[i].p_ba) == human[i])
               for i in lab if judgments[i].p_ab is not None and judgments[i].p_ba is not None]
    m["accuracy_order_ab"], ci["accuracy_order_ab"] = mean(acc_ab), _rate_ci(acc_ab)
    m["accuracy_order_ba"], ci["accuracy_order_ba"] = mean(acc_ba), _rate_ci(acc_ba)
    m["both_orders_correct"], ci["both_orders_correct"] = mean(both_ok), _rate_ci(both_ok)
    both = [i for i in range(n) if judgments[i].p_ab is not None and judgments[i].p_ba is not None]
    cons = [float(_verdict(judgments[i].p_ab) == _verdict(judgments[i].p_ba)) for i in both]
    m["positional_agreement"] = m["position_consistency"]
    ci["position_consistency"] = ci["positional_agreement"] = _rate_ci(cons)
    cat = {1.0: "A", 0.0: "B", 0.5: "tie"}
    jl = [cat[_verdict(p[i])] for i in lab]
    hl = [cat[human[i]] for i in lab]
    m["cohen_kappa"] = cohen_kappa(jl, hl)
    if len(lab) >= 2 and m["cohen_kappa"] is not None:
        rng = np.random.default_rng(seed)
        boots = []
        for _ in range(500):
            r = rng.integers(0, len(lab), len(lab))
            k = cohen_kappa([jl[x] for x in r], [hl[x] for x in r])
            if k is not None:
                boots.append(k)
        ci["cohen_kappa"] = [float(np.quantile(boots, 0.025)), float(np.quantile(boots, 0.975))] if boots else [None, None]

    # Position: every query's "first shown wins" (ties one half).
    first = []
    for j in judgments:
        if j.p_ab is not None:
            first.append(_verdict(j.p_ab))
        if j.p_ba is not None:
            first.append(1.0 - _verdict(j.p_ba))
    m["p_prefers_first"] = m["first_position_win_rate"]
    ci["first_position_win_rate"] = ci["p_prefers_first"] = _rate_ci(first)

    # Longer / lists: on pairs that differ, how often the judge's (debiased) choice is the longer / listy one.
    def _len(t):
        return _length(t, length_unit)

    longer = [float((_len(items[i].response_a) > _len(items[i].response_b)) == (_verdict(p[i]) == 1.0))
              for i in range(n) if p[i] is not None and _verdict(p[i]) != 0.5
              and _len(items[i].response_a) != _len(items[i].response_b)]
    m["p_prefers_longer"] = mean(longer)
    ci["longer_preferred_rate"] = ci["p_prefers_longer"] = _rate_ci(longer)
    lists = [i for i in range(n) if has_list(items[i].response_a) != has_list(items[i].response_b)]
    pick_list = [float(has_list(items[i].response_a) == (_verdict(p[i]) == 1.0)) for i in lists
                 if p[i] is not None and _verdict(p[i]) != 0.5]
    human_list = [float(has_list(items[i].response_a) == (items[i].label == "A")) for i in lists if items[i].label != "tie"]
    m["p_prefers_lists"], ci["p_prefers_lists"] = mean(pick_list), _rate_ci(pick_list)
    m["human_prefers_lists"], ci["human_prefers_lists"] = mean(human_list), _rate_ci(human_list)
    m["n_list_pairs"] = len(lists)
    m["parse_failure_rate_ci95"] = _rate_ci([float(x is None) for x in p])
    ci["parse_failure_rate"] = m.pop("parse_failure_rate_ci95")

    # alpaca_eval bias / variance across seeds: the modal verdict over seeds vs humans, and
    # how often one seed's verdict differs from the modal one.
    passes = [list(judgments)] + [list(js) for js in seed_judgments]
    m["n_seeds"] = len(passes)
    modal, spread = [], []
    for i in lab:
        vs = [_verdict(js[i].p) for js in passes if js[i].p is not None]
        if not vs:
            continue
        vals, counts = np.unique(vs, return_counts=True)
        mode = float(vals[np.argmax(counts)])
        modal.append(1.0 - abs(mode - human[i]))
        spread += [float(v != mode) for v in vs]
    m["bias"] = None if not modal else 1.0 - float(np.mean(modal))
    ci["bias"] = [None, None] if not modal else [1.0 - x for x in _rate_ci(modal)[::-1]]
    m["variance"] = mean(spread) if len(passes) > 1 else None
    ci["variance"] = _rate_ci(spread) if len(passes) > 1 else [None, None]

    # Per source (with intervals) and per constitution principle.
    for src, row in m["by_source"].items():
        idx = [i for i in lab if items[i].source == src]
        row["agreement_ci95"] = _rate_ci([1.0 - abs(_verdict(p[i]) - human[i]) for i in idx])
    by_pr: dict[str, list[float]] = {}
    for i in lab:
        pid = judgments[i].principle_id
        if pid:
            by_pr.setdefault(pid, []).append(1.0 - abs(_verdict(p[i]) - human[i]))
    principles = {}
    for pid, hs in sorted(by_pr.items()):
        rest = [h for q, v in by_pr.items() if q != pid for h in v]
        lo, hi = _rate_ci(hs)
        rest_rate = mean(rest)
        # Flag: even the top of this principle's interval is below the other principles' agreement.
        principles[pid] = {"n": len(hs), "agreement": mean(hs), "ci95": [lo, hi], "others_agreement": rest_rate,
                           "flagged": bool(rest and hi is not None and hi < rest_rate)}
    m["by_principle"] = principles
    m["principles_flagged"] = [k for k, v in principles.items() if v["flagged"]]

    # Length curve for the audit page: by quantile bin of len(A) - len(B), how often the
    # judge and the humans chose A (a flat line is no length preference).
    dl = np.array([_len(items[i].response_a) - _len(items[i].response_b) for i in lab], dtype=float)
    curve = []
    if len(lab) >= 2:
        edges = np.unique(np.quantile(dl, np.linspace(0, 1, 7)))
        which = np.clip(np.searchsorted(edges, dl, side="right") - 1, 0, max(0, len(edges) - 2))
        for b in range(max(1, len(edges) - 1)):
            idx = [lab[k] for k in range(len(lab)) if which[k] == b]
            if not idx:
                continue
            jv = [_verdict(p[i]) for i in idx]
            hv = [human[i] for i in idx]
            curve.append({"dlen_lo": float(edges[b]), "dlen_hi": float(edges[min(b + 1, len(edges) - 1)]),
                          "dlen_mean": float(np.mean([dl[lab.index(i)] for i in idx])), "n": len(idx),
                          "judge_a": mean(jv), "judge_a_ci95": _rate_ci(jv),
                          "human_a": mean(hv), "human_a_ci95": _rate_ci(hv)})
    m["length_curve"] = curve
    m["human_human"] = human_human_agreement(items)
    m["calibration"] = calibration_report([p[i] for i in lab], [human[i] for i in lab], method=calibration_method,
                                          seed=seed)
    m["ci95"] = ci
    return m
