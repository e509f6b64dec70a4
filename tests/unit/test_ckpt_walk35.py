"""Walk-through 35's findings on the checkpoint library's save side.

F10: with if_busy="skip", a run of skips ending within a minute of the last summary (the
final step's skip included) was never told, and close() succeeded with the run's last state
in no checkpoint. F9: close() after `max_consecutive_failures` failed saves said only "3
saves in a row failed": not the step lost, nor the newest committed checkpoint."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from tests.unit.test_ckpt_walk31 import ckpt, failing_at, of, sent, state

torch = pytest.importorskip("torch")

import trainguard.checkpoint.checkpointer as ckmod  # noqa: E402
from trainguard.checkpoint.save_report import SaveReporter  # noqa: E402
from trainguard.worker.contract import MessageKind  # noqa: E402

__all__ = ["sent"]  # the fixture, used by name


def gated(monkeypatch: pytest.MonkeyPatch, *steps: int) -> dict[int, threading.Event]:
    """The saves of `steps` wait (up to 10 s) for their event: a store slow at those."""
    gates = {s: threading.Event() for s in steps}
    real = ckmod.run_save

    def slow(job: Any) -> Any:
        if job.step in gates:
            gates[job.step].wait(10)
        return real(job)

    monkeypatch.setattr(ckmod, "run_save", slow)
    return gates


def _two_runs_of_skips(c: ckmod.Checkpointer, gates: dict[int, threading.Event]) -> None:
    """Save 5 held, 10 and 15 skipped; save 20 (its summary told) held, 25 skipped."""
    s = state()
    assert c.maybe_save(5, s)
    assert not c.maybe_save(10, s) and not c.maybe_save(15, s)
    gates[5].set()
    c.wait_quietly()
    assert c.maybe_save(20, s)  # tells the run 10..15: the minute's summary is spent
    assert not c.maybe_save(25, s)
    gates[20].set()


def test_a_skip_at_the_last_step_is_saved_by_close(
        tmp_path: Path, sent: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    c = ckpt(tmp_path / "ck", every_steps=5, if_busy="skip")
    _two_runs_of_skips(c, gated(monkeypatch, 5, 20))
    c.close()  # step 25 is the run's last state: written now, the loop is over
    assert [x["step"] for x in of(sent, MessageKind.CHECKPOINT_SAVED)] == [5, 20, 25]
    assert (tmp_path / "ck" / "latest").read_text().strip() == "step-000000025"


def test_a_run_of_skips_held_back_by_the_minute_is_told_at_close(
        tmp_path: Path, sent: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    c = ckpt(tmp_path / "ck", every_steps=5, if_busy="skip")
    _two_runs_of_skips(c, gated(monkeypatch, 5, 20))
    c.maybe_save(26, state())  # a step after the skip: its state is gone, nothing to save
    c.close()
    skipped = of(sent, MessageKind.CHECKPOINT_SAVE_SKIPPED)
    assert [x["step"] for x in skipped] == [10, 15, 25]
    assert skipped[-1]["reason"].startswith(
        "the save of step 25 was skipped, while the save of step 20 was being written"), skipped
    assert [x["step"] for x in of(sent, MessageKind.CHECKPOINT_SAVED)] == [5, 20]


def test_runs_held_back_by_the_minute_are_told_together(sent: list[Any]) -> None:
    rep = SaveReporter("ck", 0, 3)
    for step in (2, 3):
        rep.skipped(step, 1, None)  # 2 told at once
    rep.saving()  # the run's summary: the minute's one
    for steps, behind in (((5,), 4), ((7, 8), 6)):
        for step in steps:
            rep.skipped(step, behind, None)
        rep.saving()  # held back
    rep.saving(final=True)
    told = of(sent, MessageKind.CHECKPOINT_SAVE_SKIPPED)
    assert [x["step"] for x in told] == [2, 3, 8]
    assert told[-1]["reason"].startswith(
        "3 saves were skipped, steps 5, 7 to 8, each while the save before it was being "
        "written (of steps 4, 6; if_busy='skip'): a crash then resumed from a step before that "
        "save. Fix: "), told[-1]


def test_close_at_the_failure_limit_names_the_step_lost_and_that_nothing_was_kept(
        tmp_path: Path, sent: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    failing_at({10, 20, 30}, monkeypatch)
    c = ckpt(tmp_path / "ck", every_steps=10, max_consecutive_failures=3)
    for step in (10, 20, 30):
        c.maybe_save(step, state())
    with pytest.raises(ckmod.CheckpointError) as e:
        c.close()
    assert str(e.value).startswith(
        "the last checkpoint save (step 30) failed (3 in a row) and no save follows: "), e.value
    assert "; no checkpoint was committed. Fix: free or fix the storage at " in str(e.value)
    assert str(e.value).endswith("then run the job again: it starts over (nothing to resume "
                                 "from)")


def test_a_failed_save_s_log_line_says_what_follows(
        tmp_path: Path, sent: list[Any], monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """F8: the diagnosis names the first failed save's line it has not seen the rank get past;
    "step 30 failed (2 in a row)" read as if the rank gave up after two."""
    failing_at({10, 20, 30}, monkeypatch)
    c = ckpt(tmp_path / "ck", every_steps=10, async_save=False, max_consecutive_failures=3)
    for step in (10, 20):
        c.maybe_save(step, state())
    with pytest.raises(ckmod.CheckpointError):
        c.maybe_save(30, state())
    err = "[Errno 30] Read-only file system"
    assert [r.getMessage() for r in caplog.records if "failed (" in r.getMessage()] == [
        f"checkpoint save of step 10 failed (1 in a row; the next save retries; 3 in a row "
        f"stop the rank): {err}",
        f"checkpoint save of step 20 failed (2 in a row; the next save retries; 3 in a row "
        f"stop the rank): {err}",
        f"checkpoint save of step 30 failed (3 in a row; the rank stops with a "
        f"CheckpointError): {err}"]


def test_a_value_that_is_not_plain_data_is_refused_with_the_user_s_key(
        tmp_path: Path, sent: list[Any]) -> None:
    """F7: the refusal named `r/bad`, the replicated part's internal path."""
    class Opaque:
        pass

    c = ckpt(tmp_path / "ck", async_save=False)
    with pytest.raises(ckmod.CheckpointError, match=r"^cannot checkpoint 'bad/0': an Opaque "
                       "is not plain data"):
        c.save(1, {"model": torch.nn.Linear(2, 2), "bad": [Opaque()]})


