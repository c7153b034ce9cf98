"""What judging costs: tokens in and out, a price, and a budget that stops a run cleanly.

Every judge that calls a model counts its own work (:class:`Metered`): ``calls`` are the
reads it sent to its backend (one per order of a pairwise comparison, one per scored
response), ``cached`` the reads the judge cache answered (they cost nothing and are counted
apart), ``tokens_in`` the prompt tokens sent or scored (both orders counted; a CoT rationale is
sent back with the choice read, so it is counted as input there too) and ``tokens_out`` the
generated tokens (CoT rationales, rubric justifications, an endpoint's text answer). An
OpenAI-compatible server's own ``usage`` (``prompt_tokens``, ``completion_tokens``) is the
count when it reports one -- it is what the server bills; in-process backends count with the
judge's own tokenizer. A request whose server reported no usage is counted in ``unmetered``
(its tokens are unknown, never guessed). Programmatic judges call no model: zero tokens.
A jury's usage is the sum of its members'.

A step's ``judge/*`` keys are the metered judge's work since the previous row: a held-out
measurement or a win rate the same judge object judged between two steps counts in the next
row; a summary's ``judge_usage`` is the run's total at its end (a final evaluation included).

``judge.price`` turns tokens into ``cost`` (currency-agnostic: per million tokens in and out).
``judge.budget`` caps tokens and/or cost for one run: after a step whose judging brought the
run's total *past* the budget, the driver checkpoints that step, writes ``summary.stopped``
and the command exits with :class:`BudgetError` naming the step (exit 2). The step is kept,
never thrown away: its labels are paid for. ``--resume --set judge.budget.tokens=N`` continues
with a larger budget. The check is after the fact because a step's token count is known only
once its judging is done (an endpoint reports usage per answer).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import asdict, dataclass, fields
from typing import Any, Iterable, Sequence

from pydantic import Field, model_validator

from pofe.config import ConfigError, PofeConfig
from pofe.errors import PofeError

log = logging.getLogger(__name__)


class PriceConfig(PofeConfig):
    """``judge.price``: what the judge's tokens cost (any currency; per million tokens)."""

    input_per_million: float = Field(0.0, ge=0)
    """Price of one million prompt tokens sent to the judge (both orders count)."""
    output_per_million: float = Field(0.0, ge=0)
    """Price of one million tokens the judge generates (CoT rationales, text answers)."""


class BudgetConfig(PofeConfig):
    """``judge.budget``: the most one run may spend on judging (tokens and/or cost)."""

    tokens: int | None = Field(None, ge=0)
    """Tokens in + out; the run stops cleanly after the step that goes past it (resume with a larger one)."""
    cost: float | None = Field(None, ge=0)
    """Cost in ``judge.price``'s currency (needs ``judge.price``); the run stops after the step that goes past it."""

    @model_validator(mode="after")
    def _something(self) -> "BudgetConfig":
        if self.tokens is None and self.cost is None:
            raise ConfigError("bad value for 'judge.budget': give tokens and/or cost (or remove the section)")
        return self


class BudgetError(PofeError):
    """The judge budget was spent (``judge.budget``): the run stopped after a checkpointed step."""

    exit_code = 2

    def __init__(self, message: str, *, step: int):
        super().__init__(message)
        self.step = step


