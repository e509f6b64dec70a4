"""The review of walk-through 31's checkpoint save side: what the fixes there left.

#4: close() on a rank other than 0 named the step it resumed from as the newest committed
one, after any resume (every restart): only rank 0 learns of later commits.

#9 (with #6): a complete checkpoint moved by hand to another step's name is called corrupt,
its reason saying to move it back, and the job's next save pruned it before anyone could;
the resume's own verdict_of repeated quick_verdict's check (now one check, quick_verdict)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from tests.unit.test_ckpt_walk31 import ckpt, failing_at, sent, state

torch = pytest.importorskip("torch")

import trainguard.checkpoint.checkpointer as ckmod  # noqa: E402
from trainguard.checkpoint.manifest import step_dir  # noqa: E402
from trainguard.controller.dir_owner import write_owner  # noqa: E402

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


def _steps(where: Path) -> list[str]:
    return sorted(n for n in os.listdir(where) if n.startswith("step-"))


def _saved_then_moved(ck: Path, to: int) -> ckmod.Checkpointer:
    """Steps 10 and 20 saved (keep=3), then step 20's dir renamed by hand to step `to`."""
    c = ckpt(ck, async_save=False, keep=3)
    for step in (10, 20):
        c.save(step, state())
    os.rename(ck / "step-000000020", ck / f"step-{to:09d}")
    return c


def test_a_checkpoint_moved_by_hand_survives_the_next_saves(
        tmp_path: Path, sent: list[Any]) -> None:
    ck = tmp_path / "ck"
    c = _saved_then_moved(ck, 15)  # moved by hand
    [moved] = [i for i in c.list() if i.step == 15]
    assert moved.status.value == "corrupt" and "move the directory back" in moved.reason
    c.save(30, state())
    assert _steps(ck) == ["step-000000010", "step-000000015", "step-000000030"]


def test_a_checkpoint_moved_by_hand_survives_a_resume_that_skips_it(
        tmp_path: Path, sent: list[Any]) -> None:
    ck = tmp_path / "ck"
    _saved_then_moved(ck, 25)  # the newest, moved by hand
    again = ckpt(ck, async_save=False, keep=3)
    assert again.load_latest(state()) == 10  # skipped, with its reason
    again.save(30, state())
    assert _steps(ck) == ["step-000000010", "step-000000025", "step-000000030"]


