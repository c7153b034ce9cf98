"""``pofe online`` loop: labelling rules, sampling + annotation, run folders, all losses x
labels x LoRA/full, offline / iterative modes, the reward-model annotator, win rates."""

from __future__ import annotations

import json
import math

import pytest
import torch

from _online_utils import FakeJudge, eos_tiny_model, tiny_cfg
from pofe.evaluation.vs_initial import winrate, winrate_value
from pofe.loops.online import run
from pofe.labels import LabelPolicy
from pofe.loops.online.online_pairs import Annotation, _select_best_vs_worst, label, label_annotations, sample_and_annotate
from pofe.records import Completion, Judgment, Prompt
from pofe.runs import read_jsonl


# Tiny models run much faster single-threaded (shared fixture in conftest.py).

def _c(text, ids=(5,)):
    return Completion(prompt="x", text=text, token_ids=tuple(ids), prompt_token_ids=(1, 2))


def _j(p):
    return Judgment(p=p, p_ab=p, p_ba=p, consistent=p is not None, parse_ok=p is not None, judge_id="t")


def _ann(a, b, p, i=0):
    return Annotation(f"s1-r0-{i}", 1, Prompt("x"), a, b, None if p == "skip" else _j(p))


# ------------------------------------------------------------------ labelling rules

def test_label_rules_hard_and_soft():
    a, b = _c("long answer", (7, 8, 9)), _c("short", (4,))
    assert label(_ann(a, a, "skip"), "hard") == "identical"
    assert label(_ann(a, b, None), "hard") == "unlabelled"  # p=None: never invent a label
    assert label(_ann(a, b, 0.5), "hard") == "ties"
    hard = label(_ann(a, b, 0.2), "hard")  # B preferred -> chosen = B, target 1
    assert (hard.chosen_ids, hard.rejected_ids, hard.p) == ((4,), (7, 8, 9), 1.0)
    soft = label(_ann(a, b, 0.2), "soft")  # soft keeps the strength, oriented to the winner
    assert (soft.chosen_ids, soft.rejected_ids) == ((4,), (7, 8, 9)) and soft.p == pytest.approx(0.8)
    assert label(_ann(a, b, 0.5), "soft").p == 0.5
    pairs, counts, rows = label_annotations([_ann(a, a, "skip", 0), _ann(a, b, None, 1), _ann(a, b, 0.9, 2),
                                             _ann(a, b, 0.5, 3)], "hard", rank=0)
    assert counts == {"annotations": 4, "trained": 1, "identical": 1, "unlabelled": 1, "ties": 1, "inconsistent": 0,
                      "low_margin": 0}
    assert [r["status"] for r in rows] == ["identical", "unlabelled", "trained", "ties"]
    assert rows[1]["p"] is None and rows[2]["p"] == 0.9 and rows[2]["kind"] == "annotation"


def test_best_vs_worst_selection_for_more_than_two_samples():
    # 3 samples; sample 1 beats both others, sample 2 loses to both -> train on (1, 2)
    s = [_c("m"), _c("best"), _c("worst")]
    anns = [_ann(s[0], s[1], 0.1, 0), _ann(s[0], s[2], 0.8, 1), _ann(s[1], s[2], 0.9, 2)]
    for a in anns:
        a.selected = False
    _select_best_vs_worst(anns, 3)
    assert [a.selected for a in anns] == [False, False, True]


def test_identical_samples_are_masked_and_never_judged(tokenizer, tiny_model):
    judge = FakeJudge(lambda x, a, b: 1.0)
    anns = sample_and_annotate(tiny_model, tokenizer, judge, [Prompt("hi"), Prompt("yo")], n=2,
                               sampling=_greedy(), step=1)
    assert judge.calls == 0  # greedy: both samples are the same response
    pairs, counts, _ = label_annotations(anns, "hard", 0)
    assert pairs == [] and counts["identical"] == 2


def _greedy():
    from pofe.generation import SamplingConfig

    # (near-)greedy sampling: both samples of a prompt are the same response
    return SamplingConfig(temperature=1e-4, max_new_tokens=4)


