"""An in-process restart abandons the first entry's Checkpointer: nothing of the old group
is saved on the way out (walk-through 27: the survivor's old step was committed at
interpreter exit, after the job's last checkpoint, and `latest` pointed back at it)."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")


def test_an_abandoned_checkpointer_saves_nothing_at_exit_and_gives_sigterm_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from trainguard.checkpoint import Checkpointer

    monkeypatch.setenv("RANK", "0")  # a world of one
    before = signal.getsignal(signal.SIGTERM)
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    state = {"model": model, "optimizer": opt}
    ckpt = Checkpointer(tmp_path / "ckpt", async_save=False, every_steps=4, save_on_exit=True)
    try:
        saver = ckpt._exit
        assert saver is not None and signal.getsignal(signal.SIGTERM) == saver._on_signal
        for step in range(1, 7):  # saved at 4; 5 and 6 done, unsaved: an exit would save 6
            model(torch.ones(1, 2)).sum().backward()
            opt.step()
            ckpt.maybe_save(step, state)
        ckpt.abandon()  # what run_resilient's restart does
        saver._at_exit()  # (what atexit would have run, had it not been unregistered)
        assert [c.step for c in ckpt.list()] == [4]  # step 6 of the old group: not saved
        assert signal.getsignal(signal.SIGTERM) == before  # a stop now ends the rank
    finally:
        signal.signal(signal.SIGTERM, before)
