"""Plugins from a separate installed package (pofe.plugins): the toy package in
``pofe_toy_plugin/`` is installed with pip into a temporary folder, and the real CLI, run in a
subprocess with that folder on PYTHONPATH, uses its loss, judge kind, judge backend and RL
reward. Unknown names stay one-line exit-2 errors that now list the plugins; a plugin named
like a built-in, two packages with one name, and a plugin that fails to import are errors
naming the entry point and package; built-in names never read a plugin."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from _cli import pofe
from pofe import plugins
from pofe.config import ConfigError, load_config

REPO = Path(__file__).resolve().parents[2]
TOY = Path(__file__).resolve().parent / "pofe_toy_plugin"


@pytest.fixture(scope="session")
def toy_site(tmp_path_factory) -> Path:
    """The toy package installed by pip (offline, no build isolation: the venv's setuptools)."""
    src = tmp_path_factory.mktemp("toy-src") / "pofe_toy_plugin"
    shutil.copytree(TOY, src)  # pip writes build/ and *.egg-info next to the sources: never in the repo
    target = tmp_path_factory.mktemp("toy-site")
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index",
                        "--quiet", "--disable-pip-version-check", "--target", str(target), str(src)],
                       capture_output=True, text=True, timeout=300, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (target / "pofe_toy_plugin-0.1.0.dist-info" / "entry_points.txt").is_file()
    return target


@pytest.fixture
def plugin_path(monkeypatch):
    """Prepend folders to sys.path for this test only, with the plugin caches cleared around it."""
    plugins.clear_cache()

    def add(*folders: Path) -> None:
        for f in folders:
            monkeypatch.syspath_prepend(str(f))
        plugins.clear_cache()

    yield add
    plugins.clear_cache()


