"""Judge cost (pofe.judges.usage): tokens in and out per judge call, cache hits free, price, jury sums."""

from __future__ import annotations

import pytest

from pofe.config import ConfigError
from pofe.judges.config import parse_judge_config
from pofe.judges.registry import build_judge
from pofe.judges.usage import BudgetConfig, JudgeUsage, PriceConfig, exceeded, usage_of, usage_row, usage_summary
from tests.judges.fake_openai import FakeServer, chat_shape


@pytest.fixture
def server():
    s = FakeServer()
    yield s
    s.close()


def _usage_reply(prompt_tokens, completion_tokens):
    body = chat_shape({"1": -0.4, "2": -1.3})
    body["usage"] = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                     "total_tokens": prompt_tokens + completion_tokens}
    return body


def _endpoint_judge(server, tmp_path, **extra):
    cfg = {"kind": "openai", "endpoint": {"base_url": server.url, "model": "m"},
           "cache": {"path": str(tmp_path / "c.sqlite")}, **extra}
    return build_judge(parse_judge_config(cfg))


def test_endpoint_usage_is_the_servers_count_both_orders_and_cache_hits_cost_nothing(server, tmp_path):
    server.default = (200, _usage_reply(100, 1))  # every request: 100 prompt tokens, 1 answer token
    judge = _endpoint_judge(server, tmp_path, price={"input_per_million": 2.0, "output_per_million": 10.0})
    js = judge.judge(["x1", "x2"], ["a1", "a2"], ["b1", "b2"])
    assert len(server.requests) == 4  # 2 pairs x 2 orders
    u = judge.usage()
    assert (u.calls, u.cached, u.tokens_in, u.tokens_out, u.unmetered) == (4, 0, 400, 4, 0)
    assert u.cost == pytest.approx((400 * 2.0 + 4 * 10.0) / 1e6)
    assert [j.extra["cache_misses"] for j in js] == [2, 2]
    # the same pairs again: all four ordered reads from the cache, no request, no token
    judge.judge(["x1", "x2"], ["a1", "a2"], ["b1", "b2"])
    assert len(server.requests) == 4
    u2 = judge.usage()
    assert (u2.calls, u2.cached, u2.tokens_in, u2.tokens_out) == (4, 4, 400, 4)
    assert u2.cost == pytest.approx(u.cost)


def test_endpoint_without_usage_counts_unmetered_requests_never_guesses(server, tmp_path):
    body = chat_shape({"1": -0.4, "2": -1.3})
    del body["usage"]
    server.default = (200, body)
    judge = _endpoint_judge(server, tmp_path)
    judge.judge(["x"], ["a"], ["b"])
    u = judge.usage()
    assert (u.calls, u.tokens_in, u.tokens_out, u.unmetered, u.cost) == (2, 0, 0, 2, None)


def test_endpoint_cot_counts_the_rationale_as_output_and_again_as_input(server, tmp_path):
    rationale = {"choices": [{"index": 0, "text": "A is better."}],
                 "usage": {"prompt_tokens": 50, "completion_tokens": 7, "total_tokens": 57}}
    read = _usage_reply(60, 1)
    read["choices"][0]["text"] = "1"
    # generate both orders (2 requests), then read both orders (2 requests)
    server.script = [(200, rationale), (200, rationale), (200, read), (200, read)]
    cfg = {"kind": "openai", "endpoint": {"base_url": server.url, "model": "m", "api": "completions"},
           "cot": {"enabled": True}, "cache": {"enabled": False}}
    judge = build_judge(parse_judge_config(cfg))
    judge.judge(["x"], ["a"], ["b"])
    u = judge.usage()
    assert (u.calls, u.tokens_in, u.tokens_out) == (2, 2 * 50 + 2 * 60, 2 * 7 + 2 * 1)


def test_transformers_judge_tokens_are_the_rendered_prompts_both_orders(tiny_model_dir, tokenizer):
    from pofe.judges.base import render_chat

    judge = build_judge(parse_judge_config({"kind": "llm", "model": str(tiny_model_dir), "cache": {"enabled": False}}))
    prompts, a, b = ["What is 2+2?", "Name a colour."], ["4", "red"], ["five", "the sky"]
    judge.judge(prompts, a, b)
    # independently: the chat-rendered judge prompt of each order, counted with the tokenizer
    want = 0
    for x, ra, rb in zip(prompts, a, b):
        for first, second in ((ra, rb), (rb, ra)):
            rendered = judge.template.render({"prompt": x, "response_1": first, "response_2": second, "reference": ""},
                                             special_strings=judge.backend.special_strings)
            want += len(tokenizer(render_chat(tokenizer, rendered), add_special_tokens=False)["input_ids"])
    u = judge.usage()
    assert (u.calls, u.cached, u.tokens_out, u.cost) == (4, 0, 0, None)
    assert u.tokens_in == want and want > 4 * 20


def test_programmatic_judges_cost_nothing_and_a_jury_sums_its_members(server, tmp_path):
    length = build_judge(parse_judge_config({"kind": "length"}))
    length.judge(["x"], ["a"], ["bb"])
    assert usage_of(length) == JudgeUsage()
    server.default = (200, _usage_reply(30, 1))
    jury = build_judge(parse_judge_config({"kind": "jury", "members": [
        {"kind": "length"},
        {"kind": "openai", "endpoint": {"base_url": server.url, "model": "m"}, "cache": {"enabled": False},
         "price": {"input_per_million": 1.0, "output_per_million": 3.0}}]}))
    jury.judge(["x", "y"], ["a", "b"], ["aa", "bb"])
    u = usage_of(jury)
    assert (u.calls, u.tokens_in, u.tokens_out) == (4, 120, 4)
    assert u.cost == pytest.approx((120 * 1.0 + 4 * 3.0) / 1e6)


