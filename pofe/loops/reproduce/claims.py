"""Each headline claim as a fixed-seed miniature (:mod:`pofe.loops.reproduce.worlds`): real
``pofe online`` runs on a tiny policy, planted annotators, the oracle as the evaluator. Every
function returns ``value`` (pofe's number), ``ci95`` where it is a rate, ``holds`` (the paper's
direction) and the numbers behind them."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pofe.loops.reproduce.worlds import (NoisyAnnotator, InstructedAnnotator, target_length_oracle, tiny_policy,
                                         words)
from pofe.stats import mean


@dataclass
class World:
    """One harness run's shared setting: where runs go, the policy, the held-out prompts, the scale."""

    out: Path
    steps: int = 12
    batch_size: int = 4
    max_new_tokens: int = 12
    eval_prompts: int = 16
    lr: float = 1e-3
    target: int = 3
    seed: int = 0
    policy: Path | None = None
    keys: list[str] = field(default_factory=list)

    def __post_init__(self):
        from pofe.data.prompts import load_prompts, split_heldout

        self.out.mkdir(parents=True, exist_ok=True)
        self.policy = tiny_policy(self.out / "policy", seed=self.seed)
        _, held = split_heldout(load_prompts(None), self.eval_prompts, self.seed)
        (self.out / "eval-prompts.jsonl").write_text("".join(json.dumps({"prompt": p.text}) + "\n" for p in held))
        n = self.max_new_tokens
        self.keys = [f"model.name={self.policy}", "model.lora.enabled=false", f"train.steps={self.steps}",
                     f"train.batch_size={self.batch_size}", f"sampling.max_new_tokens={n}",
                     f"eval.sampling.max_new_tokens={n}", "eval.sampling.temperature=1.0", f"optim.lr={self.lr}", "optim.warmup_steps=0",
                     f"eval.num_prompts={self.eval_prompts}", f"data.eval_prompts={self.out / 'eval-prompts.jsonl'}",
                     f"run.output_dir={self.out / 'runs'}", "log.tensorboard=false", "log.progress=false",
                     "checkpoint.every=0", f"seed={self.seed}", "judge.kind=length"]  # judge: given in memory

    @property
    def oracle(self):
        return target_length_oracle(self.target)

    def config(self, name: str, *more: str):
        from pofe.config import load_config
        from pofe.loops.online import OnlineConfig

        return load_config(OnlineConfig, None, [*self.keys, f"run.name={name}", *more])

    def online(self, name: str, judge, *more: str) -> dict[str, Any]:
        """A ``pofe online`` run with ``judge`` as annotator and the oracle as evaluator."""
        from pofe.loops.online import run

        return run(self.config(name, *more), judge=judge, eval_judge=self.oracle)


def final_responses(run_dir: str | Path) -> dict[str, str]:
    """The greedy held-out responses of a run's last evaluation, by prompt."""
    from pofe.runs import read_jsonl

    files = sorted(Path(run_dir, "eval").glob("step-*.jsonl"), key=lambda f: int(f.stem.split("-")[1]))
    return {r["prompt"]: r["current"] for r in read_jsonl(files[-1])}


def versus(judge, a: dict[str, str], b: dict[str, str]) -> dict[str, Any]:
    """A's responses against B's on their common prompts under the one win rate and tie rule
    (:func:`pofe.evaluation.winrate.head_to_head`: both orders, ties as half, Wilson interval)."""
    from pofe.evaluation.winrate import head_to_head

    prompts = [p for p in a if p in b]
    h = head_to_head(judge, prompts, [a[p] for p in prompts], [b[p] for p in prompts])
    return {"winrate": h["win_rate_adjusted"], "ci95": h["win_rate_adjusted_ci95"],
            **{k: h[k] for k in ("wins", "ties", "losses")}}


def offline_dataset(cfg, judge, path: Path) -> int:
    """The offline dataset OAIF compares against, for an online config ``cfg``: its prompt stream
    and label budget (``train.steps`` x ``train.batch_size``), both responses sampled once from
    pi_0 (LoRA off: an untrained adapter is the identity) and labelled once by ``judge`` under the
    run's own label rule; written to ``path`` for ``mode: offline``. Returns the label count."""
    import torch

    from pofe.data.prompts import PromptCursor
    from pofe.loops.online import label_annotations, sample_and_annotate
    from pofe.loops.online.pair_sources import load_data
    from pofe.runs import JsonlWriter
    from pofe.runtime import load_policy, seed_everything

    prompts, _ = load_data(cfg)
    seed_everything(cfg.seed)
    policy, tok = load_policy(cfg.model.model_copy(update={"lora": cfg.model.lora.model_copy(update={"enabled": False})}))
    cursor, labels = PromptCursor(prompts, cfg.seed), 0
    with JsonlWriter(path) as w:
        for step in range(1, cfg.train.steps + 1):
            torch.manual_seed(step)
            anns = sample_and_annotate(policy, tok, judge, cursor.take(cfg.train.batch_size), n=2,
                                       sampling=cfg.sampling, step=step)
            _, counts, rows = label_annotations(anns, cfg.loss.labels, 0, cfg.labels)
            labels += counts["annotations"]
            for r in rows:
                w.write(r)
    return labels


