"""``pofe report RUN_DIR``: one self-contained HTML page (PNG plots inlined) plus the PNGs beside
it, for every command's run folder: ``online``, ``self-reward``, ``label``, ``rm``, ``rl``,
``cai revise`` and ``audit`` (a folder with ``audit.json``, or the report file itself).

Reads what the loops write and plots whatever is there; a missing key or file means a missing
plot, never an error. Every rate is drawn with its n and a Wilson 95% interval; length plots say
which unit the judge measured; a "Flags" box lists reward-hacking signs (rlaif-constitutional-ai,
"Failure modes"): KL jumps, judge scores piled at the top of the scale, overconfident labels.

Layout: ``run`` reads the folder and names its command (``run.json``; a guess from the files only
for an older folder), ``figures`` holds the shared matplotlib helpers, one module per command
draws its plots, ``plots.PLOTS`` picks them by command, ``page`` renders and writes the report,
``audit_page`` is the audit's own page.
"""

from pofe.evaluation.report.audit_page import audit_html
from pofe.evaluation.report.page import write_report
from pofe.evaluation.report.plots import PLOTS, make_plots
from pofe.evaluation.report.run import Plot, RunData, RunFolderNotFound, detect_kind, load_run, recorded_command

__all__ = ["PLOTS", "Plot", "RunData", "RunFolderNotFound", "audit_html", "detect_kind", "load_run", "make_plots",
           "recorded_command", "write_report"]
