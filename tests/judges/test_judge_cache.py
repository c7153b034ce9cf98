"""The judge cache: keyed on the answering weights (a live model is fingerprinted by its
weights, not its name), partial batches cached, write failures degrade to uncached, and
the ``pofe cache`` command."""

from __future__ import annotations

import json
import logging
import sqlite3

import pytest
from typer.testing import CliRunner

from pofe.judges.backends import ChoiceRead, TransformersBackend
from pofe.judges.cache import JudgeCache, cache_key
from pofe.judges.llm import LLMPairwiseJudge
from pofe.judges.templates import load_template
from pofe.models import DEFAULT_MODEL


class Backend:
    """Scripted reads: 'broken' in the request -> unreadable, else fixed log-probs."""

    kind = "scripted"
    fingerprint = "scripted:v1"
    cacheable = True
    special_strings = ()

    def __init__(self):
        self.requests = []

    def validate_choices(self, choices):
        pass

    def read_choices(self, requests, choices):
        self.requests.extend(requests)
        return [ChoiceRead(None, error="HTTP 500") if "broken" in r.user else
                ChoiceRead({choices[0]: -0.2, choices[1]: -1.0}) for r in requests]

    def close(self):
        pass


def test_good_reads_of_a_batch_with_a_failure_are_cached(tmp_path):
    be = Backend()
    j = LLMPairwiseJudge(be, load_template("helpful"), cache=JudgeCache(tmp_path / "c.sqlite"))
    v_ok, v_bad = j.judge(["q", "q"], ["a", "broken"], ["b", "c"])
    assert v_ok.parse_ok and not v_bad.parse_ok and len(be.requests) == 4
    assert len(j.cache) == 2  # the two good orders; the two failed ones are not stored
    again_ok, again_bad = j.judge(["q", "q"], ["a", "broken"], ["b", "c"])
    assert len(be.requests) == 6  # only the two failed orders were asked again
    assert again_ok.cached and again_ok.p == v_ok.p and not again_bad.parse_ok


class _FullDisk:
    """An sqlite connection whose writes fail like a full disk (reads still work)."""

    def __init__(self, conn):
        self.conn = conn

    def execute(self, *a):
        return self.conn.execute(*a)

    def executemany(self, *a):
        raise sqlite3.OperationalError("database or disk is full")

    def close(self):
        self.conn.close()


def test_cache_write_failure_degrades_to_uncached_with_one_warning(tmp_path, caplog):
    cache = JudgeCache(tmp_path / "c.sqlite")
    cache._conn = _FullDisk(cache._conn)
    be = Backend()
    j = LLMPairwiseJudge(be, load_template("helpful"), cache=cache)
    caplog.set_level(logging.WARNING)
    first = j.judge(["q"] * 3, ["a1", "a2", "a3"], ["b"] * 3)
    second = j.judge(["q"], ["a4"], ["b"])
    assert all(v.parse_ok for v in first + second)  # labelling went on
    assert len(cache) == 0 and cache.write_failures == 6 and not cache.writable
    assert sum("cannot be written" in r.getMessage() for r in caplog.records) == 1
    assert len(be.requests) == 8


def test_unopenable_cache_is_a_warning_not_a_failed_run(tmp_path, caplog):
    from pofe.judges.cache import open_cache
    from pofe.judges.config import CacheConfig

    (tmp_path / "not-a-dir").write_text("x")
    caplog.set_level(logging.WARNING)
    assert open_cache(CacheConfig(path=str(tmp_path / "not-a-dir" / "c.sqlite"))) is None
    assert "cannot be opened" in caplog.text


def test_live_model_is_fingerprinted_by_its_weights_not_its_name(tiny_model, tokenizer):
    import copy

    import torch

    named = TransformersBackend(DEFAULT_MODEL)
    live = TransformersBackend(DEFAULT_MODEL, model=tiny_model, tokenizer=tokenizer, cache_tag="initial-policy")
    other_model = copy.deepcopy(tiny_model)
    with torch.no_grad():
        next(other_model.parameters()).add_(1e-3)
    other = TransformersBackend(DEFAULT_MODEL, model=other_model, tokenizer=tokenizer, cache_tag="initial-policy")
    same = TransformersBackend(DEFAULT_MODEL, model=copy.deepcopy(tiny_model), tokenizer=tokenizer,
                               cache_tag="initial-policy")
    assert DEFAULT_MODEL not in live.fingerprint and live.fingerprint != named.fingerprint
    assert live.fingerprint != other.fingerprint  # different weights under the same name
    assert live.fingerprint == same.fingerprint  # equal weights: the cache may be shared
    untagged = TransformersBackend(DEFAULT_MODEL, model=tiny_model, tokenizer=tokenizer)
    assert not untagged.cacheable  # a live model without a tag may be training: never cached