@dataclass
class JudgeUsage:
    """One judge's (or a run's) judging work; ``cost`` is None without a price."""

    calls: int = 0
    cached: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    unmetered: int = 0
    cost: float | None = None

    @property
    def tokens(self) -> int:
        return self.tokens_in + self.tokens_out

    def __add__(self, other: "JudgeUsage") -> "JudgeUsage":
        cost = None if self.cost is None and other.cost is None else (self.cost or 0.0) + (other.cost or 0.0)
        return JudgeUsage(self.calls + other.calls, self.cached + other.cached, self.tokens_in + other.tokens_in,
                          self.tokens_out + other.tokens_out, self.unmetered + other.unmetered, cost)

    def __sub__(self, other: "JudgeUsage") -> "JudgeUsage":
        cost = None if self.cost is None else self.cost - (other.cost or 0.0)
        return JudgeUsage(self.calls - other.calls, self.cached - other.cached, self.tokens_in - other.tokens_in,
                          self.tokens_out - other.tokens_out, self.unmetered - other.unmetered, cost)

    def priced(self, price: PriceConfig | None) -> "JudgeUsage":
        """This usage with ``cost`` from ``price`` (per million tokens in and out)."""
        if price is None:
            return JudgeUsage(**{**asdict(self), "cost": None})
        cost = (self.tokens_in * price.input_per_million + self.tokens_out * price.output_per_million) / 1e6
        return JudgeUsage(**{**asdict(self), "cost": cost})

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "tokens": self.tokens}

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> "JudgeUsage":
        d = d or {}
        return cls(**{f.name: d.get(f.name, f.default) for f in fields(cls)})


class Metered:
    """Mixin of a judge that counts its own reads (``usage()``); ``price`` is set by
    :func:`pofe.judges.registry.build_judge` from ``judge.price``."""

    price: PriceConfig | None = None

    def count(self, *, calls: int = 0, cached: int = 0, tokens_in: int = 0, tokens_out: int = 0,
              unmetered: int = 0) -> None:
        # the async pair source judges in a background thread while the loop reads usage()
        lock = self.__dict__.setdefault("_usage_lock", threading.Lock())
        with lock:
            u = self.__dict__.setdefault("_usage", JudgeUsage())
            u.calls += calls
            u.cached += cached
            u.tokens_in += tokens_in
            u.tokens_out += tokens_out
            u.unmetered += unmetered

    def usage(self) -> JudgeUsage:
        """Everything this judge object has judged since it was built (cost from its price)."""
        return self.__dict__.get("_usage", JudgeUsage()).priced(self.price)


def usage_of(judge: Any) -> JudgeUsage:
    """A judge's usage: its own ``usage()``, a jury's members summed, a pointwise judge seen as
    pairwise through its inner judge, zero for a judge that calls no model (programmatic
    kinds, a user's own judge without ``usage``)."""
    if judge is None:
        return JudgeUsage()
    members = getattr(judge, "members", None)
    if isinstance(members, (list, tuple)) and members:
        total = JudgeUsage()
        for m in members:
            total = total + usage_of(m)
        return total
    inner = getattr(judge, "inner", None)
    if inner is not None and not callable(getattr(judge, "usage", None)):
        return usage_of(inner)
    fn = getattr(judge, "usage", None)
    if callable(fn):
        u = fn()
        return u if isinstance(u, JudgeUsage) else JudgeUsage.from_dict(u)
    return JudgeUsage()


def usage_sum(judges: Iterable[Any], dp=None) -> JudgeUsage:
    """The summed usage of ``judges`` (distinct objects counted once), over every process of
    ``dp`` (a collective then: every process calls it and gets the same numbers)."""
    seen, total = set(), JudgeUsage()
    for j in judges:
        if j is not None and id(j) not in seen:
            seen.add(id(j))
            total = total + usage_of(j)
    if dp is None or getattr(dp, "world", 1) <= 1:
        return total
    vals = {f.name: dp.sum(float(getattr(total, f.name) or 0.0)) for f in fields(JudgeUsage) if f.name != "cost"}
    cost = dp.sum(float(total.cost or 0.0))
    return JudgeUsage(**{k: int(round(v)) for k, v in vals.items()}, cost=None if total.cost is None else cost)


