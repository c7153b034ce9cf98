"""Hub-ready outputs (issue 40, point 5): ``final/README.md`` (the model card) from the driver for
every command that writes ``final/``, ``run.push_to_hub`` / ``--push-to-hub`` and ``pofe export
--push-to-hub`` against a loopback stand-in of the Hub (``tests/_hub_standin.py``) that records
what was uploaded, and the tracker keys checked before any run folder exists."""

from __future__ import annotations

import json
import sys

import pytest
import yaml
from _hub_standin import HubStandIn, point_hub_at
from typer.testing import CliRunner

from pofe.config import ConfigError, PofeConfig, load_config
from pofe.hub import (
    HubConfigError,
    HubPushError,
    check_push,
    headline,
    model_card,
    push,
)
from pofe.recipe import CheckpointConfig, Recipe, drive
from pofe.runs import RunConfig, untrusted_settings
from pofe.runtime.tracking import LogConfig, TrackerMissing, check_trackers

SUMMARY = {"command": "online", "run_dir": "/runs/online-7", "steps": 4, "seconds": 3.0, "loss_first": 0.6931,
           "loss_last": 0.5, "trained_pairs": 8,
           "eval": {"winrate_vs_init": 0.75, "winrate_vs_init_ci95": [0.3, 0.95]}}
MANIFEST = {"pofe_version": "0.1.0", "config_sha256": "ab" * 32,
            "inputs": [{"key": "data.prompts", "path": "prompts.txt", "sha256": "cd" * 32}]}
CONFIG = {"model": {"name": "smollm2-135m-instruct"}, "judge": {"kind": "llm", "model": "smollm2-135m-instruct",
                                                                "template": "helpful-short"}}


def _front(card: str) -> dict:
    head, sep, _ = card.partition("\n---\n")
    assert head.startswith("---\n") and sep
    return yaml.safe_load(head[4:])


def test_card_front_matter_names_the_base_model_and_tags():
    card = model_card(command="online", config=CONFIG, manifest=MANIFEST, summary=SUMMARY)
    assert _front(card) == {"base_model": "HuggingFaceTB/SmolLM2-135M-Instruct", "library_name": "transformers",
                            "pipeline_tag": "text-generation", "tags": ["pofe", "online"]}
    lines = card.splitlines()
    assert "`smollm2-135m-instruct` (the embedded GGUF of `HuggingFaceTB/SmolLM2-135M-Instruct`)" in lines
    assert "pofe online --config config.yaml" in lines
    assert "| `data.prompts` | `prompts.txt` | `cdcdcdcdcdcdcdcd` |" in lines
    assert "kind `llm`, model `smollm2-135m-instruct`, template `helpful-short`" in lines
    assert "Audit: not gated (the run was started without `--require-audit`)." in lines
    # the headline metrics with their Wilson interval where the summary has one
    assert "| win rate vs the initial policy | 0.75 | [0.3, 0.95] |" in lines
    assert "| loss (first step) | 0.6931 |  |" in lines
    assert "| pairs trained on | 8 |  |" in lines
    assert "- pofe version: `0.1.0`" in lines
    assert f"- config sha256: `{'ab' * 32}` (the run folder's `config.yaml`)" in lines


def test_card_states_the_audit_it_was_gated_on():
    audit = {"report": "audit.json", "passed": True, "judge": "llm:helpful-short", "calibration_sha256": "ef" * 32}
    card = model_card(command="online", config=CONFIG, manifest=MANIFEST, summary=SUMMARY, audit=audit)
    assert ("Audit: **passed** (`--require-audit audit.json`, judge `llm:helpful-short`, calibration set sha256 "
            "`efefefefefefefef`).") in card.splitlines()


def test_untrusted_text_never_reaches_the_front_matter():
    evil = "./m\n---\nbase_model: attacker/model\nlicense: mit"
    card = model_card(command="sft", config={"model": {"name": evil}}, manifest={}, summary={"steps": 1})
    # a path (not a Hub id) is no base_model; the name is one escaped line of the body
    assert _front(card) == {"library_name": "transformers", "pipeline_tag": "text-generation", "tags": ["pofe", "sft"]}
    assert "`./m --- base_model: attacker/model license: mit`" in card.splitlines()


