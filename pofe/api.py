"""The Python API: what ``from pofe import ...`` gives a notebook (``docs/api.md``).

Each function here goes through the same code as its command on the command line: a command's
config is its typed config class (an unknown key is a :class:`pofe.config.ConfigError` naming
it), a run goes through the command's ``run()`` on the one driver (:mod:`pofe.recipe`), and
every bad input is a :class:`pofe.errors.PofeError` with one line naming what is wrong.

* :func:`make_config` -- a command's typed config from a dict, a YAML file or defaults;
* :func:`run` -- any command from its config: ``run("online", {...})`` -> :class:`RunResult`
  (the run folder and the summary the CLI's ``--json`` prints);
* :func:`build_judge` -- a judge from a dict (``{"kind": "length"}``), as a command builds it;
* :func:`audit` -- a judge against labelled pairs (``pofe audit``), in memory or from files;
* :func:`judge_pairs` -- verdicts on (prompt, A, B) triples; :func:`label_prompts` -- sample two
  responses per prompt from a model and label them;
* :func:`export` -- a run's labelled pairs as TRL / alpaca_eval / ``datasets`` data.

This module sits at the top of the layers next to the CLI (it calls the commands); the CLI does
not import it.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from pofe.config import ConfigError, PofeConfig, config_from_dict, load_config
from pofe.config_docs import COMMANDS, config_class

# The function each command's pofe/cli/<name>.py calls after resolving its config: ``run`` in the
# module of its config class (every command on the driver: docs/CONTRIBUTING.md "Adding a
# command"), except these.
RUNNER_OVERRIDES: dict[str, str] = {
    "judge": "pofe.loops.judge:run_judge",
    "audit": "pofe.evaluation.audit:audit_from_config",
    "eval": "pofe.evaluation.eval:run_eval",
    "sim": "pofe.evaluation.sim:run_sim",
    "export": "pofe.api:_export_from_config",
}
# Not run from Python, and why.
NOT_RUN = {"chat": "it answers prompts typed on the command line; use pofe.load_model and "
                   "pofe.generation.generate",
           "annotate": "it serves a labelling page to a person; run `pofe annotate` in a terminal"}


class RunResult(NamedTuple):
    """What :func:`run` returns: ``run_dir, summary = pofe.run(...)``."""

    run_dir: Path | None
    """The run folder (None for a command that writes none: audit, eval, sim, export)."""
    summary: dict[str, Any]
    """The command's summary: what ``--json`` prints (``summary.json`` for a run)."""


def runner(command: str) -> Callable[..., dict[str, Any]]:
    """The function that runs ``command`` from its typed config (what its CLI module calls)."""
    if command in NOT_RUN:
        raise ConfigError(f"run: {command!r} is not run from Python: {NOT_RUN[command]}")
    if command not in COMMANDS:
        raise ConfigError(f"run: unknown command {command!r}; choose one of "
                          f"{', '.join(c for c in COMMANDS if c not in NOT_RUN)}")
    target = RUNNER_OVERRIDES.get(command) or COMMANDS[command].partition(":")[0] + ":run"
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


def make_config(command: str, config: Any = None) -> PofeConfig:
    """``command``'s typed config (``pofe.loops.online.OnlineConfig`` for ``"online"``, ...) from

    * ``None`` -- the defaults;
    * a dict -- nested sections and/or dotted keys: ``{"judge": {"kind": "length"}, "train.steps": 2}``;
    * a ``str`` / ``Path`` -- a YAML file, as ``--config``;
    * an instance of the class -- returned as it is.

    Raises:
        ConfigError: naming the bad key (``config: unknown key 'train.stpes'``).
    """
    if command not in COMMANDS:
        raise ConfigError(f"make_config: unknown command {command!r}; choose one of {', '.join(COMMANDS)}")
    cls = config_class(command)
    if isinstance(config, cls):
        return config
    if isinstance(config, PofeConfig):
        raise ConfigError(f"make_config({command!r}): config is a {type(config).__name__}; "
                          f"{command} takes a {cls.__name__} (or a dict of its keys)")
    if config is None:
        return load_config(cls)
    if isinstance(config, (str, Path)):
        return load_config(cls, config)
    if isinstance(config, Mapping):
        return config_from_dict(cls, config)
    raise ConfigError(f"make_config({command!r}): config must be a dict, a YAML path or a {cls.__name__}, "
                      f"not {type(config).__name__}")


