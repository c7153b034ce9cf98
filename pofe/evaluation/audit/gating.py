"""The one audit gate, ``--require-audit REPORT``: what the driver (``pofe.recipe``) and the
commands call before any model loads. A report vouches for a judge's identity (its config's
``identity()``) on a calibration set named by its content hash; :func:`require_audit`
refuses unless the report passed *for this judge* on an identified calibration set, and the
``*_identity`` functions name the judge behind what a command trains on (its own judge, the
labels of its pair files, the reward model's labels, self-rewarding's starting model)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Callable, Sequence

from pofe.data.calibration import CalibrationItem
from pofe.evaluation.audit.checks import describe_check, failed_checks
from pofe.evaluation.audit.config import AuditError


def calibration_set_hash(items: Sequence[CalibrationItem]) -> str:
    """sha256 of the calibration set's content (prompt, responses, label, in order): two
    reports on the same pairs share it; one edited label changes it."""
    h = hashlib.sha256()
    for it in items:
        h.update(json.dumps([it.prompt, it.response_a, it.response_b, it.label], ensure_ascii=False).encode("utf-8", "surrogatepass"))
        h.update(b"\n")
    return h.hexdigest()


def judge_identity(jcfg) -> dict[str, Any]:
    """What makes a judge *this* judge, read from its config without loading a model: the
    config's own ``identity()`` (kind, model and revision, endpoint, template and its content
    hash, constitution and its version, both orders, CoT, choices, temperatures, ...; a
    plugin's package and version). ``require_audit`` compares these key by key."""
    return dict(jcfg.identity())


