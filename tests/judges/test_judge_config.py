"""The typed judge config: a discriminated union on ``kind``, validated when a command's
config is parsed (before any model loads), each kind with only its own settings; and the
capabilities every kind declares."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pofe.config import ConfigError, dump_config, load_config
from pofe.judges import Capability, JudgeCapabilityError, build_judge, has_capability, require_capability
from pofe.judges.config import (
    COT_DEFAULT_CLAMP,
    DEFAULT_JUDGE_MODEL,
    JUDGE_CONFIGS,
    CotConfig,
    LengthJudgeConfig,
    LLMJudgeConfig,
    OpenAIJudgeConfig,
    RubricJudgeConfig,
    parse_judge_config,
)
from pofe.loops.label import LabelConfig
from pofe.loops.online import OnlineConfig
from pofe.loops.rl import RLConfig
from pofe.loops.self_reward import SelfRewardConfig

REPO = Path(__file__).resolve().parents[2]


def test_kind_switch_starts_from_the_new_kinds_defaults():
    cfg = load_config(OnlineConfig, overrides=["judge.kind=length", "judge.prefer=longer"])
    assert isinstance(cfg.judge, LengthJudgeConfig)
    assert cfg.judge.model_dump() == {"temperature": 0.0, "kind": "length", "prefer": "longer", "unit": "chars",
                                      "price": None, "budget": None}


@pytest.mark.parametrize("override, key", [
    ("judge.kind=lenght", "judge.kind"),
    ("judge.prefer=longer", "judge.prefer"),  # a length setting on the default llm judge
    ("judge.dtype=float33", "judge.dtype"),  # dtype is a Literal, not a free string
    ("judge.cot.clamp=[0.7, 0.2]", "judge.cot.clamp"),
    ("judge.endpoint.base_url=http://x", "judge.endpoint"),  # endpoint belongs to kind openai
])
def test_bad_judge_keys_name_the_key_at_parse_time(override, key):
    with pytest.raises(ConfigError) as e:
        load_config(OnlineConfig, overrides=[override])
    msg = str(e.value)
    assert f"'{key}" in msg and msg.startswith(f"--set {override}") and "\n" not in msg


def test_a_setting_of_another_kind_names_the_key_without_the_union_tag():
    with pytest.raises(ConfigError, match=r"unknown key 'judge.model'$"):
        load_config(OnlineConfig, overrides=["judge.kind=length", "judge.model=x"])
    with pytest.raises(ConfigError, match=r"missing required key 'eval.judge.kind'"):
        load_config(OnlineConfig, overrides=["eval.judge.template=helpful"])
    with pytest.raises(ConfigError, match=r"missing required key 'judge.keywords'"):
        load_config(OnlineConfig, overrides=["judge.kind=keyword"])


def test_label_default_judge_survives_partial_overrides(tmp_path):
    # LabelJudgeConfig (a subclass working around an old defaults bug) is gone: the default
    # instance's template/constitution survive a partial override through config._defaults.
    cfg = load_config(LabelConfig, overrides=[f"judge.cache.path={tmp_path / 'c.sqlite'}"])
    assert isinstance(cfg.judge, LLMJudgeConfig)
    assert (cfg.judge.template, cfg.judge.constitution) == ("constitution", "hhh")
    assert cfg.judge.cache.path == str(tmp_path / "c.sqlite")


def test_yaml_round_trip_of_every_kind(tmp_path):
    for kind, cls in JUDGE_CONFIGS.items():
        extra = {"keywords": ["x"]} if kind == "keyword" else {"callable": "m:f"} if kind == "callable" else \
            {"reward_model": "rm"} if kind == "reward-model" else {}
        cfg = load_config(OnlineConfig, overrides=[f"judge.kind={kind}"] + [f"judge.{k}={v}" for k, v in extra.items()])
        assert type(cfg.judge) is cls
        p = tmp_path / f"{kind}.yaml"
        p.write_text(dump_config(cfg))
        assert load_config(OnlineConfig, p) == cfg


@pytest.mark.parametrize("example, cls", [
    ("online-default.yaml", OnlineConfig), ("online-length.yaml", OnlineConfig), ("label-cai.yaml", LabelConfig),
    ("rl-direct-rlaif.yaml", RLConfig), ("self-reward-tiny.yaml", SelfRewardConfig),
])
def test_example_configs_still_load(example, cls):
    cfg = load_config(cls, REPO / "examples" / example)
    judge = cfg.reward.judge if cls is RLConfig else cfg.judge
    assert judge.kind in JUDGE_CONFIGS


def test_default_model_name_matches_pofe_models():
    from pofe.models import DEFAULT_MODEL

    assert DEFAULT_JUDGE_MODEL == DEFAULT_MODEL


@pytest.mark.slow
def test_judge_config_modules_import_no_torch():
    code = ("import sys; import pofe.judges, pofe.judges.config, pofe.judges.registry, pofe.judges.backends, "
            "pofe.judges.cache; bad = [m for m in ('torch', 'transformers', 'httpx') if m in sys.modules]; print(bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.stdout.strip() == "[]"


@pytest.mark.slow
def test_cli_typo_in_judge_kind_exits_2_before_any_model_or_run_folder(tmp_path):
    out_dir = tmp_path / "runs"
    r = subprocess.run([sys.executable, "-m", "pofe", "online", "--set", "judge.kind=lenght",
                        "--set", f"run.output_dir={out_dir}"], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=tmp_path)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "'judge.kind'" in lines[0] and "lenght" in lines[0]
    assert "Loading weights" not in r.stderr + r.stdout  # validation came before any model load
    assert not out_dir.exists()


# ----------------------------------------------------------------------------- capabilities
def test_capabilities_per_kind():
    caps = {k: {c.value for c in parse_judge_config(
        {"kind": k, **({"keywords": ["x"]} if k == "keyword" else {"callable": "m:f"} if k == "callable" else
                       {"reward_model": "rm"} if k == "reward-model" else {})}).capabilities} for k in JUDGE_CONFIGS}
    assert caps == {
        "llm": {"pairwise", "shares-weights", "needs-logprobs"},
        "llamacpp": {"pairwise", "needs-logprobs"},
        "openai": {"pairwise", "needs-logprobs"},
        "vllm": {"pairwise", "shares-weights", "needs-logprobs"},
        "rubric": {"pointwise", "shares-weights"},
        "expected-score": {"pointwise", "shares-weights", "needs-logprobs"},
        "length": {"pairwise", "pointwise"},
        "keyword": {"pairwise", "pointwise"},
        "reference-overlap": {"pairwise", "pointwise"},
        "callable": {"pairwise", "pointwise"},
        "reward-model": {"pairwise", "pointwise"},
    }
    # the backend decides whether a pointwise LLM judge can share loaded weights
    assert not has_capability(RubricJudgeConfig(backend="openai"), Capability.SHARES_WEIGHTS)


def test_built_judges_declare_what_their_config_declares(tiny_model, tokenizer):
    for cfg in (LengthJudgeConfig(), LLMJudgeConfig(cache={"enabled": False})):
        j = build_judge(cfg, model=tiny_model, tokenizer=tokenizer) if cfg.kind == "llm" else build_judge(cfg)
        assert j.capabilities == cfg.capabilities
    # a pairwise llm judge over an endpoint cannot share weights
    assert not has_capability(build_judge(OpenAIJudgeConfig(cache={"enabled": False})), Capability.SHARES_WEIGHTS)


def test_pairwise_only_judge_is_refused_where_a_score_is_needed():
    # self-reward scores each candidate on its own: a pairwise llm judge is refused when the
    # config is parsed (it used to crash at judge.score after loading models).
    with pytest.raises(ConfigError, match=r"--set judge.kind=llm: bad value for 'judge'.*not pointwise"):
        load_config(SelfRewardConfig, overrides=["judge.kind=llm"])
    with pytest.raises(ConfigError, match=r"reward.judge.*not pointwise"):
        load_config(RLConfig, overrides=["reward.kind=judge", "reward.judge.kind=openai"])
    assert load_config(SelfRewardConfig, overrides=["judge.kind=length"]).judge.kind == "length"
    with pytest.raises(JudgeCapabilityError, match="x: judge 'llm' is not pointwise"):
        require_capability(LLMJudgeConfig(), Capability.POINTWISE, where="x")


# ----------------------------------------------------------------------------- CoT clamp
def test_cot_clamp_defaults_to_cai_whenever_cot_is_on():
    assert CotConfig().effective_clamp() is None
    assert CotConfig(enabled=True).effective_clamp() == COT_DEFAULT_CLAMP == (0.4, 0.6)
    assert CotConfig(enabled=True, clamp=[0.3, 0.8]).effective_clamp() == (0.3, 0.8)
    assert CotConfig(enabled=True, clamp=[0.0, 1.0]).effective_clamp() == (0.0, 1.0)  # explicit "off"
    on = build_judge(OpenAIJudgeConfig(cot={"enabled": True}, endpoint={"api": "completions"}, cache={"enabled": False}))
    off = build_judge(OpenAIJudgeConfig(cache={"enabled": False}))
    assert on.clamp_p == (0.4, 0.6) and off.clamp_p is None


# ----------------------------------------------------------------------------- backends
def test_every_backend_implements_the_protocol(tiny_model, tokenizer):
    from pofe.judges import JudgeBackend
    from pofe.judges.backends import BACKENDS, EndpointBackend, TransformersBackend

    assert set(BACKENDS) == {"transformers", "llamacpp", "openai", "vllm"}
    assert isinstance(TransformersBackend("t", model=tiny_model, tokenizer=tokenizer), JudgeBackend)
    assert isinstance(EndpointBackend("http://127.0.0.1:1/v1", identify=False), JudgeBackend)
    for build in BACKENDS.values():  # llama.cpp needs a GGUF, vllm an engine to instantiate: check the class
        cls = build.__self__  # each builder is its class's from_config (the plugin contract)
        assert build == cls.from_config
        for name in ("fingerprint", "read_choices", "generate", "validate_choices", "special_strings", "close"):
            assert hasattr(cls, name), (cls, name)
