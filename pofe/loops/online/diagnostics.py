"""The off-policy diagnostic of ``pofe online`` (OAIF, Guo et al. 2024, Appendix B and Fig. 8).

Appendix B shows why offline DAP is off-policy: the policy being trained assigns a clearly
lower log-probability to responses written by another model (the preference file's) than to
its own samples. This module measures that gap *during* training, at the weights theta_t a step
trains from, on the same scale for both sets -- the mean log-probability per response token
(sum of log pi_theta(y_t | x, y_<t) over every response token of the set / number of those tokens):

* ``offpolicy/logp_fresh``: the policy's own fresh samples of the step. In the online modes they
  are the responses the step trains on, and their log pi_theta is already summed by the DAP
  update's policy pass (before the optimiser step): reused, no second pass. (In mode=iterative
  and mode=async those samples are up to K-1 / 1 updates old: the number is what theta_t thinks
  of the responses it trains on.) In mode=offline nothing is sampled for training, so one
  response per offline row's prompt is sampled (seeded by ``(seed, step)``, off the training
  RNG) and scored in a no-grad pass;
* ``offpolicy/logp_offline`` (and ``_chosen`` / ``_rejected``): a fixed set of offline responses,
  ``diagnostics.offline_rows`` preference rows drawn once with the run seed from
  ``diagnostics.offline_responses`` (default: ``data.preferences``), both responses of each;
  one no-grad pass;
* ``offpolicy/gap`` = fresh - offline: positive is Appendix B's finding (the offline responses
  are less likely under the policy than its own samples).
"""

from __future__ import annotations

import random
from typing import Any, Sequence

import torch
from pydantic import Field, model_validator

from pofe.config import ConfigError, PofeConfig
from pofe.runtime.seeds import probe_seed


class DiagnosticsSettings(PofeConfig):
    """Training diagnostics logged to ``metrics.jsonl`` (``pofe.loops.online.diagnostics``)."""

    offpolicy: bool = False
    """Log OAIF Appendix B's off-policy gap: the policy's mean per-token log-prob of its own fresh samples
    (``offpolicy/logp_fresh``) and of a fixed set of offline responses (``offpolicy/logp_offline``), and
    ``offpolicy/gap`` = fresh - offline."""
    offpolicy_every: int = Field(1, ge=1)
    """Measure every N steps. Every step by default: the fresh half reuses the update's policy pass and the
    offline half is one no-grad forward over 2 x offline_rows responses (no sampling, no judging, no backward);
    in mode=offline it also samples one response per row."""
    offline_responses: str | None = None
    """A prompt/chosen/rejected file whose responses are the offline set; None = data.preferences (mode=offline).
    Required with offpolicy in the other modes."""
    offline_rows: int = Field(8, ge=1)
    """Rows of that file drawn once with the run seed; both responses of each are measured."""

    @model_validator(mode="after")
    def _only_when_on(self) -> "DiagnosticsSettings":
        if not self.offpolicy:  # a setting that does nothing would look like a measurement that happened
            for key in ("offpolicy_every", "offline_responses", "offline_rows"):
                if getattr(self, key) != type(self).model_fields[key].default:
                    raise ConfigError(f"bad value for 'diagnostics.{key}': it applies only with diagnostics.offpolicy "
                                      "= true; remove it or set diagnostics.offpolicy=true")
        return self


def mean_token_logp(model, prompt_ids: Sequence[Sequence[int]], response_ids: Sequence[Sequence[int]], *,
                    pad_token_id: int, device, chunk: int = 8) -> tuple[float, int]:
    """(sum of log pi(y_t | x, y_<t) over every response token, number of response tokens) of
    ``model``, no grad, ``chunk`` sequences per forward. Empty responses count nothing."""
    from pofe.loops.online.dap import completion_logps
    from pofe.logprobs import SequenceBatch, build_batch

    rows = [(list(p), list(r)) for p, r in zip(prompt_ids, response_ids) if len(r)]
    total, n = 0.0, 0
    with torch.no_grad():
        for s in range(0, len(rows), chunk):
            part = rows[s:s + chunk]
            b = build_batch([p for p, _ in part], [r for _, r in part], pad_token_id=pad_token_id, padding_side="left")
            batch = SequenceBatch(b.input_ids.to(device), b.attention_mask.to(device), b.completion_mask.to(device))
            total += float(completion_logps(model, batch, max(len(r) for _, r in part)).sum())
            n += sum(len(r) for _, r in part)
    return total, n


def fresh_from_update(pairs, result) -> tuple[float, int]:
    """(summed log-prob, tokens) of the step's trained responses from the DAP update's own policy
    pass (``result.pairs``' chosen/rejected log pi_theta, summed per response), matched to ``pairs``
    by position: the update keeps their order."""
    if result is None:
        return 0.0, 0
    total = sum(ps.chosen_logp + ps.rejected_logp for ps in result.pairs)
    n = sum(len(tp.chosen_ids) + len(tp.rejected_ids) for tp in pairs[:len(result.pairs)])
    return total, n


def _ratio(total: float, n: float) -> float | None:
    return total / n if n else None


