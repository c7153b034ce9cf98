"""What every training command logs: ``metrics.jsonl`` (always), optional TensorBoard / W&B /
MLflow sinks, and a progress bar with ETA. One ``log:`` section, one sink, one bar, so runs of
different commands read and overlay the same way."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any, ClassVar

from pydantic import model_validator

from pofe.config import PofeConfig
from pofe.errors import PofeError
from pofe.runs import JsonlWriter, check_run_path


class TrackerMissing(PofeError):
    """A tracker the config turns on whose package is not installed: found before the run folder
    or any model exists (exit 2: install it or turn the tracker off)."""

    exit_code = 2


class LogConfig(PofeConfig):
    """The ``log:`` section shared by every long-running command."""

    tensorboard: bool | None = None
    """None = when tensorboard is installed."""
    wandb: bool = False
    """Log each step's metrics to Weights & Biases (needs the ``wandb`` package; checked before the run starts)."""
    wandb_project: str = "pofe"
    """W&B project of the run (``log.wandb``)."""
    wandb_entity: str | None = None
    """W&B entity (user or team) owning the project; None = your default entity."""
    wandb_tags: list[str] = []
    """W&B tags of the run."""
    wandb_group: str | None = None
    """W&B group the run belongs to (e.g. one sweep)."""
    mlflow: bool = False
    """Log each step's metrics to MLflow (needs the ``mlflow`` package; checked before the run starts)."""
    mlflow_experiment: str | None = None
    """MLflow experiment the run goes into (created when missing); None = MLflow's default."""
    progress: bool = True
    """Progress bar with ETA on stderr (main process)."""

    @model_validator(mode="after")
    def _settings_of_an_enabled_tracker(self):
        # a W&B / MLflow setting with its tracker off does nothing: say so instead of ignoring it
        for tracker, keys in (("wandb", ("wandb_project", "wandb_entity", "wandb_tags", "wandb_group")),
                              ("mlflow", ("mlflow_experiment",))):
            # compared with the defaults: a loaded config has every key set (the defaults are merged in)
            set_ = [k for k in keys if getattr(self, k) != type(self).model_fields[k].default]
            if set_ and not getattr(self, tracker):
                raise ValueError(f"log.{set_[0]} is set but log.{tracker} is false (set log.{tracker}: true)")
        for k in ("wandb_project", "wandb_entity", "wandb_group", "mlflow_experiment"):
            v = getattr(self, k)
            if v is not None and (not v.strip() or any(ord(c) < 32 for c in v)):
                raise ValueError(f"log.{k} {v!r}: must be a non-empty name on one line")
        return self


def _installed(name: str) -> bool:
    if name in sys.modules:  # None there: imports of it are blocked
        return sys.modules[name] is not None
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def check_trackers(log: LogConfig | None) -> None:
    """Refuse a tracker turned on whose package is missing, before the run folder or any model
    exists (found after the model loaded, it once left an empty run folder)."""
    if log is None:
        return
    for tracker, package in (("wandb", "wandb"), ("mlflow", "mlflow"), ("tensorboard", "tensorboard")):
        if getattr(log, tracker) is True and not _installed(package):
            raise TrackerMissing(f"tracker {tracker} needs the {package} package: pip install {package}")


