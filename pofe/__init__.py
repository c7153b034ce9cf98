"""pofe: preference optimisation from AI feedback.

The Python API (``docs/api.md``)::

    import pofe

    judge = pofe.build_judge({"kind": "length", "prefer": "shorter"})
    report = pofe.audit({"kind": "length"}, [{"prompt": ..., "response_a": ..., "response_b": ..., "label": "A"}])
    run_dir, summary = pofe.run("online", {"model.name": ..., "judge.kind": "length", "train.steps": 2})
    pofe.export(run_dir, "pairs.jsonl", format="trl")

Names are loaded on first use (PEP 562), so ``import pofe`` imports neither torch nor
transformers; ``__all__`` lists them. Stages (one subpackage each): ``generation`` (sampling
from a policy), ``judges`` (AI feedback), ``losses`` (direct-alignment losses), ``loops`` (one
module per command), ``evaluation`` (audit, eval, report, sim), ``data`` (reading every input),
``cli``; ``api`` holds the functions above.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

# public name -> the module that defines it. Module names as text, imported on first access:
# pofe.runs, pofe.runtime.checkpoints, ... read ``__version__`` from here, so this module
# must stay free of imports of the package (the layer test reads ``pofe`` as a leaf).
_API: dict[str, str] = {
    # models
    "load_model": "pofe.models",
    "load_tokenizer": "pofe.models",
    # judges and their audit
    "build_judge": "pofe.api",
    "judge_config": "pofe.api",
    "judge_pairs": "pofe.api",
    "label_prompts": "pofe.api",
    "audit": "pofe.api",
    "run_audit": "pofe.evaluation.audit",
    "require_audit": "pofe.evaluation.audit",
    # commands
    "run": "pofe.api",
    "make_config": "pofe.api",
    "config_class": "pofe.config_docs",
    "RunResult": "pofe.api",
    "export": "pofe.api",
    # losses (pure functions with soft labels)
    "dpo": "pofe.losses",
    "ipo": "pofe.losses",
    "slic": "pofe.losses",
    # records and errors
    "CalibrationItem": "pofe.data.calibration",
    "Judgment": "pofe.records",
    "PreferencePair": "pofe.records",
    "PofeError": "pofe.errors",
    "ConfigError": "pofe.config",
    # the config classes of the commands at the time of writing; pofe.config_class(command) has every one
    "OnlineConfig": "pofe.loops.online",
    "SFTConfig": "pofe.loops.sft",
    "RMConfig": "pofe.loops.rm",
    "RLConfig": "pofe.loops.rl",
    "SelfRewardConfig": "pofe.loops.self_reward",
    "LabelConfig": "pofe.loops.label",
    "CaiReviseConfig": "pofe.loops.cai_revise",
    "RefusalEvalConfig": "pofe.loops.cai_refusal",
    "JudgeCommandConfig": "pofe.loops.judge",
    "AuditConfig": "pofe.evaluation.audit.config",
    "EvalConfig": "pofe.evaluation.eval",
    "SimConfig": "pofe.evaluation.sim",
    "ExportConfig": "pofe.loops.export",
}

__all__ = sorted(_API) + ["__version__"]


def __getattr__(name: str):
    module = _API.get(name)
    if module is None:
        raise AttributeError(f"module 'pofe' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later accesses skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_API))
