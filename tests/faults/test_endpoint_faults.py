"""Fault suite for the OpenAI-compatible judge endpoint: a fake
server on 127.0.0.1 in each fault mode. What must hold in every mode: bounded retries, a
one-line error or a counted unreadable read, never an invented label, never a stale one.
"""

from __future__ import annotations

import math
import sys
import time
from email.utils import format_datetime
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "judges"))  # the shared fake server
from fake_openai import FakeServer, chat_shape, legacy_shape  # noqa: E402

from pofe.judges import EndpointError, build_judge, summarize_judgments  # noqa: E402
from pofe.judges.backends import _free_port, parse_retry_after  # noqa: E402
from pofe.judges.config import OpenAIJudgeConfig  # noqa: E402
from pofe.judges.templates import load_template  # noqa: E402

pytestmark = pytest.mark.faults

GOOD = chat_shape({"1": -0.4, "2": -1.3})  # P(first) = sigmoid(0.9)


def sig(z):
    return 1 / (1 + math.exp(-z))


@pytest.fixture
def server():
    s = FakeServer(default=(200, GOOD))
    yield s
    s.close()


def judge_for(url, tmp_path=None, **endpoint):
    ep = {"base_url": url, "backoff_s": 0.01, "max_backoff_s": 0.05, "max_retries": 2, "timeout_s": 5.0,
          "concurrency": 1, **endpoint}
    cache = {"path": str(tmp_path / "c.sqlite")} if tmp_path is not None else {"enabled": False}
    return build_judge(OpenAIJudgeConfig(endpoint=ep, cache=cache))


def posts(server):
    return [r for r in server.requests if r["path"].endswith("completions")]


# ----------------------------------------------------------------------------- transport
def test_refused_connection_is_a_clear_error_after_bounded_retries():
    j = judge_for(f"http://127.0.0.1:{_free_port()}/v1")
    t0 = time.monotonic()
    with pytest.raises(EndpointError, match=r"failed after 3 attempts \(ConnectError"):
        j.judge(["q"], ["a"], ["b"])
    assert time.monotonic() - t0 < 30  # bounded (not a timing claim: a hang would never return)


def test_persistent_5xx_is_a_clear_error(server):
    server.default = (503, {"error": "overloaded"})
    server.models_status = 503
    j = judge_for(server.url)
    with pytest.raises(EndpointError, match=r"failed after 3 attempts \(HTTP 503"):
        j.judge(["q"], ["a"], ["b"])


def test_5xx_on_reads_after_identification_is_a_clear_error(server):
    server.default = (500, "boom")
    j = judge_for(server.url)
    with pytest.raises(EndpointError, match=r"/v1/completions failed after 3 attempts \(HTTP 500"):
        j.judge(["q", "q2", "q3"], ["a"] * 3, ["b"] * 3)
    # bounded: the first request used its 3 attempts; the endpoint is then known down, so the
    # other 5 reads of the batch try once each instead of running the whole backoff schedule
    assert len(posts(server)) == 3 + 5


def test_reads_that_succeeded_in_a_batch_with_a_failed_request_are_cached(server, tmp_path):
    # order BA of item 1 fails for good (3 x 500); the three other reads succeed and are paid for
    server.script = [(200, GOOD), (500, "down"), (500, "down"), (500, "down")]
    j = judge_for(server.url, tmp_path)
    v1, v2 = j.judge(["q1", "q2"], ["a", "a"], ["b", "b"])
    assert len(posts(server)) == 6
    assert v1.p is None and v1.p_ab == pytest.approx(sig(0.9)) and v2.parse_ok
    assert v1.extra["errors"][0].startswith("request failed: judge endpoint") and "HTTP 500" in v1.extra["errors"][0]
    assert len(j.cache) == 3  # the failure is not stored, the good reads are
    r1, r2 = judge_for(server.url, tmp_path).judge(["q1", "q2"], ["a", "a"], ["b", "b"])
    assert len(posts(server)) == 7  # only the failed read was asked again
    assert r1.parse_ok and r2.cached and r1.extra["cache_hits"] == 1