def test_sampled_pairs_keep_token_ids_and_are_judged_in_one_call(tokenizer, tiny_model):
    from pofe.generation import SamplingConfig

    torch.manual_seed(0)
    judge = FakeJudge(lambda x, a, b: 0.7)
    times = {}
    anns = sample_and_annotate(tiny_model, tokenizer, judge, [Prompt("a"), Prompt("b"), Prompt("c")], n=3,
                               sampling=SamplingConfig(max_new_tokens=5, temperature=1.0), step=4, rank=1, times=times)
    assert judge.calls == 1 and len(anns) == 9  # 3 prompts x C(3, 2) comparisons, one judge call
    assert sum(a.selected for a in anns) == 3  # one trained pair per prompt
    assert anns[0].pair_id == "s4-r1-0" and anns[0].a.prompt_token_ids and anns[0].a.token_ids
    assert times["generate"] > 0 and "judge" in times


def test_winrate_counts_ties_and_unlabelled():
    prompts = [Prompt(str(i)) for i in range(5)]
    cur = [_c("a"), _c("b"), _c("same"), _c("d"), _c("e")]
    init = [_c("x"), _c("y"), _c("same"), _c("w"), _c("v")]
    ps = {"a": 0.9, "b": 0.2, "d": 0.5, "e": None}
    counts, rows = winrate(FakeJudge(lambda x, a, b: ps[a]), prompts, cur, init)
    assert counts == {"wins": 1, "ties": 2, "losses": 1, "unlabelled": 1}
    assert winrate_value(counts) == pytest.approx((1 + 0.5 * 2) / 4)
    assert rows[0]["p_ab"] == 0.9 and rows[0]["outcome"] == 1 and rows[2]["p_ab"] is None and rows[2]["identical"]


def test_winrate_orders_that_disagree_are_a_tie_as_in_eval():
    """The one tie rule: p_ab = 0.8 but p_ba = 0.4 (the judge prefers whichever
    is first) is a tie in the online eval, exactly as in ``pofe eval`` — not a win."""
    from pofe.records import Judgment

    class Positional:
        id = "positional"

        def judge(self, prompts, a, b, *, references=None):
            return [Judgment(p=0.6, p_ab=0.8, p_ba=0.4, consistent=False, parse_ok=True, judge_id=self.id)
                    for _ in prompts]

    counts, rows = winrate(Positional(), [Prompt("q")], [_c("a")], [_c("b")])
    assert counts == {"wins": 0, "ties": 1, "losses": 0, "unlabelled": 0}
    assert rows[0]["outcome"] == 0


# ------------------------------------------------------------------ whole runs on the tiny model

def _weights(path):
    from safetensors.torch import load_file

    return load_file(str(path / "model.safetensors"))


