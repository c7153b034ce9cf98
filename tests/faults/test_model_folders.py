"""Model folders are untrusted input (issue 45, point 2): one loader path (``pofe.models.load_model``,
``load_tokenizer``, ``load_adapter``; ``pofe.runtime.load_policy`` on top) checks config, weights and
tokenizer before use. Each bad folder is one ``ModelError`` line naming the file, never a random
initialisation, a hang or an internal error; the base model's identity goes into ``run.json`` and a
resume refuses a changed base.

Cases that hung on the old tree (a FIFO ``config.json``, a template that loops without bound) run
the load in a daemon thread joined with a timeout, so that they fail instead of hanging there."""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from pathlib import Path

import pytest

from pofe.errors import ModelError

pytestmark = pytest.mark.faults


@pytest.fixture
def folder(tmp_path, tiny_model_dir) -> Path:
    """A copy of the tiny model folder (2 layers, hidden 32, the real 49152-token tokenizer) to damage."""
    d = tmp_path / "m"
    shutil.copytree(tiny_model_dir, d)
    return d


def _edit_config(d: Path, **kv) -> None:
    cfg = json.loads((d / "config.json").read_text())
    cfg.update(kv)
    (d / "config.json").write_text(json.dumps(cfg, indent=2))


def _refused(fn, *, within: float = 60.0) -> str:
    """``fn()`` must raise ModelError within ``within`` seconds; returns its line."""
    out: dict = {}

    def target():
        try:
            out["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - judged below
            out["error"] = e

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(within)
    assert not t.is_alive(), f"still running after {within} s (hangs)"
    err = out.get("error")
    assert isinstance(err, ModelError), f"expected a ModelError, got {err!r} / {out.get('value')!r}"
    line = str(err)
    assert "\n" not in line and err.exit_code == 2
    return line


def _load(d: Path):
    from pofe.models import load_model

    return lambda: load_model(str(d))


# ----------------------------------------------------------------------------- weights and config


def test_config_with_more_layers_than_the_weights_is_refused_never_randomly_initialised(folder):
    """config.json says 4 layers, the weights hold 2: layers 2-3 (9 weights each: q k v o, gate up
    down, two norms) used to be initialised at random and trained, exit 0."""
    _edit_config(folder, num_hidden_layers=4)
    line = _refused(_load(folder))
    assert line == (f"{folder}/model.safetensors: lacks 18 weights that {folder}/config.json describes, e.g. "
                    f"['model.layers.2.input_layernorm.weight', 'model.layers.2.mlp.down_proj.weight', "
                    f"'model.layers.2.mlp.gate_proj.weight']; pofe never initialises weights at random (a torn copy, "
                    f"or a config.json of another model?)")


def test_the_training_path_refuses_it_too(folder):
    from pofe.runtime import ModelConfig, load_policy

    _edit_config(folder, num_hidden_layers=4)
    line = _refused(lambda: load_policy(ModelConfig(name=str(folder), device="cpu")))
    assert line.startswith(f"{folder}/model.safetensors: lacks 18 weights")


def test_weights_the_config_does_not_describe_are_refused(folder):
    _edit_config(folder, num_hidden_layers=1)
    line = _refused(_load(folder))
    assert line.startswith(f"{folder}/model.safetensors: holds 9 weights the model of {folder}/config.json does not "
                           f"have, e.g. ['model.layers.1.input_layernorm.weight',")


def test_an_encoder_model_type_is_refused(folder):
    """``model_type: bert`` trained as a causal LM (transformers maps bert to BertLMHeadModel)."""
    _edit_config(folder, model_type="bert", architectures=["BertForMaskedLM"])
    assert _refused(_load(folder)) == (
        f"{folder}/config.json: model_type 'bert' is an encoder (bidirectional) model, not a causal language model; "
        f"pofe trains causal (decoder-only) language models")


def test_a_vocabulary_larger_than_the_embedding_is_refused(folder):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(folder))
    tok.add_tokens(["<extra_1>", "<extra_2>"])
    tok.save_pretrained(str(folder))
    assert _refused(_load(folder)) == (
        f"{folder}/tokenizer.json: 49154 tokens, but the model's embedding has 49152 rows (token ids from 49152 on "
        f"would index past it): a tokenizer of another model?")


# ----------------------------------------------------------------------------- torn and hostile files


def test_a_truncated_config_json_is_one_line(folder):
    (folder / "config.json").write_text('{\n  "architectures": [\n    "LlamaForCausalLM"\n  ],\n  "attention_')
    assert _refused(_load(folder)) == (f"{folder}/config.json: not valid JSON (Unterminated string starting at at "
                                       f"line 5 column 3; truncated?)")


def test_a_truncated_tokenizer_json_is_one_line(folder):
    data = (folder / "tokenizer.json").read_bytes()
    (folder / "tokenizer.json").write_bytes(data[:1000])
    line = _refused(_load(folder))
    assert line.startswith(f"{folder}/tokenizer.json: not valid JSON (") and line.endswith("; truncated?)")