def _resumed_config(command: str, config: Any, resume: str | Path, trust_run_config: bool) -> PofeConfig:
    """The run folder's own ``config.yaml``, refused as ``--resume`` refuses it on the command line
    (:func:`pofe.cli.common.resolve_config`): a changed folder, or a setting that runs code or sends
    data out unless ``trust_run_config``."""
    from pofe.runs import RunError, untrusted_settings, verify_run_folder

    where = f"run({command!r}, resume={str(resume)!r})"
    if config is not None:
        raise ConfigError(f"{where}: config= is refused; a resumed run keeps its saved config.yaml "
                          f"(start a new run to change settings)")
    saved = Path(resume) / "config.yaml"
    if not saved.is_file():
        raise RunError(f"{where}: no config.yaml there (not a pofe run folder)")
    verify_run_folder(resume)
    cfg = load_config(config_class(command), saved)
    found = untrusted_settings(cfg)
    if found and not trust_run_config:
        key, value = found[0]
        raise RunError(f"{where}: the run folder's config.yaml sets {key}: {value}, which runs code or sends the "
                       f"run's data out; a run folder is not trusted: pass trust_run_config=True")
    return cfg


def run(command: str, config: Any = None, *, resume: str | Path | None = None,
        require_audit: str | Path | None = None, trust_run_config: bool = False) -> RunResult:
    """Run ``command`` (``"online"``, ``"sft"``, ``"cai revise"``, ...) from its config (a dict, a
    YAML path or the config object; :func:`make_config`), as ``pofe <command> --config ... --json``
    does: the same typed config, the same driver, the same run folder.

    ``resume``: a run folder to continue from its last checkpoint with its own ``config.yaml``
    (``config`` must then be None); ``require_audit``: refuse to start unless this ``pofe audit``
    report passed for the command's judge (checked before any model loads).

    Returns:
        :class:`RunResult` ``(run_dir, summary)``.
    """
    from pofe.errors import PofeError
    from pofe.runs import discard_unused_runs, forget_fresh_runs

    forget_fresh_runs()  # a new command: only the folders this call creates are ever discarded
    fn = runner(command)
    given = {k: v for k, v in (("resume", resume), ("require_audit", require_audit)) if v is not None}
    takes = inspect.signature(fn).parameters
    for key in given:
        if key not in takes:
            raise ConfigError(f"run({command!r}): {key}= is not an option of {command}")
    cfg = _resumed_config(command, config, resume, trust_run_config) if resume is not None \
        else make_config(command, config)
    try:
        summary = fn(cfg, **given)
    except PofeError as e:
        if e.exit_code == 2:  # bad input, as on the command line: a fresh run folder with nothing computed goes
            discard_unused_runs()
        raise
    run_dir = summary.get("run_dir") if isinstance(summary, dict) else None
    return RunResult(Path(run_dir) if run_dir else None, summary)


# -- judges ----------------------------------------------------------------------------------
def judge_config(config: Any):
    """A judge config from a dict (``{"kind": "length", "prefer": "longer"}``; the ``judge:``
    section of any command) or a judge config object. Raises :class:`ConfigError` naming the key
    (``judge: unknown key 'judge.prefr'``)."""
    from pofe.judges.config import _JudgeKind

    if isinstance(config, _JudgeKind):
        return config
    if not isinstance(config, Mapping):
        raise ConfigError(f"judge: a judge config is a dict such as {{'kind': 'length'}}, not {type(config).__name__}")
    # the judge section as every command validates it (kind llm when none is given)
    return config_from_dict(config_class("judge"), {"judge": dict(config)}, "judge").judge


def build_judge(config: Any, **runtime: Any):
    """The judge a command builds from its ``judge:`` section (:func:`pofe.judges.build_judge`),
    from a dict or a judge config; ``runtime``: live objects such as ``model=`` / ``tokenizer=``
    for a judge that shares a loaded model."""
    from pofe.judges.registry import build_judge as build

    return build(judge_config(config), **runtime)


