"""Formats out: pofe's pair files as datasets other tools read directly.

Inputs are whatever pair files pofe writes -- a run folder of ``pofe label`` / ``cai revise``
(``preferences.jsonl``), ``pofe online`` (``ledger.jsonl``), ``pofe judge``
(``verdicts.jsonl``), or any pair file :func:`pofe.data.preferences.load_preferences` reads.
Rows the judge could not label (``p = null``) and identical pairs are skipped and counted.

What is exported, by default (``include: trained``), is what a run trained on: an online ledger's
annotation rows with ``status: trained`` (its ties, inconsistent, low-margin and ranking-only
comparisons are left out and counted as ``not-trained:<status>``; rows without a status, as in
other pair files, are kept); ``include: all`` keeps every judged pair. A tie (``p = 0.5``) is no
preference, so the pair formats leave it out (``tie``: a TRL loss would read its "chosen" as the
winner); ``alpaca_eval`` keeps it as its own tie, ``preference`` 1.5. The summary's ``skipped``
counts everything left out, by reason.

Formats (``p`` = P(chosen better), the soft label, always kept as a column):

* ``trl`` -- TRL's standard preference format ``{prompt, chosen, rejected, p}`` as JSON
  Lines (``DPOTrainer`` / ``RewardTrainer`` via ``load_dataset("json")``);
* ``trl-conversational`` -- TRL's conversational format with an explicit prompt: ``prompt``
  is the chat (system message and every turn), ``chosen`` / ``rejected`` one assistant
  message each;
* ``alpaca_eval`` -- a JSON list of annotations ``{instruction, output_1, output_2,
  preference}`` with alpaca_eval's convention ``preference`` = 1 (output_1 better) ... 2
  (output_2 better), 1.5 a tie, i.e. ``2 - p``; the pair keeps its judged order;
* ``datasets`` -- a ``datasets.save_to_disk`` folder with the ``trl`` columns
  (``datasets.load_from_disk``).

For the TRL formats each pair is oriented so ``chosen`` is the preferred response
(``p < 0.5`` swaps the two and stores ``1 - p``): TRL's hard-label losses read ``chosen`` as
the winner, and a soft loss is unchanged by the swap (BCE(-d, 1 - p) = BCE(d, p)).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from pofe.data.io import read_located
from pofe.errors import DataError
from pofe.jsonl import json_line, json_lines
from pofe.data.preferences import to_pair
from pofe.outputs import guard_outputs
from pofe.records import PreferencePair

Format = Literal["trl", "trl-conversational", "alpaca_eval", "datasets"]
FORMATS: tuple[str, ...] = ("trl", "trl-conversational", "alpaca_eval", "datasets")

# Where each command leaves its labelled pairs, in the order they are looked for.
PAIR_FILES = ("preferences.jsonl", "ledger.jsonl", "verdicts.jsonl", "labels.jsonl")


def find_pair_file(source: str | Path) -> Path:
    """The pair file of a run folder (or ``source`` itself when it is a file or a
    ``save_to_disk`` folder)."""
    src = Path(source)
    if src.is_file() or (src / "dataset_info.json").exists() or (src / "dataset_dict.json").exists():
        return src  # a pair file, or a datasets save_to_disk folder of pairs
    if not src.is_dir():
        raise DataError(f"{source}: no such run folder or file")
    from pofe.runs import check_run_path, guard_run_dir

    # A run folder is someone's data: its pair file is never read through a planted link.
    guard_run_dir(src)
    for name in PAIR_FILES:
        if os.path.lexists(src / name):
            check_run_path(src / name)
        if (src / name).is_file():
            return src / name
    raise DataError(f"{source}: no pair file in this run folder (looked for {', '.join(PAIR_FILES)})")


def _oriented(q: PreferencePair) -> tuple[str, str, float]:
    o = q.oriented()
    return o.chosen, o.rejected, o.p


def _prompt_messages(q: PreferencePair) -> list[dict[str, str]]:
    return list(q.messages) if q.messages else [{"role": "user", "content": q.prompt}]


def export_rows(pairs: list[PreferencePair], fmt: Format) -> list[dict[str, Any]]:
    """The rows of ``fmt`` (see the module docstring)."""
    rows = []
    for q in pairs:
        if fmt == "alpaca_eval":
            rows.append({"instruction": q.prompt, "output_1": q.chosen, "output_2": q.rejected,
                         "preference": 2.0 - q.p})
            continue
        chosen, rejected, p = _oriented(q)
        if fmt == "trl-conversational":
            rows.append({"prompt": _prompt_messages(q), "chosen": [{"role": "assistant", "content": chosen}],
                         "rejected": [{"role": "assistant", "content": rejected}], "p": p})
        else:
            rows.append({"prompt": q.prompt, "chosen": chosen, "rejected": rejected, "p": p})
    return rows


def exported_pair(row: dict[str, Any], where: str, *, trained_only: bool, keep_ties: bool) -> PreferencePair | str:
    """One row as an exported pair, or the reason it is left out (see the module docstring)."""
    status = row.get("status") if row.get("kind") == "annotation" else None
    if trained_only and status is not None and status != "trained":
        return f"not-trained:{status}"
    got = to_pair(row, where)
    if not keep_ties and isinstance(got, PreferencePair) and got.p == 0.5:
        return "tie"
    return got


def read_exported(pair_file: Path, fmt: Format, include: str = "trained") -> tuple[list[PreferencePair], dict[str, int]]:
    """The pairs of ``pair_file`` that ``fmt`` exports, and what was left out (reason -> count)."""
    rows = read_located(pair_file)
    got = rows.map(lambda row, where: exported_pair(row, where, trained_only=include == "trained",
                                                   keep_ties=fmt == "alpaca_eval"))
    skipped = dict(rows.skipped)
    if not got:
        raise DataError(f"{pair_file}: no pairs to export (left out: {skipped or 'none'}"
                        + ("; --include all keeps the pairs the run did not train on"
                           if any(k.startswith("not-trained:") for k in skipped) else "") + ")")
    return got, skipped


def export_pairs(source: str | Path, fmt: Format, output: str | Path, include: str = "trained") -> dict[str, Any]:
    """Read the pairs of ``source`` (a run folder or pair file) and write them as ``fmt`` to
    ``output`` (a file; a folder for ``datasets``); ``include``: ``trained`` or ``all``. Returns a
    summary."""
    from pofe.runs import atomic_write_text

    if fmt not in FORMATS:
        raise DataError(f"--format {fmt!r}: use one of {', '.join(FORMATS)}")
    pair_file = find_pair_file(source)
    out = Path(output)
    if fmt == "datasets":
        if out.exists() and (not out.is_dir() or any(out.iterdir())):
            raise DataError(f"-o {output}: exists and is not an empty folder (a datasets folder is written fresh)")
    # Only the pair file is read, so it is the input an output must never land on; the guard
    # also keeps a datasets folder out of a live run's folder.
    check = {"folders": {"-o"}} if fmt == "datasets" else {}
    guard_outputs({"-o": out}, [pair_file], **check)
    kept, skipped = read_exported(pair_file, fmt, include)
    rows = export_rows(kept, fmt)
    if fmt == "datasets":
        import datasets

        try:
            ds = datasets.Dataset.from_list(export_rows(kept, "trl"))
        except UnicodeEncodeError as e:  # Arrow stores UTF-8 only: a lone surrogate has no form there
            raise DataError(f"-o {output}: a pair holds {e.object[e.start:e.end]!r}, a lone surrogate that a datasets "
                            "(Arrow) folder cannot store; export with --format trl (JSON Lines keeps it)") from None
        ds.save_to_disk(str(out))
    elif fmt == "alpaca_eval":
        atomic_write_text(out, json_line(rows, indent=1) + "\n")
    else:
        atomic_write_text(out, json_lines(rows))
    return {"input": str(pair_file), "output": str(out), "format": fmt, "pairs": len(rows), "include": include,
            "skipped": skipped, "left_out": sum(skipped.values())}
