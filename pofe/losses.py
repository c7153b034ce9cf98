"""Direct-alignment losses as pure functions (OAIF paper Eq. 1-3), with soft labels.

All three share one signature::

    loss(policy_chosen_logps, policy_rejected_logps,
         ref_chosen_logps, ref_rejected_logps, *, beta, p=1.0) -> LossOutput

Inputs are summed sequence log-probabilities of shape (B,). ``p`` is the soft
preference target P(chosen > rejected) in [0, 1] (a float or a (B,) tensor);
``p = 1`` gives exactly the paper's equations. Let

    h = [log pi(y+|x) - log pi0(y+|x)] - [log pi(y-|x) - log pi0(y-|x)]

be the log-ratio margin (the term inside Eq. 1-3). Then

* DPO  (Eq. 1): ``-log sigma(beta*h)``. Soft: the Bradley-Terry cross-entropy
  against p, ``-p log sigma(beta*h) - (1-p) log sigma(-beta*h)``, minimised at
  ``beta*h = logit(p)`` (rlaif-constitutional-ai, "soft labels").
* IPO  (Eq. 2): ``(h - 1/(2 beta))^2``. Soft: the target becomes
  ``(2p - 1)/(2 beta)`` (Azar et al.: the IPO regression target is proportional to
  p - 1/2), so p = 1/2 pulls the margin to 0 and p = 0 mirrors p = 1.
* SLiC (Eq. 3): ``max(0, 1 - beta*h)``. Soft: the two hinge directions weighted by
  p and 1-p, ``p max(0, 1 - beta*h) + (1-p) max(0, 1 + beta*h)``.

Paper defaults (OAIF Sec. 4.1): beta = 0.1 (DPO), 1.0 (IPO), 0.002 (SLiC).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Annotated, Any, Callable, Protocol

import torch
import torch.nn.functional as F
from pydantic import AfterValidator

from pofe.plugins import PluginError, contained, lookup, name_validator

@dataclass
class LossOutput:
    """Per-pair losses (B,) and the implicit rewards of DPO-style objectives.

    ``chosen_rewards = beta * (log pi(y+) - log pi0(y+))`` and likewise for rejected;
    ``margins = chosen_rewards - rejected_rewards = beta * h``.
    """

    losses: torch.Tensor
    chosen_rewards: torch.Tensor
    rejected_rewards: torch.Tensor
    margins: torch.Tensor

    def __getitem__(self, key: str) -> torch.Tensor:  # dict-style access, e.g. out["losses"]
        return getattr(self, key)


class PreferenceLoss(Protocol):
    """What a DAP loss is (the loss registry's value type, what ``dap_backward`` calls): a pure
    function of summed completion log-probs of policy and reference on chosen / rejected
    responses, with ``p`` = P(chosen better) as a soft label (1.0 = a hard label). A new loss
    is one function with this signature added to :data:`LOSSES`, or declared by another
    package in the entry-point group ``pofe.losses`` (:mod:`pofe.plugins`)."""

    def __call__(
        self,
        policy_chosen_logps: torch.Tensor,
        policy_rejected_logps: torch.Tensor,
        ref_chosen_logps: torch.Tensor,
        ref_rejected_logps: torch.Tensor,
        *,
        beta: float,
        p: float | torch.Tensor = 1.0,
    ) -> LossOutput: ...


def _prepare(pc, pr, rc, rr, beta, p):
    chosen_logratio = pc - rc
    rejected_logratio = pr - rr
    h = chosen_logratio - rejected_logratio  # (B,)
    p_t = torch.as_tensor(p, dtype=h.dtype, device=h.device)
    if torch.any((p_t < 0) | (p_t > 1)):
        raise ValueError("soft label p must lie in [0, 1]")
    p_t = p_t.expand_as(h)
    chosen_rewards = (beta * chosen_logratio).detach()
    rejected_rewards = (beta * rejected_logratio).detach()
    return h, p_t, chosen_rewards, rejected_rewards


def dpo(
    policy_chosen_logps: torch.Tensor,
    policy_rejected_logps: torch.Tensor,
    ref_chosen_logps: torch.Tensor,
    ref_rejected_logps: torch.Tensor,
    *,
    beta: float = 0.1,  # OAIF Sec. 4.1
    p: float | torch.Tensor = 1.0,
) -> LossOutput:
    """DPO, OAIF Eq. 1; soft p gives the Bradley-Terry cross-entropy against p."""
    h, p_t, cr, rr = _prepare(policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps, beta, p)
    z = beta * h
    # logsigmoid is the numerically stable form of log(sigma(z)).
    losses = -p_t * F.logsigmoid(z) - (1.0 - p_t) * F.logsigmoid(-z)
    return LossOutput(losses, cr, rr, cr - rr)


def ipo(
    policy_chosen_logps: torch.Tensor,
    policy_rejected_logps: torch.Tensor,
    ref_chosen_logps: torch.Tensor,
    ref_rejected_logps: torch.Tensor,
    *,
    beta: float = 1.0,  # OAIF Sec. 4.1
    p: float | torch.Tensor = 1.0,
) -> LossOutput:
    """IPO, OAIF Eq. 2; soft p moves the target margin to (2p - 1) / (2 beta)."""
    h, p_t, cr, rr = _prepare(policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps, beta, p)
    target = (2.0 * p_t - 1.0) / (2.0 * beta)
    losses = (h - target) ** 2
    return LossOutput(losses, cr, rr, cr - rr)


def slic(
    policy_chosen_logps: torch.Tensor,
    policy_rejected_logps: torch.Tensor,
    ref_chosen_logps: torch.Tensor,
    ref_rejected_logps: torch.Tensor,
    *,
    beta: float = 0.002,  # OAIF Sec. 4.1
    p: float | torch.Tensor = 1.0,
) -> LossOutput:
    """SLiC hinge, OAIF Eq. 3; soft p weights the two hinge directions by p and 1 - p."""
    h, p_t, cr, rr = _prepare(policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps, beta, p)
    z = beta * h
    losses = p_t * torch.clamp(1.0 - z, min=0.0) + (1.0 - p_t) * torch.clamp(1.0 + z, min=0.0)
    return LossOutput(losses, cr, rr, cr - rr)


LOSSES: dict[str, PreferenceLoss] = {"dpo": dpo, "ipo": ipo, "slic": slic}


# ----------------------------------------------------------------------------- reward-model losses

def soft_bt_loss(margin: torch.Tensor, p: float | torch.Tensor = 1.0) -> torch.Tensor:
    """Per-pair Bradley-Terry cross-entropy of a reward model against soft targets
    (rlaif-constitutional-ai, "From judge log-probabilities to a label"):

        L = BCE_with_logits(Δr, p) = −p log σ(Δr) − (1 − p) log σ(−Δr),  Δr = r(x, y₁) − r(x, y₂),

    with p = P(y₁ ≻ y₂). Its per-pair minimiser is σ(Δr) = p, i.e. Δr = logit(p): the RM
    inherits the judge's confidence, not only its ranking (p = 0.581 -> margin 0.33, versus an
    unbounded push under a hard label); p = 1 is the ordinary RM loss −log σ(Δr). The same
    cross-entropy as soft DPO (Eq. 1 above) with β·h replaced by the reward margin."""
    p_t = torch.as_tensor(p, dtype=margin.dtype, device=margin.device)
    if torch.any((p_t < 0) | (p_t > 1)):
        raise ValueError("soft label p must lie in [0, 1]")
    return F.binary_cross_entropy_with_logits(margin, p_t.expand_as(margin), reduction="none")


# Reward-model losses take (margin, p) rather than the four log-prob tensors of LOSSES.
RM_LOSSES: dict[str, Callable[..., torch.Tensor]] = {"soft-bt": soft_bt_loss}


def _declared_beta(fn: Any) -> float | None:
    """A loss's own beta, declared the same way by built-ins and plugins: a ``default_beta``
    attribute, else its ``beta`` keyword's default."""
    beta = getattr(fn, "default_beta", None)
    if beta is None:
        try:
            param = inspect.signature(fn).parameters.get("beta")
        except (TypeError, ValueError):
            param = None
        if param is not None and param.default is not inspect.Parameter.empty:
            beta = param.default
    return None if beta is None else float(beta)


