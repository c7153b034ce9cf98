"""OpenAI-compatible backend against a real local HTTP server: both response shapes,
retries, faults, hard-label fallback, API-key hygiene, rate limit and concurrency."""

from __future__ import annotations

import json
import logging
import math
import time

import pytest

from pofe.config import dump_config
from pofe.judges import build_judge, summarize_judgments
from pofe.judges.config import ExpectedScoreJudgeConfig, OpenAIJudgeConfig
from pofe.judges.backends import EndpointError, _free_port

from fake_openai import FakeServer, chat_shape, legacy_shape


@pytest.fixture
def server():
    s = FakeServer()
    yield s
    s.close()


def judge_for(url, **endpoint):
    ep = {"base_url": url, "backoff_s": 0.01, "max_backoff_s": 0.05, "max_retries": 2, "timeout_s": 5.0, **endpoint}
    return build_judge(OpenAIJudgeConfig(endpoint=ep, cache={"enabled": False}))


def test_chat_and_legacy_shapes_give_the_worked_example(server):
    # order (A,B): "1"=-0.4, "2"=-1.3; order (B,A): "1"=-0.7, "2"=-0.9 -> 0.711 / 0.450 / 0.581
    def by_order(body):
        text = body.get("prompt") or body["messages"][0]["content"]
        first_is_a = text.index("AAA") < text.index("BBB")
        return chat_shape({"1": -0.4, "2": -1.3} if first_is_a else {"1": -0.7, "2": -0.9})

    server.default = (200, by_order)
    j = judge_for(server.url, api="chat")
    [v] = j.judge(["q"], ["AAA"], ["BBB"])
    assert (round(v.p_ab, 3), round(v.p_ba, 3), round(v.p, 3)) == (0.711, 0.450, 0.581)
    assert server.requests[0]["path"] == "/v1/chat/completions" and server.requests[0]["top_logprobs"] == 20
    assert v.tokens == 84 and not v.hard_label_fallback

    def legacy(body):
        first_is_a = body["prompt"].index("AAA") < body["prompt"].index("BBB")
        return legacy_shape({"1": -0.4, "2": -1.3} if first_is_a else {"1": -0.7, "2": -0.9})

    server.default = (200, legacy)
    [w] = judge_for(server.url, api="completions").judge(["q"], ["AAA"], ["BBB"])
    assert w.p == pytest.approx(v.p) and server.requests[-1]["path"] == "/v1/completions"
    assert server.requests[-1]["logprobs"] == 20 and server.requests[-1]["max_tokens"] == 1


def test_variants_are_summed_and_missing_choice_is_flagged(server):
    # "1" (0.2) + " 1" (0.1) vs "2" (0.1): P(first) = 0.75 in both orders -> p = 0.5, inconsistent
    server.default = (200, chat_shape({"1": math.log(0.2), " 1": math.log(0.1), "2": math.log(0.1), "x": math.log(0.5)}))
    [v] = judge_for(server.url).judge(["q"], ["a"], ["b"])
    assert v.p_ab == pytest.approx(0.75) and v.p_ba == pytest.approx(0.25) and v.consistent is False
    server.default = (200, chat_shape({"1": -0.1, "x": -3.0}))  # "2" not among the top-k
    [w] = judge_for(server.url).judge(["q"], ["a"], ["b"])
    assert w.p_ab == 1.0 and w.extra["truncated_orders"] == 2


def test_connection_refused_is_a_clear_error_after_retries():
    url = f"http://127.0.0.1:{_free_port()}/v1"  # nothing listens here
    j = judge_for(url, max_retries=2)
    t0 = time.perf_counter()
    with pytest.raises(EndpointError, match=r"failed after 3 attempts \(ConnectError"):
        j.judge(["q"], ["a"], ["b"])
    assert time.perf_counter() - t0 < 5


