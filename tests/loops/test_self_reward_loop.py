"""``pofe self-reward`` end to end: a programmatic judge with a known preference on a tiny model
(direction of the mean judge score), and two iterations on the embedded SmolLM2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pofe.cli.self_reward import compact
from pofe.loops.self_reward import SelfRewardConfig, run
from pofe.runs import read_jsonl

EXPECTED_RUBRIC = Path(__file__).resolve().parents[2] / "examples" / "templates" / "rubric-expected-score.yaml"


@pytest.mark.slow
def test_programmatic_judge_mean_score_improves(tmp_path, tiny_model_dir, monkeypatch):
    """With a judge that prefers shorter responses standing in for the rubric, M2's held-out
    responses score higher (are shorter) than M1's, and M2 beats M1 head-to-head. The whole run
    (two iterations, each an sft and a DPO stage driven inside it) draws one progress bar.

    Measured (tiny random Llama, 16 prompts x 4 candidates, 8 DPO steps at lr 5e-2): mean
    score -84.1 -> -74.9 (chars), head-to-head 19 W / 0 T / 5 L on 24 held-out prompts."""
    pool = tmp_path / "pool.txt"
    from pofe.data.prompts import DEFAULT_PROMPTS

    pool.write_text("\n".join(DEFAULT_PROMPTS))
    cfg = SelfRewardConfig.model_validate({
        "model": {"name": str(tiny_model_dir)}, "iterations": 2,
        "judge": {"kind": "length", "prefer": "shorter"},
        "data": {"prompts": str(pool), "per_iteration": 16},
        "candidates": {"n": 4, "chunk": 16,
                       "sampling": {"max_new_tokens": 12, "temperature": 1.0, "top_p": 1.0, "batch_size": 16}},
        "dpo": {"optim": {"lr": 5e-2, "warmup_steps": 0, "schedule": "cosine", "min_lr_ratio": 0.1},
                "batch_size": 8, "grad_accum": 1, "epochs": 4},
        "selection": {"enabled": False},
        # sampled (seeded) rather than greedy: a random model's greedy output is one token repeated
        "eval": {"num_prompts": 24, "sampling": {"temperature": 1.0, "max_new_tokens": 12, "batch_size": 24}},
        "run": {"output_dir": str(tmp_path / "runs")},
    })
    import tqdm.auto

    bars = []

    class CountedBar(tqdm.auto.tqdm):
        def __init__(self, *a, **k):
            bars.append(k.get("desc"))
            super().__init__(*a, **k)

    monkeypatch.setattr(tqdm.auto, "tqdm", CountedBar)
    s = run(cfg)
    assert bars == ["pofe self-reward"], bars  # no second pofe bar, and no model-loading bars under it
    m1, m2 = s["iterations"]
    assert m2["pairs"]["kept"] == 16 and m2["dpo"]["steps"] == 8
    assert m2["eval_mean_score"] > m1["eval_mean_score"]
    h = m2["head_to_head_vs_prev"]
    assert h["wins"] > h["losses"]
    # the AIFT pairs really are "shorter chosen" under the judge
    pairs = read_jsonl(Path(s["run_dir"]) / "iter_2" / "data" / "aift.jsonl")
    assert all(len(p["chosen"]) < len(p["rejected"]) for p in pairs)


@pytest.mark.slow
def test_self_reward_embedded_two_iterations(tmp_path):
    """SmolLM2 is policy and judge (the additive rubric read by probability, so every response
    gets a score at this size). Seed SFT -> M1; self-instruct -> candidates -> self-judged
    pairs -> DPO -> M2; evaluation and RM metrics for both; then a
    resume of the finished run does nothing again."""
    ift = tmp_path / "ift.jsonl"
    ift.write_text("".join(json.dumps(r) + "\n" for r in [
        {"prompt": "Name a primary colour.", "response": "Red is a primary colour."},
        {"prompt": "What is 3 + 4?", "response": "3 + 4 = 7."},
        {"prompt": "Give a synonym of 'happy'.", "response": "Joyful."},
        {"prompt": "Translate 'thank you' into French.", "response": "Merci."},
    ]))
    ranked = tmp_path / "ranked.jsonl"
    ranked.write_text("".join(json.dumps(r) + "\n" for r in [
        {"prompt": "What is the capital of Italy?", "responses": ["Rome is the capital of Italy.", "I like pasta."]},
        {"prompt": "How many legs does a spider have?", "responses": ["Eight.", "Spiders are insects with six legs.",
                                                                      "banana"]},
    ]))
    cfg = SelfRewardConfig.model_validate({
        "iterations": 2,
        "model": {"lora": {"enabled": True, "r": 4, "alpha": 8}},
        "seed_sft": {"enabled": True, "ift": [str(ift)], "eft": False,
                     "train": {"steps": 1, "batch_size": 4, "grad_accum": 1},
                     "optim": {"lr": 1e-4, "warmup_steps": 0, "schedule": "cosine", "min_lr_ratio": 0.2}},
        "eft": {"ranked": str(ranked), "eval_fraction": 1.0},
        "judge": {"kind": "expected-score", "template": str(EXPECTED_RUBRIC), "batch_size": 8},
        "self_instruct": {"num_prompts": 2, "max_generations": 4, "min_words": 3,
                          "sampling": {"max_new_tokens": 32, "temperature": 0.6, "top_p": 0.9, "batch_size": 4}},
        "candidates": {"n": 3, "chunk": 8, "sampling": {"max_new_tokens": 16, "temperature": 0.7, "top_p": 0.9}},
        "dpo": {"steps": 1, "batch_size": 2, "grad_accum": 1,
                "optim": {"lr": 1e-4, "warmup_steps": 0, "schedule": "cosine", "min_lr_ratio": 0.1}},
        # checkpoint selection is exercised on the tiny model (test_resume_mid_scoring_and_mid_dpo)
        "selection": {"enabled": False},
        "eval": {"num_prompts": 2, "sampling": {"temperature": 0.0, "max_new_tokens": 16}},
        "run": {"output_dir": str(tmp_path / "runs"), "name": "sr"},
    })
    s = run(cfg)
    root = Path(s["run_dir"])
    for t in (1, 2):
        it = root / f"iter_{t}"
        assert (it / "metrics.json").exists() and (it / "eval_responses.jsonl").exists()
        assert (it / "model" / "config.json").exists(), f"iter_{t}/model"
    assert (root / "iter_1" / "data" / "ift.jsonl").exists()
    for f in ("prompts.json", "candidates.jsonl", "aift.jsonl"):
        assert (root / "iter_2" / "data" / f).exists(), f
    m1, m2 = s["iterations"]
    assert m1["rm_metrics"]["n_pairs"] == 4 and m1["rm_metrics"]["n_unscored_responses"] == 0
    p = m2["prompts"]
    assert p["candidates"] == p["kept"] + sum(p["rejected"].values()) + p["surplus"]
    assert m2["pairs"]["prompts"] == p["kept"]
    assert m2["pairs"]["kept"] + m2["pairs"]["tie"] + m2["pairs"]["fewer_than_2_scored"] + \
        m2["pairs"]["identical_text"] == m2["pairs"]["prompts"]
    # seeded: SmolLM2's expected rubric scores of its candidates differ, so pairs are kept
    # and M2 really is a DPO step away from M1 (not a copy of it)
    assert m2["pairs"]["kept"] >= 1, m2["pairs"]
    assert m2["dpo"]["steps"] == 1 and m2["selected_step"] == 1
    assert m2["head_to_head_vs_prev"]["n"] + m2["head_to_head_vs_prev"]["dropped_unparsed"] == 2
    rows = compact(s)
    assert [r["iteration"] for r in rows] == [1, 2] and rows[1]["rm_metrics"]["n_pairs"] == 4
    # Resuming a finished run redoes nothing and reports the same numbers.
    again = run(cfg, resume=root)
    assert [m["iteration"] for m in again["iterations"]] == [1, 2]
    assert again["iterations"][1]["eval_mean_score"] == m2["eval_mean_score"]


@pytest.mark.slow
def test_resume_mid_scoring_and_mid_dpo(tmp_path, tiny_model_dir, monkeypatch):
    """Crash after the first chunk of candidates is written, resume; crash after the first DPO
    checkpoint, resume: the chunk is not redone, DPO continues from its checkpoint."""
    from pofe.data.prompts import DEFAULT_PROMPTS
    from pofe.judges.programmatic import ValueJudge
    from pofe.runtime import checkpoints

    pool = tmp_path / "pool.txt"
    pool.write_text("\n".join(DEFAULT_PROMPTS[:8]))
    cfg = SelfRewardConfig.model_validate({
        "model": {"name": str(tiny_model_dir)}, "iterations": 2,
        "judge": {"kind": "length"},
        "data": {"prompts": str(pool), "per_iteration": 4},
        "candidates": {"n": 2, "chunk": 2, "sampling": {"max_new_tokens": 6, "temperature": 1.0}},
        "dpo": {"optim": {"lr": 1e-3, "warmup_steps": 0}, "batch_size": 1, "grad_accum": 1, "steps": 4},
        "selection": {"num_checkpoints": 2, "num_prompts": 2},
        "eval": {"num_prompts": 2, "sampling": {"max_new_tokens": 6}},
        "run": {"output_dir": str(tmp_path / "runs"), "name": "r"},
    })

    class Crash(RuntimeError):
        pass

    real_score = ValueJudge.score
    calls = {"n": 0}

    def flaky_score(self, prompts, responses, **kw):
        calls["n"] += 1
        if calls["n"] == 3:  # 1: M1's held-out responses; 2, 3: the two chunks of candidates
            raise Crash()
        return real_score(self, prompts, responses, **kw)

    monkeypatch.setattr(ValueJudge, "score", flaky_score)
    with pytest.raises(Crash):
        run(cfg)
    root = tmp_path / "runs" / "r"
    cand = root / "iter_2" / "data" / "candidates.jsonl"
    first = read_jsonl(cand)
    assert [r["index"] for r in first] == [0, 1]
    monkeypatch.setattr(ValueJudge, "score", real_score)

    def crash_after_checkpoint(*a, **k):
        raise Crash()

    # the DPO stage's driver prunes right after its step-2 checkpoint is saved
    monkeypatch.setattr(checkpoints, "prune_checkpoints", crash_after_checkpoint)
    with pytest.raises(Crash):
        run(cfg, resume=root)
    rows = read_jsonl(cand)
    assert [r["index"] for r in rows] == [0, 1, 2, 3] and rows[:2] == first  # chunk 1 kept, not redone
    assert (root / "iter_2" / "dpo" / "checkpoints" / "step-2").is_dir()
    monkeypatch.undo()
    s = run(cfg, resume=root)
    m2 = s["iterations"][1]
    assert m2["dpo"]["resumed_from"] == 2 and m2["dpo"]["steps"] == 4
    assert (root / "iter_2" / "model" / "config.json").exists() and m2["selected_step"] in (2, 4)


@pytest.mark.slow
def test_seed_stage_sft_baseline_writes_eft(tmp_path, tiny_model_dir):
    """Seed stage wiring: IFT-only SFT baseline -> it judges the ranked responses with the
    rubric (EFT) -> M1 = SFT on IFT + EFT; the held-out ranked split measures M1 as a judge.
    A random tiny model never writes "Score: N", so every group is unscored and counted,
    no EFT example is invented, and every RM-eval response is reported unscored."""
    ift = tmp_path / "ift.jsonl"
    ift.write_text("".join(json.dumps({"prompt": f"Question {i}?", "response": f"Answer {i}."}) + "\n" for i in range(4)))
    ranked = tmp_path / "ranked.jsonl"
    ranked.write_text("".join(json.dumps({"prompt": f"Q{i}", "responses": [f"good {i}", f"bad {i}"]}) + "\n"
                              for i in range(4)))
    cfg = SelfRewardConfig.model_validate({
        "model": {"name": str(tiny_model_dir)}, "iterations": 1,
        "seed_sft": {"enabled": True, "ift": [str(ift)], "train": {"steps": 1, "batch_size": 2, "grad_accum": 1}},
        "eft": {"ranked": str(ranked), "eval_fraction": 0.5},
        "judge": {"kind": "rubric", "template": "rubric", "rubric": {"samples": 1, "max_new_tokens": 6}},
        "eval": {"num_prompts": 1, "sampling": {"max_new_tokens": 4}},
        "run": {"output_dir": str(tmp_path / "runs"), "name": "seed"},
    })
    s = run(cfg)
    it = Path(s["run_dir"]) / "iter_1"
    assert (it / "sft_baseline" / "final" / "config.json").exists() and (it / "model" / "config.json").exists()
    stats = json.loads((it / "data" / "eft_stats.json").read_text())
    assert stats["groups"] == 2 and stats["groups_unscored"] == 2 and stats["examples"] == 0
    assert len(read_jsonl(it / "data" / "rm_eval.jsonl")) == 2
    m1 = s["iterations"][0]
    assert m1["eft"]["groups"] == 2 and m1["sft"]["data"] == {"ift": 4, "eft": 0, "eft_capped": 0}
    assert m1["rm_metrics"]["n_unscored_responses"] == 4 and m1["rm_metrics"]["pairwise_accuracy"] is None


@pytest.mark.slow
def test_cli_resume_keeps_the_runs_own_config(tmp_path, tiny_model_dir):
    """``pofe self-reward --resume RUN`` without --config must not overwrite the run's
    config.yaml with defaults and carry on with a different judge (one candidates.jsonl
    would hold rows from two judges). The run's own config is the truth; options are refused."""
    import shutil

    import yaml
    from typer.testing import CliRunner

    from pofe.cli.main import app
    from pofe.data.prompts import DEFAULT_PROMPTS

    pool = tmp_path / "pool.txt"
    pool.write_text("\n".join(DEFAULT_PROMPTS[:8]))
    cfg = {"model": {"name": str(tiny_model_dir)}, "iterations": 2, "judge": {"kind": "length"},
           "data": {"prompts": str(pool), "per_iteration": 4},
           "candidates": {"n": 2, "chunk": 2, "sampling": {"max_new_tokens": 6, "temperature": 1.0}},
           "dpo": {"optim": {"lr": 1e-3, "warmup_steps": 0}, "batch_size": 1, "grad_accum": 1, "steps": 1},
           "selection": {"enabled": False}, "eval": {"num_prompts": 2, "sampling": {"max_new_tokens": 6}},
           "log": {"progress": False, "tensorboard": False},
           "run": {"output_dir": str(tmp_path / "runs"), "name": "sr"}}
    path = tmp_path / "sr.yaml"
    path.write_text(yaml.safe_dump(cfg))
    first = CliRunner().invoke(app, ["self-reward", "--config", str(path), "--json"])
    assert first.exit_code == 0, first.output
    root = tmp_path / "runs" / "sr"
    saved = (root / "config.yaml").read_text()
    assert (root / "final" / "config.json").exists()  # final/ = M_T
    # a crash after the candidates of iteration 2: nothing after them exists yet (nor the
    # driver's checkpoint of iteration 2, written once its row and iter_2/metrics.json are)
    for p in ("iter_2/metrics.json", "iter_2/model", "iter_2/dpo", "iter_2/eval_responses.jsonl", "summary.json",
              "final", "checkpoints/step-2"):
        q = root / p
        shutil.rmtree(q) if q.is_dir() and not q.is_symlink() else q.unlink()
    r = CliRunner().invoke(app, ["self-reward", "--resume", str(root), "--json"])
    assert r.exit_code == 0, r.output
    assert (root / "config.yaml").read_text() == saved
    assert {row["judge_id"] for row in read_jsonl(root / "iter_2" / "data" / "candidates.jsonl")} == {"length:shorter:chars"}
    assert [row["step"] for row in read_jsonl(root / "metrics.jsonl")] == [1, 2]  # no duplicated rows
    assert (root / "final" / "config.json").exists()
    r2 = CliRunner().invoke(app, ["self-reward", "--resume", str(root), "--iterations", "3"])
    assert r2.exit_code == 2 and "refused" in r2.output