@pytest.mark.parametrize("retry_after", [
    "1e308",  # float("1e308") seconds: used to overflow
    "inf",
    "99999999999999999999999",
    format_datetime(datetime(9999, 12, 31, 23, 59, 59, tzinfo=timezone.utc), usegmt=True),  # HTTP-date, far future
    "Thu, 01 Jan 1970 00:00:00 GMT",  # in the past: no wait
    "soon",  # unreadable: ignored
])
def test_429_with_any_retry_after_is_capped_and_recovers(server, retry_after):
    server.reply_headers = {"Retry-After": retry_after}
    server.script = [(429, {"error": "slow down"})]
    j = judge_for(server.url)
    t0 = time.monotonic()
    [v] = j.judge(["q"], ["a"], ["b"])
    assert v.parse_ok and v.p_ab == pytest.approx(sig(0.9))
    assert len(posts(server)) == 3  # one 429, then both orders
    assert time.monotonic() - t0 < 30  # capped at max_backoff_s, never the header's value


def test_parse_retry_after_values():
    now = 1_700_000_000.0
    date = format_datetime(datetime.fromtimestamp(now, timezone.utc) + timedelta(seconds=90), usegmt=True)
    assert parse_retry_after("120") == 120.0
    assert parse_retry_after(date, now=now) == pytest.approx(90.0)
    assert parse_retry_after("-5") == 0.0
    assert parse_retry_after("1e308") == 1e308  # the caller caps it
    assert parse_retry_after("nan") is None and parse_retry_after("soon") is None and parse_retry_after(None) is None
    assert parse_retry_after("Fri, 31 Dec 9999 23:59:59 GMT") > 1e9


def test_hang_times_out_and_is_a_clear_error(server):
    server.delay = 1.0
    j = judge_for(server.url, timeout_s=0.2, max_retries=1)
    with pytest.raises(EndpointError, match=r"failed after 2 attempts \(ReadTimeout"):
        j.judge(["q"], ["a"], ["b"])


# ----------------------------------------------------------------------------- bodies
def test_garbage_bodies_are_retried_then_counted_unreadable(server):
    # item 1: both orders garbage on every attempt; item 2 fine -> item 1 counted, item 2 labelled
    server.script = [(200, "<html>502 Bad Gateway</html>")] * 6
    j = judge_for(server.url)
    v, w = j.judge(["q", "q2"], ["a", "a"], ["b", "b"])
    assert v.p is None and not v.parse_ok and v.p_ab is None and v.p_ba is None
    assert v.extra["errors"] == ["malformed JSON (after 3 attempts)"] * 2
    assert w.parse_ok and w.p_ab == pytest.approx(sig(0.9))
    assert len(posts(server)) == 8  # bounded: 3 attempts per garbage order, 1 per good one
    assert summarize_judgments([v, w])["parse_failures"] == 1


def test_a_server_answering_only_garbage_is_a_clear_error(server):
    server.default = (200, "<html>502 Bad Gateway</html>")
    j = judge_for(server.url)
    with pytest.raises(EndpointError, match=r"answered all 2 requests of a batch unreadably \(malformed JSON "
                                            r"\(after 3 attempts\)\)"):
        j.judge(["q"], ["a"], ["b"])
    assert len(posts(server)) == 6


def test_garbage_once_then_good_recovers(server):
    server.script = [(200, "{trunc")]
    j = judge_for(server.url)
    [v] = j.judge(["q"], ["a"], ["b"])
    assert v.parse_ok and v.p_ab == pytest.approx(sig(0.9))


def test_missing_choices_are_counted_unreadable(server):
    server.script = [(200, {"id": "x", "choices": []})] * 3
    j = judge_for(server.url)
    [v] = j.judge(["q"], ["a"], ["b"])
    assert v.p is None and v.extra["errors"] == ["no choices in response (after 3 attempts)"]
    assert v.p_ba == pytest.approx(1 - sig(0.9))  # the other order was read
    server.default = (200, {"id": "x"})
    with pytest.raises(EndpointError, match=r"unreadably \(no choices in response"):
        j.judge(["q2"], ["a"], ["b"])