def test_500_then_success_recovers(server):
    server.script = [(500, {"error": "overloaded"}), (503, "busy")]
    j = judge_for(server.url, concurrency=1)
    [v] = j.judge(["q"], ["a"], ["b"])
    assert v.parse_ok and len(server.requests) == 4  # 2 failures + 2 orders
    assert j.backend.stats.calls == 4


def test_4xx_is_not_retried(server):
    server.default = (400, {"error": "bad request"})
    with pytest.raises(EndpointError, match="HTTP 400"):
        judge_for(server.url, concurrency=1).judge(["q"], ["a"], ["b"])
    assert len(server.requests) == 2  # each order sent once, never retried (one 4xx is counted; all 4xx: raised)


def test_malformed_json_and_missing_logprobs_are_counted_not_crashed(server):
    # item 1: both orders malformed on every attempt (a 200 that is not JSON is retried:
    # max_retries=2 -> 3 attempts per order)
    server.script = [(200, "{not json")] * 6 + [
                     (200, {"choices": [{"message": {"content": "2"}}]}),  # item 2, order AB: no logprobs, text "2"
                     (200, {"choices": [{"message": {"content": "Response 1."}}]}),  # order BA: text names 1
                     (200, {"choices": [{"message": {"content": "both are fine"}}]}),  # item 3: unreadable
                     (200, {"choices": [{"message": {"content": "hmm"}}]})]
    j = judge_for(server.url, concurrency=1)
    v1, v2, v3 = j.judge(["q1", "q2", "q3"], ["a", "a", "a"], ["b", "b", "b"])
    assert v1.p is None and v1.extra["errors"] == ["malformed JSON (after 3 attempts)"] * 2
    # hard labels: AB says second (B) -> p_ab = 0; BA says first (B) -> p_ba = 0
    assert v2.p == 0.0 and v2.hard_label_fallback and v2.extra["hard_label_orders"] == 2
    assert v3.p is None and not v3.parse_ok
    s = summarize_judgments([v1, v2, v3])
    assert s["parse_failures"] == 2 and s["hard_label_fallbacks"] == 2 and s["order_parse_failures"] == 4


def test_api_key_from_env_is_sent_but_never_recorded(server, monkeypatch, tmp_path, caplog):
    secret = "sk-test-SECRET-123"
    monkeypatch.setenv("POFE_TEST_KEY", secret)
    caplog.set_level(logging.DEBUG)
    server.script = [(500, "x")]
    cfg = OpenAIJudgeConfig(endpoint={"base_url": server.url, "api_key_env": "POFE_TEST_KEY", "backoff_s": 0.01},
                      cache={"path": str(tmp_path / "c.sqlite")})
    j = build_judge(cfg)
    [v] = j.judge(["q"], ["a"], ["b"])
    assert all(h.get("Authorization") == f"Bearer {secret}" for h in server.headers)
    blob = json.dumps(v.to_dict()) + dump_config(cfg) + caplog.text + (tmp_path / "c.sqlite").read_bytes().decode("latin-1")
    assert secret not in blob and "POFE_TEST_KEY" in dump_config(cfg)
    monkeypatch.delenv("POFE_TEST_KEY")
    with pytest.raises(ValueError, match="POFE_TEST_KEY"):
        build_judge(cfg)


def test_concurrency_and_rate_limit(server):
    server.delay = 0.1
    j = judge_for(server.url, concurrency=4)
    j.judge([f"q{i}" for i in range(4)], ["a"] * 4, ["b"] * 4)
    assert server.max_in_flight > 1 and server.max_in_flight <= 4
    server.delay = 0.0
    t0 = time.perf_counter()
    judge_for(server.url, concurrency=4, rate_limit=20.0).judge(["q1", "q2", "q3"], ["a"] * 3, ["b"] * 3)
    assert time.perf_counter() - t0 >= 5 / 20.0  # 6 requests evenly spaced at 20/s
    n = len(server.requests)
    judge_for(server.url).judge(["same"] * 3, ["a"] * 3, ["b"] * 3)  # identical items: each ordered read once
    assert len(server.requests) - n == 2


