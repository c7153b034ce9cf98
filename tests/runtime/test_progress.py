"""One bar per command: a run driven inside another run's loop (self-reward's sft and DPO stages)
shows as the outer bar's ``stage`` field instead of drawing a second bar."""

from __future__ import annotations

import threading
from typing import ClassVar

import pytest


class FakeBar:
    made: ClassVar[list[FakeBar]] = []

    def __init__(self, *, total, initial, desc, **_):
        self.total, self.n, self.desc, self.postfix, self.closed = total, initial, desc, {}, False
        FakeBar.made.append(self)

    def set_postfix(self, post, refresh=True):
        self.postfix = dict(post)

    def update(self, n=1):
        self.n += n

    def close(self):
        self.closed = True

    @staticmethod
    def set_lock(*_):  # huggingface_hub's bar switch reaches tqdm's lock
        pass

    @staticmethod
    def get_lock():
        return None


@pytest.fixture
def bars(monkeypatch):
    import tqdm.auto
    import transformers.utils.logging  # noqa: F401 - as a model command's setup has, before its bar

    FakeBar.made = []
    monkeypatch.setattr(tqdm.auto, "tqdm", FakeBar)
    return FakeBar.made


def test_a_stage_run_shows_in_the_outer_bar(bars):
    from pofe.runtime.tracking import LogConfig, Progress

    on = LogConfig(progress=True, tensorboard=False)
    outer = Progress(on, total=2, desc="pofe self-reward")
    inner = Progress(on, total=8, initial=2, desc="pofe sft", show=(("loss", "loss", "{:.3f}"),))
    inner.update({"loss": 0.5})
    assert len(bars) == 1 and bars[0].desc == "pofe self-reward"
    assert bars[0].postfix == {"stage": "sft 3/8", "loss": "0.500"} and bars[0].n == 0
    inner.close()
    assert bars[0].postfix == {} and not bars[0].closed
    second = Progress(on, total=4, desc="pofe online")  # the next stage: still the one bar
    second.update({})
    assert len(bars) == 1 and bars[0].postfix == {"stage": "online 1/4"}
    second.close()
    outer.update({"loss": 1.0})
    assert bars[0].n == 1 and bars[0].postfix == {"loss": "1.000"}
    from transformers.utils import logging as hf_logging

    assert not hf_logging.is_progress_bar_enabled()  # a stage's model load draws no bar under ours
    outer.close()
    assert bars[0].closed and Progress._open == [] and hf_logging.is_progress_bar_enabled()
    again = Progress(on, total=1, desc="pofe sft")  # after the outer run ended, a run draws its own bar
    again.close()
    assert len(bars) == 2


def test_a_run_in_another_thread_or_without_an_outer_bar_draws_its_own(bars):
    from pofe.runtime.tracking import LogConfig, Progress

    on, off = LogConfig(progress=True, tensorboard=False), LogConfig(progress=False, tensorboard=False)
    quiet = Progress(off, total=2, desc="pofe self-reward")  # the outer run asked for no bar
    stage = Progress(on, total=3, desc="pofe sft")
    assert len(bars) == 1 and bars[0].desc == "pofe sft"
    t = threading.Thread(target=lambda: Progress(on, total=1, desc="pofe rm").close())
    t.start()
    t.join()
    assert [b.desc for b in bars] == ["pofe sft", "pofe rm"]
    stage.close()
    quiet.close()
    assert Progress._open == []
