"""Plots of a ``pofe rl`` run: reward, KL (k1 and k3), response length, held-out reward before
and after; with ``reward.shaping``, the shaping term's size next to the length bias the gating audit
measured; with ``audit.every``, the live judge's re-audits."""

from __future__ import annotations

from pofe.evaluation.report.drift import drift_plots
from pofe.evaluation.report.figures import _bars_png, _line
from pofe.evaluation.report.run import RunData, _num


def _rl_plots(run: RunData, add) -> None:
    rows = run.metrics
    add("reward", "Reward", "Mean reward of the sampled responses per step (and the monitor reward, never optimised).",
        _line(rows, [("objective/scores", "reward"), ("monitor", "monitor")], "Reward per step", "reward"))
    add("kl", "KL to the reference", "k1 and k3 estimates of KL(policy || reference) per step; jumps are flagged above.",
        _line(rows, [("objective/kl", "KL (k1)"), ("objective/kl_k3", "KL (k3)")], "KL to the reference", "nats"))
    rw = run.config.get("reward") if isinstance(run.config.get("reward"), dict) else {}
    unit = (rw.get("unit", "tokens") if rw.get("kind", "programmatic") == "programmatic"
            else "characters of text (the judge / reward model reads the response)") if run.config else "not recorded"
    add("length", "Response length", "Mean sampled response length per step in tokens (the policy's own unit; the "
        f"reward measured length in: {unit}).",
        _line(rows, [("length", "tokens")], "Mean response length", "tokens"))
    sm = run.summary or {}
    b, a = sm.get("eval_before") or {}, sm.get("eval_after") or {}
    if _num(b.get("reward")) is not None and _num(a.get("reward")) is not None:
        cis = [_reward_ci(b), _reward_ci(a)]
        why = ("95% intervals: percentile bootstrap of the per-sample rewards (pofe.stats.bootstrap_ci)"
               if all(cis) else "no interval: the run's summary records the means only, not per-sample rewards")
        add("eval", "Held-out reward before and after",
            f"Mean reward on held-out prompts (n = {b.get('n')} before, {a.get('n')} after samples); {why}.",
            _bars_png([f"before (n={b.get('n')})", f"after (n={a.get('n')})"], [b["reward"], a["reward"]],
                      "Held-out reward (95% intervals)" if all(cis) else "Held-out reward (means only)", "reward",
                      cis=cis))
    _shaping_plot(run, add)
    drift_plots(run, add)


def _reward_ci(ev: dict) -> tuple[float, float] | None:
    """The 95% interval of an eval's mean reward: ``reward_ci95`` as recorded, else the project's
    bootstrap over the per-sample ``rewards``; None when neither is there."""
    ci = ev.get("reward_ci95")
    if isinstance(ci, (list, tuple)) and len(ci) == 2 and all(_num(c) is not None for c in ci):
        return (_num(ci[0]), _num(ci[1]))
    vals = [_num(v) for v in ev.get("rewards") or [] if _num(v) is not None] if isinstance(ev.get("rewards"), list) else []
    if not vals:
        return None
    import numpy as np

    from pofe.stats import bootstrap_ci

    return bootstrap_ci(np.asarray(vals, dtype=float))


def audit_bias_text(audit: dict | None) -> str:
    """The gating audit's length and list bias in words (``summary.audit``, kept from the
    ``--require-audit`` report), or why there is none."""
    if not isinstance(audit, dict):
        return "The run was not gated by an audit (--require-audit), so no measured length bias is recorded."

    def f(key, fmt="{:.3f}"):
        v = _num(audit.get(key))
        return "not measured" if v is None else fmt.format(v)

    return (f"The gating audit ({audit.get('path')}, judge {audit.get('judge')}) measured: length correlation "
            f"(Somers' D) {f('length_correlation')}, length slope {f('length_slope', '{:.2f}')} logit per sd, picks the "
            f"longer response {f('longer_preferred_rate')} (humans {f('human_longer_preferred_rate')}), "
            f"P(prefers lists) {f('p_prefers_lists')}.")


def _shaping_plot(run: RunData, add) -> None:
    rows = run.metrics
    keys = [("reward/shaping_abs", "all terms"), ("reward/shaping_length_abs", "length"),
            ("reward/shaping_lists_abs", "lists")]
    png = _line(rows, keys, "Reward shaping per step (mean |term|)", "reward units")
    if png is None:
        return
    sm = run.summary or {}
    coefs = sm.get("shaping") or ((run.config.get("reward") or {}).get("shaping") if run.config else None) or {}
    add("shaping", "Reward shaping and the judge's measured length bias",
        f"Mean absolute size of the zero-centred group shaping term (coefficients: length {coefs.get('length')} per "
        f"token, lists {coefs.get('lists')} per list item), next to the scores it shifts. {audit_bias_text(sm.get('audit'))}",
        png)