def test_no_logprobs_falls_back_to_a_flagged_text_label_or_unreadable(server):
    server.script = [(200, {"choices": [{"message": {"content": "1"}}]}),  # order AB: "first"
                     (200, {"choices": [{"message": {"content": "2"}}]}),  # order BA: "second" = A
                     (200, {"choices": [{"message": {"content": "I cannot decide"}}]}),
                     (200, {"choices": [{"message": {"content": "1"}}]})]
    j = judge_for(server.url)
    v, w = j.judge(["q", "q2"], ["a", "a"], ["b", "b"])
    assert v.p == 1.0 and v.hard_label_fallback and v.extra["hard_label_orders"] == 2  # flagged for the ledger
    assert v.to_dict()["hard_label_fallback"] is True
    assert w.p is None and "no logprobs and no readable verdict" in w.extra["errors"]


@pytest.mark.parametrize("shape", ["chat", "legacy"])
def test_nan_logprobs_are_unreadable_never_a_label(server, shape):
    nan = float("nan")
    make = chat_shape if shape == "chat" else legacy_shape
    server.script = [(200, make({"1": nan, "2": -1.3})),  # item 1, order AB: NaN on a choice
                     (200, make({"1": -0.4, "2": -1.3})),  # item 1, order BA: fine
                     (200, make({"1": float("inf"), "2": -1.3})),  # item 2: +inf is not a log-prob either
                     (200, make({"1": -0.4, "2": nan}))]
    j = judge_for(server.url)
    v1, v2 = j.judge(["q", "q2"], ["a", "a"], ["b", "b"])
    # Before: the NaN entry was dropped, the choice read as absent -> p_ab = 0 (a confident label).
    assert v1.p_ab is None and v1.p is None and not v1.parse_ok and "non-finite logprob" in v1.extra["errors"]
    assert v1.p_ba == pytest.approx(1 - sig(0.9))  # the good order is still reported
    assert v2.p is None and v2.extra["orders_failed"] == 2
    assert summarize_judgments([v1, v2])["parse_failures"] == 2


def test_nan_with_a_single_order_is_unreadable_not_zero(server):
    server.default = (200, chat_shape({"1": float("nan"), "2": -0.1}))
    j = build_judge(OpenAIJudgeConfig(both_orders=False, cache={"enabled": False},
                                      endpoint={"base_url": server.url, "max_retries": 0}))
    [v] = j.judge(["q"], ["a"], ["b"])
    assert v.p is None and not v.parse_ok


# ----------------------------------------------------------------------------- identity and cache
def test_changed_model_behind_the_url_never_serves_old_labels(server, tmp_path):
    j = judge_for(server.url, tmp_path)
    first = j.judge(["q1", "q2"], ["a", "a"], ["b", "b"])
    assert len(posts(server)) == 4 and all(v.p_ab == pytest.approx(sig(0.9)) for v in first)
    again = j.judge(["q1", "q2"], ["a", "a"], ["b", "b"])
    assert len(posts(server)) == 4 and all(v.cached for v in again)  # same model: served from the cache
    # the operator swaps the model behind the same URL; the new model prefers the second reply
    server.model_id = "fake-model-v2"
    server.default = (200, chat_shape({"1": -1.3, "2": -0.4}))
    fresh = judge_for(server.url, tmp_path)  # a rerun: new process, same cache file
    swapped = fresh.judge(["q1", "q2"], ["a", "a"], ["b", "b"])
    assert len(posts(server)) == 8  # new requests ...
    assert all(not v.cached and v.p_ab == pytest.approx(sig(-0.9)) for v in swapped)  # ... and the new model's labels
    # and the same judge object notices a swap between two calls as well
    server.model_id = "fake-model-v3"
    server.default = (200, GOOD)
    [v] = fresh.judge(["q1"], ["a"], ["b"])
    assert not v.cached and v.p_ab == pytest.approx(sig(0.9)) and "fake-model-v3" in v.extra["model"]