def test_a_run_of_skipped_saves_says_what_a_crash_loses_and_how_many_were_skipped(
        tmp_path: Path, sent: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """#14: the save of step 5 held, 9 saves skipped (10..50) within a minute: the only
    Warning named neither what a crash loses nor that 9 were skipped."""
    from tests.unit.test_ckpt_walk31 import of, stall_saves
    from trainguard.worker.contract import MessageKind

    go = stall_saves(monkeypatch)
    c = ckpt(tmp_path / "ck", every_steps=5, if_busy="skip")
    s = state()
    assert c.maybe_save(5, s)
    for step in range(10, 55, 5):
        assert not c.maybe_save(step, s)
    go.set()
    c.close()
    first, summary = of(sent, MessageKind.CHECKPOINT_SAVE_SKIPPED)
    assert first["step"] == 10
    assert ": until it commits, a crash resumes from a step before 5 and loses every step " \
        "since. Fix:" in first["reason"]
    assert summary["step"] == 45  # 50, the last step's, is written by close() (review 38 #3)
    assert summary["reason"].startswith(
        "8 saves in a row were skipped, steps 10 to 45, while the save of step 5 was being "
        "written (if_busy='skip'): a crash then resumed from a step before 5. Fix: "), summary


def test_the_listing_lives_with_its_concern_and_the_reports_log_under_their_own_name(
        tmp_path: Path, sent: list[Any], caplog: pytest.LogCaptureFixture) -> None:
    """#12: save_report.py held the listing only to keep checkpointer.py under 400 lines, and
    logged under the Checkpointer's name."""
    import trainguard.checkpoint as ck

    assert ck.list_checkpoints.__module__ == "trainguard.checkpoint.listing"
    assert ck.CheckpointInfo.__module__ == "trainguard.checkpoint.listing"
    c = ckpt(tmp_path / "ck", async_save=False)
    c.save(5, state())
    assert [(i.step, i.status.value) for i in c.list()] == [(5, "valid")]
    c._events.other_writer(5, "job-b")
    assert [r.name for r in caplog.records if "committed by the job 'job-b'" in r.message] == \
        ["trainguard.checkpoint.save_report"]


def test_a_job_behind_another_in_one_dir_says_it_and_prunes_none_of_its_steps(
        tmp_path: Path, sent: list[Any], monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """#3: two jobs at different steps in one dir (the usual case): the one behind pruned the
    other's steps, and nothing was said (only a save of a step the other had committed was)."""
    ck = tmp_path / "ck"
    a = ckpt(ck, async_save=False, keep=3)  # job-a (the `sent` fixture's run id)
    for step in (80, 90, 100):
        a.save(step, state())
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job-b")
    b = ckpt(ck, async_save=False, keep=3)
    b.save(10, state())
    b.save(20, state())
    assert _steps(ck) == ["step-000000010", "step-000000020", "step-000000080",
                          "step-000000090", "step-000000100"]
    told = [r.message for r in caplog.records if "committed by the job 'job-a'" in r.message]
    assert told == [
        f"checkpoint of step 10 committed, but: the checkpoint dir {ck} holds step 100, newer "
        "than this one, committed by the job 'job-a': two jobs write this dir, and a restart "
        "of this job would resume the other job's weights (step 100); its steps are neither "
        "counted nor pruned here. Fix: give each job its own --checkpoint-dir"]  # once a minute


def _as(monkeypatch: pytest.MonkeyPatch, job: str) -> None:
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", job)


def _launched(ck: Path, job: str) -> None:
    """The owner mark a launch writes into its --checkpoint-dir (controller/dir_owner.py),
    with the launch's time: a save made after it is newer."""
    write_owner(ck, job, ck.parent / job)


def _job_a_at_100(ck: Path) -> ckmod.Checkpointer:
    """Job a launched into `ck` (its mark) and committed steps 80, 90 and 100 (keep 3)."""
    ck.mkdir()
    _launched(ck, "job-a")
    a = ckpt(ck, async_save=False, keep=3)
    for step in (80, 90, 100):
        a.save(step, state())
    return a


def test_a_job_ahead_of_another_in_one_dir_prunes_none_of_its_steps_and_says_it(
        tmp_path: Path, sent: list[Any], monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """#3's rest: the job ahead learned nothing and its pruning deleted the other job's
    newest steps as its own. Job b launched into job a's dir after it (the mark is b's)."""
    ck = tmp_path / "ck"
    a = _job_a_at_100(ck)
    _as(monkeypatch, "job-b")
    _launched(ck, "job-b")
    b = ckpt(ck, async_save=False, keep=3)
    b.save(10, state())
    b.save(20, state())
    _as(monkeypatch, "job-a")
    a.save(110, state())
    a.save(120, state())
    assert _steps(ck) == [step_dir(s) for s in (10, 20, 100, 110, 120)]
    told = [r.message for r in caplog.records if "which writes this dir too" in r.message]
    assert told == [
        f"checkpoint of step 110 committed, but: the checkpoint dir {ck} holds step 20, "
        "committed by the job 'job-b', which writes this dir too (it launched into it after "
        "this job, or saved there since); its steps are neither counted nor pruned here. "
        "Fix: give each job its own --checkpoint-dir"]  # once a minute


def test_the_job_that_launched_last_leaves_the_steps_another_job_saved_since(
        tmp_path: Path, sent: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """The mark is this job's own, but another job committed a step after this job's launch
    (the mark's `at`): that step is left alone; the other job's steps from before the launch
    are pruned, but for its newest (review of walk-through 33 #4: job a, still running, lost
    its only checkpoint, step 10, to b's prune), and none counts toward b's `keep`."""
    ck = tmp_path / "ck"
    ck.mkdir()
    _as(monkeypatch, "job-a")
    a = ckpt(ck, async_save=False, keep=3)
    a.save(10, state())
    _launched(ck, "job-b")
    _as(monkeypatch, "job-b")
    b = ckpt(ck, async_save=False, keep=3)
    for step in (100, 110, 120):
        b.save(step, state())
    assert _steps(ck) == [step_dir(s) for s in (10, 100, 110, 120)]  # a's only step stays
    _as(monkeypatch, "job-a")
    a.save(30, state())
    _as(monkeypatch, "job-b")
    b.save(130, state())
    assert _steps(ck) == [step_dir(s) for s in (30, 110, 120, 130)]


def test_a_job_continuing_from_another_s_checkpoints_prunes_all_but_their_newest(
        tmp_path: Path, sent: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    ck = tmp_path / "ck"
    _job_a_at_100(ck)
    _launched(ck, "job-c")  # job a ended; job c continues from its checkpoints
    _as(monkeypatch, "job-c")
    c = ckpt(ck, async_save=False, keep=3)
    c.save(110, state())
    c.save(120, state())
    assert _steps(ck) == [step_dir(s) for s in (100, 110, 120)]


def test_the_job_ahead_leaves_the_other_job_s_save_in_flight(
        tmp_path: Path, sent: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """Review of walk-through 33 #3: b (launched last: its mark) has a save in flight, its
    files there and no manifest yet (an object store writes in place; a local dir stages in
    `.tmp-step-*`); a's prune deleted it as an incomplete leftover."""
    ck = tmp_path / "ck"
    a = _job_a_at_100(ck)
    _launched(ck, "job-b")
    _as(monkeypatch, "job-b")
    ckpt(ck, async_save=False, keep=3).save(10, state())
    (ck / step_dir(20)).mkdir()
    (ck / step_dir(20) / "rank-00000.pt").write_bytes(b"half")
    (ck / ".tmp-step-000000030-b").mkdir()
    _as(monkeypatch, "job-a")
    a.save(110, state())
    assert _steps(ck) == [step_dir(s) for s in (10, 20, 90, 100, 110)]
    assert (ck / ".tmp-step-000000030-b").is_dir()