def _variants_cfg(tmp_path, tiny_model_dir, name: str, chunk: int) -> SelfRewardConfig:
    """Three iterations on the tiny model judging itself with both variants on, 4 prompts each."""
    from pofe.data.prompts import DEFAULT_PROMPTS

    pool = tmp_path / "pool.txt"
    pool.write_text("\n".join(DEFAULT_PROMPTS[:12]))
    return SelfRewardConfig.model_validate({
        "model": {"name": str(tiny_model_dir)}, "iterations": 3,
        "judge": {"kind": "expected-score", "template": str(EXPECTED_RUBRIC), "batch_size": 8},
        "data": {"prompts": str(pool), "per_iteration": 4},
        "candidates": {"n": 3, "chunk": chunk, "sampling": {"max_new_tokens": 6, "temperature": 1.0}},
        "dpo": {"optim": {"lr": 1e-2, "warmup_steps": 0}, "batch_size": 2, "grad_accum": 1, "steps": 2},
        "cream": {"enabled": True}, "temporal": {"anchor": "m1"},
        "selection": {"enabled": False}, "eval": {"num_prompts": 2, "rm_metrics": False, "sampling": {"max_new_tokens": 6}},
        "log": {"progress": False, "tensorboard": False}, "run": {"output_dir": str(tmp_path / "runs"), "name": name},
    })