def curve(run_dir: str | Path) -> list[list[float]]:
    """A run's ``[step, win rate vs pi_0]`` at each evaluation: OAIF Fig. 3's curve (there the
    evaluator is a human or a stronger LLM; here the oracle)."""
    from pofe.runs import read_jsonl

    return [[r["step"], r["winrate_vs_init"]] for r in read_jsonl(Path(run_dir) / "metrics.jsonl")
            if r.get("winrate_vs_init") is not None]


def online_beats_offline(world: World) -> dict[str, Any]:
    """OAIF Sec. 4.2 (Table 2): online DPO against offline DPO at the same annotator and label
    budget, head to head on held-out prompts; with both runs' win rate vs pi_0 at four points of
    training (Fig. 3: online climbs, offline does not keep up)."""
    oracle = world.oracle
    every = f"eval.every={max(1, world.steps // 4)}"
    budget = offline_dataset(world.config("offline-data"), oracle, world.out / "offline-pairs.jsonl")
    off = world.online("offline", oracle, "mode=offline", f"data.preferences={world.out / 'offline-pairs.jsonl'}", every)
    on = world.online("online", oracle, every)
    h = versus(oracle, final_responses(on["run_dir"]), final_responses(off["run_dir"]))
    # Holds when the whole 95% interval is above a coin flip AND online is no worse than pi_0:
    # beating an offline run that degraded (Fig. 3's red curve) is not the claim on its own.
    holds = h["ci95"][0] is not None and h["ci95"][0] > 0.5 and (on["winrate_vs_init"] or 0.0) >= 0.5
    return {"value": h["winrate"], "ci95": h["ci95"], "holds": holds,
            "detail": {**h, "label_budget": budget, "online_vs_initial": on["winrate_vs_init"],
                       "offline_vs_initial": off["winrate_vs_init"],
                       "fig3": {"online": curve(on["run_dir"]), "offline": curve(off["run_dir"])}}}


def annotator_quality(world: World, accuracies=(0.6, 0.8, 1.0), target: int = 1) -> dict[str, Any]:
    """OAIF Sec. 4.5 (Fig. 5): the better the annotator, the better the policy. Planted accuracies
    stand in for annotator sizes; the measure is the oracle's loss after training (lower is better).
    Its own oracle wants ``target`` words, below the initial policy's (about 3): a direction every
    annotator can teach, so what differs is how well."""
    oracle, dist = target_length_oracle(target), {}
    for acc in accuracies:
        s = world.online(f"accuracy-{acc:g}", NoisyAnnotator(oracle, acc, seed=world.seed))
        dist[acc] = mean(abs(words(r) - target) for r in final_responses(s["run_dir"]).values())
    ds = [dist[a] for a in accuracies]
    # the weakest annotator trains the worst policy (OAIF compares XS against S and L); the order of
    # the two stronger ones is within the noise of 16 held-out prompts (0.32 words apart when measured)
    holds = all(x is not None for x in ds) and all(ds[0] > d for d in ds[1:])
    return {"value": ds[-1], "ci95": None, "holds": holds,
            "detail": {"distance_by_accuracy": {f"{a:g}": d for a, d in dist.items()}, "target_words": target}}


def length_dial(world: World, helpful_words: int = 12) -> dict[str, Any]:
    """OAIF Sec. 4.6 (Fig. 6a): asking the annotator for short, then very short, answers shortens
    the policy's (~120 -> ~90 -> ~40 tokens). Mean held-out length in words per instruction."""
    lengths = {}
    for instruction in ("helpful", "short", "very short"):
        s = world.online(f"dial-{instruction.replace(' ', '-')}", InstructedAnnotator(instruction, helpful_words))
        lengths[instruction] = mean(words(r) for r in final_responses(s["run_dir"]).values())
    h, sh, vs = (lengths[k] for k in ("helpful", "short", "very short"))
    return {"value": [h, sh, vs], "ci95": None, "holds": None not in (h, sh, vs) and h > sh > vs,
            "detail": {"mean_words": lengths, "helpful_words": helpful_words}}


def labelling_chain(world: World) -> dict[str, Any]:
    """RLAIF seed, "A toy run": a reward model copies the judge's length preference, and debiasing
    by both orders removes the position bias but not the length bias (``pofe sim``)."""
    from pofe.evaluation.sim import run_sim

    r = run_sim()
    rm = r["rm"]
    holds = (rm["judge_debiased_soft"]["length_to_quality_ratio"] > 0.4
             and abs(r["first_position_win_rate_debiased"] - 0.5) < abs(r["first_position_win_rate"] - 0.5)
             and rm["human_hard"]["length_to_quality_ratio"] < 0.1)
    return {"value": rm["judge_debiased_soft"]["length_to_quality_ratio"], "ci95": None, "holds": holds,
            "detail": {"rm_length_to_quality": {k: v["length_to_quality_ratio"] for k, v in rm.items()},
                       "first_position_win_rate": [r["first_position_win_rate"], r["first_position_win_rate_debiased"]]}}
