"""A LoRA policy saves without asking the Hub about its base model: peft's default looked the
embedded model's name up online at every checkpoint (a network call, and "Unable to fetch
remote file ... Name or service not known" offline)."""

from __future__ import annotations

import json
import warnings

import pytest


@pytest.mark.parametrize("how", ["new-adapter", "reward-model"])
def test_lora_save_asks_no_hub(how, tokenizer, tmp_path, monkeypatch):
    import peft.utils.other as peft_other

    from pofe.models import tiny_causal_lm
    from pofe.runtime.model import LoraSettings, apply_lora

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)  # the check is skipped offline; a user is online
    asked = []
    monkeypatch.setattr(peft_other, "file_exists", lambda repo, name, **kw: asked.append((repo, name)) or True)
    from pofe.runtime.model import ModelConfig

    if how == "new-adapter":
        model = tiny_causal_lm(tokenizer)
    else:
        from pofe.loops.rm.reward_model import tiny_reward_model

        model = tiny_reward_model(tokenizer)
    model.name_or_path = model.config._name_or_path = "smollm2-135m-instruct"  # as load_model names it
    if how == "new-adapter":
        model = apply_lora(model, LoraSettings(enabled=True, r=2, alpha=4))
    else:
        from pofe.loops.rm.reward_model import wrap_reward_model

        model = wrap_reward_model(model, ModelConfig(lora={"enabled": True, "r": 2, "alpha": 4}))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        model.save_pretrained(tmp_path / "adapter")
    assert asked == []
    assert [str(w.message) for w in seen if "remote file" in str(w.message) or "config file" in str(w.message)] == []
    saved = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert saved["base_model_name_or_path"] == "smollm2-135m-instruct"  # still the portable name