def _judge(judge: Any):
    """A judge object as it is; a judge config (or dict: ``{"kind": "length"}``) built."""
    from pofe.judges.config import _JudgeKind

    return build_judge(judge) if isinstance(judge, (Mapping, _JudgeKind)) else judge


def judge_pairs(judge: Any, prompts: Sequence[str], responses_a: Sequence[str], responses_b: Sequence[str], *,
                references: Sequence[str | None] | None = None, batch_size: int = 64) -> list:
    """One :class:`pofe.records.Judgment` per (prompt, A, B): ``p`` = P(A better), both orders'
    reads in ``p_ab`` / ``p_ba``, ``None`` where the judge could not read a verdict (never
    invented). ``judge``: a judge object (:func:`pofe.judges.build_judge`) or its config as a dict;
    a pointwise judge compares the two scores. ``pofe judge`` does the same on a file."""
    from pofe.errors import DataError
    from pofe.judges.base import as_pairwise

    judge = as_pairwise(_judge(judge))
    prompts, responses_a, responses_b = list(prompts), list(responses_a), list(responses_b)
    sizes = {"prompts": len(prompts), "responses_a": len(responses_a), "responses_b": len(responses_b)}
    if references is not None:
        sizes["references"] = len(references)
    if len(set(sizes.values())) > 1:
        raise DataError("judge_pairs: one of each per pair, got " + ", ".join(f"{n} {k}" for k, n in sizes.items()))
    out: list = []
    for i in range(0, len(prompts), max(1, batch_size)):
        part = slice(i, i + batch_size)
        refs = {"references": list(references[part])} if references is not None else {}
        out.extend(judge.judge(prompts[part], responses_a[part], responses_b[part], **refs))
    return out


def label_prompts(model: Any, prompts: Sequence[str], judge: Any, *, tokenizer: Any = None,
                  sampling: Any = None, seed: int = 0, device: str | None = None) -> list:
    """Sample two responses per prompt from ``model`` and label each pair with ``judge`` (the
    RL-CAI labelling of ``pofe label``, in memory): a :class:`pofe.records.PreferencePair` per
    labelled prompt, oriented (``chosen`` = the preferred response, ``p`` = max(p, 1 - p) the soft
    label; ``provenance`` keeps the judge's id and both orders' reads). Two identical samples carry
    no preference and an unreadable verdict has no label: both are left out.

    ``model``: a name, hub id or folder (loaded with :func:`pofe.models.load_model`) or a loaded
    model with its ``tokenizer`` (``device``: where a named model loads, ``auto|cpu|cuda|mps``;
    None: the CPU); ``sampling``: a :class:`pofe.generation.base.SamplingConfig` or a
    dict of its keys."""
    from pofe.generation.base import SamplingConfig
    from pofe.generation.pairs import sample_pairs
    from pofe.records import PreferencePair

    if isinstance(model, (str, Path)):
        from pofe.models import load_model

        model, tokenizer = load_model(str(model), device=device)
    elif tokenizer is None:
        raise ConfigError("label_prompts: a loaded model needs its tokenizer= (or pass the model's name or folder)")
    if not isinstance(sampling, SamplingConfig):
        sampling = config_from_dict(SamplingConfig, sampling or {}, "sampling")
    triples = [t for t in sample_pairs(model, tokenizer, list(prompts), sampling, seed) if t[1].strip() != t[2].strip()]
    verdicts = judge_pairs(judge, *zip(*triples)) if triples else []
    return [PreferencePair(prompt=x, chosen=a, rejected=b, p=j.p,
                           provenance={"judge_id": j.judge_id, "p_ab": j.p_ab, "p_ba": j.p_ba}).oriented()
            for (x, a, b), j in zip(triples, verdicts) if j.p is not None]


