"""Per-step metrics of the DAP loops (pure functions) and the end-of-run summary.

Metric names follow TRL's ``DPOTrainer`` where one exists, so that pofe and TRL runs overlay
in TensorBoard / W&B: ``loss``, ``rewards/chosen``, ``rewards/rejected``, ``rewards/margins``,
``rewards/accuracies``, ``logps/chosen``, ``logps/rejected``, ``objective/kl``,
``learning_rate``, ``grad_norm``, ``step``. pofe's own (judge and sampling) metrics keep
plain names: mean_p, consistency_rate, mean_len, winrate_vs_init, time_*, *_pairs.
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Sequence

from pofe.stats import mean


P_BINS = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)


def p_histogram(ps: Sequence[float]) -> list[int]:
    """Counts of P(A better) in the bins [0, .2), [.2, .4), [.4, .6), [.6, .8), [.8, 1]."""
    counts = [0] * (len(P_BINS) - 1)
    for p in ps:
        k = min(int(p * 5), 4)
        counts[k] += 1
    return counts


def step_metrics(*, step: int, annotations: Sequence[dict], pairs: Sequence[Any], counts: dict[str, int],
                 times: dict[str, float], gen_tokens: int, num_samples: int, lr: float, gen_chars: int = 0,
                 grad_norm: float | None) -> dict[str, Any]:
    """One ``metrics.jsonl`` row from everything a step produced (all processes gathered).

    Args:
        annotations: ledger rows of this step (``p``, ``consistent`` per judged pair); empty
            in offline mode.
        pairs: :class:`pofe.loops.online.dap.PairStats` of the trained pairs.
        counts: trained / identical / unlabelled / ties / inconsistent / low_margin.
        times: seconds for generate, judge, reference, policy, optimizer and the whole step.
    """
    labelled = [a for a in annotations if a.get("p") is not None]
    ps = [float(a["p"]) for a in labelled]
    cons = [bool(a["consistent"]) for a in labelled if a.get("consistent") is not None]
    train_time = times.get("reference", 0.0) + times.get("policy", 0.0) + times.get("optimizer", 0.0)
    row: dict[str, Any] = {
        "step": step,
        "wall_time": time.time(),
        "cpu_time": time.process_time(),  # cumulative CPU seconds of this process (benchmarks)
        "loss": mean([p.loss for p in pairs]),
        # Implicit rewards beta*log(pi/pi0) (DPO's reward, OAIF Eq. 1): margin and how often
        # the chosen response already gets the larger one ("accuracy"), TRL's names.
        "rewards/chosen": mean([p.chosen_reward for p in pairs]),
        "rewards/rejected": mean([p.rejected_reward for p in pairs]),
        "rewards/margins": mean([p.margin for p in pairs]),
        "rewards/accuracies": mean([1.0 if p.margin > 0 else 0.0 for p in pairs]),
        "logps/chosen": mean([p.chosen_logp for p in pairs]),
        "logps/rejected": mean([p.rejected_logp for p in pairs]),
        # mean_p: the judge's confidence in the response it prefers, max(p, 1 - p);
        # mean_p_a: raw mean of P(A better) (near 0.5 unless the sampler orders pairs).
        "mean_p": mean([max(p, 1 - p) for p in ps]),
        "mean_p_a": mean(ps),
        "p_hist": p_histogram(ps) if ps else None,
        "consistency_rate": mean([1.0 if c else 0.0 for c in cons]),
        "mean_len": gen_tokens / num_samples if num_samples else None,  # tokens per sampled response
        "mean_chars": gen_chars / num_samples if num_samples else None,
        # k1 estimate of KL(pi || pi0) per sequence on the sampled responses.
        "objective/kl": mean([p.kl for p in pairs]),
        "annotations": counts.get("annotations", 0),
        "pairs": counts.get("trained", 0),
        "identical_pairs": counts.get("identical", 0),
        "unlabelled_pairs": counts.get("unlabelled", 0),
        "tie_pairs": counts.get("ties", 0),
        "inconsistent_pairs": counts.get("inconsistent", 0),
        "low_margin_pairs": counts.get("low_margin", 0),
        # labels read as text because the endpoint gave no logprobs (a hard 0/1, no strength)
        "text_fallback_labels": sum(1 for a in labelled if a.get("text_fallback")),
        "learning_rate": lr,
        "grad_norm": grad_norm,
        "time_generate": times.get("generate", 0.0),
        "time_judge": times.get("judge", 0.0),
        "time_reference": times.get("reference", 0.0),
        "time_policy": times.get("policy", 0.0),
        "time_optimizer": times.get("optimizer", 0.0),
        "time_train": train_time,
        "time_step": times.get("step", 0.0),
        "gen_tokens": gen_tokens,
        "tokens_per_s": gen_tokens / times["generate"] if times.get("generate") else None,
    }
    return row


def summarise(rows: Sequence[dict], eval_rows: Sequence[dict], *, window: int | None = None) -> dict[str, Any]:
    """The end-of-run summary from ``metrics.jsonl`` rows (so a resumed run summarises the
    whole run, not just the part after the resume).

    ``mean_len_first`` / ``mean_len_last`` average the sampled responses' token length over
    the first / last ``window`` steps (default: a tenth of the run, 1 to 5 steps), because
    one step's 8 samples are noisy.
    """
    train = [r for r in rows if "loss" in r or "mean_len" in r]
    n = len(train)
    w = window or max(1, min(5, n // 10))
    lens = [r["mean_len"] for r in train if r.get("mean_len") is not None]
    chars = [r["mean_chars"] for r in train if r.get("mean_chars") is not None]
    times = [r["time_step"] for r in train if r.get("time_step")]
    parts = {k: sum(r.get(f"time_{k}", 0.0) or 0.0 for r in train)
             for k in ("generate", "judge", "reference", "policy", "optimizer")}
    total = sum(parts.values()) or 1.0
    last_eval = eval_rows[-1] if eval_rows else None
    return {
        "steps": train[-1]["step"] if train else 0,
        "annotations": sum(r.get("annotations", 0) or 0 for r in train),
        "trained_pairs": sum(r.get("pairs", 0) or 0 for r in train),
        "identical_pairs": sum(r.get("identical_pairs", 0) or 0 for r in train),
        "unlabelled_pairs": sum(r.get("unlabelled_pairs", 0) or 0 for r in train),
        "tie_pairs": sum(r.get("tie_pairs", 0) or 0 for r in train),
        "inconsistent_pairs": sum(r.get("inconsistent_pairs", 0) or 0 for r in train),
        "low_margin_pairs": sum(r.get("low_margin_pairs", 0) or 0 for r in train),
        "text_fallback_labels": sum(r.get("text_fallback_labels", 0) or 0 for r in train),
        "mean_len_first": mean(lens[:w]),
        "mean_len_last": mean(lens[-w:]),
        "mean_len_window": w,
        "mean_chars_first": mean(chars[:w]),
        "mean_chars_last": mean(chars[-w:]),
        "loss_first": train[0].get("loss") if train else None,
        "loss_last": train[-1].get("loss") if train else None,
        "winrate_vs_init": last_eval["winrate_vs_init"] if last_eval else None,
        "eval": last_eval,
        # median over steps, excluding the first (it pays one-off warm-up costs)
        "seconds_per_step": statistics.median(times[1:] if len(times) > 1 else times) if times else None,
        "time_split": {k: round(v / total, 3) for k, v in parts.items()},
        "time_split_seconds": {k: round(v, 2) for k, v in parts.items()},
    }


def online_summary(history: Sequence[dict], cfg, *, beta: float, judge: str | None, engine: dict[str, Any],
                   ) -> dict[str, Any]:
    """``pofe online``'s summary keys: :func:`summarise` of the whole run's rows (its ``steps``
    left to the driver), the loss and label settings and ``engine``'s keys (its name and syncs)."""
    s = summarise(history, [r for r in history if r.get("winrate_vs_init") is not None or "eval_wins" in r])
    s.pop("steps")
    s.update(mode=cfg.mode, loss=cfg.loss.name, beta=beta, labels=cfg.loss.labels, label_filter=cfg.labels.model_dump(),
             judge=judge, **engine)
    return s


def iteration_row(m: dict[str, Any]) -> dict[str, Any]:
    """The ``metrics.jsonl`` row of one self-reward iteration (``step`` = the iteration): the
    scalars a tracker can plot; the full record stays in ``iter_t/metrics.json``."""
    pairs, h2h, rm = m.get("pairs") or {}, m.get("head_to_head_vs_prev") or {}, m.get("rm_metrics") or {}
    dpo = m.get("dpo") or {}
    row = {"step": m["iteration"], "iteration": m["iteration"], "mean_score": m.get("mean_score"),
           "eval_mean_score": m.get("eval_mean_score"), "mean_length_chars": m.get("mean_length_chars"),
           "pairs_kept": pairs.get("kept"), "unscored_candidates": m.get("unscored_candidates"),
           "loss": dpo.get("loss_last"), "winrate_vs_prev": h2h.get("win_rate_adjusted"),
           "rm/pairwise_accuracy": rm.get("pairwise_accuracy")}
    return {k: v for k, v in row.items() if v is not None}
