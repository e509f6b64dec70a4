"""close() is where a script learns its last save is durable: when that save failed, nothing
follows to retry it (walk-through 27: a job whose final save hit a full disk read
`succeeded`, its last 10 steps kept nowhere)."""

from __future__ import annotations

import errno
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")


def ckpt_with_failing(steps: set[int], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                      ) -> Any:
    import trainguard.checkpoint.checkpointer as mod

    real = mod.run_save

    def run_save(job: Any) -> Any:
        if job.step in steps:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(job)

    monkeypatch.setenv("RANK", "0")  # a world of one
    monkeypatch.setattr(mod, "run_save", run_save)
    return mod.Checkpointer(tmp_path / "ckpt", every_steps=10, save_on_exit=False)


@pytest.mark.parametrize("async_save", [True, False])
def test_close_raises_when_the_last_save_failed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, async_save: bool) -> None:
    from trainguard.checkpoint import CheckpointError

    ckpt = ckpt_with_failing({20}, tmp_path, monkeypatch)
    ckpt.async_save = async_save
    state = {"model": torch.nn.Linear(2, 2)}
    for step in (10, 20):
        ckpt.maybe_save(step, state)
    with pytest.raises(CheckpointError) as e:
        ckpt.close()
    msg = str(e.value)
    assert "the last checkpoint save (step 20) failed and no save follows" in msg
    assert "No space left on device" in msg and "newest committed checkpoint (10)" in msg
    assert "Fix: free or fix the storage at" in msg


def test_close_is_quiet_when_a_failed_save_was_followed_by_a_good_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ckpt = ckpt_with_failing({10}, tmp_path, monkeypatch)
    state = {"model": torch.nn.Linear(2, 2)}
    for step in (10, 20):
        ckpt.maybe_save(step, state)
    ckpt.close()
    assert [c.step for c in ckpt.list()] == [20]