@pytest.mark.slow
def test_cream_and_anchored_rejection_three_iterations(tmp_path, tiny_model_dir):
    """``cream.enabled`` and ``temporal.anchor: m1`` on the tiny model judging itself (the
    expected-score rubric read by probability: every candidate gets a score). Iteration 2 has
    no previous judge (hard labels, said so); iteration 3 scores its candidates again with M1,
    and its pairs carry C = (mean Kendall tau + 1) / 2, recomputed here with scipy from the two
    score files, as DPO's soft label. Every rejected of iteration 3 is one of M1's candidates
    for that prompt (``anchor_candidates.jsonl``), every chosen one of M2's."""
    import yaml
    from scipy.stats import kendalltau

    s = run(_variants_cfg(tmp_path, tiny_model_dir, "r", chunk=4))
    root = Path(s["run_dir"])
    assert s["variants"] == {"cream": True, "temporal_anchor": "m1", "temporal_future": False, "meta_judge": False}
    _, it2, it3 = s["iterations"]
    assert it2["cream"]["applied"] is False and it2["cream"]["labels"] == "hard"
    assert not (root / "iter_2" / "data" / "cream_scores.jsonl").exists()
    assert not (root / "iter_2" / "data" / "anchor_candidates.jsonl").exists()  # M1 is the current model
    assert all(p["p"] == 1.0 for p in read_jsonl(root / "iter_2" / "data" / "aift.jsonl"))

    cur = read_jsonl(root / "iter_3" / "data" / "candidates.jsonl")
    prev = read_jsonl(root / "iter_3" / "data" / "cream_scores.jsonl")
    taus = []
    for r, q in zip(cur, prev, strict=True):
        both = [(a, b) for a, b in zip(r["scores"], q["scores"]) if a is not None and b is not None]
        t = kendalltau([a for a, _ in both], [b for _, b in both], variant="b").statistic
        taus.append(t)
    taus = [t for t in taus if t == t]  # NaN = undefined (one ranking all tied)
    c = (sum(taus) / len(taus) + 1) / 2
    cream = it3["cream"]
    assert cream["applied"] is True and cream["judge"] == "M1" and cream["prompts"] == len(taus)
    assert cream["C"] == pytest.approx(c, abs=1e-12)
    assert prev != [{"index": r["index"], "scores": r["scores"]} for r in cur]  # M1 judges differently from M2
    pairs = read_jsonl(root / "iter_3" / "data" / "aift.jsonl")
    assert pairs and all(p["p"] == pytest.approx(c, abs=1e-12) for p in pairs)
    assert yaml.safe_load((root / "iter_3" / "dpo" / "config.yaml").read_text())["loss"]["labels"] == "soft"
    rows = read_jsonl(root / "metrics.jsonl")  # one row per iteration
    assert "cream/applied" not in rows[0] and rows[1]["cream/applied"] == 0 and "cream/C" not in rows[1]
    assert rows[2]["cream/applied"] == 1 and rows[2]["cream/C"] == pytest.approx(c, abs=1e-12)
    assert rows[2]["cream/tau_mean"] == pytest.approx(2 * c - 1, abs=1e-12)

    anchor = {r["prompt"]: r["responses"] for r in read_jsonl(root / "iter_3" / "data" / "anchor_candidates.jsonl")}
    own = {r["prompt"]: r["responses"] for r in cur}
    assert set(anchor) == set(own)
    for p in pairs:
        assert p["rejected"] in anchor[p["prompt"]] and p["chosen"] in own[p["prompt"]]
        assert p["rejected_from"] == "M1"


