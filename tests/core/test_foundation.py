"""Models, records, run folders, generation."""

import json

import pytest

from pofe.generation import SamplingConfig, generate
from pofe.models import DEFAULT_MODEL, apply_chat_template, embedded_gguf_path, load_model
from pofe.records import PreferencePair
from pofe.runs import JsonlWriter, RunConfig, new_run_dir, read_jsonl, write_config


def test_embedded_gguf_is_shipped():
    p = embedded_gguf_path(DEFAULT_MODEL)
    assert p.suffix == ".gguf" and p.stat().st_size > 50_000_000


def test_unknown_embedded_name():
    with pytest.raises(ValueError, match="not an embedded model"):
        embedded_gguf_path("gpt-7")


def test_load_local_dir_and_chat_template(tiny_model_dir):
    model, tok = load_model(str(tiny_model_dir))
    assert model.config.num_hidden_layers == 2
    assert tok.pad_token is not None
    text = apply_chat_template(tok, "hi")
    assert "hi" in text and text != "hi"  # SmolLM2's template wraps the message


def test_missing_local_model_is_clear(tmp_path):
    with pytest.raises(Exception) as e:
        load_model(str(tmp_path / "nope"))
    assert "nope" in str(e.value)


def test_generate_keeps_ids_and_is_seeded(tiny_model, tokenizer):
    s = SamplingConfig(max_new_tokens=5, temperature=1.0)
    a = generate(tiny_model, tokenizer, ["one", "two three"], n=2, sampling=s, seed=3)
    b = generate(tiny_model, tokenizer, ["one", "two three"], n=2, sampling=s, seed=3)
    assert [[c.token_ids for c in g] for g in a] == [[c.token_ids for c in g] for g in b]
    assert len(a) == 2 and all(len(g) == 2 for g in a)
    c = a[1][0]
    assert c.prompt == "two three" and 1 <= c.num_tokens <= 5 and c.prompt_token_ids
    assert tokenizer.decode(c.prompt_token_ids).count("two three") == 1


def test_preference_pair_validates_and_roundtrips():
    p = PreferencePair("x", "a", "b", p=0.7, provenance={"judge": "length"})
    assert PreferencePair.from_dict(json.loads(json.dumps(p.to_dict()))) == p
    with pytest.raises(ValueError):
        PreferencePair("x", "a", "b", p=1.2)


def test_run_dirs_never_collide(tmp_path):
    cfg = RunConfig(output_dir=str(tmp_path), name="r")
    d1 = new_run_dir(cfg, "online")
    write_config(d1, cfg)
    d2 = new_run_dir(cfg, "online")
    assert d1 != d2 and d2.name == "r-2"
    assert (d1 / "config.yaml").read_text().startswith("output_dir")


def test_jsonl_writer_and_torn_last_line(tmp_path):
    f = tmp_path / "m.jsonl"
    with JsonlWriter(f) as w:
        w.write({"step": 1, "loss": float("nan")})
        w.write({"step": 2})
    with open(f, "a") as fh:
        fh.write('{"step": 3, "lo')  # a crash mid-write
    rows = read_jsonl(f)
    assert rows == [{"step": 1, "loss": None}, {"step": 2}]


def test_greedy_with_several_samples_repeats_the_greedy_answer(tiny_model, tokenizer):
    s = SamplingConfig(max_new_tokens=4, temperature=0.0)
    out = generate(tiny_model, tokenizer, ["a", "b c"], n=3, sampling=s)
    for g in out:
        assert len(g) == 3 and len({c.token_ids for c in g}) == 1


# ----------------------------------------------------------------------------- model names, devices, adapters

def test_typo_hub_name_fails_fast_and_offline(monkeypatch):
    """A typo'd model name must not retry the hub for tens of seconds. Offline, a hub id that is not
    in the local cache is one clear error, and no request is made."""
    from pofe.models import ModelError, resolve_model_path

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import huggingface_hub

    def no_network(*a, **k):
        raise AssertionError("the hub was contacted")

    monkeypatch.setattr(huggingface_hub.HfApi, "model_info", no_network)
    with pytest.raises(ModelError, match=r"'HuggingFaceTB/SmolLM2-135M-Instrukt'.*HF_HUB_OFFLINE"):
        resolve_model_path("HuggingFaceTB/SmolLM2-135M-Instrukt")