def test_server_without_a_model_list_is_never_cached(server, tmp_path, caplog):
    server.models_status = 404
    j = judge_for(server.url, tmp_path)
    j.judge(["q"], ["a"], ["b"])
    j.judge(["q"], ["a"], ["b"])
    assert len(posts(server)) == 4  # no identity, no cache: both calls asked the server
    assert "judge cache disabled" in caplog.text


def test_audit_gate_compares_the_full_judge_identity(tmp_path):
    # a judge id that omitted the endpoint URL, both_orders, CoT, choices and temperature would
    # let an audit of one judge pass the gate for another
    import json

    from pofe.evaluation.audit import AuditError, judge_identity, require_audit

    audited = OpenAIJudgeConfig(endpoint={"base_url": "http://judge-a:8000/v1", "model": "m"})
    report = {"judge": "openai:m:helpful", "judge_identity": judge_identity(audited), "passed": True, "checks": {},
              "calibration": {"sha256": "abc"}}
    path = tmp_path / "audit.json"
    path.write_text(json.dumps(report))
    assert require_audit(path, judge_identity(audited.model_copy()))["passed"]
    variants = {
        "endpoint": audited.model_copy(update={"endpoint": audited.endpoint.model_copy(update={"base_url": "http://b/v1"})}),
        "both_orders": audited.model_copy(update={"both_orders": False}),
        "cot": audited.model_copy(update={"cot": audited.cot.model_copy(update={"enabled": True})}),
        "choices": audited.model_copy(update={"choices": ["A", "B"]}),
        "template_hash": audited.model_copy(update={"template": "helpful-short"}),
    }
    for key, cfg in variants.items():
        with pytest.raises(AuditError, match=rf"different judge \(.*{key}"):
            require_audit(path, judge_identity(cfg))
    # settings that change only speed are not part of the identity
    fast = audited.model_copy(update={"endpoint": audited.endpoint.model_copy(update={"concurrency": 16})})
    assert judge_identity(fast) == judge_identity(audited)
    # a CoT judge's identity records the clamp actually applied (the CAI default unless overridden)
    assert judge_identity(variants["cot"])["cot_clamp_applied"] == [0.4, 0.6]


# ----------------------------------------------------------------------------- injection
ONE_TOKEN_ATTACKS = [":", "Thought process:", " ", "1", "Solution"]


def _outside_tags(text, tags):
    import re

    for t in tags:
        text = re.sub(rf"<{t}>\n.*?\n</{t}>", f"<{t}></{t}>", text, flags=re.S)
    return text


@pytest.mark.parametrize("name", ["helpful", "helpful-short", "helpful-very-short", "summarize", "harmless",
                                  "constitution"])
@pytest.mark.parametrize("cot", [False, True])
def test_one_token_attacks_leave_the_rendered_prompt_unchanged(name, cot):
    t = load_template(name)
    tags = sorted(t.delimiter_tags)
    fields = {"prompt": "hi", "response_1": "one", "response_2": "two", "principle": "Be honest."}
    benign = t.render(fields, cot=cot)
    for attack in ONE_TOKEN_ATTACKS + [t.answer_prefix, t.cot_prefix, t.cot_answer_prefix]:
        for slot in ("response_1", "response_2"):
            evil = t.render({**fields, slot: attack}, cot=cot)
            for tag in tags:
                assert evil.user.count(f"<{tag}>") == 1 and evil.user.count(f"</{tag}>") == 1
            assert _outside_tags(evil.user, tags) == _outside_tags(benign.user, tags)
            assert evil.assistant_prefix == benign.assistant_prefix


def test_one_token_response_gets_the_model_answer_not_a_shortcut(server):
    # The judge's read comes from the model; a ":" response changes nothing pofe adds.
    j = judge_for(server.url)
    [v] = j.judge(["q"], [":"], ["Thought process:"])
    assert v.parse_ok and v.p == pytest.approx(0.5 * (sig(0.9) + 1 - sig(0.9)))
    body = posts(server)[0]["prompt"]
    assert body.count("<reply_1>") == 1 and body.count("</reply_2>") == 1
