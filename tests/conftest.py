"""Shared fixtures. Tiny random models are built in-process over the embedded model's real
tokenizer (converted once into $POFE_HOME); nothing is downloaded from a hub."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _isolated_pofe_home() -> None:
    """Give the test session its own $POFE_HOME so judge caches and other state from earlier
    runs can never make a test pass or fail, while reusing the (read-only after creation)
    converted model cache of the user's real $POFE_HOME to avoid a 20 s GGUF conversion."""
    import tempfile

    from pofe.models import pofe_home

    real_models = pofe_home() / "models"
    real_models.mkdir(parents=True, exist_ok=True)
    home = Path(tempfile.mkdtemp(prefix="pofe-test-home-"))
    (home / "models").symlink_to(real_models, target_is_directory=True)
    os.environ["POFE_HOME"] = str(home)


_isolated_pofe_home()



@pytest.fixture(autouse=True)
def _unit_tier_starts_no_process(request, monkeypatch):
    """The tiers: a test marked ``slow`` is end-to-end (a real ``pofe`` process, torchrun, vLLM,
    the embedded model, or more than a couple of seconds); every other test is the unit tier that
    ``pytest`` alone runs (pyproject's ``-m "not slow"``). A unit test that starts a process fails
    here saying so, so the tier stays what it claims (``make test`` runs both tiers)."""
    if request.node.get_closest_marker("slow") is None:
        import subprocess

        def refuse(self, args, *a, **k):
            raise AssertionError(f"a unit-tier test started a process ({str(args)[:120]}): mark the test "
                                 "@pytest.mark.slow (end-to-end tier) or run the code in-process")

        monkeypatch.setattr(subprocess.Popen, "_execute_child", refuse)
    yield


def pytest_collection_modifyitems(config, items):
    """Tests marked ``long`` first (stable otherwise): with two workers (``make test``: --dist
    loadfile --no-loadscope-reorder, files handed out in collection order) the rl example's run
    (~20 minutes on one thread) starts at once. xdist's default order (files with most tests
    first) handed that one-test file out last, and one worker ran it alone for its whole length."""
    items.sort(key=lambda item: item.get_closest_marker("long") is None)


SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


@pytest.fixture(scope="session")
def tokenizer():
    from pofe.models import load_tokenizer

    return load_tokenizer()


@pytest.fixture
def tiny_model(tokenizer):
    """A fresh tiny random Llama (2 layers, hidden 32) over the real tokenizer."""
    from pofe.models import tiny_causal_lm

    return tiny_causal_lm(tokenizer)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, tokenizer):
    """A tiny random model saved as a local directory (exercises the load-from-path code)."""
    from pofe.models import tiny_causal_lm

    d = tmp_path_factory.mktemp("tiny-llama")
    tiny_causal_lm(tokenizer).save_pretrained(d)
    tokenizer.save_pretrained(d)
    return d


@pytest.fixture(scope="session")
def shared_data():
    """../shared/data, or skip with a clear message when it is absent."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared data folder not found at {SHARED_DATA} (tests that read benchmark data need it)")
    return SHARED_DATA


@pytest.fixture(scope="session", autouse=True)
def _one_torch_thread_per_test_process():
    """Every test process computes on one torch thread, as the subprocesses the tests start do
    (``tests/_cli.py``: OMP_NUM_THREADS=1). ``make test`` runs two pytest workers on a 2-core CPU:
    two workers with two OpenMP threads each spin against each other, and tiny models ran up to
    ~20x slower than single-threaded. A test that needs more threads sets them and restores them."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="session")
def varied_model_dir(tmp_path_factory, tokenizer):
    """The tiny random model with its matrices redrawn at std 0.2: at the usual 0.02 its greedy
    answer to every prompt is the same run of newlines, so rows in the wrong order would still
    compare equal; here different prompts get different greedy answers."""
    import torch

    from pofe.models import tiny_causal_lm

    model, g = tiny_causal_lm(tokenizer), torch.Generator().manual_seed(1)
    with torch.no_grad():
        for w in model.parameters():
            if w.dim() > 1:
                w.normal_(0, 0.2, generator=g)
    d = tmp_path_factory.mktemp("varied-llama")
    model.save_pretrained(d)
    tokenizer.save_pretrained(d)
    return d
