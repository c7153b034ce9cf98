"""Each training command's own pieces, until they move into per-command folders. The runtime they
stand on (data parallelism, sharding, ZeRO, checkpoints, guards, the optimiser step, optim, the
policy loading, tracking, precision) is ``pofe.runtime``. This package re-exports nothing: import
from the defining module.

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
* ``metrics`` -- per-step metrics of the DAP loops (TRL's names) and the end-of-run summary.
* ``ledger`` -- ``ledger.jsonl``: every annotation a run trained on or skipped, every trained pair's loss.
* ``tournament`` -- pairwise tournament rewards: a prompt's samples compared by a pairwise judge.
* ``stages`` -- helpers for multi-stage loops: stage seeds, atomic JSON, freeing a model, a stage clock.
* ``self_reward_stages`` -- the stages of ``pofe self-reward`` and the chain M1 -> M_T they form.
* ``online_pairs`` -- online pairs: sample, judge both orders, and turn verdicts into pairs.
* ``reward_model`` -- a causal LM with a scalar head: scoring, loading, held-out margins (rm, rl, judge).
* ``diagnostics`` -- OAIF Appendix B's off-policy gap in ``pofe online``: log-probs of fresh vs offline responses.
* ``engine_reference`` -- ``reference.source: engine``: pi_0's log-probs read from the annotator's vLLM engine.
* ``meta_rewarding`` -- Meta-Rewarding in ``pofe self-reward`` (``meta_judge.enabled``).
* ``self_reward_variants`` -- two variants of ``pofe self-reward``'s AIFT pairs (CREAM, Temporal Self-Rewarding), each off by default.
* ``online_settings`` -- ``pofe online``'s data and evaluation settings.
* ``drift`` -- the live judge re-audited every ``audit.every`` steps (online, rl), warning or stopping on a crossing.
"""