def _check_loss_plugin(name: str, fn: Any) -> None:
    # A plugin loss needs a beta for ``loss.beta: null`` just as the built-ins have the paper's:
    # refused when the config is parsed, not when the first step divides by None.
    if not callable(fn):
        raise PluginError(f"loss plugin {name!r} is a {type(fn).__name__}, not a function with PreferenceLoss's signature")
    beta = _declared_beta(fn)
    if beta is None or not beta > 0:
        raise PluginError(f"loss plugin {name!r} declares no default beta > 0 (give its beta keyword a default, "
                          f"or set a default_beta attribute)")


def _check_rm_loss_plugin(name: str, fn: Any) -> None:
    if not callable(fn):
        raise PluginError(f"reward-model loss plugin {name!r} is a {type(fn).__name__}, not a function (margin, p) -> losses")


LossName = Annotated[str, AfterValidator(name_validator("pofe.losses", lambda: LOSSES, _check_loss_plugin))]
"""A config field naming a DAP loss: a key of :data:`LOSSES` or a ``pofe.losses`` plugin."""

RMLossName = Annotated[str, AfterValidator(name_validator("pofe.rm_losses", lambda: RM_LOSSES, _check_rm_loss_plugin))]
"""A config field naming a reward-model loss: a key of :data:`RM_LOSSES` or a ``pofe.rm_losses`` plugin."""


def get_loss(name: str) -> PreferenceLoss:
    """The DAP loss named ``name``: built in (:data:`LOSSES`), else a ``pofe.losses`` plugin
    (whose failures are one line naming it: :func:`pofe.plugins.contained`)."""
    fn = lookup("pofe.losses", name, LOSSES)
    return fn if name in LOSSES else contained("pofe.losses", name, fn)


def default_beta(name: str) -> float:
    """beta when ``loss.beta`` is unset: the loss's own, declared on the function (the paper's for
    the built-ins, OAIF Sec. 4.1: DPO 0.1, IPO 1.0, SLiC 0.002; a plugin's ``default_beta``
    attribute or ``beta`` keyword default), one rule for both."""
    fn = get_loss(name)
    _check_loss_plugin(name, fn)
    return _declared_beta(fn)  # type: ignore[return-value]


def get_rm_loss(name: str) -> Callable[..., torch.Tensor]:
    """The reward-model loss named ``name``: built in (:data:`RM_LOSSES`), else a ``pofe.rm_losses`` plugin."""
    fn = lookup("pofe.rm_losses", name, RM_LOSSES)
    return fn if name in RM_LOSSES else contained("pofe.rm_losses", name, fn)