def test_price_arithmetic_rows_and_budget_checks():
    u = JudgeUsage(calls=3, cached=1, tokens_in=1_500_000, tokens_out=250_000).priced(
        PriceConfig(input_per_million=0.5, output_per_million=2.0))
    assert u.cost == pytest.approx(0.75 + 0.5) and u.tokens == 1_750_000
    step = JudgeUsage(tokens_in=10, tokens_out=2)
    row = usage_row(step, u)
    assert row["judge/tokens_in"] == 10 and row["judge/tokens_out_total"] == 250_000
    assert row["judge/cost"] is None and row["judge/cost_total"] == pytest.approx(1.25)
    assert usage_summary([{"step": 1}, {"step": 2, **row}])["tokens"] == 1_750_000
    assert exceeded(BudgetConfig(tokens=1_750_000), u) is None  # at the budget is within it
    assert "1750000 tokens > judge.budget.tokens=1749999" in exceeded(BudgetConfig(tokens=1_749_999), u)
    assert "cost 1.25 > judge.budget.cost=1" in exceeded(BudgetConfig(cost=1.0), u)


def test_budget_and_price_settings_refused_where_they_do_nothing():
    with pytest.raises(ConfigError, match="judge.budget.cost"):
        parse_judge_config({"kind": "length", "budget": {"cost": 1.0}})
    with pytest.raises(ConfigError, match="judge.budget"):
        parse_judge_config({"kind": "length", "budget": {}})
    with pytest.raises(ConfigError, match="judge.members.1.budget"):
        parse_judge_config({"kind": "jury", "members": [{"kind": "length"}, {"kind": "length", "budget": {"tokens": 5}}]})
    with pytest.raises(ConfigError, match="judge.price"):
        parse_judge_config({"kind": "jury", "members": [{"kind": "length"}, {"kind": "length"}],
                            "price": {"input_per_million": 1.0}})
    # price and budget change no label: not part of the audited identity
    a = parse_judge_config({"kind": "length"}).identity()
    b = parse_judge_config({"kind": "length", "budget": {"tokens": 5}, "price": {"input_per_million": 1}}).identity()
    assert a == b


def test_a_budget_nothing_reads_is_refused_when_the_config_is_parsed():
    from pofe.config import load_config
    from pofe.loops.online import OnlineConfig
    from pofe.loops.rl import RLConfig

    with pytest.raises(ConfigError, match="eval.judge.budget"):
        load_config(OnlineConfig, overrides=["eval.judge.kind=length", "eval.judge.budget.tokens=5"])
    with pytest.raises(ConfigError, match="'judge.budget': mode=offline"):
        load_config(OnlineConfig, overrides=["mode=offline", "data.preferences=x.jsonl", "judge.budget.tokens=5"])
    with pytest.raises(ConfigError, match="monitor.judge.budget"):
        load_config(RLConfig, overrides=["monitor.kind=judge", "monitor.judge.kind=length", "monitor.judge.budget.tokens=5"])
    assert load_config(OnlineConfig, overrides=["judge.budget.tokens=5"]).judge.budget.tokens == 5


def test_budget_meter_rows_state_across_a_resume_and_the_stop(caplog):
    from pofe.judges.usage import BudgetMeter, Metered

    class Fake(Metered):
        pass

    judge = Fake()
    judge.price = PriceConfig(input_per_million=1e6, output_per_million=0.0)  # 1 per input token
    meter = BudgetMeter(BudgetConfig(tokens=25), [judge])
    judge.count(calls=2, tokens_in=10, tokens_out=2)
    row = meter.row(1)
    assert (row["judge/tokens_in"], row["judge/tokens_out"], row["judge/cost"], row["judge/tokens_in_total"]) == (10, 2, 10.0, 10)
    assert meter.after_row(1) is None
    state = meter.state()
    assert state["judge_usage"]["tokens"] == 12 and state["judge_usage"]["cost"] == 10.0
    # a resumed process: a fresh judge, the total from the checkpoint
    judge2 = Fake()
    resumed = BudgetMeter(BudgetConfig(tokens=25), [judge2], state=state)
    judge2.count(calls=2, cached=1, tokens_in=10, tokens_out=2, unmetered=1)
    with caplog.at_level("WARNING"):
        row = resumed.row(2)
    assert (row["judge/tokens_in"], row["judge/tokens_in_total"], row["judge/cached_total"]) == (10, 20, 1)
    assert row["judge/unmetered_total"] == 1 and "no token usage reported" in caplog.text
    assert resumed.after_row(2) is None  # 24 tokens: within 25
    judge2.count(calls=1, tokens_in=2)
    resumed.row(3)  # 26 > 25: the step that went past it
    err = resumed.after_row(3)
    assert err is not None and err.exit_code == 2 and str(err).startswith("judge budget spent at step 3: 26 tokens")
    assert resumed.after_row(4) is None  # the stop belongs to its step
    judge2.count(calls=2, tokens_in=7)  # judged after the last row (a final evaluation): in the summary's total
    assert resumed.summary()["tokens_in"] == 10 + 10 + 2 + 7 and resumed.summary()["calls"] == 2 + 2 + 1 + 2