@pytest.mark.slow
def test_variants_resume_mid_anchor_candidates_and_after_cream_scores(tmp_path, tiny_model_dir, monkeypatch):
    """With both variants on, a crash after the first chunk of M1's anchor candidates, then (on
    the resume) a crash after CREAM's second scoring is written: the second resume ends as the
    uninterrupted run (the same pairs, soft labels, rows and final weights), the anchor chunk
    and the previous judge's scores read back rather than redone."""
    from safetensors.torch import load_file

    from pofe.generation import candidates
    from pofe.loops.self_reward import self_reward_variants

    ref = run(_variants_cfg(tmp_path, tiny_model_dir, "ref", chunk=2))

    class Crash(RuntimeError):
        pass

    real_fault, real_consistency, seen = candidates.fault_point, self_reward_variants.consistency, []

    def fault(name):  # iteration 2: candidates 0, 2; iteration 3: candidates 0, 2, then the anchor's 0
        seen.append(name)
        if len(seen) == 5:
            raise Crash()
        real_fault(name)

    monkeypatch.setattr(candidates, "fault_point", fault)
    cfg = _variants_cfg(tmp_path, tiny_model_dir, "r", chunk=2)
    with pytest.raises(Crash):
        run(cfg)
    root = tmp_path / "runs" / "r"
    anchor = root / "iter_3" / "data" / "anchor_candidates.jsonl"
    first = read_jsonl(anchor)
    assert [r["index"] for r in first] == [0, 1] and not (root / "iter_3" / "data" / "cream_scores.jsonl").exists()
    monkeypatch.setattr(candidates, "fault_point", real_fault)

    def crash_once(*a, **k):
        raise Crash()

    monkeypatch.setattr(self_reward_variants, "consistency", crash_once)
    with pytest.raises(Crash):
        run(cfg, resume=root)
    assert read_jsonl(anchor)[:2] == first and [r["index"] for r in read_jsonl(anchor)] == [0, 1, 2, 3]
    scores = read_jsonl(root / "iter_3" / "data" / "cream_scores.jsonl")
    monkeypatch.setattr(self_reward_variants, "consistency", real_consistency)
    s = run(cfg, resume=root)
    ref_root = Path(ref["run_dir"])
    assert read_jsonl(root / "iter_3" / "data" / "cream_scores.jsonl") == scores
    for f in ("iter_3/data/aift.jsonl", "iter_3/data/anchor_candidates.jsonl", "iter_3/data/cream_scores.jsonl",
              "iter_2/data/aift.jsonl", "metrics.jsonl"):
        assert read_jsonl(root / f) == read_jsonl(ref_root / f), f
    assert s["iterations"][2]["cream"] == ref["iterations"][2]["cream"]
    w, w_ref = load_file(str(root / "final" / "model.safetensors")), load_file(str(ref_root / "final" / "model.safetensors"))
    assert w.keys() == w_ref.keys() and all(w[k].equal(w_ref[k]) for k in w)