def test_a_step_found_corrupt_and_written_anew_counts_toward_keep(
        tmp_path: Path, sent: list[Any]) -> None:
    """F1: the prune right after the rewrite of a step found corrupt on load still counted it
    corrupt, so one more old step stayed than `keep` (for good: no later save pruned it)."""
    ck = tmp_path / "ck"
    c = ckpt(ck, async_save=False, keep=2)
    for step in (1, 2, 3):
        c.save(step, state())
    for step in (2, 3):  # a byte flipped: the checksum fails on load
        f = ck / f"step-{step:09d}" / "replicated.pt"
        data = bytearray(f.read_bytes())
        data[-1] ^= 0xFF
        f.write_bytes(bytes(data))
    again = ckpt(ck, async_save=False, keep=2)
    assert again.load_latest(state()) is None
    for step in (1, 2, 3):
        again.save(step, state())
    assert sorted(p.name for p in ck.glob("step-*")) == ["step-000000002", "step-000000003"]


def test_close_waits_for_the_last_save_inside_the_checkpoint_phase(
        tmp_path: Path, sent: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """Review 38 #2: close() waited for the save in flight outside the checkpoint phase: a
    long last save was confirmed hung at the close() line and, with --restart-on-hang, the
    rank was restarted mid-save until the job failed, its last step never saved."""
    monkeypatch.setattr("trainguard.worker.progress._launcher", True)  # marks are sent
    c = ckpt(tmp_path / "ck", every_steps=5)
    gates = gated(monkeypatch, 5)
    assert c.maybe_save(5, state())
    threading.Timer(0.3, gates[5].set).start()
    before = len(of(sent, MessageKind.PHASE))
    c.close()
    phases = [(p["name"], p["state"]) for p in of(sent, MessageKind.PHASE)[before:]]
    assert ("checkpoint", "begin") in phases and ("checkpoint", "end") in phases, phases
    assert (tmp_path / "ck" / "latest").read_text().strip() == "step-000000005"
