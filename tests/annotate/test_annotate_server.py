"""The annotate server over HTTP (loopback only, Host/Origin checks, bad writes refused, no
path traversal), the command's errors and a smoke run, and ``pofe audit --calibration``."""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pofe.annotate.server import AnnotateConfig, make_server
from pofe.cli.main import app

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()


def _write_pairs(path: Path, n: int = 3) -> Path:
    rows = [{"prompt": f"Question {i}?", "response_a": f"Answer {i}.", "response_b": f"A longer answer, number {i}."}
            for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def server(tmp_path):
    _write_pairs(tmp_path / "pairs.jsonl")
    srv = make_server(AnnotateConfig(data={"pairs": str(tmp_path / "pairs.jsonl")}, annotator="ann",
                                     output=str(tmp_path / "cal.jsonl")))
    t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    t.start()
    yield srv
    srv.shutdown()
    srv.server_close()
    srv.session.close()


def _req(srv, method, path, body=None, headers=None, raw_body=None):
    port = srv.server_address[1]
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    h = {"Host": f"127.0.0.1:{port}"}
    data = raw_body
    if body is not None:
        data = json.dumps(body).encode()
        h["Content-Type"] = "application/json"
    h.update(headers or {})
    c.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
    for k, v in h.items():
        c.putheader(k, v)
    c.putheader("Content-Length", str(len(data or b"")))
    c.endheaders(data)
    r = c.getresponse()
    out = r.status, r.getheader("Content-Type"), r.read()
    c.close()
    return out


def test_binds_loopback_and_serves_page_state_and_writes(server):
    assert server.server_address[0] == "127.0.0.1"
    status, ctype, body = _req(server, "GET", "/")
    assert status == 200 and ctype.startswith("text/html") and b"/static/annotate.js" in body
    assert _req(server, "GET", "/static/annotate.js")[0] == 200
    st = json.loads(_req(server, "GET", "/api/state")[2])
    assert (st["total"], st["labelled"], st["pair"]["index"]) == (3, 0, 1)
    status, _, body = _req(server, "POST", "/api/decide", {"pair_id": st["pair"]["id"], "choice": "tie"})
    assert status == 200 and json.loads(body)["labelled"] == 1
    rows = [json.loads(x) for x in Path(server.session.log.path).read_text().splitlines()]
    assert [r["event"] for r in rows] == ["open", "label"] and rows[1]["label"] == "tie"
    assert rows[0]["n_pairs"] == 3 and len(rows[0]["pairs_sha256"]) == 64


def test_refuses_foreign_host_origin_and_bad_writes(server):
    log_before = Path(server.session.log.path).read_text()
    port = server.server_address[1]
    pid = json.loads(_req(server, "GET", "/api/state")[2])["pair"]["id"]
    assert _req(server, "GET", "/api/state", headers={"Host": f"attacker.example:{port}"})[0] == 403
    assert _req(server, "GET", "/", headers={"Host": "127.0.0.1:1"})[0] == 403  # another port: not this server
    assert _req(server, "POST", "/api/decide", {"pair_id": pid, "choice": "left"},
                headers={"Origin": "http://attacker.example"})[0] == 403
    assert _req(server, "POST", "/api/decide", raw_body=json.dumps({"pair_id": pid, "choice": "left"}).encode(),
                headers={"Content-Type": "text/plain"})[0] == 415  # what a cross-site form could send
    status, _, body = _req(server, "POST", "/api/decide", {"pair_id": "../../etc/passwd", "choice": "left"})
    assert status == 400 and "unknown pair id" in json.loads(body)["error"]
    assert _req(server, "POST", "/api/decide", {"pair_id": pid, "choice": "best"})[0] == 400
    assert _req(server, "POST", "/api/decide", raw_body=b"{not json", headers={"Content-Type": "application/json"})[0] == 400
    assert _req(server, "POST", "/api/decide", raw_body=b"x" * 70_000, headers={"Content-Type": "application/json"})[0] == 413
    assert _req(server, "POST", "/api/undo", {})[0] == 409  # nothing to undo
    for path in ("/static/../server.py", "/static/..%2f..%2fserver.py", "/static/index.html/../../log.py",
                 "/../pairs.py", "/static/", "/static/annotate.js/"):
        assert _req(server, "GET", path)[0] == 404, path
    assert Path(server.session.log.path).read_text() == log_before  # nothing was written


def _cli(args):
    return runner.invoke(app, ["annotate", *args])


def test_cli_bad_input_exits_2_with_one_line(tmp_path):
    pairs = _write_pairs(tmp_path / "pairs.jsonl")
    out = str(tmp_path / "cal.jsonl")
    cases = [
        (["--annotator", "ann", "-o", out], "missing"),  # no pairs
        ([str(pairs), "--annotator", "a b", "-o", out], "annotator id 'a b'"),
        ([str(pairs), "--annotator", "ann", "-o", out, "--host", "0.0.0.0"], "not a loopback address"),
        ([str(pairs), "--annotator", "ann", "-o", str(pairs)], "is the pairs file itself"),
        ([str(tmp_path / "nope.jsonl"), "--annotator", "ann", "-o", out], "pairs file not found"),
        ([str(pairs), "--annotator", "ann", "-o", out, "--set", "prot=1"], "unknown key 'prot'"),
    ]
    for args, msg in cases:
        r = _cli(args)
        assert r.exit_code == 2, (args, r.output)
        assert msg in r.output and r.output.strip().count("\n") == 0, r.output
    other = tmp_path / "notes.jsonl"
    other.write_text('{"prompt": "mine"}\n{"prompt": "torn')
    r = _cli([str(pairs), "--annotator", "ann", "-o", str(other)])
    assert r.exit_code == 2 and "is not a pofe annotate log" in r.output
    assert other.read_text() == '{"prompt": "mine"}\n{"prompt": "torn'  # untouched
    assert not Path(out).exists()


def test_cli_pairs_and_limit_are_the_data_keys_and_the_old_keys_are_unknown(tmp_path):
    import yaml

    r = _cli(["p.jsonl", "-a", "ann", "-o", "cal.jsonl", "--limit", "2", "--print-config"])
    assert r.exit_code == 0, r.output
    assert yaml.safe_load(r.stdout)["data"] == {"pairs": "p.jsonl", "limit": 2}
    for old in ("pairs=q.jsonl", "limit=2"):
        r = _cli(["p.jsonl", "-a", "ann", "-o", "cal.jsonl", "--set", old, "--print-config"])
        assert r.exit_code == 2 and f"unknown key '{old.split('=')[0]}'" in r.output, (old, r.output)
    r = _cli(["-a", "ann", "-o", "cal.jsonl", "--print-config"])
    assert r.exit_code == 2 and "missing required key 'data.pairs'" in r.output, r.output


@pytest.mark.slow
def test_cli_smoke_serves_until_sigterm(tmp_path):
    pairs = _write_pairs(tmp_path / "pairs.jsonl", n=2)
    out = tmp_path / "cal.jsonl"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "pofe", "annotate", str(pairs), "--annotator", "ann", "-o", str(out),
                             "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        first = proc.stdout.readline()
        assert first.startswith("pofe annotate: http://127.0.0.1:"), first + proc.stderr.read()
        port = int(first.rsplit(":", 1)[1].strip(" /\n"))
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        c.request("GET", "/api/state")
        st = json.loads(c.getresponse().read())
        c.request("POST", "/api/decide", json.dumps({"pair_id": st["pair"]["id"], "choice": "left"}),
                  {"Content-Type": "application/json"})
        assert c.getresponse().status == 200
        c.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        rest, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "stopped; ann: 1 labelled, 0 skipped of 2" in rest
    assert [json.loads(x)["event"] for x in out.read_text().splitlines()] == ["open", "label"]


def test_audit_reads_annotations_with_calibration_option(tmp_path):
    rows = [{"event": "open", "annotator": "ann"}]
    for i in range(6):  # the longer response is always b; humans pick it in 4 of 6, tie on 1
        label = ["B", "B", "B", "B", "A", "tie"][i]
        rows.append({"event": "label", "annotator": "ann", "pair_id": f"p{i}", "label": label, "prompt": f"q{i}",
                     "response_a": "short", "response_b": "a much longer response " * (i + 1)})
    rows.append({"event": "skip", "annotator": "ann", "pair_id": "p6"})
    rows.append({"event": "label", "annotator": "bob", "pair_id": "p0", "label": "A", "prompt": "q0",
                 "response_a": "short", "response_b": "a much longer response "})
    rows.append({"event": "undo", "annotator": "bob", "pair_id": "p0"})
    cal = tmp_path / "cal.jsonl"
    cal.write_text("".join(json.dumps(r) + "\n" for r in rows))
    report = tmp_path / "audit.json"
    r = runner.invoke(app, ["audit", "--calibration", str(cal), "--judge", "length", "--set", "judge.prefer=longer",
                            "--set", "contrasts=false", "-o", str(report)])
    assert r.exit_code in (0, 1), r.output
    rep = json.loads(report.read_text())
    assert rep["calibration"]["n_items"] == 6 and rep["calibration"]["by_source"] == {f"ann@{tmp_path.name}/cal.jsonl": 6}
    m = rep["metrics"]
    assert m["n_labelled"] == 5 and m["human_ties"]["n"] == 1
    assert m["agreement"] == pytest.approx(4 / 5)  # the judge always picks b (longer); humans did 4 of 5 times