def read_audit_report(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.exists():
        raise AuditError(f"audit report not found: {path} (run `pofe audit ... --output {path}` first)")
    try:
        report = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise AuditError(f"audit report {path} is not valid JSON ({e.msg})") from None
    if not isinstance(report, dict) or "passed" not in report or "checks" not in report:
        raise AuditError(f"audit report {path} has no 'passed'/'checks' keys: not a pofe audit report")
    return report


def require_audit(report: str | Path | dict[str, Any], judge_identity: dict[str, Any] | None = None, *,
                  judge_id: str | None = None, calibration_sha256: str | None = None) -> dict[str, Any]:
    """Refuse to train on a judge unless its audit passed *for this judge* (``--require-audit REPORT``).

    ``report`` is the report's path (or the loaded dict). Raises :class:`AuditError` when
    the report is missing or unreadable; when any key of ``judge_identity`` (see
    :func:`judge_identity`: judge, template hash, constitution version, ...) differs from
    the report's, or the report records none; when ``judge_id`` differs from the audited
    judge's id; when the report names no calibration set (or not ``calibration_sha256``);
    and when any check failed. Returns the report otherwise.
    """
    where = report if not isinstance(report, dict) else "(report)"
    rep = report if isinstance(report, dict) else read_audit_report(report)
    failed = failed_checks(rep)
    if not rep["passed"] or failed:
        detail = "; ".join(describe_check(n, rep["checks"][n]) for n in failed) or "passed is false"
        raise AuditError(f"judge {rep.get('judge')!r} failed its audit ({where}): {detail}. "
                         "Refusing to train on it.", failed)
    if judge_id is not None and rep.get("judge") != judge_id:
        raise AuditError(f"audit report {where} audited judge {rep.get('judge')!r}, not {judge_id!r}; "
                         "audit the judge you train with", ["judge_mismatch"])
    if judge_identity is not None:
        audited = rep.get("judge_identity")
        if not isinstance(audited, dict):
            raise AuditError(f"audit report {where} records no judge_identity (written by an older pofe); "
                             "re-run `pofe audit` for this judge", ["judge_mismatch"])
        diff = [k for k, v in judge_identity.items() if k not in audited or audited[k] != v]
        if diff:
            detail = "; ".join(f"{k}: audited {audited.get(k, '<missing>')!r}, training with {judge_identity[k]!r}"
                               for k in diff)
            raise AuditError(f"audit report {where} is for a different judge ({detail}); audit the judge you "
                             "train with", ["judge_mismatch"])
    sha = (rep.get("calibration") or {}).get("sha256")
    if judge_identity is not None and not sha:
        raise AuditError(f"audit report {where} names no calibration set (no calibration.sha256); re-run `pofe audit`",
                         ["calibration_unknown"])
    if calibration_sha256 is not None and sha != calibration_sha256:
        raise AuditError(f"audit report {where} was measured on calibration set {str(sha)[:12]}, not "
                         f"{calibration_sha256[:12]}", ["calibration_mismatch"])
    return rep


_PROVENANCE = ("judge_id", "template_hash", "constitution_version")


def labels_identity(sources: Sequence[str | Path]) -> dict[str, Any]:
    """The judge identity recorded in AI-labelled pair files (``pofe label`` labels/preferences,
    top-level or under ``provenance``): ``{judge_id, template_hash, constitution_version}``.
    Raises :class:`AuditError` when a source has no such record (human-labelled data, or a
    hub source) or the files mix several judges: a gate cannot vouch for those labels."""
    from pofe.runs import read_jsonl

    seen: dict[tuple, str] = {}
    for src in sources:
        path = Path(src)
        if path.is_dir():
            path = next((path / n for n in ("preferences.jsonl", "labels.jsonl") if (path / n).is_file()), path)
        if not path.is_file() or not path.name.endswith(".jsonl"):
            raise AuditError(f"--require-audit: {src} is not a pofe-labelled JSONL file, so no judge is named "
                             "for its labels", ["labels_unknown"])
        for k, row in enumerate(read_jsonl(path), 1):
            if not isinstance(row, dict):
                continue
            prov = row.get("provenance") if isinstance(row.get("provenance"), dict) else row
            key = tuple(prov.get(f) for f in _PROVENANCE)
            if key[0] is None:
                raise AuditError(f"--require-audit: {path}:{k}: the row names no judge_id (not AI-labelled?)",
                                 ["labels_unknown"])
            seen.setdefault(key, f"{path}:{k}")
    if not seen:
        raise AuditError("--require-audit: the training files hold no labelled rows", ["labels_unknown"])
    if len(seen) > 1:
        where = ", ".join(f"{k[0]} ({v})" for k, v in list(seen.items())[:3])
        raise AuditError(f"--require-audit: the labels come from {len(seen)} different judges ({where}); "
                         "one report cannot vouch for them all", ["judge_mismatch"])
    return dict(zip(_PROVENANCE, next(iter(seen))))


def reward_model_identity(model_dir: str | Path) -> dict[str, Any]:
    """The judge behind a ``pofe rm`` model: the labels its run trained on (``RUN/config.yaml``
    ``data.train``), through :func:`labels_identity`."""
    from pofe.config import safe_yaml_load

    d = Path(model_dir)
    cfg_path = next((c / "config.yaml" for c in (d, d.parent) if (c / "config.yaml").is_file()), None)
    if cfg_path is None:
        raise AuditError(f"--require-audit: {model_dir} is not inside a pofe rm run folder (no config.yaml), so "
                         "the judge behind its labels is unknown", ["labels_unknown"])
    train = ((safe_yaml_load(cfg_path.read_text(encoding="utf-8"), str(cfg_path)) or {}).get("data") or {}).get("train") or []
    return labels_identity([t if Path(t).is_absolute() or Path(t).exists() else cfg_path.parent / t for t in train])


def reward_identity(reward_cfg) -> dict[str, Any]:
    """The judge behind ``pofe rl``'s reward: the judge itself (``reward.kind=judge``, or the
    pairwise judge of ``reward.kind=pairwise``) or the judge that labelled the reward model's training pairs; a programmatic reward has
    no judge to audit."""
    kind = getattr(reward_cfg, "kind", None)
    if kind in ("judge", "pairwise") and getattr(reward_cfg, "judge", None) is not None:
        return judge_identity(reward_cfg.judge)
    if kind == "reward-model" and getattr(reward_cfg, "model", None):
        return reward_model_identity(reward_cfg.model)
    raise AuditError(f"--require-audit: reward.kind={kind} has no judge to audit (use it with reward.kind=judge or pairwise "
                     "or a reward model trained on pofe-labelled pairs)", ["no_judge"])


def self_reward_identity(judge_cfg, model_name: str) -> dict[str, Any]:
    """Self-rewarding's judge is the policy M_t itself, which changes every iteration: the
    gate names the model the audit judged with (the starting model) and the judge template
    (kind, template and its hash), and nothing that differs per iteration."""
    ident = judge_identity(judge_cfg)
    return {"kind": ident.get("kind"), "model": model_name, "template": ident.get("template"),
            "template_hash": ident.get("template_hash")}


def gate(report_path: str | Path | None, identity: dict[str, Any] | Callable[[], dict[str, Any]]) -> dict[str, Any] | None:
    """The one call a CLI command makes for ``--require-audit`` (before any model loads):
    nothing without a report; else :func:`require_audit` for ``identity`` (a dict, or a
    function computing it, e.g. from the label files). A refusal is an :class:`AuditError`,
    which the CLI prints as one line with exit status 2 (library code never exits itself).
    Returns the passed report (None without one): the run's model card states it."""
    if report_path is None:
        return None
    return require_audit(report_path, identity() if callable(identity) else identity)