@pytest.mark.slow
def test_variants_on_the_embedded_model(tmp_path):
    """SmolLM2 as policy and judge with CREAM and anchored rejection, three iterations (CREAM
    needs a previous judge: it applies from iteration 3) on 2 prompts each, 8-token generations.
    Iteration 3's soft label is C = (mean tau + 1) / 2 recomputed with scipy from the two
    judges' score files; its rejected responses are SmolLM2-M1's, its chosen M2's.

    Measured (this CPU, about 45 s): iteration 3 tau_mean 0.0 over 2 prompts, C = 0.5, 2 pairs kept
    (with one DPO step at lr 5e-4 M1 and M2 ranked alike: tau 1, C 1)."""
    from scipy.stats import kendalltau

    from pofe.data.prompts import DEFAULT_PROMPTS

    pool = tmp_path / "pool.txt"
    pool.write_text("\n".join(DEFAULT_PROMPTS[:4]))
    cfg = SelfRewardConfig.model_validate({
        "iterations": 3,
        "model": {"lora": {"enabled": True, "r": 4, "alpha": 8}},
        "judge": {"kind": "expected-score", "template": str(EXPECTED_RUBRIC), "batch_size": 12},
        "data": {"prompts": str(pool), "per_iteration": 2},
        "candidates": {"n": 3, "chunk": 2, "sampling": {"max_new_tokens": 8, "temperature": 0.7, "top_p": 0.9}},
        "dpo": {"steps": 2, "batch_size": 2, "grad_accum": 1,
                "optim": {"lr": 1e-2, "warmup_steps": 0, "schedule": "cosine", "min_lr_ratio": 0.1}},
        "cream": {"enabled": True}, "temporal": {"anchor": "m1"},
        "selection": {"enabled": False},
        "eval": {"num_prompts": 1, "rm_metrics": False, "sampling": {"temperature": 0.0, "max_new_tokens": 8}},
        "log": {"progress": False, "tensorboard": False},
        "run": {"output_dir": str(tmp_path / "runs"), "name": "sr"},
    })
    s = run(cfg)
    root = Path(s["run_dir"])
    _, it2, it3 = s["iterations"]
    assert it2["cream"]["applied"] is False and it3["cream"]["applied"] is True
    cur = read_jsonl(root / "iter_3" / "data" / "candidates.jsonl")
    prev = read_jsonl(root / "iter_3" / "data" / "cream_scores.jsonl")
    assert all(x is not None for r in cur + prev for x in r["scores"])  # read by probability: all scored
    taus = [kendalltau(r["scores"], q["scores"], variant="b").statistic for r, q in zip(cur, prev, strict=True)]
    taus = [t for t in taus if t == t]
    c = (sum(taus) / len(taus) + 1) / 2
    assert it3["cream"]["C"] == pytest.approx(c, abs=1e-12)
    pairs = read_jsonl(root / "iter_3" / "data" / "aift.jsonl")
    anchor = {r["prompt"]: r["responses"] for r in read_jsonl(root / "iter_3" / "data" / "anchor_candidates.jsonl")}
    own = {r["prompt"]: r["responses"] for r in cur}
    assert it3["pairs"]["kept"] == len(pairs) >= 1, it3["pairs"]
    for p in pairs:
        assert p["p"] == pytest.approx(c, abs=1e-12)
        assert p["rejected"] in anchor[p["prompt"]] and p["chosen"] in own[p["prompt"]]