# ----------------------------------------------------------------------------- pofe cache
def _filled(path, n=5):
    c = JudgeCache(path)
    for i in range(n):
        c.put(cache_key("k", i), {"lp": [i, -1.0], "raw": "x" * 100})  # equal sizes
    c.close()


@pytest.fixture(scope="module")
def app():
    from pofe.cli.main import app

    return app


def test_pofe_cache_stats_export_prune_clear(tmp_path, app):
    path = tmp_path / "c.sqlite"
    _filled(path)
    runner = CliRunner()
    r = runner.invoke(app, ["cache", "stats", "--path", str(path), "--json"])
    assert r.exit_code == 0, r.output
    s = json.loads(r.stdout)
    assert s["entries"] == 5 and s["data_bytes"] > 0

    out = tmp_path / "export.jsonl"
    r = runner.invoke(app, ["cache", "export", "--path", str(path), "-o", str(out)])
    assert r.exit_code == 0, r.output
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(rows) == 5 and {r["key"] for r in rows} == {cache_key("k", i) for i in range(5)}
    assert rows[0]["value"]["raw"] == "x" * 100

    per_entry = s["data_bytes"] // 5
    r = runner.invoke(app, ["cache", "prune", "--path", str(path), "--max-size", str(2 * per_entry), "--json"])
    assert r.exit_code == 0, r.output
    p = json.loads(r.stdout)
    assert p["deleted"] == 3 and p["entries"] == 2 and p["data_bytes"] <= 2 * per_entry
    c = JudgeCache(path)  # the newest entries are kept
    assert c.get(cache_key("k", 4)) is not None and c.get(cache_key("k", 0)) is None
    c.close()

    r = runner.invoke(app, ["cache", "clear", "--path", str(path), "--yes"])
    assert r.exit_code == 0 and "cleared 2 entries" in r.stdout
    assert len(JudgeCache(path)) == 0


def test_pofe_cache_bad_input_is_one_line_exit_2(tmp_path, app):
    runner = CliRunner()
    r = runner.invoke(app, ["cache", "stats", "--path", str(tmp_path / "missing.sqlite")])
    assert r.exit_code == 2 and "no judge cache at" in r.output
    _filled(tmp_path / "c.sqlite")
    r = runner.invoke(app, ["cache", "prune", "--path", str(tmp_path / "c.sqlite"), "--max-size", "lots"])
    assert r.exit_code == 2 and "--max-size 'lots'" in r.output


def test_pofe_cache_stats_without_a_cache_says_so_and_exits_0(tmp_path, app, monkeypatch):
    # a fresh install has no cache until a judge reads: a state, not an error (it exited 2)
    monkeypatch.setenv("POFE_HOME", str(tmp_path / "home"))
    where = tmp_path / "home" / "judge-cache.sqlite"
    r = CliRunner().invoke(app, ["cache", "stats"])
    assert r.exit_code == 0, r.output
    assert r.stdout == f"no judge cache yet at {where} (a judge with the cache on writes it on its first read)\n"
    r = CliRunner().invoke(app, ["cache", "stats", "--json"])
    assert r.exit_code == 0 and json.loads(r.stdout) == {
        "path": str(where), "exists": False, "entries": 0, "file_bytes": 0, "data_bytes": 0, "oldest": None,
        "newest": None}
    assert not where.exists()  # looking creates nothing

def test_parse_size():
    from pofe.cli.cache import parse_size

    assert parse_size("1024") == 1024 and parse_size("2K") == 2048 and parse_size("1.5M") == 1572864
    assert parse_size("1 GB") == 1024 ** 3
    with pytest.raises(ValueError):
        parse_size("-1M")
