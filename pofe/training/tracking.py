"""What every training command logs: ``metrics.jsonl`` (always), optional TensorBoard / W&B /
MLflow sinks, and a progress bar with ETA. One ``log:`` section, one sink, one bar, so runs of
different commands read and overlay the same way."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pofe.config import PofeConfig
from pofe.runs import JsonlWriter, check_run_path


class LogConfig(PofeConfig):
    """The ``log:`` section shared by every long-running command."""

    tensorboard: bool | None = None
    """None = when tensorboard is installed."""
    wandb: bool = False
    mlflow: bool = False
    progress: bool = True
    """Progress bar with ETA on stderr (main process)."""


class MetricsSink:
    """metrics.jsonl plus optional TensorBoard / W&B / MLflow."""

    def __init__(self, run_dir: Path, log: LogConfig, *, config: dict):
        self.jsonl = JsonlWriter(Path(run_dir) / "metrics.jsonl")
        self.tb = self._wandb = self._mlflow = None
        if log.tensorboard is not False:
            check_run_path(Path(run_dir) / "tensorboard")  # event files never go through a planted link
            try:
                from torch.utils.tensorboard import SummaryWriter

                self.tb = SummaryWriter(str(Path(run_dir) / "tensorboard"))
            except ImportError:
                if log.tensorboard:
                    raise RuntimeError("log.tensorboard is true but tensorboard is not installed: pip install tensorboard") from None
        if log.wandb:
            try:
                import wandb as _wandb
            except ImportError:
                raise RuntimeError("log.wandb is true but wandb is not installed: pip install wandb") from None
            check_run_path(Path(run_dir) / "wandb")
            self._wandb = _wandb.init(project="pofe", name=Path(run_dir).name, config=config, dir=str(run_dir))
        if log.mlflow:
            try:
                import mlflow as _mlflow
            except ImportError:
                raise RuntimeError("log.mlflow is true but mlflow is not installed: pip install mlflow") from None
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

    ``show`` maps metric keys to (short name, format) for the postfix."""

    def __init__(self, log: LogConfig, *, total: int, initial: int = 0, desc: str, main: bool = True,
                 show: tuple[tuple[str, str, str], ...] = (("loss", "loss", "{:.3f}"),)):
        self.bar = None
        self.show = show
        if main and log.progress:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total, initial=initial, desc=desc, unit="step", dynamic_ncols=True)

    def update(self, row: dict[str, Any] | None = None, n: int = 1) -> None:
        if self.bar is None:
            return
        post = {name: fmt.format(row[key]) for key, name, fmt in self.show if row and row.get(key) is not None}
        if post:
            self.bar.set_postfix(post, refresh=False)
        self.bar.update(n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