class OffPolicyProbe:
    """The diagnostic of one run: the fixed offline rows (drawn once with the seed), tokenised on
    first use; :meth:`before_update` measures at theta_t, :meth:`row` adds the fresh half."""

    def __init__(self, pairs: Sequence[Any], *, every: int, sample_fresh: bool, seed: int):
        self.pairs, self.every, self.sample_fresh, self.seed = list(pairs), every, sample_fresh, seed
        self.tokens = None  # [TokenPair] of the offline rows, once a tokenizer is known

    @classmethod
    def load(cls, cfg, items: Sequence[Any]) -> "OffPolicyProbe | None":
        """The probe of an online config (None when ``diagnostics.offpolicy`` is off); ``items`` are
        the training items (the preference pairs in mode=offline). Refused before any model loads."""
        d = cfg.diagnostics
        if not d.offpolicy:
            return None
        if d.offline_responses:
            from pofe.data.preferences import load_preferences

            pool = load_preferences(d.offline_responses).pairs
        else:  # mode=offline (the other modes need the file: checked when the config is parsed)
            pool = list(items)
        if not pool:
            raise ConfigError(f"diagnostics.offline_responses: {d.offline_responses or cfg.data.preferences} has no pairs")
        rows = random.Random(cfg.seed).sample(pool, min(d.offline_rows, len(pool)))
        return cls(rows, every=d.offpolicy_every, sample_fresh=cfg.mode == "offline", seed=cfg.seed)

    def due(self, step: int) -> bool:
        return step % self.every == 0

    def before_update(self, step: int, policy, tokenizer, sampling, *, device) -> dict[str, Any]:
        """At theta_t (before the step's optimiser step): the offline rows' log-probs, and in
        mode=offline a fresh sample per row and its log-prob. Empty when not due."""
        from pofe.loops.online.dap import tokenize_pair

        if not self.due(step):
            return {}
        if self.tokens is None:  # "soft": a tied row (p = 0.5) is kept; the set is the file's responses
            cache: dict = {}
            self.tokens = [t for t in (tokenize_pair(tokenizer, pp, tokenizer.eos_token_id, cache, "soft")
                                       for pp in self.pairs) if t is not None]
        pad = tokenizer.pad_token_id
        prompts = [t.prompt_ids for t in self.tokens]
        ch = mean_token_logp(policy, prompts, [t.chosen_ids for t in self.tokens], pad_token_id=pad, device=device)
        rj = mean_token_logp(policy, prompts, [t.rejected_ids for t in self.tokens], pad_token_id=pad, device=device)
        out = {"offline": (ch[0] + rj[0], ch[1] + rj[1]), "chosen": ch, "rejected": rj}
        if self.sample_fresh:
            out["fresh"] = self._sample(step, policy, tokenizer, sampling, device)
        return out

    def _sample(self, step: int, policy, tokenizer, sampling, device) -> tuple[float, int]:
        from pofe.generation import generate
        from pofe.generation.base import prompt_input
        from pofe.records import Prompt

        prompts = [Prompt(pp.prompt, messages=getattr(pp, "messages", None)) for pp in self.pairs]
        hf = sampling.model_copy(update={"engine": "hf"})  # theta_t's own tensors, no engine to build or sync
        with torch.random.fork_rng(devices=[]), torch.no_grad():  # off the training RNG: resume stays exact
            comps = [g[0] for g in generate(policy, tokenizer, [prompt_input(p) for p in prompts], n=1,
                                            sampling=hf, seed=probe_seed(self.seed, step))]
        return mean_token_logp(policy, [c.prompt_token_ids for c in comps], [c.token_ids for c in comps],
                               pad_token_id=tokenizer.pad_token_id, device=device)

    def row(self, step: int, measured: dict[str, Any], pairs, result, *, acc) -> dict[str, Any]:
        """The step's ``offpolicy/*`` keys (every process calls this: the fresh sums are summed over
        processes; the offline rows are the same on every process)."""
        from pofe.runtime.parallel import reduce_sum

        if not self.due(step):
            return {}
        fresh = measured.get("fresh") or fresh_from_update(pairs, result)
        f_sum, f_n = reduce_sum(acc, fresh[0]), reduce_sum(acc, fresh[1])
        if self.sample_fresh:  # every process sampled the same rows: the mean is any one's
            f_sum, f_n = fresh
        fr, off = _ratio(f_sum, f_n), _ratio(*measured["offline"])
        return {"offpolicy/logp_fresh": fr, "offpolicy/logp_offline": off,
                "offpolicy/logp_offline_chosen": _ratio(*measured["chosen"]),
                "offpolicy/logp_offline_rejected": _ratio(*measured["rejected"]),
                "offpolicy/gap": None if fr is None or off is None else fr - off,
                "offpolicy/fresh_tokens": int(f_n), "offpolicy/offline_tokens": int(measured["offline"][1])}


def offpolicy_summary(history: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """First and last measured values and the share of measured steps with a positive gap."""
    rows = [h for h in history if h.get("offpolicy/gap") is not None]
    if not rows:
        return None
    keys = ("offpolicy/logp_fresh", "offpolicy/logp_offline", "offpolicy/gap")
    return {"steps": len(rows), "first": {k: rows[0].get(k) for k in keys}, "last": {k: rows[-1].get(k) for k in keys},
            "positive_gap_rate": sum(h["offpolicy/gap"] > 0 for h in rows) / len(rows)}


__all__ = ["DiagnosticsSettings", "OffPolicyProbe", "mean_token_logp", "fresh_from_update", "offpolicy_summary"]