def _calibration_items(items: Any) -> list:
    """CalibrationItems from items, dicts (prompt, response_a, response_b, label) or files."""
    from pofe.data.calibration import CalibrationItem, load_calibration
    from pofe.errors import DataError
    from pofe.data.preferences import normalise_label

    if isinstance(items, (str, Path)):
        items = [items]
    items = list(items)
    if not items:
        raise DataError("audit: no labelled pairs given (items is empty)")
    if all(isinstance(x, (str, Path)) for x in items):
        return load_calibration(items)
    out = []
    for i, x in enumerate(items):
        if isinstance(x, CalibrationItem):
            out.append(x)
            continue
        where = f"items[{i}]"
        if not isinstance(x, Mapping):
            raise DataError(f"{where}: a CalibrationItem or a dict (prompt, response_a, response_b, label), "
                            f"not {type(x).__name__}")
        for key in ("prompt", "response_a", "response_b", "label"):
            if key not in x:
                raise DataError(f"{where}: missing {key!r}")
            if key != "label" and not isinstance(x[key], str):
                raise DataError(f"{where}: {key!r} must be a string")
        try:
            label = normalise_label(x["label"], where)
        except ValueError as e:
            raise DataError(str(e)) from None
        out.append(CalibrationItem(x["prompt"], x["response_a"], x["response_b"], label, str(x.get("source", "")),
                                   x.get("id") or f"items:{i}"))
    return out


def audit(judge: Any, items: Any, config: Any = None) -> dict[str, Any]:
    """``pofe audit`` on a judge and labelled pairs: the report dict (``agreement``,
    ``position_consistency``, the length bias, calibration and the contrast probes under
    ``metrics``; ``checks`` and ``passed`` against ``config``'s thresholds). Written to
    ``config["output"]`` (and its HTML page) when given: what ``--require-audit`` reads.

    ``judge``: a judge config as a dict (``{"kind": "length"}``; the report then vouches for that
    config, as ``pofe audit --judge`` does), or a judge object (vouched for by its id only).
    ``items``: dicts with ``prompt``, ``response_a``, ``response_b`` and ``label`` (``"A"``,
    ``"B"`` or ``"tie"``: the response a person preferred), :class:`CalibrationItem` s, or
    calibration files. ``config``: the rest of an :class:`AuditConfig` (a dict, a YAML path or the
    object): ``thresholds``, ``contrasts``, ``output``, ...
    """
    from pofe.evaluation.audit import guard_audit_outputs, judge_identity, run_audit, write_audit
    from pofe.judges.config import _JudgeKind

    cfg = make_config("audit", config)
    identity = None
    if isinstance(judge, (Mapping, _JudgeKind)):
        jcfg = judge_config(judge)
        cfg = cfg.model_copy(update={"judge": jcfg})
        judge = build_judge(jcfg)
        identity = {"judge_id": getattr(judge, "id", None), **judge_identity(jcfg)}
    calibration = _calibration_items(items)
    guard_audit_outputs(cfg)  # before the (slow) judging: never over a calibration or judge file
    report = run_audit(judge, calibration, cfg, identity=identity)
    if cfg.output:
        write_audit(report, cfg.output, cfg.html)
    return report


# -- export ----------------------------------------------------------------------------------
def _export_from_config(cfg) -> dict[str, Any]:
    from pofe.data.export import export_pairs

    if not cfg.source or not cfg.output:
        raise ConfigError("export: give a source (a run folder or pair file) and an output")
    if getattr(cfg, "push_to_hub", None):  # the upload lives in the command line's export for now: refused, not skipped
        raise ConfigError("export: push_to_hub is not done from Python yet; run `pofe export ... --push-to-hub REPO`")
    return export_pairs(cfg.source, cfg.format, cfg.output, cfg.include)


def export(source: str | Path, output: str | Path, format: str = "trl", include: str = "trained") -> dict[str, Any]:
    """``pofe export``: a run's labelled pairs (or a pair file) as ``format`` (``trl``,
    ``trl-conversational``, ``alpaca_eval`` or ``datasets``) in ``output``; ``include``:
    ``trained`` (the pairs the run trained on) or ``all``. Returns the summary (``pairs``,
    ``output``, what was left out and why)."""
    cfg = make_config("export", {"source": str(source), "output": str(output), "format": format, "include": include})
    return _export_from_config(cfg)
