"""A jury: several pairwise judges pooled into one verdict.

Each member judges the pair itself and gives its own p (both orders averaged, if it reads
both); a member with a calibration map from its own ``pofe audit`` report is calibrated first
(``labels.calibration``'s map, applied the same way); the jury's p is the weighted mean of the
members' log-odds, a logarithmic opinion pool (Genest & Zidek 1986):

    p = sigma( sum_i w_i logit(p_i) / sum_i w_i ),   p_i clipped to [0.001, 0.999]

Members that cancel (p and 1 - p at equal weight) pool to 0.5 exactly, a tie, not to a
rounding error's 0.4999999999999999 (which hardens to "B").

The same pool of the members' per-order reads gives the jury's ``p_ab`` and ``p_ba``, so an
audit measures the jury's own position bias. Two members biased towards opposite positions
cancel there: with p_ab = sigma(t + b), p_ba = sigma(t - b) for one and -b for the other, the
equal-weight pool is sigma(t) in both orders.

A member whose verdict is unreadable (``p`` None) is left out of that pair's pool and counted
(``extra.dropped``); when every member is unreadable the jury's verdict is unreadable, never a
made-up 0.5. Every verdict records each member's reads (``extra.members``) for the ledger and
for the audit's member rows.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any, Sequence

from pofe.judges.base import Capability, JudgeConfigError, check_batch, require_capability
from pofe.judges.config import JURY_P_CLIP
from pofe.judges.probability import is_consistent
from pofe.records import Judgment


def _logit(p: float) -> float:
    p = min(max(p, JURY_P_CLIP), 1.0 - JURY_P_CLIP)
    return math.log(p / (1.0 - p))


def _sigmoid(z: float) -> float:
    return 1.0 / (1.0 + math.exp(-z)) if z >= 0 else math.exp(z) / (1.0 + math.exp(z))


def _readable(p: Any) -> bool:
    return isinstance(p, (int, float)) and not isinstance(p, bool) and math.isfinite(p)


TIE_TOLERANCE = 1e-9
"""Pooled log-odds within this fraction of the members' own (weighted mean |logit|) are an exact
tie. Opposite reads do not cancel to 0.0 in floating point: 1 - 0.999 is 0.0010000000000000009,
not 0.001, so a jury of a clipped 1 and a clipped 0 pooled to 0.4999999999999999 and voted "B"
on every pair. The error is ~1e-13 of the log-odds at the clip; nothing a judge reads is that
fine, so a pool that small is the cancellation it stands for and reads 0.5 exactly."""


def pool(ps: Sequence[float | None], weights: Sequence[float]) -> float | None:
    """The weighted mean of the log-odds of the readable ``ps`` (None: none is readable); a
    mean that cancels to within rounding (:data:`TIE_TOLERANCE`) is the tie 0.5, exactly, so
    the pool is symmetric: swapping every member's p for 1 - p gives 1 - the pool."""
    pairs = [(_logit(p), w) for p, w in zip(ps, weights) if _readable(p)]
    if not pairs:
        return None
    total = sum(w for _, w in pairs)
    z = sum(w * x for x, w in pairs) / total
    if abs(z) <= TIE_TOLERANCE * sum(w * abs(x) for x, w in pairs) / total:
        return 0.5
    return _sigmoid(z)


def _map_tag(cmap: dict[str, Any]) -> str:
    core = {k: v for k, v in cmap.items() if k not in ("source", "judge", "calibration_sha256", "agreement")}
    return hashlib.sha256(json.dumps(core, sort_keys=True).encode()).hexdigest()[:8]


