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


# ---------------------------------------------------------------------------- one test per command
# Each synthetic folder holds the files that command's loop writes today (pofe/loops/*.py).


def _jsonl(path: Path, rows) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_report_online_win_rate_has_n_and_interval_and_samples_and_kl_flag(tmp_path):
    d = tmp_path / "online"
    d.mkdir()
    (d / "config.yaml").write_text("judge:\n  kind: llm\n")
    rows = [{"step": s, "loss": 0.7, "mean_len": 30.0, "mean_chars": 120.0 + s, "kl": 0.01 if s < 8 else 0.5}
            for s in range(1, 11)]
    rows[4].update({"winrate_vs_init": 0.75, "eval_wins": 6, "eval_ties": 0, "eval_losses": 2})
    _jsonl(d / "metrics.jsonl", rows)
    _jsonl(d / "eval" / "step-5.jsonl", [{"prompt": "Say hi.", "current": "Hello there!", "initial": "hi", "p": 0.9}])
    res = write_report(d)
    assert res["kind"] == "online" and "winrate" in res["plots"] and "length" in res["plots"]
    page = _check_report(res)
    assert "Wilson 95% bars" in page and "The judge measured length in: chars" in page
    assert "KL jump at step 8" in page and res["flags"][0].startswith("KL jump at step 8")
    assert "Hello there!" in page and "Sample generations" in page


def test_report_self_reward_head_to_head_with_intervals(tmp_path):
    d = tmp_path / "sr"
    for t in (1, 2):
        m = {"iteration": t, "mean_score": 3.0 + t,
             "head_to_head_vs_prev": {"wins": 5, "ties": 2, "losses": 3, "n": 10, "win_rate_adjusted": 0.6}}
        (d / f"iter_{t}").mkdir(parents=True)
        (d / f"iter_{t}" / "metrics.json").write_text(json.dumps(m))
    _jsonl(d / "iter_2" / "data" / "candidates.jsonl",
           [{"index": i, "prompt": f"p{i}", "responses": ["meh", "great answer", "ok", "fine"], "scores": [5, 5, 5, 4 + i]}
            for i in range(2)])
    res = write_report(d)
    assert res["kind"] == "self-reward" and res["plots"] == ["head_to_head", "scores", "iterations"]
    page = _check_report(res)
    # 7 of 8 candidates scored 5.
    assert "iter_2: 88% of self-judged candidates got the top score (5): judge collapse" in page
    assert "lowest-scored (4) vs highest-scored (5)" in page


def test_report_label_run(tmp_path):
    d = tmp_path / "label"
    rows = [{"prompt": f"q{i}", "response_a": "a" * (10 + i), "response_b": "b" * 12, "p": p, "p_ab": p, "p_ba": p,
             "principle_id": ("harm", "honest")[i % 2]} for i, p in enumerate([0.99, 0.98, 0.02, 0.97, 0.01] * 3)]
    _jsonl(d / "labels.jsonl", rows)
    _jsonl(d / "preferences.jsonl", [])
    (d / "summary.json").write_text(json.dumps({"pairs": 15, "parsed": 15}))
    res = write_report(d)
    assert res["kind"] == "label" and res["plots"] == ["p_hist", "judge_fitness", "principles"]
    page = _check_report(res)
    assert "overconfident labels" in page and "response A" in page and "q0" in page


def test_report_rm_run(tmp_path):
    d = tmp_path / "rm"
    _jsonl(d / "metrics.jsonl", [{"step": s, "epoch": 0, "loss": 0.7 - 0.05 * s, "rewards/accuracies": 0.5 + 0.04 * s,
                                  "eval_accuracy": 0.6 if s == 4 else None} for s in range(1, 6)])
    (d / "final").mkdir()
    (d / "final" / "pofe_reward_model.json").write_text("{}")
    table = [{"bin": [b / 10, (b + 1) / 10], "n": 4, "mean_pred": b / 10 + 0.05, "mean_label": b / 10 + 0.02} for b in range(10)]
    (d / "summary.json").write_text(json.dumps({"train_pairs": 40, "eval_before": {"n": 20, "n_decided": 20, "accuracy": 0.5},
                                                "eval": {"n": 20, "n_decided": 20, "accuracy": 0.8, "ece": 0.03,
                                                         "reliability": table}}))
    res = write_report(d)
    assert res["kind"] == "rm" and res["plots"] == ["loss", "accuracy", "eval_accuracy", "calibration"]
    _check_report(res)


def test_report_rl_run(tmp_path):
    d = tmp_path / "rl"
    rows = [{"step": s, "objective/scores": 0.1 * s, "objective/scores_std": 0.1, "objective/kl": 0.01,
             "objective/kl_k3": 0.01, "length": 20.0 + s,
             "judge": {"top_of_scale_share": 0.8 if s == 6 else 0.1}} for s in range(1, 7)]
    _jsonl(d / "metrics.jsonl", rows)
    (d / "summary.json").write_text(json.dumps({"algo": "rloo", "eval_before": {"reward": 0.1, "n": 8},
                                                "eval_after": {"reward": 0.5, "n": 8}}))
    res = write_report(d)
    assert res["kind"] == "rl" and res["plots"] == ["reward", "kl", "length", "eval"]
    page = _check_report(res)
    assert "80% of samples at step 6" in page


