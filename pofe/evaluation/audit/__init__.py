"""``pofe audit``: validate a judge on human-labelled pairs before training on it, and gate
training on the result.

* :mod:`~pofe.evaluation.audit.config` -- :class:`AuditConfig` (judge, calibration data,
  :class:`AuditThresholds`) and :class:`AuditError`;
* :mod:`~pofe.evaluation.audit.metrics` -- the calibration-set measurements (agreement,
  position, length, lists, kappa, human-human agreement, calibration), with their intervals;
* :mod:`~pofe.evaluation.audit.contrasts` -- the batched judge loop and the contrast probes
  (padding, bullets, confident preamble, one-token attacks, answering for the judge);
* :mod:`~pofe.evaluation.audit.checks` -- thresholds to named checks, and the readable table;
* :mod:`~pofe.evaluation.audit.gating` -- the one ``--require-audit`` gate: judge and
  calibration-set identities, :func:`require_audit`, :func:`gate`;
* :mod:`~pofe.evaluation.audit.run` -- :func:`run_audit`, :func:`audit_from_config` and the
  report files.
"""

from pofe.evaluation.audit.checks import describe_check, evaluate_checks, failed_checks, format_audit
from pofe.evaluation.audit.config import AuditConfig, AuditDataConfig, AuditError, AuditThresholds
from pofe.evaluation.audit.contrasts import ATTACK_KINDS, contrast_metrics, contrast_pairs
from pofe.evaluation.audit.gating import (
    calibration_set_hash, gate, judge_identity, labels_identity, read_audit_report, require_audit,
    reward_identity, reward_model_identity, self_reward_identity,
)
from pofe.evaluation.audit.metrics import calibration_metrics, cohen_kappa, has_list, human_human_agreement
from pofe.evaluation.audit.run import audit_from_config, audit_outputs, guard_audit_outputs, run_audit, write_audit

__all__ = [
    "ATTACK_KINDS", "AuditConfig", "AuditDataConfig", "AuditError", "AuditThresholds", "audit_from_config",
    "audit_outputs", "calibration_metrics", "calibration_set_hash", "cohen_kappa", "contrast_metrics",
    "contrast_pairs", "describe_check", "evaluate_checks", "failed_checks", "format_audit", "gate",
    "guard_audit_outputs", "has_list", "human_human_agreement", "judge_identity", "labels_identity",
    "read_audit_report", "require_audit", "reward_identity", "reward_model_identity", "run_audit",
    "self_reward_identity", "write_audit",
]