def test_unreachable_hub_is_one_error_not_retries(monkeypatch):
    from pofe.models import ModelError, resolve_model_path

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    import huggingface_hub

    calls = []

    def down(self, repo_id, **k):
        calls.append(repo_id)
        raise ConnectionError("network unreachable")

    monkeypatch.setattr(huggingface_hub.HfApi, "model_info", down)
    with pytest.raises(ModelError, match="unreachable"):
        resolve_model_path("someorg/some-model")
    assert calls == ["someorg/some-model"]  # one look-up, no retry loop


@pytest.mark.parametrize("name", ["./no/such/model", "/no/such/model", "runs/sft-1/final", "~/nope"])
def test_local_paths_are_never_tried_as_hub_ids(monkeypatch, name):
    from pofe.models import ModelError, resolve_model_path

    import huggingface_hub

    monkeypatch.setattr(huggingface_hub.HfApi, "model_info", lambda *a, **k: pytest.fail("hub contacted"))
    with pytest.raises(ModelError, match="no such directory"):
        resolve_model_path(name)


def test_folder_without_config_is_clear(tmp_path):
    from pofe.models import ModelError, resolve_model_path

    with pytest.raises(ModelError, match="no config.json"):
        resolve_model_path(str(tmp_path))


def test_resolve_device(monkeypatch):
    import torch

    from pofe.models import DeviceUnavailable, resolve_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    assert resolve_device("auto") == "cpu" and resolve_device("cpu") == "cpu"
    with pytest.raises(DeviceUnavailable, match="model.device=cuda"):
        resolve_device("cuda")
    with pytest.raises(DeviceUnavailable, match="MPS"):
        resolve_device("mps")
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    assert resolve_device("auto") == "mps"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("auto") == "cuda"  # CUDA first, then MPS


def test_load_policy_honours_model_device(monkeypatch, tiny_model_dir):
    """model.device reaches the loaded weights: the device resolution is redirected to the
    ``meta`` device (no accelerator here), and the policy's parameters must land there."""
    import pofe.models as M
    from pofe.runtime import ModelConfig, load_policy

    asked = []

    def fake_resolve(device):
        asked.append(device)
        return "meta"

    monkeypatch.setattr(M, "resolve_device", fake_resolve)
    model, _ = load_policy(ModelConfig(name=str(tiny_model_dir), device="cuda"))
    assert asked == ["cuda"]
    assert {p.device.type for p in model.parameters()} == {"meta"}


@pytest.mark.slow
def test_loaded_model_records_the_name_not_the_cache_path(monkeypatch, tiny_model_dir, tmp_path):
    """An adapter saved from the embedded model must name the *model*, not
    this machine's cache folder, and carry its tokenizer; load_model reads it back."""
    import torch

    import pofe.models as M
    from pofe.runtime import LoraSettings, ModelConfig, load_policy, save_final

    monkeypatch.setitem(M.EMBEDDED_MODELS, "tiny-embedded", ("nope", "nope.gguf"))
    monkeypatch.setattr(M, "ensure_embedded_cache", lambda name=None: tiny_model_dir)
    policy, tok = load_policy(ModelConfig(name="tiny-embedded", lora=LoraSettings(enabled=True, r=2)))
    with torch.no_grad():
        for n, p in policy.named_parameters():
            if "lora_B" in n:
                p.add_(0.05)  # a non-zero adapter, so loading it back is observable
    out = save_final(policy, tok, tmp_path / "final")
    cfg = json.loads((out / "adapter" / "adapter_config.json").read_text())
    assert cfg["base_model_name_or_path"] == "tiny-embedded"
    assert (out / "adapter" / "tokenizer_config.json").is_file()
    # read back from the adapter folder alone: base by name + adapter, same outputs as the merged copy
    back, tok2 = load_model(str(out / "adapter"))
    merged, _ = load_model(str(out))
    ids = torch.tensor([tok2("hello there").input_ids])
    with torch.no_grad():
        a, b, c = back(ids).logits, merged(ids).logits, policy.eval()(ids).logits
    assert torch.allclose(a, c, atol=1e-5) and torch.allclose(b, c, atol=1e-5)


