"""Shared training plumbing for every loop (online, sft, self-reward, rm, rl), kept here once so
that loops stay short and a fix lands everywhere at once. The names the loops and commands use
are re-exported below; modules inside this package import from the defining module.

* ``checkpoints`` -- atomic checkpoints with everything an exact resume needs, and the final model; no pickle.
* ``guards`` -- a non-finite loss stops the run, single-process refusal of ``WORLD_SIZE > 1``, fault points.
* ``model`` -- the ``model:`` sections, loading the policy (new or continued LoRA), the reference pi_0.
* ``optim`` -- the ``optim:`` section: AdamW or Adafactor, warm-up then constant / linear / cosine.
* ``step`` -- ``optimizer_step``: the one optimiser step every command takes (sync, finite-loss check, clip, step, schedule).
* ``dap`` -- the direct-alignment update: pairs -> policy / reference log-probs -> DPO / IPO / SLiC loss.
* ``dap_step`` -- one ``pofe online`` step (OAIF Algorithm 1, step 4) and its metrics row.
* ``rl`` -- policy-gradient pieces of ``pofe rl``: RLOO / GRPO baselines, KL estimators, the loss.
* ``rl_step`` -- one ``pofe rl`` step (sample -> score -> update) and the held-out measurement.
* ``rm_step`` -- one ``pofe rm`` step (Bradley-Terry loss against the soft target) and the batch order.
* ``sft_step`` -- one ``pofe sft`` step: chat-templated examples, response-only NLL.
* ``rewards`` -- ``pofe rl``'s reward sources: programmatic, reward model, pointwise judge, tournament.
* ``pair_sources`` -- where ``pofe online``'s pairs come from, one source per mode, and the engine sync.
* ``annotator`` -- ``pofe online``'s annotator and evaluation judge, and whether they share pi_0's weights.
* ``prefetch`` -- ``mode: async``: the next step's samples and feedback made in a background thread.
* ``tracking`` -- ``metrics.jsonl``, TensorBoard / W&B / MLflow sinks, the progress bar (``log:``).
* ``metrics`` -- per-step metrics of the DAP loops (TRL's names) and the end-of-run summary.
* ``ledger`` -- ``ledger.jsonl``: every annotation a run trained on or skipped, every trained pair's loss.
* ``precision`` -- bf16 autocast compute with fp32 master weights and optimiser state.
* ``parallel`` -- data parallelism (accelerate): gathers, sums, a weights digest, the per-step seed.
* ``allocator`` -- glibc malloc tuned so that a step reuses its large buffers instead of re-mapping them.
* ``tournament`` -- pairwise tournament rewards: a prompt's samples compared by a pairwise judge.
* ``stages`` -- helpers for multi-stage loops: stage seeds, atomic JSON, freeing a model, a stage clock.
* ``self_reward_stages`` -- the stages of ``pofe self-reward`` and the chain M1 -> M_T they form.
* ``online_pairs`` -- online pairs: sample, judge both orders, and turn verdicts into pairs.
* ``reward_model`` -- a causal LM with a scalar head: scoring, loading, held-out margins (rm, rl, judge).
* ``diagnostics`` -- OAIF Appendix B's off-policy gap in ``pofe online``: log-probs of fresh vs offline responses.
* ``drift`` -- the live judge re-audited every ``audit.every`` steps (online, rl), warning or stopping on a crossing.
"""

from __future__ import annotations

from pofe.training.checkpoints import (CheckpointError, final_complete, latest_checkpoint, load_checkpoint,
                                       prune_checkpoints, save_checkpoint, save_final, seed_everything)
from pofe.training.guards import MultiProcessRefused, NonFiniteLoss, check_finite, fault_point
from pofe.training.model import DeviceConfig, LoadConfig, LoraSettings, ModelConfig, Reference, apply_lora, load_policy
from pofe.training.optim import OptimConfig, make_optimizer, make_scheduler

__all__ = [
    "DeviceConfig", "LoadConfig", "LoraSettings", "ModelConfig", "Reference", "apply_lora", "load_policy",
    "OptimConfig", "make_optimizer", "make_scheduler", "CheckpointError", "final_complete", "latest_checkpoint",
    "load_checkpoint", "prune_checkpoints", "save_checkpoint", "save_final", "seed_everything",
    "MultiProcessRefused", "NonFiniteLoss", "check_finite", "fault_point",
]
