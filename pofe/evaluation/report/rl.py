"""Plots of a ``pofe rl`` run: reward, KL (k1 and k3), response length, held-out reward before
and after."""

from __future__ import annotations

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
        add("eval", "Held-out reward before and after",
            f"Mean reward on held-out prompts (n = {b.get('n')} before, {a.get('n')} after samples).",
            _bars_png([f"before (n={b.get('n')})", f"after (n={a.get('n')})"], [b["reward"], a["reward"]],
                      "Held-out reward", "reward"))