def test_model_adapter_continues_training_an_existing_adapter(tiny_model_dir, tmp_path, tokenizer):
    import torch

    from pofe.runtime import LoraSettings, ModelConfig, Reference, load_policy, save_final

    first, tok = load_policy(ModelConfig(name=str(tiny_model_dir), lora=LoraSettings(enabled=True, r=2)))
    with torch.no_grad():
        for n, p in first.named_parameters():
            if "lora_B" in n:
                p.fill_(0.01)
    save_final(first, tok, tmp_path / "final")
    cont, _ = load_policy(ModelConfig(name=str(tiny_model_dir), adapter=str(tmp_path / "final" / "adapter")))
    trained = {n: p for n, p in cont.named_parameters() if p.requires_grad}
    assert trained and all("lora_" in n for n in trained)
    assert all(torch.all(p == 0.01) for n, p in trained.items() if "lora_B" in n)
    # the reference is the starting policy (base + adapter), not the bare base model
    ref = Reference(cont, lora=False)
    ids = torch.tensor([tokenizer("x y z").input_ids])
    with ref.model() as m, torch.no_grad():
        assert torch.allclose(m(ids).logits, first.eval()(ids).logits, atol=1e-6)


# Model loads that do not pass ``model.device`` yet, each owned by the helper
# converting that command to a ``model:`` section. The test fails both when a new load ignores
# the device and when one listed here is fixed (then remove it from the list).
DEVICE_PENDING: set[tuple[str, str]] = set()


def test_every_model_load_passes_the_device():
    """Static check over pofe/: every ``load_model(...)`` and every ``ModelConfig(...)`` built
    in code passes ``device=`` (``load_policy`` passes ``cfg.device`` itself)."""
    import ast
    from pathlib import Path

    import pofe

    root = Path(pofe.__file__).parent
    offenders = set()
    for path in root.rglob("*.py"):
        rel = f"pofe/{path.relative_to(root)}"
        if rel == "pofe/models.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
                if name in ("load_model", "ModelConfig") and not any(k.arg == "device" or k.arg is None for k in node.keywords):
                    if name == "ModelConfig" and not node.args and not node.keywords:
                        continue  # ModelConfig() as a field default: the user's YAML sets the device
                    offenders.add((rel, name))
    assert offenders == DEVICE_PENDING, {"new offenders": offenders - DEVICE_PENDING,
                                         "fixed, remove from DEVICE_PENDING": DEVICE_PENDING - offenders}


MODEL_COMMANDS = [  # every command that loads a model it runs (judges: see tests/judges)
    ("pofe.loops.online", "OnlineConfig"), ("pofe.loops.self_reward", "SelfRewardConfig"), ("pofe.loops.sft", "SFTConfig"),
    ("pofe.loops.rm", "RMConfig"), ("pofe.loops.rl", "RLConfig"), ("pofe.loops.label", "LabelConfig"),
    ("pofe.loops.cai_revise", "CaiReviseConfig"), ("pofe.evaluation.eval", "EvalConfig"), ("pofe.loops.chat", "ChatConfig"),
    ("pofe.loops.cai_refusal", "RefusalEvalConfig"),
]


@pytest.mark.parametrize("module,cls", MODEL_COMMANDS)
def test_every_command_accepts_model_device(module, cls):
    """``--set model.device=...`` is a key of every command that runs a model,
    validated at parse time (a typo is an error naming the key)."""
    import importlib

    from pofe.config import ConfigError, load_config

    C = getattr(importlib.import_module(module), cls)
    assert load_config(C, None, ["model.device=cpu"]).model.device == "cpu"
    with pytest.raises(ConfigError, match="model.device"):
        load_config(C, None, ["model.device=gpu0"])
