"""``pofe report``: HTML with every plot inlined, PNGs beside it, tolerant of missing keys."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pofe.cli.main import app
from pofe.evaluation.report import load_run, write_report

runner = CliRunner()

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _embedded_images(html_text: str) -> list[bytes]:
    return [base64.b64decode(m) for m in re.findall(r"src='data:image/png;base64,([A-Za-z0-9+/=]+)'", html_text)]


def _check_report(res: dict) -> str:
    html_text = Path(res["html"]).read_text()
    imgs = _embedded_images(html_text)
    # Every plot is embedded, once, as a real PNG, and the same bytes are written beside the HTML.
    assert len(imgs) == len(res["plots"]) == len(res["pngs"])
    for img, png in zip(imgs, res["pngs"]):
        assert img.startswith(PNG_MAGIC)
        assert Path(png).parent == Path(res["html"]).parent
        assert Path(png).read_bytes() == img
    # Self-contained: every src is inline data, no scripts or linked stylesheets.
    assert re.findall(r"src='([a-z]+):", html_text) == ["data"] * len(imgs)
    assert "<script" not in html_text and "<link" not in html_text
    return html_text


def _synthetic_online_run(d: Path, steps: int = 12) -> Path:
    d.mkdir(parents=True)
    (d / "config.yaml").write_text("loss: dpo\njudge:\n  kind: length\n")
    rows = []
    for s in range(1, steps + 1):
        r = {"step": s, "loss": 0.69 - 0.02 * s, "mean_len": 40 - s, "consistency_rate": 1.0, "kl": 0.01 * s,
             "time_generate": 0.5, "time_judge": 0.1, "time_train": 0.3, "time_step": 1.0, "p_hist": [1, 0, 0, 0, 1]}
        if s % 4 == 0:
            r["winrate_vs_init"] = 0.5 + 0.03 * s
        if s == 3:
            del r["loss"], r["kl"]  # a step that trained nothing: missing keys are skipped
            r["consistency_rate"] = None
        rows.append(r)
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 13, "lo')  # torn line
    ledger = [{"kind": "annotation", "step": 1, "p": p} for p in (0.0, 0.25, 0.5, 1.0)]
    ledger += [{"kind": "annotation", "step": 2, "p": None}, {"kind": "loss", "step": 1, "loss": 0.7}]
    (d / "ledger.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ledger))
    return d


def test_report_from_synthetic_online_run(tmp_path):
    d = _synthetic_online_run(tmp_path / "run")
    run = load_run(d)
    assert len(run.metrics) == 12 and run.ledger_p == [0.0, 0.25, 0.5, 1.0]
    res = write_report(d)
    assert res["plots"] == ["loss", "winrate", "length", "p_hist", "consistency", "kl", "time"]
    assert Path(res["html"]) == d / "report" / "report.html"
    html_text = _check_report(res)
    assert "Win rate against the initial policy" in html_text and "config.yaml" in html_text
    assert "last win rate vs initial</th><td>0.860 (step 12)" in html_text


def test_report_tolerates_sparse_and_empty_runs(tmp_path):
    d = tmp_path / "sparse"
    d.mkdir()
    (d / "metrics.jsonl").write_text('{"step": 1, "loss": 1.0}\n{"step": 2, "loss": 0.5, "mean_chars": 80}\n')
    res = write_report(d, tmp_path / "out")
    assert res["plots"] == ["loss", "length"]
    _check_report(res)
    empty = tmp_path / "empty"
    empty.mkdir()
    res = write_report(empty)
    assert res["plots"] == [] and "Nothing to plot" in Path(res["html"]).read_text()
    with pytest.raises(FileNotFoundError):
        write_report(tmp_path / "nope")


def test_report_self_reward_iterations(tmp_path):
    d = tmp_path / "sr"
    for t, (score, wr) in enumerate([(3.1, None), (3.6, 0.58), (3.9, 0.55)], start=1):
        (d / f"iter_{t}").mkdir(parents=True)
        m = {"iteration": t, "model": f"m{t}", "mean_score": score, "rm_metrics": {"pairwise_accuracy": 0.5 + 0.05 * t}}
        if wr is not None:
            m["head_to_head_vs_prev"] = {"win_rate": wr}
        (d / f"iter_{t}" / "metrics.json").write_text(json.dumps(m))
    (d / "iter_10").mkdir()  # an iteration without metrics yet
    run = load_run(d)
    assert [n for n, _ in run.iterations] == ["iter_1", "iter_2", "iter_3"]
    res = write_report(d)
    assert res["plots"] == ["iterations"] and res["iterations"] == ["iter_1", "iter_2", "iter_3"]
    _check_report(res)


def test_cli_report(tmp_path):
    d = _synthetic_online_run(tmp_path / "run")
    out = runner.invoke(app, ["report", str(d), "--json"])
    assert out.exit_code == 0, out.output
    res = json.loads(out.stdout)
    assert len(res["pngs"]) == 7 and Path(res["html"]).exists()
    bad = runner.invoke(app, ["report", str(tmp_path / "missing")])
    assert bad.exit_code == 2 and "run folder not found" in bad.stderr


@pytest.mark.slow
def test_report_from_a_real_online_run(tmp_path, tiny_model_dir):
    """Acceptance: a real ``pofe online`` run folder (tiny model, length judge) -> HTML + PNGs."""
    from _online_utils import tiny_cfg
    from pofe.loops.online import run

    cfg = tiny_cfg(tmp_path, tiny_model_dir, "train.steps=3", "eval.every=1")
    s = run(cfg)
    d = Path(s["run_dir"])
    res = write_report(d)
    for name in ("loss", "winrate", "length", "p_hist", "consistency", "time"):
        assert name in res["plots"], name
    assert res["annotations"] > 0 and res["metrics_rows"] == 3
    _check_report(res)
