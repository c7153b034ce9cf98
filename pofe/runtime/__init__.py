"""The runtime: what every command needs to run a model on one or many processes, below the stage
packages (data, generation, judges), evaluation and the driver. Its modules import only the
leaves (``pofe.config``, ``pofe.errors``, ``pofe.runs``, ``pofe.models``, ...) and each other, so
any layer above can use them (tests/project/test_layout.py checks it). The names code outside the
package imports are re-exported below; modules inside this package import from the defining module.

* ``parallel`` -- data parallelism (accelerate): a process's block, gathers, sums, a weights digest.
* ``sharding`` -- FSDP2 sharded training: launch checks, lock-stepped passes, the sharded clip and state.
* ``zero`` -- DeepSpeed ZeRO stages 2 and 3: the engine, its optimiser, gathering whole weights.
* ``checkpoints`` -- atomic checkpoints with everything an exact resume needs, and the final model; no pickle.
* ``seeds`` -- every seed pofe derives: the process-wide reseed, per step, per block, and each command's named streams.
* ``guards`` -- a non-finite loss stops the run, single-process refusal of ``WORLD_SIZE > 1``, fault points.
* ``step`` -- ``optimizer_step``: the one optimiser step every command takes (sync, finite-loss check, clip, step, schedule).
* ``optim`` -- the ``optim:`` section: AdamW or Adafactor, warm-up then constant / linear / cosine.
* ``model`` -- the ``model:`` sections, loading the policy (new or continued LoRA), the reference pi_0.
* ``tracking`` -- ``metrics.jsonl``, TensorBoard / W&B / MLflow sinks, the progress bar (``log:``).
* ``precision`` -- bf16 autocast compute with fp32 master weights and optimiser state.
* ``activations`` -- a training forward that saves fewer activations (RMSNorm, SwiGLU, attention) with the same numbers.
* ``allocator`` -- glibc malloc tuned so that a step reuses its large buffers instead of re-mapping them.
"""

from __future__ import annotations

from pofe.runtime.checkpoints import (CheckpointError, final_complete, latest_checkpoint, load_checkpoint,
                                      prune_checkpoints, save_checkpoint, save_final)
from pofe.runtime.guards import MultiProcessRefused, NonFiniteLoss, check_finite, fault_point
from pofe.runtime.model import DeviceConfig, LoadConfig, LoraSettings, ModelConfig, Reference, apply_lora, load_policy
from pofe.runtime.optim import OptimConfig, make_optimizer, make_scheduler
from pofe.runtime.seeds import seed_everything

__all__ = [
    "DeviceConfig", "LoadConfig", "LoraSettings", "ModelConfig", "Reference", "apply_lora", "load_policy",
    "OptimConfig", "make_optimizer", "make_scheduler", "CheckpointError", "final_complete", "latest_checkpoint",
    "load_checkpoint", "prune_checkpoints", "save_checkpoint", "save_final", "seed_everything",
    "MultiProcessRefused", "NonFiniteLoss", "check_finite", "fault_point",
]