def test_report_cai_revise_run(tmp_path):
    d = tmp_path / "cai"
    _jsonl(d / "revisions.jsonl", [{"prompt": f"p{i}", "original": "Sure, here is how." * (i + 1),
                                    "final": "I can't help with that.", "rounds": [], "set": "red-team"} for i in range(4)]
           + [{"prompt": "b", "original": "Blue.", "final": "Blue.", "rounds": [], "set": "benign"}])
    (d / "summary.json").write_text(json.dumps({
        "principle_counts": {"harm-1": 3, "harm-2": 1},
        "refusal": {"original": {"harmful_refusal_rate": 0.0, "over_refusal_rate": 0.0},
                    "revised": {"harmful_refusal_rate": 1.0, "over_refusal_rate": 0.0}}}))
    res = write_report(d)
    assert res["kind"] == "cai-revise" and res["plots"] == ["lengths", "refusal", "principles"]
    page = _check_report(res)
    assert "I can&#x27;t help with that." in page


def test_report_audit_folder_and_file(tmp_path):
    from pofe.evaluation.audit import AuditConfig, run_audit, write_audit
    from pofe.evaluation.sim import PlantedJudge, PlantedWorld

    world = PlantedWorld(80, seed=0)
    rep = run_audit(PlantedJudge(world), world.items, AuditConfig(contrast_limit=5))
    write_audit(rep, tmp_path / "aud" / "audit.json")
    res = write_report(tmp_path / "aud")
    assert res["kind"] == "audit" and res["plots"] == ["reliability", "length_curve"]
    page = _check_report(res)
    assert "Audit report" in page and "Cohen" in page
    assert write_report(tmp_path / "aud" / "audit.json", tmp_path / "o2")["plots"] == ["reliability", "length_curve"]


def test_the_command_comes_from_run_json_not_from_the_files(tmp_path):
    """A folder names the command that wrote it (run.json); the file guess is only for older folders."""
    import json as _json

    from pofe.evaluation.report import detect_kind, load_run

    d = tmp_path / "r"
    d.mkdir()
    # the files of an rl run (objective/kl_k3 in its metrics) ...
    (d / "metrics.jsonl").write_text(_json.dumps({"step": 1, "loss": 0.5, "objective/kl_k3": 0.1}) + "\n")
    assert detect_kind(load_run(d)) == "rl"  # no run.json: guessed
    # ... in a folder whose run.json says sft: the report believes run.json
    (d / "run.json").write_text(_json.dumps({"format": 1, "command": "sft"}))
    run = load_run(d)
    assert run.kind == "sft"
    assert write_report(d)["kind"] == "sft"


def test_report_online_offpolicy_gap_figure(tmp_path):
    """OAIF Appendix B's two curves (fresh samples, offline responses) in one figure, and how often
    the fresh curve is above."""
    d = tmp_path / "online"
    rows = [{"step": s, "loss": 0.7, "offpolicy/logp_fresh": -1.0 - 0.1 * s, "offpolicy/logp_offline": -3.0,
             "offpolicy/gap": 2.0 - 0.1 * s} for s in range(1, 5)]
    rows.append({"step": 5, "loss": 0.7, "offpolicy/logp_fresh": -3.5, "offpolicy/logp_offline": -3.0,
                 "offpolicy/gap": -0.5})
    _jsonl(d / "metrics.jsonl", rows)
    (d / "run.json").write_text(json.dumps({"command": "online"}))
    res = write_report(d)
    assert res["kind"] == "online" and res["plots"][-1] == "offpolicy"
    page = _check_report(res)
    assert "Off-policy gap (OAIF Appendix B)" in page and "above at 4 of 5 measured steps" in page
    # a run without the diagnostic has no such figure
    assert "offpolicy" not in write_report(_synthetic_online_run(tmp_path / "plain"))["plots"]


def test_report_rl_shaping_next_to_the_audits_length_bias(tmp_path):
    d = tmp_path / "rl"
    rows = [{"step": s, "objective/scores": 0.1, "objective/kl": 0.01, "objective/kl_k3": 0.01, "length": 20.0,
             "reward/shaping_abs": 0.05 * s, "reward/shaping_length_abs": 0.05 * s} for s in range(1, 4)]
    _jsonl(d / "metrics.jsonl", rows)
    audit = {"path": "audit.json", "judge": "llm:x", "length_correlation": 0.31, "length_slope": 1.25,
             "longer_preferred_rate": 0.8, "human_longer_preferred_rate": 0.55, "p_prefers_lists": None}
    (d / "summary.json").write_text(json.dumps({"algo": "rloo", "shaping": {"length": -0.01, "lists": 0.0},
                                                "audit": audit}))
    res = write_report(d)
    assert res["kind"] == "rl" and "shaping" in res["plots"]
    page = _check_report(res)
    assert "coefficients: length -0.01 per token, lists 0.0 per list item" in page
    assert ("measured: length correlation (Somers&#x27; D) 0.310, length slope 1.25 logit per sd, picks the longer "
            "response 0.800 (humans 0.550), P(prefers lists) not measured") in page
    (d / "summary.json").write_text(json.dumps({"algo": "rloo", "shaping": {"length": -0.01, "lists": 0.0}}))
    page = _check_report(write_report(d))
    assert "not gated by an audit (--require-audit)" in page