def test_run_folder_contents_and_summary(tmp_path, tiny_model_dir):
    cfg = tiny_cfg(tmp_path, tiny_model_dir, "checkpoint.every=1", "eval.every=1")
    s = run(cfg)
    d = tmp_path / s["run_dir"].split("/")[-1]
    for f in ("config.yaml", "metrics.jsonl", "ledger.jsonl", "summary.json", "eval/step-2.jsonl",
              "checkpoints/step-2/model.safetensors", "final/model.safetensors", "final/tokenizer_config.json"):
        assert (d / f).exists(), f
    assert sorted(p.name for p in (d / "checkpoints").iterdir()) == ["step-1", "step-2"]
    rows = read_jsonl(d / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    for key in ("loss", "mean_p", "consistency_rate", "mean_len", "objective/kl", "winrate_vs_init", "time_generate",
                "time_judge", "time_train", "rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies",
                "logps/chosen", "logps/rejected", "learning_rate", "grad_norm", "p_hist", "tokens_per_s",
                "inconsistent_pairs", "low_margin_pairs", "text_fallback_labels"):
        assert key in rows[-1], key
    ledger = read_jsonl(d / "ledger.jsonl")
    ann = [r for r in ledger if r["kind"] == "annotation"]
    losses = [r for r in ledger if r["kind"] == "loss"]
    assert len(ann) == 4 and {r["step"] for r in ann} == {1, 2}
    assert {r["pair_id"] for r in losses} == {r["pair_id"] for r in ann if r["status"] == "trained"}
    assert all(r["judge_id"] == "length:shorter:chars" for r in ann if r["p"] is not None)
    for key in ("steps", "annotations", "mean_len_first", "mean_len_last", "winrate_vs_init", "seconds_per_step",
                "time_split", "run_dir"):
        assert key in s, key
    assert s["steps"] == 2 and s["annotations"] == 4
    assert json.loads((d / "summary.json").read_text())["steps"] == 2
    from transformers import AutoModelForCausalLM

    before, after = _weights(tiny_model_dir), _weights(d / "final")
    assert any(not torch.equal(before[k], after[k]) for k in before)  # the policy moved
    AutoModelForCausalLM.from_pretrained(d / "final")


@pytest.mark.parametrize("loss,labels,lora", [
    ("dpo", "hard", False), ("dpo", "soft", True), ("ipo", "soft", False), ("ipo", "hard", True),
    ("slic", "hard", False), ("slic", "soft", True)])
def test_every_loss_with_hard_and_soft_labels_lora_and_full(tmp_path, tiny_model_dir, loss, labels, lora):
    # soft labels come from a judge with graded p (length judge with a temperature)
    cfg = tiny_cfg(tmp_path, tiny_model_dir, f"loss.name={loss}", f"loss.labels={labels}", f"model.lora.enabled={lora}",
                   "model.lora.r=4", "judge.temperature=20", "train.steps=1", "eval.enabled=false",
                   "optim.lr=1e-2")
    s = run(cfg)
    row = read_jsonl(f"{s['run_dir']}/metrics.jsonl")[-1]
    assert row["pairs"] >= 1 and math.isfinite(row["loss"])
    if labels == "soft":
        assert any(0 < r["p"] < 1 for r in read_jsonl(f"{s['run_dir']}/ledger.jsonl") if r["kind"] == "loss")
    final = tmp_path / s["run_dir"].split("/")[-1] / "final"
    assert (final / "adapter").exists() == lora
    before, after = _weights(tiny_model_dir), _weights(final)
    assert any(not torch.equal(before[k], after[k]) for k in before)


def test_unlabelled_pairs_are_skipped_and_nothing_is_updated(tmp_path, tokenizer, tiny_model):
    start = {k: v.clone() for k, v in tiny_model.state_dict().items()}
    cfg = tiny_cfg(tmp_path, "unused", "eval.enabled=false")
    s = run(cfg, model=tiny_model, tokenizer=tokenizer, judge=FakeJudge(lambda x, a, b: None))
    assert s["unlabelled_pairs"] == 4 and s["trained_pairs"] == 0
    assert all(torch.equal(start[k], v) for k, v in tiny_model.state_dict().items())
    ledger = read_jsonl(f"{s['run_dir']}/ledger.jsonl")
    assert [r["status"] for r in ledger] == ["unlabelled"] * 4 and all(r["p"] is None for r in ledger)


@pytest.mark.slow
def test_offline_mode_trains_on_a_preference_file_and_a_ledger(tmp_path, tiny_model_dir):
    online = run(tiny_cfg(tmp_path / "a", tiny_model_dir, "eval.enabled=false"))
    ledger = f"{online['run_dir']}/ledger.jsonl"  # the ledger doubles as an offline dataset
    s = run(tiny_cfg(tmp_path / "b", tiny_model_dir, "mode=offline", f"data.preferences={ledger}", "eval.enabled=false"))
    assert s["mode"] == "offline" and s["trained_pairs"] == 4
    assert not (tmp_path / "b" / s["run_dir"].split("/")[-1] / "ledger.jsonl").exists()
    from pofe.config import ConfigError

    with pytest.raises(ConfigError, match="data.preferences"):  # before any run folder or model
        run(tiny_cfg(tmp_path / "c", tiny_model_dir, "mode=offline", "eval.enabled=false"))
    assert not (tmp_path / "c").exists()


@pytest.mark.slow
def test_iterative_mode_relabels_every_k_steps(tmp_path, tiny_model_dir):
    s = run(tiny_cfg(tmp_path, tiny_model_dir, "mode=iterative", "train.iterative_every=2", "train.steps=4",
                     "eval.enabled=false", "checkpoint.every=1"))
    ledger = read_jsonl(f"{s['run_dir']}/ledger.jsonl")
    ann_steps = [r["step"] for r in ledger if r["kind"] == "annotation"]
    assert sorted(set(ann_steps)) == [1, 3] and len(ann_steps) == 8  # 2 steps x 2 prompts per labelling round
    assert sorted({r["step"] for r in ledger if r["kind"] == "loss"}) == [1, 2, 3, 4]


@pytest.mark.slow
def test_reward_model_annotator(tmp_path, tokenizer, tiny_model_dir):
    from transformers import LlamaConfig, LlamaForSequenceClassification

    from pofe.judges.config import RewardModelJudgeConfig
    from pofe.judges.registry import build_judge

    torch.manual_seed(0)
    rm = LlamaForSequenceClassification(LlamaConfig(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32,
                                                    num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
                                                    num_labels=1, pad_token_id=tokenizer.pad_token_id))
    rm_dir = tmp_path / "rm"
    rm.save_pretrained(rm_dir)
    tokenizer.save_pretrained(rm_dir)
    judge = build_judge(RewardModelJudgeConfig(reward_model=str(rm_dir)))
    r = judge.rewards(["q", "q"], ["yes", "no way"])
    [v] = judge.judge(["q"], ["yes"], ["no way"])
    assert v.p == pytest.approx(1 / (1 + math.exp(-(r[0] - r[1])))) and v.p_ab == v.p_ba == v.p and v.consistent
    assert judge.score(["q"], ["yes"])[0].score == pytest.approx(r[0])
    from pofe.config import ConfigError, load_config
    from pofe.loops.online import OnlineConfig

    with pytest.raises(ConfigError, match="missing required key 'judge.reward_model'"):  # at parse time
        load_config(OnlineConfig, overrides=["judge.kind=reward-model"])
    s = run(tiny_cfg(tmp_path, tiny_model_dir, "judge.kind=reward-model", f"judge.reward_model={rm_dir}",
                     "train.steps=1", "loss.labels=soft", "eval.enabled=false"))
    assert s["judge"].startswith("reward-model:") and s["trained_pairs"] >= 1


@pytest.mark.slow
def test_length_judge_shortens_responses(tmp_path, tokenizer):
    """The direction of OAIF Sec. 4.6 on a tiny model: an annotator preferring shorter
    responses makes the policy's responses shorter (in tokens)."""
    model = eos_tiny_model(tokenizer)
    cfg = tiny_cfg(tmp_path, "unused", "train.steps=16", "train.batch_size=4", "sampling.max_new_tokens=16",
                   "sampling.temperature=1.0", "optim.lr=5e-2", "eval.enabled=false")
    s = run(cfg, model=model, tokenizer=tokenizer)
    assert s["mean_len_last"] < 0.7 * s["mean_len_first"], s


@pytest.mark.slow
def test_llm_annotator_shares_the_initial_weights_and_the_template_steers(tmp_path, tiny_model_dir, monkeypatch):
    """judge.kind=llm with the policy's own weights: the annotator is pi_0 (shared, not
    reloaded: one model load per run) and switching judge.template is the only change
    needed to change its verdicts on the very same sampled pairs (OAIF Sec. 4.6)."""
    import transformers

    loads = []
    orig = transformers.AutoModelForCausalLM.from_pretrained.__func__

    def counting(cls, *a, **k):
        loads.append(a[0] if a else k.get("pretrained_model_name_or_path"))
        return orig(cls, *a, **k)

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", classmethod(counting))
    by_template = {}
    for template in ("helpful", "helpful-very-short"):
        loads.clear()
        s = run(tiny_cfg(tmp_path / template, tiny_model_dir, "judge.kind=llm", f"judge.model={tiny_model_dir}",
                         f"judge.template={template}", "judge.cache.enabled=false", "train.steps=1",
                         "eval.enabled=false", "model.lora.enabled=true", "model.lora.r=4"))
        assert len(loads) == 1, loads  # the policy only: the annotator shares pi_0's weights
        ann = [r for r in read_jsonl(f"{s['run_dir']}/ledger.jsonl") if r["kind"] == "annotation"]
        assert len(ann) == 2 and all(r["p"] is not None for r in ann)
        assert {r["template_id"].split("@")[0] for r in ann} == {template}
        assert all(r["p_ab"] is not None and r["p_ba"] is not None for r in ann)  # both orders
        by_template[template] = ann
    a, b = by_template["helpful"], by_template["helpful-very-short"]
    # same seed, same policy: the same sampled pairs; only the annotator's prompt differs ...
    assert [(r["response_a"], r["response_b"]) for r in a] == [(r["response_a"], r["response_b"]) for r in b]
    # ... and its verdicts move with it
    assert a[0]["template_hash"] != b[0]["template_hash"]
    assert any(x["p"] != y["p"] for x, y in zip(a, b))  # (random tiny weights: tiny but real differences), [(x["p"], y["p"]) for x, y in zip(a, b)]


def test_tensorboard_sink(tmp_path, tiny_model_dir):
    pytest.importorskip("tensorboard")
    s = run(tiny_cfg(tmp_path, tiny_model_dir, "log.tensorboard=true", "train.steps=1", "eval.enabled=false"))
    assert list((tmp_path / s["run_dir"].split("/")[-1] / "tensorboard").glob("events.out.tfevents.*"))


@pytest.mark.parametrize("lora", [True, False])
def test_build_annotator_shares_pi0_never_the_current_policy(tokenizer, tiny_model, tiny_model_dir, lora):
    from pofe.loops.online.annotator import build_annotator
    from pofe.runtime import Reference, load_policy

    cfg = tiny_cfg("unused", tiny_model_dir, "judge.kind=llm", f"judge.model={tiny_model_dir}", f"model.lora.enabled={lora}")
    policy, _ = load_policy(cfg.model, model=tiny_model, tokenizer=tokenizer)
    ref = Reference(policy, lora=lora)
    judge, ctx = build_annotator(cfg.judge, cfg=cfg, reference=ref, tokenizer=tokenizer)
    assert judge.backend._model is ref.module  # no third copy of the weights
    assert lora or judge.backend._model is not policy  # full FT: the frozen copy, not the trained one
    assert ctx == ref.model  # LoRA: calls run with the adapter disabled
    other = tiny_cfg("unused", tiny_model_dir, "judge.kind=llm", "judge.model=some/other-model")
    j2, ctx2 = build_annotator(other.judge, cfg=other, reference=ref, tokenizer=tokenizer)
    assert j2.backend._model is None  # a different annotator model loads lazily on its own


# ------------------------------------------------------------------ label hygiene

def _jv(p, consistent, fallback=False):
    return Judgment(p=p, p_ab=p, p_ba=p, consistent=consistent, parse_ok=True, judge_id="t",
                    hard_label_fallback=fallback, tokens=7, constitution_version="v2", extra={"errors": ["BA: no verdict"]})


def test_label_hygiene_drops_and_counts_inconsistent_and_low_margin_pairs():
    a, b = _c("long answer", (7, 8, 9)), _c("short", (4,))
    anns = [Annotation("i0", 1, Prompt("x"), a, b, _jv(0.9, True)),     # kept
            Annotation("i1", 1, Prompt("x"), a, b, _jv(0.55, False)),   # orders disagree
            Annotation("i2", 1, Prompt("x"), a, b, _jv(0.45, True)),    # |p - 1/2| = 0.05 < 0.1
            Annotation("i3", 1, Prompt("x"), a, b, _jv(0.1, True, fallback=True))]  # kept, read as text
    # defaults (OAIF Algorithm 1): every readable non-tie label is trained, as a hard label
    pairs, counts, _ = label_annotations(anns, "hard", 0)
    assert counts["trained"] == 4 and counts["inconsistent"] == counts["low_margin"] == 0
    strict = LabelPolicy(drop_inconsistent=True, min_margin=0.1)
    pairs, counts, rows = label_annotations(anns, "hard", 0, strict)
    assert [p.pair_id for p in pairs] == ["i0", "i3"]
    assert (counts["trained"], counts["inconsistent"], counts["low_margin"]) == (2, 1, 1)
    assert [r["status"] for r in rows] == ["trained", "inconsistent", "low_margin", "trained"]
    # the ledger keeps what the judge reported: text fallback, tokens, constitution version, errors
    assert [r["text_fallback"] for r in rows] == [False, False, False, True]
    assert rows[0]["judge_tokens"] == 7 and rows[0]["constitution_version"] == "v2"
    assert rows[0]["errors"] == ["BA: no verdict"]
    # a margin of exactly min_margin is kept (|0.6 - 0.5| = 0.1)
    assert isinstance(label(Annotation("e", 1, Prompt("x"), a, b, _jv(0.6, True)), "hard", strict), type(pairs[0]))


def test_calibration_map_is_applied_before_the_filters_and_ledgered(tmp_path):
    """In ``pofe online``, ``labels.calibration`` (an audit report) maps each
    judge p before the margin filter. T = 2: p = 0.9 -> expit(ln 9 / 2) = 3/4; p = 0.55 ->
    expit(logit(0.55) / 2) = 0.525, under a 0.05 margin; the ledger keeps p_raw."""
    import json

    from pydantic import ValidationError

    report = tmp_path / "audit.json"
    report.write_text(json.dumps({"metrics": {"calibration": {"map": {"method": "temperature", "temperature": 2.0}}}}))
    a, b = _c("long answer", (7, 8, 9)), _c("short", (4,))
    anns = [Annotation("i0", 1, Prompt("x"), a, b, _jv(0.9, True)), Annotation("i1", 1, Prompt("x"), a, b, _jv(0.55, True))]
    hy = LabelPolicy(min_margin=0.05, calibration=str(report))
    pairs, counts, rows = label_annotations(anns, "soft", 0, hy)
    assert [p.pair_id for p in pairs] == ["i0"] and pairs[0].p == pytest.approx(0.75) and counts["low_margin"] == 1
    assert rows[0]["p"] == pytest.approx(0.75) and rows[0]["p_raw"] == 0.9 and rows[0]["calibration"] == str(report)
    assert rows[1]["p"] == pytest.approx(0.525, abs=1e-4)
    with pytest.raises(ValidationError, match="not found"):  # a missing report fails at parse time
        LabelPolicy(calibration=str(tmp_path / "missing.json"))


def test_label_hygiene_counts_reach_metrics_and_summary(tmp_path, tiny_model_dir):
    # a judge whose two orders never agree: with drop_inconsistent nothing is trained, and
    # metrics / summary say why
    class Flip(FakeJudge):
        def judge(self, prompts, responses_a, responses_b, *, references=None):
            return [Judgment(p=0.7, p_ab=0.9, p_ba=0.4, consistent=False, parse_ok=True, judge_id="flip",
                             hard_label_fallback=True) for _ in prompts]

    cfg = tiny_cfg(tmp_path, tiny_model_dir, "labels.drop_inconsistent=true", "eval.enabled=false",
                   "sampling.temperature=1.0")
    s = run(cfg, judge=Flip(lambda *a: None))
    rows = read_jsonl(f"{s['run_dir']}/metrics.jsonl")
    judged = sum(r["annotations"] - r["identical_pairs"] for r in rows)
    assert judged > 0 and s["trained_pairs"] == 0
    assert s["inconsistent_pairs"] == judged == sum(r["inconsistent_pairs"] for r in rows)
    assert s["text_fallback_labels"] == judged
    assert s["label_filter"] == {"drop_inconsistent": True, "min_margin": 0.0, "calibration": None}
    from pofe.cli.online import describe

    text = describe(s, cfg)  # what the CLI prints: the filter, its counts, and that nothing was trained
    assert f"drop inconsistent orders on ({judged} dropped)" in text and f"{judged} text-fallback labels" in text
    assert "no pair was trained" in text


@pytest.mark.parametrize("key,value", [("loss.beta", "-0.1"), ("loss.beta", "0"), ("train.batch_size", "0"),
                                       ("train.steps", "0"), ("train.grad_accum", "0"),
                                       ("train.samples_per_prompt", "1"), ("labels.min_margin", "0.7"),
                                       ("train.iterative_every", "0"), ("eval.num_prompts", "-1"),
                                       ("sampling.temperature", "0")])
def test_nonsense_hyperparameters_are_refused_at_parse_time(key, value):
    from pofe.config import ConfigError, load_config
    from pofe.loops.online import OnlineConfig

    with pytest.raises(ConfigError) as e:
        load_config(OnlineConfig, None, [f"{key}={value}"])
    assert key in str(e.value)