class MetricsSink:
    """metrics.jsonl plus optional TensorBoard / W&B / MLflow."""

    def __init__(self, run_dir: Path, log: LogConfig, *, config: dict):
        check_trackers(log)  # the driver checked before the run; a library caller gets the same line
        self.jsonl = JsonlWriter(Path(run_dir) / "metrics.jsonl")
        self.tb = self._wandb = self._mlflow = None
        if log.tensorboard is not False:
            check_run_path(Path(run_dir) / "tensorboard")  # event files never go through a planted link
            try:
                from torch.utils.tensorboard import SummaryWriter

                self.tb = SummaryWriter(str(Path(run_dir) / "tensorboard"))
            except ImportError:
                if log.tensorboard:
                    raise TrackerMissing("tracker tensorboard needs the tensorboard package: pip install tensorboard") from None
        if log.wandb:
            import wandb as _wandb

            check_run_path(Path(run_dir) / "wandb")
            self._wandb = _wandb.init(project=log.wandb_project, entity=log.wandb_entity, tags=list(log.wandb_tags) or None,
                                      group=log.wandb_group, name=Path(run_dir).name, config=config, dir=str(run_dir))
        if log.mlflow:
            import mlflow as _mlflow

            if log.mlflow_experiment:
                _mlflow.set_experiment(log.mlflow_experiment)
            _mlflow.start_run(run_name=Path(run_dir).name)
            self._mlflow = _mlflow

    def write(self, row: dict[str, Any]) -> None:
        self.jsonl.write(row)
        scalars = {k: v for k, v in row.items() if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "step"}
        step = int(row.get("step", 0))
        if self.tb is not None:
            for k, v in scalars.items():
                self.tb.add_scalar(k, v, step)
            self.tb.flush()
        if self._wandb is not None:
            self._wandb.log(scalars, step=step)
        if self._mlflow is not None:
            self._mlflow.log_metrics(scalars, step=step)

    def close(self) -> None:
        self.jsonl.close()
        if self.tb is not None:
            self.tb.close()
        if self._wandb is not None:
            self._wandb.finish()
        if self._mlflow is not None:
            self._mlflow.end_run()


class Progress:
    """A tqdm bar with ETA over optimiser steps (main process only; a no-op when disabled).

    ``show`` maps metric keys to (short name, format) for the postfix. A run started inside
    another run's loop in the same thread (self-reward's sft and DPO stages) draws no bar of its
    own: it shows as the outer bar's ``stage`` field (``sft 3/8`` plus its own postfix), and while
    a bar is drawn transformers' own bars (a stage loading or saving its model) are off, so one
    command keeps one bar however many stages it drives."""

    _open: ClassVar[list[Progress]] = []  # the bars now drawn, outermost first (stages run one at a time)

    def __init__(self, log: LogConfig, *, total: int, initial: int = 0, desc: str, main: bool = True,
                 show: tuple[tuple[str, str, str], ...] = (("loss", "loss", "{:.3f}"),)):
        import threading

        self.bar = self.outer = None
        self.library_bars = False
        self.show, self.total, self.n = show, total, initial
        self.name = desc.removeprefix("pofe ")
        self.thread = threading.get_ident()
        if not (main and log.progress):
            return
        outer = next((p for p in Progress._open if p.thread == self.thread), None)
        if outer is not None:
            self.outer = outer
            self._show_in_outer({})
        else:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total, initial=initial, desc=desc, unit="step", dynamic_ncols=True)
            self.library_bars = _library_bars(False)
        Progress._open.append(self)

    def _postfix(self, row: dict[str, Any] | None) -> dict[str, str]:
        return {name: fmt.format(row[key]) for key, name, fmt in self.show if row and row.get(key) is not None}

    def _show_in_outer(self, post: dict[str, str]) -> None:
        self.outer.bar.set_postfix({"stage": f"{self.name} {self.n}/{self.total}", **post}, refresh=True)

    def update(self, row: dict[str, Any] | None = None, n: int = 1) -> None:
        if self.outer is not None:
            self.n += n
            self._show_in_outer(self._postfix(row))
            return
        if self.bar is None:
            return
        post = self._postfix(row)
        if post:
            self.bar.set_postfix(post, refresh=False)
        self.bar.update(n)

    def close(self) -> None:
        if self in Progress._open:
            Progress._open.remove(self)
        if self.outer is not None:
            self.outer.bar.set_postfix({}, refresh=True)  # the stage is over: the outer bar's own fields return
        elif self.bar is not None:
            self.bar.close()
            _library_bars(self.library_bars)


def _library_bars(on: bool) -> bool:
    """Turn transformers' (and huggingface_hub's) progress bars on or off; returns whether they were on.
    Only where transformers is already imported: a command that loads no model (an endpoint judge's
    ``pofe label``) does not pay its import for a bar; a command that does has imported it in setup,
    before its bar, so its stages' loads are covered."""
    if "transformers" not in sys.modules:
        return False
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    if on and not was:
        hf_logging.enable_progress_bar()
    elif not on and was:
        hf_logging.disable_progress_bar()
    return was