def _fake_dist(root: Path, name: str, entry_points: str, module: str | None = None, code: str = "") -> Path:
    """A minimal installed distribution: a .dist-info folder (what importlib.metadata reads) and
    optionally one module."""
    d = root / f"{name.replace('-', '_')}-0.1.dist-info"
    d.mkdir(parents=True)
    (d / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (d / "entry_points.txt").write_text(entry_points)
    if module:
        (root / f"{module}.py").write_text(code)
    return root


def _pofe(*args: str, path: tuple[Path, ...] = (), cwd: Path = REPO) -> subprocess.CompletedProcess:
    """pofe with only pofe and the plugin folders ``path`` importable (not the caller's PYTHONPATH)."""
    return pofe(*args, cwd=cwd, PYTHONPATH=os.pathsep.join([str(REPO), *map(str, path)]))


def _sets(*sets: str) -> list[str]:
    return [a for s in sets for a in ("--set", s)]


def _error_lines(r: subprocess.CompletedProcess) -> list[str]:
    return [ln for ln in r.stderr.splitlines() if ln.strip()]


# ----------------------------------------------------------------------------- in process

@pytest.mark.slow
def test_toy_losses_by_hand_through_their_entry_points(toy_site, plugin_path):
    from pofe.loops.online import OnlineConfig
    from pofe.loops.rm import RMConfig
    from pofe.losses import default_beta, get_loss, get_rm_loss

    plugin_path(toy_site)
    loss = get_loss("toy-hinge")
    # pair 1: h = (-1 - -2) - (-3 - -2) = 2, beta h = 1 -> max(0, 2 - 1) = 1
    # pair 2: h = (-2 - -1) - (-2 - -5) = -4, beta h = -2 -> max(0, 2 + 2) = 4
    pc, pr, rc, rr = (torch.tensor(v) for v in ([-1.0, -2.0], [-3.0, -2.0], [-2.0, -1.0], [-2.0, -5.0]))
    out = loss(pc, pr, rc, rr, beta=0.5)
    assert out.losses.tolist() == [1.0, 4.0] and out.margins.tolist() == [1.0, -2.0]
    # soft p = 0.25: 0.25 max(0, 2 - z) + 0.75 max(0, 2 + z) -> 0.25 + 2.25 = 2.5 and 1 + 0 = 1
    assert loss(pc, pr, rc, rr, beta=0.5, p=0.25).losses.tolist() == [2.5, 1.0]
    assert default_beta("toy-hinge") == 0.5  # the plugin's own beta keyword default
    assert default_beta("ipo") == 1.0  # built-ins keep the paper's (OAIF Sec. 4.1)
    cfg = load_config(OnlineConfig, overrides=["loss.name=toy-hinge"])
    assert cfg.loss.name == "toy-hinge" and cfg.loss.beta_value == 0.5

    rm = get_rm_loss("toy-rm-hinge")
    margin = torch.tensor([0.5, -1.0, 2.0])
    assert rm(margin).tolist() == [0.5, 2.0, 0.0]  # max(0, 1 - m)
    assert rm(margin, 0.5).tolist() == [1.0, 1.0, 1.5]  # (max(0, 1 - m) + max(0, 1 + m)) / 2
    assert load_config(RMConfig, overrides=["loss=toy-rm-hinge"]).loss == "toy-rm-hinge"


def test_toy_judge_kind_config_and_verdicts(toy_site, plugin_path):
    from pofe.evaluation.audit import judge_identity
    from pofe.judges import Capability, build_judge
    from pofe.judges.base import capabilities_of
    from pofe.judges.config import PluginJudgeConfig, parse_judge_config
    from pofe.loops.online import OnlineConfig

    plugin_path(toy_site)
    cfg = parse_judge_config({"kind": "toy-word", "options": {"word": "Blue"}})
    assert isinstance(cfg, PluginJudgeConfig) and cfg.options.word == "Blue"
    assert capabilities_of(cfg) == frozenset({Capability.PAIRWISE})
    assert judge_identity(cfg) == {"kind": "toy-word", "options": {"word": "Blue"}, "plugin": "pofe-toy-plugin 0.1.0"}
    verdicts = build_judge(cfg).judge(["q"] * 3, ["a blue sky", "green", "grey"], ["red", "BLUE", "black"])
    assert [v.p for v in verdicts] == [1.0, 0.0, 0.5]

    online = load_config(OnlineConfig, overrides=["judge.kind=toy-word", "judge.options.word=blue"])
    assert isinstance(online.judge, PluginJudgeConfig) and online.model_dump()["judge"] == {
        "kind": "toy-word", "options": {"word": "blue"}}
    with pytest.raises(ConfigError, match=r"unknown key 'judge.options.colour'$"):
        load_config(OnlineConfig, overrides=["judge.kind=toy-word", "judge.options.word=b", "judge.options.colour=c"])
    with pytest.raises(ConfigError, match=r"missing required key 'judge.options.word'$"):
        load_config(OnlineConfig, overrides=["judge.kind=toy-word"])
    with pytest.raises(ConfigError, match=r"unknown key 'judge.word'$"):  # the plugin's settings live under options
        load_config(OnlineConfig, overrides=["judge.kind=toy-word", "judge.options.word=b", "judge.word=b"])


def test_unknown_names_name_the_key_and_list_the_plugins(toy_site, plugin_path):
    from pofe.loops.online import OnlineConfig
    from pofe.loops.rl import RLConfig
    from pofe.loops.rm import RMConfig

    plugin_path(toy_site)
    for cls, override, listing in [
        (OnlineConfig, "loss.name=hinge", "unknown loss 'hinge'; choose one of ['dpo', 'ipo', 'slic', 'toy-hinge']"),
        (RMConfig, "loss=hinge", "unknown reward-model loss 'hinge'; choose one of ['soft-bt', 'toy-rm-hinge']"),
        (RLConfig, "reward.function=words", "unknown reward function 'words'; choose one of ['length', 'toy-prompt-words']"),
        (OnlineConfig, "judge.kind=word", ("unknown kind 'word'; choose one of 'llm', 'vllm', 'llamacpp', 'openai', 'rubric', "
                                           "'expected-score', 'length', 'keyword', 'reference-overlap', 'callable', "
                                           "'reward-model', 'toy-word'")),
    ]:
        with pytest.raises(ConfigError) as e:
            load_config(cls, overrides=[override])
        key = override.split("=")[0]
        assert str(e.value).startswith(f"--set {override}: bad value for '{key}': {listing}"), str(e.value)
    with pytest.raises(ConfigError, match=r"'judge.backend': unknown judge backend 'fixed'; choose one of "
                                          r"\['llamacpp', 'openai', 'transformers', 'vllm', 'toy-fixed'\]"):
        load_config(OnlineConfig, overrides=["judge.kind=rubric", "judge.backend=fixed"])


def test_builtin_names_never_read_the_entry_points(monkeypatch, plugin_path):
    """Lazy: a built-in name resolves without listing a single entry point."""
    import importlib.metadata

    from pofe.judges import build_judge
    from pofe.judges.config import parse_judge_config
    from pofe.loops.online import OnlineConfig
    from pofe.loops.rl import RLConfig
    from pofe.losses import LOSSES, default_beta, get_loss, get_rm_loss

    def refuse(*a, **k):
        raise AssertionError("entry points were read for a built-in name")

    monkeypatch.setattr(importlib.metadata, "entry_points", refuse)
    assert get_loss("slic") is LOSSES["slic"] and default_beta("slic") == 0.002 and get_rm_loss("soft-bt")
    build_judge(parse_judge_config({"kind": "length"}))
    load_config(OnlineConfig, overrides=["loss.name=ipo", "judge.kind=rubric", "judge.backend=openai"])
    load_config(RLConfig, overrides=["reward.function=length"])
    with pytest.raises(AssertionError, match="entry points were read"):  # the guard itself works
        get_loss("not-built-in")


def test_a_plugin_named_like_a_builtin_is_an_error_naming_both(tmp_path, plugin_path):
    from pofe.judges.config import parse_judge_config
    from pofe.loops.online import OnlineConfig

    plugin_path(_fake_dist(tmp_path, "pofe-clash", "[pofe.losses]\ndpo = clash:f\n[pofe.judges]\nlength = clash:J\n"))
    with pytest.raises(ConfigError) as e:
        load_config(OnlineConfig, overrides=["loss.name=hinge"])
    msg = str(e.value)
    assert "'loss.name'" in msg and "loss plugin 'dpo'" in msg and "pofe-clash 0.1" in msg and "built-in loss 'dpo'" in msg
    with pytest.raises(Exception, match=r"judge kind plugin 'length' .*pofe-clash 0\.1.*built-in judge kind 'length'"):
        parse_judge_config({"kind": "lenght"})


def test_two_packages_with_one_plugin_name_is_an_error_naming_both(tmp_path, plugin_path):
    from pofe.loops.rl.policy_gradient import plugin_reward

    a = _fake_dist(tmp_path / "a", "pofe-twin-a", "[pofe.rewards]\ntwin = twin_a:f\n")
    b = _fake_dist(tmp_path / "b", "pofe-twin-b", "[pofe.rewards]\ntwin = twin_b:f\n")
    plugin_path(a, b)
    with pytest.raises(plugins.PluginError, match=r"two reward function plugins are named 'twin'.*pofe-twin-(a|b) 0\.1.*"
                                                  r"pofe-twin-(a|b) 0\.1"):
        plugin_reward("twin")


def test_reward_plugin_answers_are_checked():
    from pofe.records import Completion
    from pofe.loops.rl.policy_gradient import PluginReward

    comps = [Completion(prompt="a", text="x", token_ids=[1], prompt_token_ids=[2])] * 2
    assert PluginReward("ok", lambda p, c: ([1, None], {}))(["a", "b"], comps) == ([1.0, None], {})
    for bad, why in [(lambda p, c: [1.0, 2.0], "not a \\(rewards, info dict\\) pair"),
                     (lambda p, c: ([1.0], {}), "returned 1 rewards for 2 completions"),
                     (lambda p, c: ([1.0, float("nan")], {}), "returned reward nan for completion 1"),
                     (lambda p, c: ([True, 1.0], {}), "returned reward True for completion 0")]:
        with pytest.raises(plugins.PluginError, match=why):
            PluginReward("bad", bad)(["a", "b"], comps)


# ----------------------------------------------------------------------------- the CLI (subprocesses)

@pytest.mark.slow  # a pofe subprocess per command: 5-15 s each on a shared 2-core CPU
def test_cli_judge_with_the_plugin_kind_and_the_plugin_backend(toy_site, tmp_path):
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"prompt": "Colour?", "response_a": a, "response_b": b}) + "\n" for a, b in
                             [("It is blue.", "It is red."), ("Green.", "Blue, surely."), ("Grey.", "Black.")]))
    r = _pofe("judge", str(pairs), "--json", *_sets("judge.kind=toy-word", "judge.options.word=blue",
                                                    f"run.output_dir={tmp_path}", "run.name=word"), path=(toy_site,))
    assert r.returncode == 0, r.stderr[-2000:]
    rows = [json.loads(x) for x in (tmp_path / "word" / "verdicts.jsonl").read_text().splitlines()]
    assert [x["p"] for x in rows] == [1.0, 0.0, 0.5] and {x["judge_id"] for x in rows} == {"toy-word:blue"}
    assert "kind: toy-word\n  options:\n    word: blue\n" in (tmp_path / "word" / "config.yaml").read_text()

    # the backend plugin under a built-in pointwise kind: the rubric judge parses its fixed "Score: 4"
    r = _pofe("judge", str(pairs), "--json", *_sets("judge.kind=rubric", "judge.backend=toy-fixed",
                                                    f"run.output_dir={tmp_path}", "run.name=rubric"), path=(toy_site,))
    assert r.returncode == 0, r.stderr[-2000:]
    rows = [json.loads(x) for x in (tmp_path / "rubric" / "verdicts.jsonl").read_text().splitlines()]
    assert [x["score"] for x in rows] == [4.0] * 3 and all(x["samples"] == [4.0, 4.0, 4.0] for x in rows)
    assert {x["extra"]["backend"] for x in rows} == {"toy-fixed"}