def usage_row(step: JudgeUsage, total: JudgeUsage) -> dict[str, Any]:
    """A metrics row's ``judge/*`` keys: this step's work and the run's running total (``_total``)."""
    row: dict[str, Any] = {}
    for name, u in (("", step), ("_total", total)):
        row.update({f"judge/calls{name}": u.calls, f"judge/cached{name}": u.cached,
                    f"judge/tokens_in{name}": u.tokens_in, f"judge/tokens_out{name}": u.tokens_out,
                    f"judge/cost{name}": u.cost})
    row["judge/unmetered_total"] = total.unmetered  # requests whose tokens the server did not report
    return row


def usage_summary(history: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The run's judging totals from its last metrics row that has them (None: no judge rows)."""
    last = next((h for h in reversed(history) if "judge/tokens_in_total" in h), None)
    if last is None:
        return None
    u = {k: last.get(f"judge/{k}_total") for k in ("calls", "cached", "tokens_in", "tokens_out", "cost", "unmetered")}
    return {**u, "tokens": (u["tokens_in"] or 0) + (u["tokens_out"] or 0)}


class BudgetMeter:
    """The judging of one run: its running total across resumes (kept in the checkpoint), the
    ``judge/*`` row of each step, and the budget's stop."""

    def __init__(self, budget: BudgetConfig | None, judges: Sequence[Any] = (), *, dp=None,
                 state: dict[str, Any] | None = None):
        self.budget, self.judges, self.dp = budget, list(judges), dp
        # spent by earlier processes of this run (a resume starts with fresh judge objects)
        self.before = JudgeUsage.from_dict((state or {}).get("judge_usage"))
        self.last = usage_sum(self.judges, dp)  # judges built already may have worked (none do yet)
        self.base = self.last
        self.stop: BudgetError | None = None
        self.warned = False

    def total(self, now: JudgeUsage | None = None) -> JudgeUsage:
        return self.before + ((now if now is not None else usage_sum(self.judges, self.dp)) - self.base)

    def row(self, step: int) -> dict[str, Any]:
        """The step's ``judge/*`` keys, and the budget check (a collective under data parallel)."""
        now = usage_sum(self.judges, self.dp)
        spent, total = now - self.last, self.total(now)
        self.last = now
        why = exceeded(self.budget, total)
        if total.unmetered and self.budget is not None and not self.warned:
            self.warned = True
            log.warning("judge.budget: %d judge requests so far had no token usage reported by the server; their "
                        "tokens are unknown and not counted against the budget", total.unmetered)
        if why and self.stop is None:
            self.stop = BudgetError(f"judge budget spent at step {step}: {why}; stopped after step {step}'s "
                                    f"checkpoint (raise it with --resume RUN --set judge.budget.tokens=N or "
                                    f"judge.budget.cost=X)", step=step)
        return usage_row(spent, total)

    def state(self) -> dict[str, Any]:
        return {"judge_usage": self.total().to_dict()}

    def summary(self) -> dict[str, Any]:
        """The run's total now (a collective under data parallel): with what was judged after the
        last row (a final evaluation)."""
        return self.total().to_dict()

    def after_row(self, step: int) -> BudgetError | None:
        return self.stop if self.stop is not None and self.stop.step == step else None


def budget_of(judge_cfg: Any) -> BudgetConfig | None:
    """A judge config's ``budget`` (None for none, and for a plugin kind, which has no such key)."""
    return getattr(judge_cfg, "budget", None)


def exceeded(budget: BudgetConfig | None, total: JudgeUsage) -> str | None:
    """Why ``total`` is past ``budget`` (None: within it)."""
    if budget is None:
        return None
    if budget.tokens is not None and total.tokens > budget.tokens:
        return f"{total.tokens} tokens > judge.budget.tokens={budget.tokens}"
    if budget.cost is not None and total.cost is not None and total.cost > budget.cost:
        return f"cost {total.cost:.6g} > judge.budget.cost={budget.cost:g}"
    return None


__all__ = ["PriceConfig", "BudgetConfig", "BudgetError", "JudgeUsage", "Metered", "usage_of", "usage_sum", "usage_row",
           "usage_summary", "BudgetMeter", "budget_of", "exceeded"]
