"""close() with a step skipped at the last boundary (if_busy="skip"), review 38 #2 and #3.

#2: the save in flight failed while close() waited for it; its event said "the last save: no
save follows; the rank ends with a CheckpointError", then close() wrote the skipped step and
returned normally. #3: close()'s summary of the skipped saves named the step it was about to
write as skipped ("a crash then resumed from a step before 20"), then CheckpointSaved of it."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from tests.unit.test_ckpt_walk31 import ckpt, failing_at, of, sent, state
from tests.unit.test_ckpt_walk35 import _two_runs_of_skips, gated

torch = pytest.importorskip("torch")

import trainguard.checkpoint.checkpointer as ckmod  # noqa: E402
from trainguard.worker.contract import MessageKind  # noqa: E402

__all__ = ["sent"]  # the fixture, used by name


def _fail_20_then_skip_25(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                          failing: set[int], limit: int = 3) -> ckmod.Checkpointer:
    gate = threading.Event()
    failing_at(failing, monkeypatch, before=gate)  # the save of 20 fails once close() waits
    c = ckpt(tmp_path / "ck", every_steps=5, if_busy="skip", max_consecutive_failures=limit)
    assert c.maybe_save(20, state())
    assert not c.maybe_save(25, state())  # skipped behind 20: the last step
    threading.Timer(0.3, gate.set).start()
    return c


def test_a_failed_save_in_flight_at_close_says_the_next_save_retries(
        tmp_path: Path, sent: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    c = _fail_20_then_skip_25(tmp_path, monkeypatch, {20})
    c.close()  # step 25 is written: the run's last state is kept
    failed = of(sent, MessageKind.CHECKPOINT_SAVE_FAILED)
    assert [(f["step"], f["on_exit"]) for f in failed] == [(20, None)], failed
    assert [x["step"] for x in of(sent, MessageKind.CHECKPOINT_SAVED)] == [25]
    assert (tmp_path / "ck" / "latest").read_text().strip() == "step-000000025"


def test_when_the_skipped_step_s_save_fails_too_that_one_is_the_last(
        tmp_path: Path, sent: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    c = _fail_20_then_skip_25(tmp_path, monkeypatch, {20, 25})
    with pytest.raises(ckmod.CheckpointError) as e:
        c.close()
    assert str(e.value).startswith("the last checkpoint save (step 25) failed (2 in a row) "
                                   "and no save follows: "), e.value
    failed = of(sent, MessageKind.CHECKPOINT_SAVE_FAILED)
    assert [(f["step"], f["on_exit"]) for f in failed] == [(20, None), (25, ckmod._LAST_SAVE)]


def test_a_save_in_flight_failing_at_the_limit_is_told_once_and_25_is_not_written(
        tmp_path: Path, sent: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    c = _fail_20_then_skip_25(tmp_path, monkeypatch, {20}, limit=1)
    with pytest.raises(ckmod.CheckpointError) as e:
        c.close()
    assert str(e.value).startswith(
        "the last checkpoint save (step 20) failed and no save follows: "), e.value
    failed = of(sent, MessageKind.CHECKPOINT_SAVE_FAILED)
    assert [f["step"] for f in failed] == [20], failed  # it said the rank stops: not twice
    assert not of(sent, MessageKind.CHECKPOINT_SAVED)


def test_the_step_close_writes_is_not_told_as_skipped(
        tmp_path: Path, sent: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    c = ckpt(tmp_path / "ck", every_steps=5, if_busy="skip")
    _two_runs_of_skips(c, gated(monkeypatch, 5, 20))
    c.close()
    assert [x["step"] for x in of(sent, MessageKind.CHECKPOINT_SAVE_SKIPPED)] == [10, 15]
    assert [x["step"] for x in of(sent, MessageKind.CHECKPOINT_SAVED)] == [5, 20, 25]
