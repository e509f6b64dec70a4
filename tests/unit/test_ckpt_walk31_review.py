"""The review of walk-through 31's checkpoint save side: what the fixes there left.

#4: close() on a rank other than 0 named the step it resumed from as the newest committed
one, after any resume (every restart): only rank 0 learns of later commits."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.unit.test_ckpt_walk31 import ckpt, failing_at, sent, state

torch = pytest.importorskip("torch")

import trainguard.checkpoint.checkpointer as ckmod  # noqa: E402

__all__ = ["sent"]  # the fixture, used by name


def test_close_on_rank_1_names_the_newest_commit_after_a_resume(
        tmp_path: Path, sent: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    ckpt(tmp_path / "ck", async_save=False).save(25, state())  # rank 0 commits 25
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    r1 = ckpt(tmp_path / "ck", every_steps=30)
    assert r1.load_latest(state()) == 25
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    ckpt(tmp_path / "ck", async_save=False).save(28, state())  # rank 0 commits 28 later
    failing_at({30}, monkeypatch)
    r1.maybe_save(30, state())
    with pytest.raises(ckmod.CheckpointError) as e:
        r1.close()
    assert "the steps after the newest committed checkpoint (28) are not kept" in str(e.value)
