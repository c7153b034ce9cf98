"""Which plots a run gets: :data:`PLOTS` maps the command that wrote the folder (``run.kind``: the
one ``run.json`` records) to the function drawing its plots, ``fn(run, add)`` calling
``add(name, title, caption, png)`` once per plot (a ``None`` png is no plot). A new command's
plots are one module in this package and one entry here."""

from __future__ import annotations

import logging

from pofe.evaluation.report.audit import _audit_plots
from pofe.evaluation.report.cai import _cai_plots
from pofe.evaluation.report.label import _label_plots
from pofe.evaluation.report.online import _online_plots
from pofe.evaluation.report.rl import _rl_plots
from pofe.evaluation.report.rm import _rm_plots
from pofe.evaluation.report.run import Plot, RunData
from pofe.evaluation.report.self_reward import _self_reward_plots

log = logging.getLogger(__name__)

PLOTS = {"online": _online_plots, "self-reward": _self_reward_plots, "label": _label_plots, "rm": _rm_plots,
         "rl": _rl_plots, "cai-revise": _cai_plots, "audit": _audit_plots}


MALFORMED = (TypeError, ValueError, AttributeError, KeyError, IndexError)
"""What a plot or page section raises on a received folder whose values are not the types pofe
writes (a dict where a number goes, a string where a dict goes): that part is left out, with a
warning, never an internal error."""


def make_plots(run: RunData) -> list[Plot]:
    plots: list[Plot] = []

    def add(name, title, caption, png):
        if png is not None:
            plots.append(Plot(name, title, caption, png))

    # a command without plots of its own (sft, judge) gets the generic metrics curves
    try:
        PLOTS.get(run.kind, _online_plots)(run, add)
    except MALFORMED as e:  # the plots drawn before it stay
        log.warning("report: %s: plots after %d left out: malformed values in the folder (%s: %s)", run.run_dir,
                    len(plots), type(e).__name__, " ".join(str(e).split())[:200])
    return plots
