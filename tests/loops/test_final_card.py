"""Every training command that writes ``final/`` leaves its model card ``final/README.md`` (the
driver writes it: :func:`pofe.recipe.write_card`), and ``pofe sft --push-to-hub`` uploads exactly
``final/`` to a loopback stand-in of the Hub. End-to-end tier: each command runs on the tiny
random model (10-20 s each on a 2-core CPU), the push test as a real ``pofe`` process."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest
import yaml
from _hub_standin import HubStandIn
from invariants import configs as C

from pofe.config_docs import config_class

pytestmark = pytest.mark.slow

MODULES = {"online": "online", "sft": "sft", "rm": "rm", "rl": "rl", "self-reward": "self_reward"}


@pytest.mark.parametrize("command", sorted(MODULES))
def test_final_has_a_model_card(command, tmp_path, tiny_model_dir):
    cfg = config_class(command).model_validate(C.COMMANDS[command].config(tmp_path, tiny_model_dir, "r"))
    summary = importlib.import_module(f"pofe.loops.{MODULES[command]}").run(cfg)
    card = (Path(summary["final_model"]) / "README.md").read_text()
    head = yaml.safe_load(card.split("\n---\n")[0].removeprefix("---\n"))
    assert head["tags"][:2] == ["pofe", command] and head["library_name"] == "transformers"
    assert "base_model" not in head  # the tiny model is a local folder, not a Hub id
    manifest = json.loads((tmp_path / "r" / "run.json").read_text())
    lines = card.splitlines()
    assert f"`{tiny_model_dir}`" in lines
    assert f"- config sha256: `{manifest['config_sha256']}` (the run folder's `config.yaml`)" in lines
    assert f"- pofe version: `{manifest['pofe_version']}`" in lines
    assert "| metric | value | 95% interval |" in lines


def test_sft_push_to_hub_uploads_final(tmp_path, tiny_model_dir):
    from _cli import pofe

    cfg = C.sft(tmp_path, tiny_model_dir, "pushed", {"train.steps": 1, "checkpoint.every": 0})
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    with HubStandIn() as hub:
        res = pofe("sft", "--config", str(tmp_path / "c.yaml"), "--push-to-hub", "me/tiny-sft",
                   HF_ENDPOINT=hub.url, HF_TOKEN=hub.token, HF_HUB_OFFLINE="0")
    assert res.returncode == 0, res.stderr
    final = tmp_path / "pushed" / "final"
    want = {str(p.relative_to(final)): p.read_bytes() for p in sorted(final.rglob("*")) if p.is_file()}
    assert "README.md" in want and "model.safetensors" in want
    assert hub.files == {("model", "me/tiny-sft"): want}
    assert f"pushed to {hub.url}/me/tiny-sft" in res.stdout.splitlines()