def test_headline_of_a_command_without_a_table_is_its_top_level_numbers():
    assert headline("toy", {"command": "toy", "steps": 4, "seconds": 1.0, "mse": 0.25, "note": "x"}) == [("mse", 0.25, None)]


def test_push_uploads_exactly_the_folder(tmp_path, monkeypatch):
    final = tmp_path / "final"
    (final / "adapter").mkdir(parents=True)
    files = {"README.md": model_card(command="sft", config={"model": {"name": "org/base"}}, manifest=MANIFEST,
                                     summary={"steps": 2}).encode(),
             "config.json": b'{"model_type": "llama"}', "model.safetensors": bytes(range(256)) * 8,
             "adapter/adapter_config.json": b"{}"}
    for rel, data in files.items():
        (final / rel).write_bytes(data)
    with HubStandIn() as hub:
        point_hub_at(monkeypatch, hub)
        out = push(final, "me/tiny-sft")
    assert hub.repos == [("model", "me/tiny-sft")]
    assert hub.files == {("model", "me/tiny-sft"): files}
    assert hub.validated == [files["README.md"].decode()]  # the card's front matter passed the Hub's check
    assert out["repo"] == "me/tiny-sft" and out["url"] == f"{hub.url}/me/tiny-sft" and len(out["commit"]) == 40


def test_a_failed_push_is_one_line_naming_the_repo_and_keeps_the_folder(tmp_path, monkeypatch):
    final = tmp_path / "final"
    final.mkdir()
    (final / "config.json").write_text("{}")
    with HubStandIn() as hub:
        point_hub_at(monkeypatch, hub)
        hub.fail = 403
        with pytest.raises(HubPushError) as e:
            push(final, "me/x")
    assert str(e.value).startswith("push to the Hugging Face Hub repo me/x failed (HTTP 403: ")
    assert str(e.value).endswith(f"{final} is complete locally: push it later with `hf upload me/x {final}`")
    assert "\n" not in str(e.value) and e.value.exit_code == 1
    assert (final / "config.json").read_text() == "{}"


