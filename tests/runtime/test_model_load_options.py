"""``model.revision`` and ``model.attn_implementation`` (issue 40, point 5): checked when the config
is parsed, and passed to ``from_pretrained`` by the one loader path."""

from __future__ import annotations

import pytest

from pofe.config import ConfigError, load_config
from pofe.errors import ModelError
from pofe.loops.sft import SFTConfig
from pofe.models import load_model
from pofe.runtime.model import ModelConfig, load_policy


def _load(tmp_path, text: str) -> SFTConfig:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return load_config(SFTConfig, path)


def test_revision_is_for_hub_ids_only(tmp_path, tiny_model_dir):
    cfg = ModelConfig(name="org/some-model", revision="v1.0", attn_implementation="sdpa")
    assert cfg.load_kwargs() == {"revision": "v1.0", "attn_implementation": "sdpa"}
    assert ModelConfig(name="org/some-model").load_kwargs() == {}
    with pytest.raises(ConfigError, match=rf"model.revision 'main' picks a version of a Hugging Face Hub repo; "
                                          rf"model.name '{tiny_model_dir}' is a local folder \(drop model.revision\)"):
        _load(tmp_path, f"model:\n  name: {tiny_model_dir}\n  revision: main\n")
    with pytest.raises(ConfigError, match=r"model.name 'smollm2-135m-instruct' is an embedded model"):
        _load(tmp_path, "model:\n  revision: main\n")
    # a library caller that passes a revision for a folder gets the same refusal from the loader
    with pytest.raises(ModelError, match=r"a revision \('main'\) picks a version of a Hugging Face Hub repo"):
        load_model(str(tiny_model_dir), revision="main")


def test_attn_implementation_is_one_of_transformers_kernels(tmp_path):
    with pytest.raises(ConfigError, match=r"model.attn_implementation"):
        _load(tmp_path, "model:\n  attn_implementation: fast\n")


def test_the_tiny_model_loads_with_eager_attention(tiny_model_dir):
    model, _ = load_policy(ModelConfig(name=str(tiny_model_dir), attn_implementation="eager", device="cpu"))
    assert model.config._attn_implementation == "eager"


def test_flash_attention_without_its_package_is_one_line(tiny_model_dir, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "flash_attn" else real(name, *a))
    with pytest.raises(ModelError) as e:
        load_policy(ModelConfig(name=str(tiny_model_dir), attn_implementation="flash_attention_2", device="cpu"))
    assert str(e.value) == ("model.attn_implementation flash_attention_2 needs the flash-attn package and a CUDA GPU "
                            "(pip install flash-attn; or use sdpa or eager)")