@pytest.mark.slow  # a pofe subprocess per command: 5-15 s each on a shared 2-core CPU
def test_cli_online_trains_with_the_plugin_loss(toy_site, tiny_model_dir, tmp_path):
    prefs = tmp_path / "prefs.jsonl"
    prefs.write_text("".join(json.dumps({"prompt": f"What is {i} plus {i}?", "chosen": f"It is {2 * i}.",
                                         "rejected": "No idea at all."}) + "\n" for i in range(4)))
    r = _pofe("online", "--json", *_sets("mode=offline", f"data.preferences={prefs}", f"model.name={tiny_model_dir}",
                                         "judge.kind=length", "loss.name=toy-hinge", "train.steps=2", "train.batch_size=2",
                                         "optim.lr=1e-3", "optim.warmup_steps=0", "eval.enabled=false", "log.progress=false",
                                         "log.tensorboard=false", f"run.output_dir={tmp_path}", "run.name=on"),
              path=(toy_site,))
    assert r.returncode == 0, r.stderr[-2000:]
    summary = json.loads(r.stdout[r.stdout.index("{"):])
    assert summary["loss"] == "toy-hinge" and summary["beta"] == 0.5  # beta: the plugin's own default
    rows = [json.loads(x) for x in (tmp_path / "on" / "metrics.jsonl").read_text().splitlines()]
    # step 1: policy = reference, so h = 0 and every pair's hinge is max(0, 2 - 0) = 2 (SLiC would give 1, DPO log 2)
    assert rows[0]["loss"] == pytest.approx(2.0, abs=1e-5) and rows[0]["rewards/margins"] == pytest.approx(0.0, abs=1e-5)
    # step 2: margins beta*h stay far below 2 at lr 1e-3, so the mean hinge is 2 - the mean margin
    assert rows[1]["loss"] == pytest.approx(2.0 - rows[1]["rewards/margins"], abs=1e-5)
    assert rows[1]["loss"] != pytest.approx(2.0, abs=1e-4)  # it trained


