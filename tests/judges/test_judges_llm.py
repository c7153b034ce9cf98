"""In-process transformers judges on a tiny random model: hand-computed probabilities,
batching invariance, caching, expected score, rubric, and the ``pofe judge`` command."""

from __future__ import annotations

import json
import re

import pytest
import torch

from pofe.judges import build_judge
from pofe.judges.config import ExpectedScoreJudgeConfig, LLMJudgeConfig, RubricJudgeConfig
from pofe.judges.backends import TransformersBackend
from pofe.judges.templates import Rendered, load_template
from pofe.models import apply_chat_template


def _next_lp(model, tok, text):
    ids = tok(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        return torch.log_softmax(model(input_ids=ids).logits[0, -1].float(), -1)


def test_variant_ids_and_summed_choice_logprob(tiny_model, tokenizer):
    be = TransformersBackend("tiny", model=tiny_model, tokenizer=tokenizer)
    # "A" and " A" are both single tokens in SmolLM2's vocabulary; " 1" is two tokens (skipped).
    assert be.variant_ids("A") == sorted({tokenizer.encode("A", add_special_tokens=False)[0],
                                          tokenizer.encode(" A", add_special_tokens=False)[0]})
    assert be.variant_ids("1") == tokenizer.encode("1", add_special_tokens=False)
    req = Rendered("Which is better?", "The better option is (")
    [read] = be.read_choices([req], ["A", "B"])
    lp = _next_lp(tiny_model, tokenizer, apply_chat_template(tokenizer, req.user) + req.assistant_prefix)
    want = torch.logsumexp(lp[be.variant_ids("A")], 0).item()
    assert read.logprobs["A"] == pytest.approx(want, abs=1e-5)
    with pytest.raises(ValueError, match="single token"):
        be.validate_choices(["10", "2"])


def test_batched_left_padded_reads_match_single_reads(tiny_model, tokenizer):
    be = TransformersBackend("tiny", model=tiny_model, tokenizer=tokenizer, batch_size=3)
    reqs = [Rendered("short", "Answer: "), Rendered("a much longer request " * 12, "Answer: "), Rendered("mid " * 5, "Answer: ")]
    batched = be.read_choices(reqs, ["1", "2"])
    for r, b in zip(reqs, batched):
        [single] = TransformersBackend("tiny", model=tiny_model, tokenizer=tokenizer, batch_size=1).read_choices([r], ["1", "2"])
        assert b.logprobs["1"] == pytest.approx(single.logprobs["1"], abs=1e-4)
        assert b.logprobs["2"] == pytest.approx(single.logprobs["2"], abs=1e-4)


def test_llm_judge_both_orders_by_hand(tiny_model, tokenizer, tmp_path):
    cfg = LLMJudgeConfig(model="tiny", cache={"path": str(tmp_path / "c.sqlite")})
    j = build_judge(cfg, model=tiny_model, tokenizer=tokenizer, cache_tag="step-0")
    [v] = j.judge(["Name a colour."], ["Blue."], ["Seven."])
    t = load_template("helpful")

    def p_first(first, second):
        r = t.render({"prompt": "Name a colour.", "response_1": first, "response_2": second})
        lp = _next_lp(tiny_model, tokenizer, apply_chat_template(tokenizer, r.user) + r.assistant_prefix)
        l1, l2 = lp[tokenizer.encode("1", add_special_tokens=False)[0]], lp[tokenizer.encode("2", add_special_tokens=False)[0]]
        return torch.sigmoid(l1 - l2).item()

    p_ab, p_ba = p_first("Blue.", "Seven."), 1 - p_first("Seven.", "Blue.")
    assert v.p_ab == pytest.approx(p_ab, abs=1e-4) and v.p_ba == pytest.approx(p_ba, abs=1e-4)
    assert v.p == pytest.approx((p_ab + p_ba) / 2, abs=1e-4)
    assert v.template_id == "helpful@v1" and v.tokens > 0 and v.extra["cache_misses"] == 2
    calls = j.backend.stats.calls
    [again] = j.judge(["Name a colour."], ["Blue."], ["Seven."])
    assert again.cached and again.p == pytest.approx(v.p) and j.backend.stats.calls == calls
    # A live model object without a cache tag is never cached (its weights may be training).
    j2 = build_judge(cfg, model=tiny_model, tokenizer=tokenizer)
    assert j2.cache is None


def test_llm_judge_cot_and_constitution_run_on_tiny_model(tiny_model, tokenizer):
    cfg = LLMJudgeConfig(template="constitution", cot={"enabled": True, "max_new_tokens": 4, "clamp": [0.4, 0.6]},
                      cache={"enabled": False})
    j = build_judge(cfg, model=tiny_model, tokenizer=tokenizer)
    vs = j.judge(["q1", "q2"], ["a1", "a2"], ["b1", "b2"])
    for v in vs:
        assert v.parse_ok and 0.4 <= v.p <= 0.6 and len(v.raw) == 2 and v.principle_id and v.constitution_version


def test_expected_score_splits_multi_token_ten(tiny_model, tokenizer):
    cfg = ExpectedScoreJudgeConfig(cache={"enabled": False})
    j = build_judge(cfg, model=tiny_model, tokenizer=tokenizer)
    [s] = j.score(["Say hi."], ["Hi!"])
    dist = s.extra["distribution"]
    assert sum(dist.values()) == pytest.approx(1.0, abs=1e-5) and 0.0 <= s.score <= 1.0
    # By hand: P(10) = P("1") P("0" | "1"); P(1) = P("1") (1 - P("0" | "1")); others read directly.
    r = load_template("expected-score").render({"prompt": "Say hi.", "response": "Hi!"})
    text = apply_chat_template(tokenizer, r.user) + r.assistant_prefix
    lp0, lp1 = _next_lp(tiny_model, tokenizer, text), _next_lp(tiny_model, tokenizer, text + "1")
    ids = lambda c: TransformersBackend("t", model=tiny_model, tokenizer=tokenizer).variant_ids(c)  # noqa: E731
    p = {str(k): torch.logsumexp(lp0[ids(str(k))], 0).exp().item() for k in range(1, 10)}
    p_cont = torch.logsumexp(lp1[ids("0")], 0).exp().item()
    p["10"], p["1"] = p["1"] * p_cont, p["1"] * (1 - p_cont)
    z = sum(p.values())
    expected = sum(int(k) * v / z for k, v in p.items())
    assert s.extra["expected"] == pytest.approx(expected, abs=1e-4)
    assert s.score == pytest.approx((expected - 1) / 9, abs=1e-5)


def test_rubric_on_tiny_model_is_unscored_not_invented(tiny_model, tokenizer):
    cfg = RubricJudgeConfig(rubric={"samples": 2, "max_new_tokens": 6}, cache={"enabled": False})
    j = build_judge(cfg, model=tiny_model, tokenizer=tokenizer)
    [s] = j.score(["Say hi."], ["Hi!"])
    assert len(s.samples) == 2 and len(s.raw) == 2
    # Random weights (fixed seed) write no "Score: N": every sample is unscored and the
    # judge says so instead of inventing a value.
    assert not any(re.search(r"(?i)score\s*[:=]?\s*\d", r) for r in s.raw), s.raw
    assert s.samples == (None, None) and s.score is None and not s.parse_ok


@pytest.mark.slow
def test_pofe_judge_twice_second_run_is_all_cache_hits(tiny_model_dir, tmp_path):
    from typer.testing import CliRunner

    from pofe.cli.main import app

    rows = [{"prompt": f"Question {i}?", "response_a": f"Answer {i}.", "response_b": "No."} for i in range(3)]
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = ["judge", str(data), "--model", str(tiny_model_dir), "--json",
            "--set", f"judge.cache.path={tmp_path / 'cache.sqlite'}", "--set", f"run.output_dir={tmp_path / 'runs'}"]
    runner = CliRunner()
    first = runner.invoke(app, args)
    assert first.exit_code == 0, first.output
    s1 = json.loads(first.stdout)
    assert s1["n"] == 3 and s1["cache_misses"] == 6 and s1["cache_hits"] == 0 and s1["model_calls"] >= 1
    for k in ("mean_p", "consistency_rate", "first_position_win_rate", "parse_failures", "judge_tokens", "seconds"):
        assert k in s1
    second = runner.invoke(app, args)
    assert second.exit_code == 0, second.output
    s2 = json.loads(second.stdout)
    assert s2["model_calls"] == 0 and s2["cache_hits"] == 6 and s2["cache_misses"] == 0 and s2["cache_hit_rate"] == 1.0
    assert s2["mean_p"] == pytest.approx(s1["mean_p"])
    verdicts = [json.loads(x) for x in open(s2["output"])]
    assert len(verdicts) == 3 and all(v["cached"] and v["template_hash"] for v in verdicts)
    bad = runner.invoke(app, ["judge", str(data), "--set", "judge.tempalte=x"])
    assert bad.exit_code == 2 and "tempalte" in bad.output


def test_shared_training_model_is_judged_in_eval_mode_and_restored(tiny_model, tokenizer):
    tiny_model.train()
    j = build_judge(LLMJudgeConfig(cache={"enabled": False}), model=tiny_model, tokenizer=tokenizer)
    v1 = j.judge(["q"], ["a"], ["b"])[0]
    v2 = j.judge(["q"], ["a"], ["b"])[0]
    assert tiny_model.training  # restored
    assert v1.p == v2.p  # no dropout noise in the reads