def test_chat_prefill_and_cache_across_calls(server, tmp_path):
    cfg = OpenAIJudgeConfig(endpoint={"base_url": server.url, "api": "chat", "chat_prefill": True},
                      cache={"path": str(tmp_path / "c.sqlite")})
    j = build_judge(cfg)
    j.judge(["q"], ["a"], ["b"])
    msgs = server.requests[0]["messages"]
    assert msgs[-1] == {"role": "assistant", "content": "Better reply: "}
    n = len(server.requests)
    [v] = build_judge(cfg).judge(["q"], ["b"], ["a"])  # swapped pair, new judge object, same cache file
    assert len(server.requests) == n and v.cached


def test_cot_and_expected_score_over_completions(server):
    def answer(body):
        if body["max_tokens"] > 1:  # rationale request
            return {"choices": [{"text": " Reply 1 answers the question."}], "usage": {"total_tokens": 30}}
        prompt = body["prompt"]
        if prompt.endswith("Rating: 1"):  # continuation read after "1": P("0") = 0.25
            return legacy_shape({"0": math.log(0.25), ".": math.log(0.75)}, text=".")
        if prompt.endswith("Rating: "):  # score read: "1" 0.4, "7" 0.6
            return legacy_shape({"1": math.log(0.4), "7": math.log(0.6)}, text="7")
        return legacy_shape({"1": -0.1, "2": -2.5})

    server.default = (200, answer)
    ep = {"base_url": server.url, "backoff_s": 0.01}
    j = build_judge(OpenAIJudgeConfig(endpoint=ep, cot={"enabled": True, "clamp": [0.4, 0.6]}, cache={"enabled": False}))
    [v] = j.judge(["q"], ["a"], ["b"])
    assert v.raw == (" Reply 1 answers the question.",) * 2 and v.p == pytest.approx(0.5)
    second = [r for r in server.requests if r["max_tokens"] == 1][0]["prompt"]
    assert second.endswith("Comparison: Reply 1 answers the question.\nBetter reply: ")
    es = build_judge(ExpectedScoreJudgeConfig(backend="openai", endpoint=ep, cache={"enabled": False}))
    [s] = es.score(["q"], ["y"])
    # P(1) = 0.4 * 0.75 = 0.3, P(10) = 0.4 * 0.25 = 0.1, P(7) = 0.6 -> E = 0.3 + 1.0 + 4.2 = 5.5 -> (5.5 - 1) / 9 = 0.5
    assert s.extra["expected"] == pytest.approx(5.5) and s.score == pytest.approx(0.5)
    with pytest.raises(ValueError, match="chat_prefill"):
        build_judge(OpenAIJudgeConfig(endpoint={**ep, "api": "chat"}, cot={"enabled": True}))
    with pytest.raises(ValueError, match="chat_prefill"):
        build_judge(ExpectedScoreJudgeConfig(backend="openai", endpoint={**ep, "api": "chat"}))


def test_pofe_judge_cli_with_csv_and_programmatic_judge(tmp_path):
    from typer.testing import CliRunner

    from pofe.cli.main import app

    f = tmp_path / "rows.csv"
    f.write_text("prompt,response_a,response_b\nq1,short,much longer answer\nq2,a long long answer,tiny\n")
    r = CliRunner().invoke(app, ["judge", str(f), "--judge", "length", "--json", "--set", f"run.output_dir={tmp_path}"])
    assert r.exit_code == 0, r.output
    s = json.loads(r.stdout)
    assert s["n"] == 2 and s["mean_p"] == 0.5 and s["consistency_rate"] == 1.0 and s["model_calls"] == 0
    assert s["first_position_win_rate"] == 0.5
    rows = [json.loads(x) for x in open(s["output"])]
    assert [x["p"] for x in rows] == [1.0, 0.0]
    r2 = CliRunner().invoke(app, ["judge", str(tmp_path / "missing.jsonl"), "--judge", "length"])
    assert r2.exit_code == 2 and "not found" in r2.output