@pytest.mark.slow  # a pofe subprocess per command: 5-15 s each on a shared 2-core CPU
def test_cli_rl_step_with_the_plugin_reward(toy_site, tiny_model_dir, tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("".join(f"Question number {i}: what is it plus one?\n" for i in range(6)))  # 8 words each
    r = _pofe("rl", "--model", str(tiny_model_dir), "--prompts", str(prompts), "--steps", "1", "--json",
              "--output-dir", str(tmp_path), "--name", "rl",
              *_sets("reward.function=toy-prompt-words", "train.batch_size=2", "train.group_size=2", "eval.num_prompts=2",
                     "eval.samples=1", "sampling.max_new_tokens=4", "log.progress=false", "log.tensorboard=false"),
              path=(toy_site,))
    assert r.returncode == 0, r.stderr[-2000:]
    summary = json.loads(r.stdout[r.stdout.index("{"):])
    assert summary["reward"] == "toy-prompt-words"  # the plugin's id
    (row,) = [json.loads(x) for x in (tmp_path / "rl" / "metrics.jsonl").read_text().splitlines()]
    assert row["objective/scores"] == 8.0 and row["objective/scores_std"] == 0.0 and row["unscored"] == 0
    assert row["toy/scored"] == 4  # info["metrics"] of the plugin: 2 prompts x 2 samples
    assert summary["eval_before"]["reward"] == 8.0


@pytest.mark.slow  # a pofe subprocess per command: 5-15 s each on a shared 2-core CPU
def test_cli_unknown_names_are_one_line_exit_2_listing_the_plugins(toy_site, tmp_path):
    for args, key, listed in [
        (["online", *_sets("loss.name=hinge")], "loss.name", "'toy-hinge'"),
        (["judge", "x.jsonl", *_sets("judge.kind=word")], "judge.kind", "'toy-word'"),
        (["rl", *_sets("reward.function=words")], "reward.function", "'toy-prompt-words'"),
    ]:
        r = _pofe(*args, *_sets(f"run.output_dir={tmp_path / 'runs'}"), path=(toy_site,), cwd=tmp_path)
        lines = _error_lines(r)
        assert r.returncode == 2 and len(lines) == 1, r.stderr
        assert f"'{key}'" in lines[0] and listed in lines[0], lines[0]
    assert not (tmp_path / "runs").exists()  # refused before any run folder


@pytest.mark.slow  # a pofe subprocess per command: 5-15 s each on a shared 2-core CPU
def test_cli_a_broken_plugin_is_never_imported_for_builtins_and_named_when_used(tmp_path):
    site = _fake_dist(tmp_path / "site", "pofe-broken", "[pofe.losses]\nbroken = pofe_broken:loss\n",
                      module="pofe_broken", code="raise ImportError('the broken plugin was imported')\n")
    r = _pofe("online", "--print-config", *_sets("loss.name=slic"), path=(site,), cwd=tmp_path)
    assert r.returncode == 0 and "name: slic" in r.stdout, r.stderr
    r = _pofe("online", *_sets("loss.name=broken", f"run.output_dir={tmp_path / 'runs'}"), path=(site,), cwd=tmp_path)
    lines = _error_lines(r)
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert "'loss.name'" in lines[0] and "loss plugin 'broken' failed to import" in lines[0]
    assert "entry point 'broken = pofe_broken:loss'" in lines[0] and "package pofe-broken 0.1" in lines[0]
    assert "ImportError: the broken plugin was imported" in lines[0]
    assert not (tmp_path / "runs").exists()


def test_builtin_backend_names_match_the_backends_map():
    from pofe.judges.backends import BACKENDS
    from pofe.judges.config import BACKEND_SPECS

    assert set(BACKEND_SPECS) == set(BACKENDS)


def test_length_settings_with_a_plugin_reward_are_refused(monkeypatch):
    """reward.prefer/unit/scale configure the built-in length reward only: with a plugin reward they would do nothing."""
    from pofe.config import ConfigError
    from pofe.loops.rl.rewards import RewardConfig

    RewardConfig(function="length", prefer="longer", scale=2.0)  # the built-in reads them
    import pofe.loops.rl.rewards as rewards

    fields = RewardConfig.model_fields
    assert fields["prefer"].default == "shorter" and fields["scale"].default == 1.0
    # bypass the plugin-name lookup: the check under test is the model validator on an already-valid name
    cfg = RewardConfig.model_construct(kind="programmatic", function="toy-words", prefer="longer", unit="tokens", scale=1.0,
                                       model=None, max_length=512, judge=None, pairwise=rewards.PairwiseRewardConfig())
    with pytest.raises(ConfigError, match=r"reward\.prefer.*function length"):
        cfg._source_given()