def test_a_push_that_cannot_happen_is_refused_before_the_run(monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(HubConfigError, match=r"^run.push_to_hub me/x: HF_HUB_OFFLINE is set, so nothing can be pushed"):
        check_push("me/x")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setattr("huggingface_hub.get_token", lambda: None)
    with pytest.raises(HubConfigError) as e:
        check_push("me/x")
    assert str(e.value) == "run.push_to_hub me/x: no Hugging Face token (set HF_TOKEN or run `hf auth login`)"


def test_push_to_hub_is_a_repo_id_and_never_taken_silently_from_a_run_folder(tmp_path):
    assert RunConfig(push_to_hub="me/model-1").push_to_hub == "me/model-1"
    bad = tmp_path / "c.yaml"
    bad.write_text("run:\n  push_to_hub: ../etc\n")
    with pytest.raises(ConfigError, match=r"run.push_to_hub.*'../etc' is not a Hugging Face repo id"):
        load_config(Toy, bad)
    # a received run folder's config must not upload its model anywhere on --resume
    assert ("run.push_to_hub", "me/m") in untrusted_settings(Toy(run=RunConfig(push_to_hub="me/m")))


# ----------------------------------------------------------------------------- on the driver

class Toy(PofeConfig):
    checkpoint: CheckpointConfig = CheckpointConfig()
    log: LogConfig = LogConfig(progress=False, tensorboard=False)
    run: RunConfig = RunConfig()
    seed: int = 0


class ToyRecipe(Recipe):
    """Two steps of nothing; ``final/`` is one file (the driver owns the card and the push)."""

    command = "toy"

    def setup(self, run):
        self.total_steps = 2

    def step(self, step):
        return {"mse": 1.0 / step}

    def save_final(self, out):
        from pofe.runtime.checkpoints import FINAL_MARKER

        out.mkdir()
        (out / "weights.bin").write_bytes(b"\x00\x01")
        (out / FINAL_MARKER).write_text(json.dumps({"files": {"weights.bin": 2}}))  # whole: a resume keeps it
        return out

    def summary(self, history):
        return {"mse": history[-1]["mse"]}


class NoWeights(ToyRecipe):
    writes_final = False


def test_the_driver_writes_the_card_then_pushes_final(tmp_path, monkeypatch):
    with HubStandIn() as hub:
        point_hub_at(monkeypatch, hub)
        s = drive(ToyRecipe(Toy(run=RunConfig(output_dir=str(tmp_path), name="t", push_to_hub="me/toy"))))
    final = tmp_path / "t" / "final"
    card = (final / "README.md").read_text()
    assert "| mse | 0.5 |  |" in card.splitlines()
    assert hub.files == {("model", "me/toy"): {"weights.bin": b"\x00\x01", "README.md": card.encode(),
                                               "pofe_final.json": b'{"files": {"weights.bin": 2}}'}}
    assert s["hub"]["repo"] == "me/toy"
    assert json.loads((tmp_path / "t" / "summary.json").read_text())["hub"] == s["hub"]


def test_a_failed_push_leaves_the_run_folder_complete(tmp_path, monkeypatch):
    with HubStandIn() as hub:
        point_hub_at(monkeypatch, hub)
        hub.fail = 500
        with pytest.raises(HubPushError, match=r"^push to the Hugging Face Hub repo me/toy failed \(HTTP 500"):
            drive(ToyRecipe(Toy(run=RunConfig(output_dir=str(tmp_path), name="t", push_to_hub="me/toy"))))
    run = tmp_path / "t"
    assert json.loads((run / "summary.json").read_text())["mse"] == 0.5
    assert (run / "final" / "README.md").is_file() and (run / "final" / "weights.bin").read_bytes() == b"\x00\x01"
    # --resume of the finished run retries the push: nothing is recomputed, final/ goes up as it is
    with HubStandIn() as hub:
        point_hub_at(monkeypatch, hub)
        s = drive(ToyRecipe(Toy(run=RunConfig(output_dir=str(tmp_path), name="t", push_to_hub="me/toy"))), resume=run)
    assert s["steps_run"] == 0 and s["hub"]["repo"] == "me/toy"
    assert hub.files[("model", "me/toy")]["weights.bin"] == b"\x00\x01"


def test_push_from_a_command_without_final_is_refused_before_anything(tmp_path):
    with pytest.raises(HubConfigError) as e:
        drive(NoWeights(Toy(run=RunConfig(output_dir=str(tmp_path), push_to_hub="me/toy"))))
    assert str(e.value) == "run.push_to_hub me/toy: pofe toy writes no final/ model to push"
    assert list(tmp_path.iterdir()) == []


# ----------------------------------------------------------------------------- trackers

def test_a_missing_tracker_package_is_refused_before_the_run_folder(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # as if not installed
    with pytest.raises(TrackerMissing) as e:
        drive(ToyRecipe(Toy(log=LogConfig(progress=False, tensorboard=False, wandb=True),
                            run=RunConfig(output_dir=str(tmp_path)))))
    assert str(e.value) == "tracker wandb needs the wandb package: pip install wandb" and e.value.exit_code == 2
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setitem(sys.modules, "mlflow", None)
    with pytest.raises(TrackerMissing, match="^tracker mlflow needs the mlflow package: pip install mlflow$"):
        check_trackers(LogConfig(mlflow=True))


def test_tracker_keys_are_typed_and_need_their_tracker(tmp_path):
    cfg = LogConfig(wandb=True, wandb_project="p", wandb_entity="team", wandb_tags=["a", "b"], wandb_group="g",
                    mlflow=True, mlflow_experiment="exp")
    assert (cfg.wandb_project, cfg.wandb_entity, cfg.wandb_tags, cfg.wandb_group, cfg.mlflow_experiment) == (
        "p", "team", ["a", "b"], "g", "exp")
    path = tmp_path / "c.yaml"
    path.write_text("log:\n  wandb_entity: team\n")
    with pytest.raises(ConfigError, match=r"log.wandb_entity is set but log.wandb is false \(set log.wandb: true\)"):
        load_config(Toy, path)
    path.write_text("log:\n  wandb: true\n  wandb_tags: oops\n")
    with pytest.raises(ConfigError, match=r"log.wandb_tags"):
        load_config(Toy, path)
    path.write_text("log:\n  mlflow: true\n  mlflow_experiment: \"a\\nb\"\n")
    with pytest.raises(ConfigError, match=r"log.mlflow_experiment 'a\\nb': must be a non-empty name on one line"):
        load_config(Toy, path)


def test_sink_passes_the_wandb_and_mlflow_keys(tmp_path, monkeypatch):
    import types

    from pofe.runtime.tracking import MetricsSink

    calls = {}
    wandb = types.SimpleNamespace(init=lambda **kw: calls.setdefault("wandb", kw) and types.SimpleNamespace(
        log=lambda *a, **k: None, finish=lambda: None))
    mlflow = types.SimpleNamespace(set_experiment=lambda name: calls.setdefault("experiment", name),
                                   start_run=lambda run_name: calls.setdefault("run_name", run_name),
                                   log_metrics=lambda *a, **k: None, end_run=lambda: None)
    monkeypatch.setitem(sys.modules, "wandb", wandb)
    monkeypatch.setitem(sys.modules, "mlflow", mlflow)
    log = LogConfig(tensorboard=False, wandb=True, wandb_project="p", wandb_entity="team", wandb_tags=["x"],
                    wandb_group="g", mlflow=True, mlflow_experiment="exp")
    sink = MetricsSink(tmp_path, log, config={"a": 1})
    sink.close()
    assert {k: calls["wandb"][k] for k in ("project", "entity", "tags", "group", "name")} == {
        "project": "p", "entity": "team", "tags": ["x"], "group": "g", "name": tmp_path.name}
    assert calls["experiment"] == "exp" and calls["run_name"] == tmp_path.name


# ----------------------------------------------------------------------------- pofe export --push-to-hub

def test_export_pushes_its_file_to_a_dataset_repo(tmp_path, monkeypatch):
    from pofe.cli.main import app

    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(json.dumps({"prompt": "Q?", "chosen": "good", "rejected": "bad", "p": 0.8}) + "\n")
    out = tmp_path / "trl.jsonl"
    with HubStandIn() as hub:
        point_hub_at(monkeypatch, hub)
        res = CliRunner().invoke(app, ["export", str(pairs), "-o", str(out), "--push-to-hub", "me/pairs"])
    assert res.exit_code == 0, res.output
    assert hub.repos == [("dataset", "me/pairs")]
    assert hub.files == {("dataset", "me/pairs"): {"trl.jsonl": out.read_bytes()}}
    assert f"pushed to {hub.url}/me/pairs" in res.output.splitlines()


def test_cli_refusals_come_before_any_run_folder(tmp_path, monkeypatch):
    from pofe.cli.main import app

    ift = tmp_path / "ift.jsonl"
    ift.write_text(json.dumps({"prompt": "Q?", "response": "A."}) + "\n")
    runs = tmp_path / "runs"
    base = ["sft", "--ift", str(ift), "--output-dir", str(runs), "--steps", "1"]
    monkeypatch.setitem(sys.modules, "wandb", None)
    res = CliRunner().invoke(app, [*base, "--set", "log.wandb=true"])
    assert (res.exit_code, res.output.strip()) == (2, "error: tracker wandb needs the wandb package: pip install wandb")
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    res = CliRunner().invoke(app, [*base, "--push-to-hub", "me/sft"])
    assert res.exit_code == 2
    assert res.output.strip() == ("error: run.push_to_hub me/sft: HF_HUB_OFFLINE is set, so nothing can be pushed "
                                  "(unset it, or drop run.push_to_hub)")
    res = CliRunner().invoke(app, [*base, "--push-to-hub", "not a repo"])
    assert res.exit_code == 2 and "'not a repo' is not a Hugging Face repo id" in res.output
    assert not runs.exists()  # refused before the run folder's parent was even made
