"""What the sharded-training invariants (FSDP2, ZeRO) share: the 2-process launch with the
launcher's sharding variables, the cases' data and settings."""

from __future__ import annotations

import json
from pathlib import Path

import configs
import yaml
from _cli import torchrun
from harness import Result

LR = 1e-3
ATOL = LR / 10
RTOL, RTOL_LATER = 1e-5, 1e-3

LORA = {"model.lora.enabled": True, "model.lora.r": 4}
OFFLINE = {"mode": "offline", "eval.enabled": False, "train.steps": 3, "train.grad_accum": 2, "optim.warmup_steps": 0}


def launch_two(argv, env: dict[str, str], *, config: dict | None = None, resume: Path | None = None,
               fault: str | None = None, timeout: float = 300) -> Result:
    """``pofe`` on 2 torchrun processes with ``env`` (what an accelerate config exports) set: a run
    from ``config`` (written next to its run folder) or a ``--resume`` of ``resume``."""
    extra = dict(env, **({"POFE_FAULT": fault} if fault else {}))
    if config is not None:
        run_dir = Path(config["run"]["output_dir"]) / config["run"]["name"]
        path = run_dir.parent / f"{run_dir.name}.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        args = [*argv, "--config", str(path)]
    else:
        run_dir, args = Path(resume), [*argv, "--resume", str(resume)]
    p = torchrun(*args, nproc=2, timeout=timeout, **extra)
    return Result(p.returncode, p.stdout, p.stderr, run_dir)


def preferences(work: Path) -> str:
    path = work / "prefs.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"question {i}?", "chosen": "ok " * (i % 3 + 1),
                                        "rejected": "no, " * (i % 4 + 2)}) + "\n" for i in range(16)))
    return str(path)


def overrides(command: str, work: Path) -> dict:
    """The data and learning rate of an equality case of ``command``."""
    data = {"sft": lambda: {"data.ift": [configs.ift_file(work, 12)]}, "rm": dict,
            "online": lambda: {"data.preferences": preferences(work)}}[command]()
    return {"optim.lr": LR, **data}