def test_a_truncated_safetensors_file_is_one_line(folder):
    path = folder / "model.safetensors"
    size = path.stat().st_size
    path.write_bytes(path.read_bytes()[: size // 2])
    assert _refused(_load(folder)) == (f"{path}: its tensors end at byte {size} but the file has {size // 2} bytes "
                                       f"(truncated: a torn copy?)")


def test_a_one_tib_safetensors_header_claim_is_refused_before_any_allocation(folder):
    path = folder / "model.safetensors"
    data = bytearray(path.read_bytes())
    data[:8] = (1 << 40).to_bytes(8, "little")
    path.write_bytes(bytes(data))
    assert _refused(_load(folder)) == (f"{path}: its header claims 1099511627776 bytes but the file has {len(data)} "
                                       f"(truncated, or not a safetensors file)")


def test_a_fifo_as_config_json_is_refused_not_opened(folder):
    (folder / "config.json").unlink()
    os.mkfifo(folder / "config.json")
    assert _refused(_load(folder), within=30) == (f"{folder}/config.json: is a FIFO; a model folder's files must be "
                                                  f"regular files")


# ----------------------------------------------------------------------------- chat templates


def _template(d: Path, text: str) -> None:
    (d / "chat_template.jinja").write_text(text)


@pytest.mark.slow
def test_a_template_with_nested_range_loops_is_stopped_at_load(folder, monkeypatch):
    """Two nested ``range(100000)`` loops: each within the sandbox's cap, 10^10 iterations together."""
    import pofe.models as models

    monkeypatch.setattr(models, "TEMPLATE_SECONDS", 1.0)
    _template(folder, "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}{{ messages[0]['content'] }}")
    t0 = time.monotonic()
    line = _refused(lambda: models.load_tokenizer(str(folder)), within=30)
    assert time.monotonic() - t0 < 15
    assert line == (f"{folder}/chat_template.jinja: the chat template did not finish rendering in 1 s (a template "
                    f"that loops without bound is refused)")


def test_a_template_that_loops_only_on_some_prompts_is_stopped_at_render(folder, monkeypatch):
    """Fine on the probe at load, unbounded on one prompt: every render is bounded, not only the first."""
    import pofe.models as models

    monkeypatch.setattr(models, "TEMPLATE_SECONDS", 1.0)
    _template(folder, "{% if messages[0]['content'] == 'boom' %}{% set r = range(100000) %}{% for i in r %}"
                      "{% for j in r %}{% endfor %}{% endfor %}{% endif %}<user>{{ messages[0]['content'] }}</user>")
    tok = models.load_tokenizer(str(folder))
    assert models.apply_chat_template(tok, "hi") == "<user>hi</user>"
    line = _refused(lambda: models.apply_chat_template(tok, "boom"), within=30)
    assert line == (f"{folder}/chat_template.jinja: the chat template did not finish rendering in 1 s (a template "
                    f"that loops without bound is refused)")


def test_a_template_that_writes_without_bound_is_refused(folder):
    from pofe.models import load_tokenizer

    _template(folder, "{% for i in range(100000) %}{{ messages[0]['content'] * 100 }}{% endfor %}")
    # "Hello" (5 characters) x 100 x 100000 = 50,000,000 characters; allowed: 1 MiB + 8 x 5
    assert _refused(lambda: load_tokenizer(str(folder))) == (
        f"{folder}/chat_template.jinja: the chat template wrote 50000000 characters for a 5-character conversation "
        f"(at most 1048616); refused")


@pytest.mark.parametrize("text, why", [
    ("{{ raise_exception('system messages are not supported') }}", "TemplateError: system messages are not supported"),
    ("{{ ''.__class__.__mro__ }}", "SecurityError: access to attribute '__class__' of 'str' object is unsafe."),
])
def test_a_template_that_raises_or_probes_the_sandbox_is_one_line(folder, text, why):
    from pofe.models import load_tokenizer

    _template(folder, text)
    assert _refused(lambda: load_tokenizer(str(folder))) == f"{folder}/chat_template.jinja: the chat template failed ({why})"


# ----------------------------------------------------------------------------- adapters


def _adapter(tmp_path: Path, base: Path, targets) -> Path:
    from peft import LoraConfig, get_peft_model

    from pofe.models import load_model

    model, tok = load_model(str(base))
    a = tmp_path / "adapter"
    get_peft_model(model, LoraConfig(r=2, target_modules=["q_proj"], task_type="CAUSAL_LM")).save_pretrained(str(a))
    tok.save_pretrained(str(a))
    cfg = json.loads((a / "adapter_config.json").read_text())
    cfg["base_model_name_or_path"], cfg["target_modules"] = str(base), targets
    (a / "adapter_config.json").write_text(json.dumps(cfg))
    return a


def test_an_adapter_whose_target_modules_match_nothing_is_one_line(tmp_path, tiny_model_dir):
    a = _adapter(tmp_path, tiny_model_dir, ["nothing_here"])
    assert _refused(_load(a)) == (f"{a}/adapter_config.json: target_modules ['nothing_here'] match no module of the "
                                  f"base model")


@pytest.mark.slow
def test_an_adapter_whose_weights_are_for_other_modules_is_refused(tmp_path, tiny_model_dir):
    """target_modules v_proj, weights for q_proj: peft only warned and left the v_proj adapters at
    their initial values."""
    a = _adapter(tmp_path, tiny_model_dir, ["v_proj"])
    line = _refused(_load(a))
    assert line == (f"{a}/adapter_model.safetensors: lacks 4 of the adapter's weights, e.g. "
                    f"['base_model.model.model.layers.0.self_attn.v_proj.lora_A.weight', "
                    f"'base_model.model.model.layers.0.self_attn.v_proj.lora_B.weight'] (they would keep their "
                    f"initial values)")


def test_new_lora_target_modules_matching_nothing_is_one_line(tiny_model_dir):
    from pofe.runtime import LoraSettings, ModelConfig, load_policy

    cfg = ModelConfig(name=str(tiny_model_dir), device="cpu", lora=LoraSettings(enabled=True, target_modules=["qproj"]))
    line = _refused(lambda: load_policy(cfg))
    assert line.startswith(f"model.lora.target_modules ['qproj']: match no module of the model {str(tiny_model_dir)!r} "
                           f"(its modules end in e.g. [")


@pytest.mark.slow
def test_a_good_folder_and_adapter_still_load(tmp_path, tiny_model_dir):
    from pofe.models import load_model

    model, tok = load_model(str(tiny_model_dir))
    assert model.config.num_hidden_layers == 2 and len(tok) == 49152
    merged, _ = load_model(str(_adapter(tmp_path, tiny_model_dir, ["q_proj"])))
    assert hasattr(merged, "peft_config")


# ----------------------------------------------------------------------------- the base model's identity


def test_resume_refuses_a_base_model_folder_whose_weights_were_replaced(tmp_path, folder, tokenizer):
    """``run.json`` hashed input files, not model folders: weights replaced by other weights of the
    same shapes resumed without a word."""
    from pofe.config import PofeConfig
    from pofe.models import tiny_causal_lm
    from pofe.runs import RunConfig, RunError, open_run, verify_run_folder, write_config
    from pofe.runtime import ModelConfig

    class Cfg(PofeConfig):
        model: ModelConfig
        run: RunConfig

    cfg = Cfg(model=ModelConfig(name=str(folder)), run=RunConfig(output_dir=str(tmp_path / "runs"), name="r"))
    run = open_run(cfg.run, "toy")
    write_config(run, cfg)
    recorded = json.loads((run / "run.json").read_text())["models"]
    assert [(m["key"], m["path"]) for m in recorded] == [("model.name", str(folder))]
    assert set(recorded[0]["files"]) == {"chat_template.jinja", "config.json", "generation_config.json",
                                         "model.safetensors", "tokenizer.json", "tokenizer_config.json"}
    verify_run_folder(run)  # unchanged: resumes
    tiny_causal_lm(tokenizer, seed=7).save_pretrained(folder)  # same shapes, other weights
    with pytest.raises(RunError) as e:
        verify_run_folder(run)
    assert str(e.value) == (f"--resume {run}: model.name = {folder} changed since the run started "
                            f"({folder}/model.safetensors changed); a resumed run would continue on other weights: "
                            f"start a new run")


@pytest.mark.slow
def test_the_cli_prints_the_one_line_and_leaves_no_run_folder(tmp_path, folder):
    """What the user sees: ``error: <line>``, exit 2, and no run folder with nothing computed in it."""
    from _cli import invoke

    _edit_config(folder, num_hidden_layers=4)
    ift = tmp_path / "ift.jsonl"
    ift.write_text("".join(json.dumps({"prompt": f"Q{i}?", "response": f"A{i}."}) + "\n" for i in range(4)))
    res = invoke("sft", "--ift", str(ift), "--model", str(folder), "--steps", "1", "--output-dir", str(tmp_path / "runs"),
                 "--set", "log.progress=false")
    assert res.returncode == 2
    assert res.stderr.strip().splitlines()[-1].startswith(
        f"error: {folder}/model.safetensors: lacks 18 weights that {folder}/config.json describes, e.g. [")
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_a_reward_models_lora_target_modules_matching_nothing_is_one_line(tiny_model_dir):
    from pofe.runtime import LoraSettings, ModelConfig
    from pofe.loops.rm.reward_model import load_reward_model

    cfg = ModelConfig(name=str(tiny_model_dir), device="cpu", lora=LoraSettings(enabled=True, target_modules=["qproj"]))
    assert _refused(lambda: load_reward_model(cfg)).startswith(
        f"model.lora.target_modules ['qproj']: match no module of the model {str(tiny_model_dir)!r} (its modules end in e.g. [")
