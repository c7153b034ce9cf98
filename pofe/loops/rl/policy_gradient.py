"""Policy-gradient pieces of ``pofe rl``: group baselines, KL estimators, the per-sequence
loss, per-token log-probs of sampled responses, and the reward sources a step is scored with.

Pure functions where possible, so the numbers can be checked by hand (tests/loops/test_rl.py):

* **RLOO** (Ahmadian et al. 2024): the whole response is one action; advantage
  A_i = r_i − mean_{j≠i} r_j (leave-one-out, unbiased), loss −A_i · log π(y_i | x).
* **GRPO-style** (Shao et al. 2024): A_i = (r_i − mean r) / (std r + ε), applied to every
  token and averaged per response, loss −(1/|y_i|) Σ_t A_i log π(y_i,t).
* KL to the reference from per-token log-probs (Schulman 2020): k1 (unbiased) and k3 (≥ 0).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from typing import Annotated, Any

import torch
from pydantic import AfterValidator

from pofe.plugins import PluginError, lookup, name_validator
from pofe.records import Completion


# ----------------------------------------------------------------------------- pure pieces

def group_advantages(rewards: torch.Tensor, algo: str, eps: float = 1e-6) -> torch.Tensor:
    """Advantages for rewards of shape (G, k): RLOO leave-one-out or GRPO standardised.

    RLOO: A_i = r_i − (Σ_j r_j − r_i)/(k − 1)  (= k/(k − 1) · (r_i − mean r)).
    GRPO: A_i = (r_i − mean r)/(std r + ε), std with the unbiased 1/(k − 1) normaliser
    (torch's default); a constant group gives 0 either way.
    """
    k = rewards.shape[1]
    if k < 2:
        raise ValueError("group baselines need at least 2 samples per prompt")
    if algo == "rloo":
        loo_mean = (rewards.sum(dim=1, keepdim=True) - rewards) / (k - 1)
        return rewards - loo_mean
    if algo == "grpo":
        return (rewards - rewards.mean(dim=1, keepdim=True)) / (rewards.std(dim=1, keepdim=True) + eps)
    raise ValueError(f"unknown algo {algo!r}")


def masked_group_advantages(total: torch.Tensor, valid: torch.Tensor, k: int, algo: str) -> torch.Tensor:
    """Advantages for a flat (G·k,) reward vector where ``valid`` marks scored samples.

    Unscored samples get advantage 0 (no gradient) and do not move their group's baseline;
    a group with fewer than 2 scored samples has no baseline and gets no gradient at all."""
    adv = torch.zeros_like(total)
    for g in range(len(total) // k):
        sl = slice(g * k, (g + 1) * k)
        v = valid[sl]
        if int(v.sum()) >= 2:
            adv_g = torch.zeros(k, dtype=total.dtype)
            adv_g[v] = group_advantages(total[sl][v].unsqueeze(0), algo).squeeze(0)
            adv[sl] = adv_g
    return adv


_LIST_ITEM = re.compile(r"^[ \t]*(?:[-*+]|\d+[.)])[ \t]+\S", re.M)


def list_items(text: str) -> int:
    """Markdown list items in a response: lines that start (after indentation) with ``-``, ``*``,
    ``+``, ``1.`` or ``1)`` followed by a space and text. The list-bias probe's feature: LLM
    judges prefer bulleted answers (the audit's ``bullets`` contrast, alpaca_eval's P(prefers lists))."""
    return len(_LIST_ITEM.findall(text))


def group_shaping(features: dict[str, torch.Tensor], coefs: dict[str, float], valid: torch.Tensor,
                  k: int) -> dict[str, torch.Tensor]:
    """Zero-centred shaping terms, one (G·k,) tensor per feature: within each prompt's group,
    coef · (x_i − mean of x over the group's scored samples), 0 for unscored samples.

    Centring inside the group leaves every group's mean reward (over its scored samples) where
    the reward put it -- ``objective/scores`` keeps its meaning -- and moves only the ranking
    inside the group, which is all a group baseline (RLOO or GRPO) learns from. A group with one
    scored sample gets 0 (nothing to rank). Use it against a judge's measured bias, e.g.
    ``length: -0.01`` per token against a judge that prefers the longer response."""
    out = {}
    for name, x in features.items():
        term = torch.zeros(len(x), dtype=torch.float64)
        for g in range(len(x) // k):
            sl = slice(g * k, (g + 1) * k)
            v = valid[sl]
            if int(v.sum()) >= 2:
                xs = x[sl].to(torch.float64)
                part = torch.zeros(k, dtype=torch.float64)
                part[v] = coefs[name] * (xs[v] - xs[v].mean())
                term[sl] = part
        out[name] = term
    return out


def kl_terms(policy_tok: torch.Tensor, ref_tok: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per-sequence KL estimates from per-token log-probs on the sampled tokens (Schulman 2020):
    k1 = Σ_t (log π − log π_ref) (unbiased, can be negative per sample),
    k3 = Σ_t [e^{ref − log π} − (ref − log π) − 1] (≥ 0 per token)."""
    d = (ref_tok - policy_tok) * mask
    k1 = (-d).sum(-1)
    k3 = ((torch.exp(d) - d - 1.0) * mask).sum(-1)
    return {"k1": k1, "k3": k3}


def pg_loss(policy_tok: torch.Tensor, mask: torch.Tensor, adv: torch.Tensor, algo: str) -> torch.Tensor:
    """Per-sequence policy-gradient loss: RLOO −A·Σ_t logπ; GRPO −A·mean_t logπ.

    One update per batch keeps it on-policy, so the PPO ratio is 1 and clipping is inactive;
    what remains is the REINFORCE gradient with a group baseline (no value model)."""
    seq = (policy_tok * mask).sum(-1)
    if algo == "grpo":
        seq = seq / mask.sum(-1).clamp(min=1)
    return -(adv * seq)


def token_logprobs(model, comps: Sequence[Completion], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, W) log-probs of the sampled tokens (from the ids kept on each Completion) and the (B, W)
    completion mask, W = the longest completion: a left-padded batch whose logits are computed
    only over the completions (:func:`pofe.logprobs.completion_token_logprobs`)."""
    from pofe.logprobs import build_batch, completion_token_logprobs

    b = build_batch([c.prompt_token_ids for c in comps], [c.token_ids for c in comps], pad_token_id=pad_id,
                    padding_side="left")
    width = max(1, max(len(c.token_ids) for c in comps))
    dev = next(model.parameters()).device
    b.input_ids, b.attention_mask, b.completion_mask = (t.to(dev) for t in (b.input_ids, b.attention_mask, b.completion_mask))
    lp = completion_token_logprobs(model, b, width)
    return lp, b.completion_mask[:, -width:].to(lp.dtype)


# ----------------------------------------------------------------------------- reward sources

class RewardFn:
    """(prompts, completions) -> (rewards with None for unscored, info dict)."""

    id: str = "reward"

    def __call__(self, prompts: Sequence[str], completions: Sequence[Completion]) -> tuple[list[float | None], dict[str, Any]]:
        raise NotImplementedError


class LengthReward(RewardFn):
    """±scale · length / normaliser (max_new_tokens for tokens and words, 4x that for chars),
    so rewards sit in [−scale, 0] (prefer shorter) or [0, scale] (prefer longer)."""

    def __init__(self, *, prefer: str, unit: str, scale: float, max_new_tokens: int):
        self.unit, self.scale = unit, scale
        self.sign = -1.0 if prefer == "shorter" else 1.0
        self.norm = float(max_new_tokens * (4 if unit == "chars" else 1))
        self.id = f"length:{prefer}:{unit}"

    def length(self, c: Completion) -> int:
        if self.unit == "tokens":
            return c.num_tokens
        return len(c.text) if self.unit == "chars" else len(c.text.split())

    def __call__(self, prompts, completions):
        return [self.sign * self.scale * self.length(c) / self.norm for c in completions], {}


class JudgeScoreReward(RewardFn):
    """A pointwise judge's score as the reward (direct RLAIF with the expected-score judge).

    The judge returns :class:`~pofe.records.Score` with ``score`` already normalised when it
    is an expected-score judge; a score distribution found in ``Score.extra`` (key
    ``distribution`` / ``probs``) is averaged for logging. ``None`` scores stay None.
    """

    def __init__(self, judge):
        if not callable(getattr(judge, "score", None)):
            raise ValueError(f"judge {getattr(judge, 'id', judge)!r} is not pointwise (no score method); "
                             "use kind expected-score (direct RLAIF) or another pointwise judge")
        self.judge = judge
        self.id = f"judge:{getattr(judge, 'id', '?')}"

    def __call__(self, prompts, completions):
        scores = self.judge.score(list(prompts), [c.text for c in completions])
        vals = [s.score if s.parse_ok else None for s in scores]
        return vals, {"score_distribution": score_distribution(scores)}


class PairwiseTournamentReward(RewardFn):
    """A pairwise judge's tournament among each prompt's samples as the reward
    (:mod:`pofe.loops.rl.tournament`): mean soft win score or per-group Bradley–Terry
    strength; unreadable comparisons masked and counted. ``info["metrics"]`` holds the
    ``reward/...`` numbers of the call (judge calls per group, unreadable, ties, BT spread)."""

    def __init__(self, judge, **settings):
        from pofe.loops.rl.tournament import Tournament

        self.tournament = Tournament(judge, **settings)
        self.judge = self.tournament.judge
        self.id = self.tournament.id

    def __call__(self, prompts, completions):
        rewards, metrics = self.tournament(list(prompts), [c.text for c in completions])
        return rewards, {"metrics": metrics}


class CallableReward(RewardFn):
    """Wrap a Python ``f(prompt, completion) -> float | None`` (library use and tests)."""

    def __init__(self, f: Callable[[str, Completion], float | None], id: str = "callable"):
        self.f, self.id = f, id

    def __call__(self, prompts, completions):
        return [self.f(x, c) for x, c in zip(prompts, completions)], {}


class PluginReward(RewardFn):
    """A reward function from an installed plugin package (entry-point group ``pofe.rewards``,
    :mod:`pofe.plugins`): ``f(prompts, completions) -> (rewards, info)``, the :class:`RewardFn`
    contract. Its answer is checked on every call: one reward per completion, each a finite
    number or None (unscored: no gradient), and a dict of info (``info["metrics"]`` is logged
    in the step's row, as a tournament's counts are)."""

    def __init__(self, name: str, fn: Callable[..., Any]):
        self.name, self.fn = name, fn
        self.id = getattr(fn, "id", None) or f"plugin:{name}"

    def __call__(self, prompts, completions):
        from pofe.plugins import call_error

        try:
            out = self.fn(list(prompts), list(completions))
        except PluginError:
            raise
        except (Exception, SystemExit) as e:  # the plugin's failure, named: never an internal error
            raise call_error("pofe.rewards", self.name, f"on {len(completions)} completions", e) from e
        where = f"reward plugin {self.name!r}"
        if not (isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], dict)):
            raise PluginError(f"{where} returned {type(out).__name__}, not a (rewards, info dict) pair")
        rewards, info = out
        rewards = list(rewards)
        if len(rewards) != len(completions):
            raise PluginError(f"{where} returned {len(rewards)} rewards for {len(completions)} completions")
        for i, r in enumerate(rewards):
            # a NaN is a broken reward, never an unscored sample: None says that
            if r is not None and (isinstance(r, bool) or not isinstance(r, (int, float)) or not math.isfinite(r)):
                raise PluginError(f"{where} returned reward {r!r} for completion {i}: a finite number or None")
        return [None if r is None else float(r) for r in rewards], info


def _check_reward_plugin(name: str, fn: Any) -> None:
    if isinstance(fn, type) or not callable(fn):
        raise PluginError(f"reward plugin {name!r} must be a function or callable object (prompts, completions) -> "
                          f"(rewards, info), got {fn!r}")


REWARD_FUNCTIONS = ("length",)
"""Built-in programmatic rewards (``reward.function``)."""

RewardFunctionName = Annotated[str, AfterValidator(name_validator("pofe.rewards", REWARD_FUNCTIONS, _check_reward_plugin))]
"""``reward.function``: a built-in programmatic reward or a ``pofe.rewards`` plugin."""


def plugin_reward(name: str) -> PluginReward:
    """The ``pofe.rewards`` plugin ``name`` as a :class:`RewardFn`."""
    fn = lookup("pofe.rewards", name, {})
    _check_reward_plugin(name, fn)
    return PluginReward(name, fn)


def score_distribution(scores) -> dict[str, Any] | None:
    """Mean of the judges' distributions over the score tokens (1..10), the expected raw score
    when available, and the share of samples at the top of the scale (E[score] ≥ 90% of the
    range): the number to watch for reward hacking (seed, "Reward hacking the judge")."""
    dists, expected = [], []
    for s in scores:
        extra = getattr(s, "extra", None) or {}
        d = extra.get("distribution") or extra.get("probs") or extra.get("score_probs")
        if isinstance(d, dict):
            keys = sorted(d, key=lambda k: float(k))
            d = [d[k] for k in keys]
        if isinstance(d, (list, tuple)) and d:
            dists.append([float(v) for v in d])
        e = extra.get("expected_score", extra.get("expected"))
        if e is not None:
            expected.append(float(e))
    out: dict[str, Any] = {}
    if dists and len({len(d) for d in dists}) == 1:
        n = len(dists[0])
        mean = [sum(d[i] for d in dists) / len(dists) for i in range(n)]
        out["mean_distribution"] = [round(v, 4) for v in mean]
        evs = [sum((i + 1) * v for i, v in enumerate(d)) / max(sum(d), 1e-12) for d in dists]
        out["top_of_scale_share"] = sum(e >= 1 + 0.9 * (n - 1) for e in evs) / len(evs)
    if expected:
        out["expected_score_mean"] = sum(expected) / len(expected)
    return out or None