class JuryJudge:
    """Pairwise judge pooling ``members`` (pairwise judges) in log-odds with ``weights`` (None:
    equal) after each member's calibration map (``calibrations``, None for none)."""

    capabilities = frozenset({Capability.PAIRWISE})

    def __init__(self, members: Sequence[Any], weights: Sequence[float] | None = None,
                 calibrations: Sequence[dict[str, Any] | None] | None = None, *, judge_id: str | None = None):
        from pofe.labels import apply_calibration

        n = len(members)
        if n < 2:
            raise JudgeConfigError(f"a jury needs at least 2 members, got {n}")
        for i, m in enumerate(members):
            require_capability(m, Capability.PAIRWISE, where=f"judge.members.{i}")
        weights = [1.0] * n if weights is None else [float(w) for w in weights]
        calibrations = [None] * n if calibrations is None else list(calibrations)
        if len(weights) != n or len(calibrations) != n:
            raise JudgeConfigError(f"a jury of {n} members got {len(weights)} weights and {len(calibrations)} "
                                   "calibration maps")
        if not all(math.isfinite(w) and w > 0 for w in weights):
            raise JudgeConfigError(f"jury weights must be positive numbers, got {weights}")
        for i, (m, c) in enumerate(zip(members, calibrations)):
            audited = (c or {}).get("judge")
            if audited is not None and audited != getattr(m, "id", None):
                raise JudgeConfigError(f"judge.calibration.{i}: {c.get('source')} is an audit of judge {audited!r}, "
                                       f"not of member {i} ({getattr(m, 'id', m)!r})")
        total = sum(weights)
        self.members = list(members)
        self.weights = [w / total for w in weights]
        self.calibrations = calibrations
        self._apply = apply_calibration
        self.member_ids = [str(getattr(m, "id", type(m).__name__)) for m in members]
        # the weights and calibrations are part of the id: another pool is another judge
        parts = [f"{w:.4g}*{mid}" + (f"[cal {_map_tag(c)}]" if c else "")
                 for w, mid, c in zip(self.weights, self.member_ids, calibrations)]
        self.id = judge_id or f"jury({' + '.join(parts)})"

    def judge(self, prompts, responses_a, responses_b, *, references=None) -> list[Judgment]:
        check_batch(prompts, responses_a, responses_b)
        kw = {} if references is None else {"references": references}
        reads = []
        for mid, m in zip(self.member_ids, self.members):
            js = m.judge(prompts, responses_a, responses_b, **kw)
            if len(js) != len(prompts):
                raise RuntimeError(f"jury member {mid!r} returned {len(js)} verdicts for {len(prompts)} pairs")
            reads.append(js)
        return [self._verdict([js[k] for js in reads]) for k in range(len(prompts))]

    def _calibrated(self, p: Any, cmap: dict[str, Any] | None) -> float | None:
        return self._apply(float(p), cmap) if _readable(p) else None

    def _verdict(self, js: Sequence[Judgment]) -> Judgment:
        records, kept = [], []
        for mid, w, cmap, j in zip(self.member_ids, self.weights, self.calibrations, js):
            ok = _readable(j.p)
            cal = [self._calibrated(x, cmap) for x in (j.p, j.p_ab, j.p_ba)]
            records.append({"judge_id": mid, "weight": w, "p": j.p, "p_ab": j.p_ab, "p_ba": j.p_ba,
                            "consistent": j.consistent, "principle_id": j.principle_id, "pooled": ok,
                            **({"p_calibrated": cal[0]} if cmap else {})})
            if ok:
                kept.append((w, cal, j))
        dropped = len(js) - len(kept)
        extra: dict[str, Any] = {"members": records, "dropped": dropped}
        if not kept:
            extra["error"] = "every member's verdict is unreadable"
            return Judgment(p=None, p_ab=None, p_ba=None, consistent=None, parse_ok=False, judge_id=self.id,
                            tokens=sum(j.tokens for j in js), latency_s=sum(j.latency_s for j in js), extra=extra)
        w = [k[0] for k in kept]
        p, p_ab, p_ba = (pool([k[1][x] for k in kept], w) for x in range(3))
        return Judgment(p=p, p_ab=p_ab, p_ba=p_ba, consistent=is_consistent(p_ab, p_ba), parse_ok=True,
                        judge_id=self.id, hard_label_fallback=any(k[2].hard_label_fallback for k in kept),
                        tokens=sum(j.tokens for j in js), latency_s=sum(j.latency_s for j in js),
                        cached=all(j.cached for j in js), extra=extra)

    def close(self) -> None:
        for m in self.members:
            if callable(getattr(m, "close", None)):
                m.close()
