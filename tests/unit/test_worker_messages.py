"""Worker reports become job events (pure mapping over a real job store)."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from trainguard.controller.incidents import IncidentBook
from trainguard.controller.store import JobStore
from trainguard.controller.worker_messages import WorkerMessages
from trainguard.protocol import WorkerMessage
from trainguard.records import Level, Reason

NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)


def msg(kind: str, **data: Any) -> WorkerMessage:
    return WorkerMessage(kind=kind, rank=0, at=NOW, data=data)


def handler(tmp_path: Path) -> tuple[WorkerMessages, list[tuple[Level, Reason, str]]]:
    seen: list[tuple[Level, Reason, str]] = []

    def emit(level: Level, reason: Reason, message: str, **_: Any) -> None:
        seen.append((level, reason, message))

    store = JobStore.create(tmp_path / "job", "r")
    return WorkerMessages(emit, IncidentBook(store)), seen


def test_a_committed_checkpoint_is_an_event_and_counts_for_progress(tmp_path: Path) -> None:
    h, seen = handler(tmp_path)
    h.handle([msg("checkpoint_saved", step=20, location="/ck", bytes=2**20, blocked_s=0.01,
                  write_s=0.2)], attempt=0)
    assert seen[0][1] == Reason.CHECKPOINT_SAVED and "step 20 committed" in seen[0][2]
    assert h.committed_this_attempt == 20 and h.max_committed_step == 20


def test_resumed_is_reported_once_per_attempt_whatever_the_number_of_ranks(
        tmp_path: Path) -> None:
    h, seen = handler(tmp_path)
    h.handle([msg("resumed", step=10), msg("resumed", step=10)], attempt=1)
    assert [r for _, r, _ in seen] == [Reason.RESUMED]


def test_a_resume_said_not_exact_is_a_warning_once_an_attempt(tmp_path: Path) -> None:
    """Walk-through 25: Lightning's not-exact resume was only in the rank logs."""
    h, seen = handler(tmp_path)
    why = "resumed after batch 2 of epoch 1 with a DataLoader that keeps no position: ..."
    h.handle([msg("resumed", step=12, location="/ck/last.ckpt"),
              msg("resumed", step=12, not_exact=why),
              msg("resumed", step=12, not_exact=why)], attempt=1)  # each rank says it
    assert [(lv, r) for lv, r, _ in seen] == [(Level.INFO, Reason.RESUMED),
                                             (Level.WARNING, Reason.RESUMED)]
    assert seen[1][2] == f"rank 0's resume from step 12 is not exact: {why}"


def test_a_resume_from_a_checkpoint_committed_before_the_job_was_created_is_a_warning(
        tmp_path: Path) -> None:
    """Walk-through 39 #5: a new job given an earlier run's output dir resumed from its
    last checkpoint and trained nothing, said as Info. The integrations send when the
    checkpoint was committed; one from before the job was created is another run's."""
    h, seen = handler(tmp_path)
    h.created_at = NOW.timestamp()
    h.handle([msg("resumed", step=30, location="/out/checkpoint-30",
                  committed_at=NOW.timestamp() - 3600)], attempt=0)
    assert [(lv, r) for lv, r, _ in seen] == [(Level.WARNING, Reason.RESUMED)]
    assert seen[0][2] == (
        "resumed from the checkpoint of step 30 at /out/checkpoint-30, committed "
        "2025-12-31T23:00:00.000+00:00, before this job was created: another run's checkpoint "
        "in the trainer's output dir (a resume takes the newest committed one there); give "
        "the job a new output dir to start fresh")
    h.handle([msg("resumed", step=40, location="/out/checkpoint-40",
                  committed_at=NOW.timestamp() + 60)], attempt=1)  # this job's own
    assert seen[1][:2] == (Level.INFO, Reason.RESUMED)
    # another host's clock a few seconds ahead: the job's own (review 47 #4)
    h.handle([msg("resumed", step=0, location="/out/checkpoint-0",
                  committed_at=NOW.timestamp() - 5)], attempt=2)
    assert seen[2][:2] == (Level.INFO, Reason.RESUMED)


def test_a_slurm_requeue_s_own_checkpoints_are_no_other_run_s(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Review 47 #4: a requeue whose job dir is new (Slurm's restart count says it is the
    same job) resumed its own checkpoint under the 'another run's' Warning."""
    from trainguard.controller.recorder import Recorder
    from trainguard.paths import JobPaths
    from trainguard.spec_build import build_spec

    spec = build_spec(None, {"entrypoint": "train.py", "run_id": "r"})
    paths = JobPaths(tmp_path / "job", tmp_path / "job" / "logs", tmp_path / "job" / "ck")
    paths.make()
    with JobStore.create(paths.job_dir, "r") as store:
        monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
        rec = Recorder(spec, paths, store, ["train.py"])
        rec.begin()
        assert rec.messages.created_at is None
        # requeued into its own job dir again: the store knows when the job was created
        # (review 48 #6: the check was dropped there too)
        again = Recorder(spec, paths, store, ["train.py"])
        again.begin()
        assert again.messages.created_at == datetime.fromisoformat(
            str(store.meta()["created_at"])).timestamp()
        monkeypatch.delenv("SLURM_RESTART_COUNT")
        fresh = Recorder(spec, paths, store, ["train.py"])
        fresh.begin()
        assert fresh.messages.created_at is not None


def test_the_integrations_say_when_the_checkpoint_they_resume_from_was_committed(
        tmp_path: Path) -> None:
    from trainguard.integrations.common import commit_time, mark_committed, mark_file_committed

    d = tmp_path / "checkpoint-5"
    d.mkdir()
    (d / "model.safetensors").write_bytes(b"x")
    mark_committed(d, 5)  # (no launcher: nothing is told)
    f = tmp_path / "epoch=0-step=5.ckpt"
    f.write_bytes(b"y")
    mark_file_committed(f, 5, tell=False)
    assert all(isinstance(commit_time(p), float) for p in (d, f))
    assert commit_time(tmp_path / "nothing-here") is None
    unmarked = tmp_path / "checkpoint-9"  # taken where none is marked: when it was written
    unmarked.mkdir()
    assert commit_time(unmarked) == unmarked.stat().st_mtime


def test_an_auto_resume_of_the_other_framework_is_a_warning_once(tmp_path: Path) -> None:
    """Walk-through 39 #12: `--auto-resume hf` on a Lightning script said so on the rank's
    stderr only; the job read succeeded and nothing resumed."""
    h, seen = handler(tmp_path)
    why = "--auto-resume hf is on, but this script loads Lightning's Trainer (...)"
    h.handle([msg("auto_resume_unused", why=why), msg("auto_resume_unused", why=why)],
             attempt=0)
    assert seen == [(Level.WARNING, Reason.AUTO_RESUME_UNUSED, f"rank 0: {why}")]


def test_no_checkpoint_after_one_was_committed_is_a_warning(tmp_path: Path) -> None:
    h, seen = handler(tmp_path)
    h.handle([msg("no_checkpoint", location="s3://b/run")], attempt=0)
    assert seen == []  # a first start: nothing expected
    h.handle([msg("checkpoint_saved", step=30, location="s3://b/run")], attempt=0)
    h.handle([msg("no_checkpoint", location="s3://b/run")], attempt=1)
    level, reason, text = seen[-1]
    assert (level, reason) == (Level.WARNING, Reason.CHECKPOINT_MISSING)
    assert "committed step 30" in text


def test_unknown_kinds_are_ignored(tmp_path: Path) -> None:
    h, seen = handler(tmp_path)
    h.handle([msg("from_the_future", x=1)], attempt=0)
    assert seen == []


def test_a_message_that_cannot_be_handled_is_dropped_and_the_next_one_counts(
        tmp_path: Path) -> None:
    """An agent of another version (or a bug) must not fail the job with one message."""
    h, seen = handler(tmp_path)
    h.handle([msg("checkpoint_saved", step="x"), msg("checkpoint_saved", step=1e400),
              msg("checkpoint_saved", step=30, location="/ck")], attempt=0)
    assert [s[1] for s in seen] == [Reason.CHECKPOINT_SAVED]
    assert h.max_committed_step == 30


def test_a_checkpoint_event_leaves_out_what_was_not_measured(tmp_path: Path) -> None:
    h, seen = handler(tmp_path)  # the HF integration measures no times
    h.handle([msg("checkpoint_saved", step=10, location="/r/checkpoint-10", bytes=2**20 * 0.4,
                  write_s=None, blocked_s=None)], attempt=0)
    # in the unit people read (a small checkpoint read "0.0 MiB")
    assert seen[0][2] == "checkpoint of step 10 committed at /r/checkpoint-10 (409.6 KiB)"
    h.handle([msg("checkpoint_saved", step=11, location="/r/c-11")], attempt=0)
    assert seen[1][2] == "checkpoint of step 11 committed at /r/c-11"


def test_a_failed_save_says_what_follows_and_the_last_one_allowed_does_not_say_it_retries(
        tmp_path: Path) -> None:
    """Walk-through 19: the third failed save in a row (the one that raises CheckpointError
    and ends the rank) still said 'training goes on, the next save retries'."""
    h, seen = handler(tmp_path)
    h.handle([msg("checkpoint_save_failed", step=s, error="No space left on device",
                  consecutive=n, limit=3, location="/ck") for s, n in ((10, 1), (20, 3))]
             + [msg("checkpoint_save_failed", step=30, error="x", consecutive=1),
                msg("checkpoint_save_failed", step=31, error="y", consecutive=1, limit=3,
                    on_exit="the rank is exiting")], attempt=0)
    assert [m for _, _, m in seen] == [
        "rank 0: checkpoint of step 10 failed (1 in a row: the next save retries; 3 in a row "
        "stop the rank): No space left on device",
        "rank 0: checkpoint of step 20 failed (3 in a row: the rank stops with a "
        "CheckpointError at its next step): No space left on device",
        "rank 0: checkpoint of step 30 failed (1 in a row: the next save retries): x",
        "rank 0: checkpoint of step 31 failed (1 in a row: a save on the way out: no save "
        "follows): y"]


def test_a_kept_message_is_recorded_once_under_the_attempt_it_was_sent_in(
        tmp_path: Path) -> None:
    """node/outbox.py: a message with an id comes again after a reconnect (resent: its first
    controller may have recorded it and died before it acknowledged), or in a command's reply
    the agent answered again from its memory; a resent one may come in a later attempt's
    report."""
    from trainguard.controller.recorder import Recorder
    from trainguard.paths import JobPaths
    from trainguard.spec_build import build_spec

    spec = build_spec(None, {"entrypoint": "train.py", "run_id": "r"})
    paths = JobPaths(tmp_path / "job", tmp_path / "job" / "logs", tmp_path / "job" / "ck")
    paths.make()
    store = JobStore.create(paths.job_dir, "r")
    saved = msg("checkpoint_saved", step=10, location="/ck").model_copy(
        update={"id": "9-1-0", "attempt": 0})
    first = Recorder(spec, paths, store, ["train.py"])
    first.messages.handle([saved, saved], attempt=0)  # the reply answered twice: once
    second = Recorder(spec, paths, store, ["train.py"])  # a controller that took over
    again = saved.model_copy(update={"resent": True})
    later = msg("checkpoint_saved", step=20, location="/ck").model_copy(
        update={"id": "9-2-0", "attempt": 0, "resent": True})
    second.messages.handle([again, later], attempt=1)  # in attempt 1's first report
    got = [(e.message, e.involved.attempt, (e.data or {}).get("message_id"))
           for _, e in store.events() if e.reason == Reason.CHECKPOINT_SAVED.value]
    assert got == [("checkpoint of step 10 committed at /ck", 0, "9-1-0"),
                   ("checkpoint of step 20 committed at /ck", 0, "9-2-0")]
    assert second.messages.max_committed_step == 20
    assert second.messages.committed_this_attempt is None  # attempt 0's, not attempt 1's


def test_a_rank_that_resumed_without_a_part_of_its_own_is_a_warning_each(
        tmp_path: Path) -> None:
    """Walk-through 21: a save on the way out (--save-on-exit) holds no dead rank's state;
    that rank resumed with a donor's data position and a fresh RNG, and nothing said the
    run was no longer bit-exact."""
    h, seen = handler(tmp_path)
    h.handle([msg("resumed", step=12, source="storage", own_part=True),
              WorkerMessage(kind="resumed", rank=1, at=NOW,
                            data={"step": 12, "source": "storage", "own_part": False,
                                  "borrowed_from": 0})], attempt=1)
    assert [(lv, r) for lv, r, _ in seen] == [(Level.INFO, Reason.RESUMED),
                                             (Level.WARNING, Reason.RESUMED)]
    assert seen[1][2].startswith("rank 1 resumed from the checkpoint of step 12 without a "
                                 "part of its own")
    assert "rank 0's data position and a fresh RNG" in seen[1][2]
    assert "not bit for bit" in seen[1][2]


def test_a_message_kept_while_no_controller_watched_keeps_its_own_time(tmp_path: Path) -> None:
    """(walk-through 23) After a takeover, the CheckpointSaved events of commits made while no
    controller ran were all stamped with the takeover's time: the dashboard's checkpoint table
    and the goodput ledger read 17 saves at one instant."""
    from datetime import timedelta

    from trainguard.records import utcnow
    from trainguard.worker.contract import MessageKind

    got: list[dict[str, Any]] = []

    def emit(level: Level, reason: Reason, message: str, **kw: Any) -> None:
        got.append(kw)

    store = JobStore.create(tmp_path / "job", "r")
    wm = WorkerMessages(emit, IncidentBook(store))
    sent = utcnow() - timedelta(minutes=3)
    late = WorkerMessage(kind=MessageKind.CHECKPOINT_SAVED, rank=0, at=sent,
                         data={"step": 50, "location": "/ck"})
    now = WorkerMessage(kind=MessageKind.CHECKPOINT_SAVED, rank=0, at=utcnow(),
                        data={"step": 60, "location": "/ck"})
    wm.handle([late, now], 0)
    assert got[0]["at"] == sent
    assert got[1]["at"] is None


def test_the_interval_advice_times_saves_by_the_rank_that_made_them(tmp_path: Path) -> None:
    """(walk-through 25) Saves 0.1 s apart arrive in one agent poll and were recorded at one
    instant: the interval advice read the poll's period (or nothing) as the save interval."""
    from datetime import timedelta
    from types import SimpleNamespace

    from trainguard.controller.recorder import Recorder
    from trainguard.goodput.metrics import interval_advice
    from trainguard.goodput.read import saves
    from trainguard.paths import JobPaths
    from trainguard.records import utcnow
    from trainguard.spec_build import build_spec

    spec = build_spec(None, {"entrypoint": "train.py", "run_id": "r"})
    paths = JobPaths(tmp_path / "job", tmp_path / "job" / "logs", tmp_path / "job" / "ck")
    paths.make()
    store = JobStore.create(paths.job_dir, "r")
    t0 = utcnow()
    batch = [WorkerMessage(kind="checkpoint_saved", rank=0, at=t0 + timedelta(seconds=0.1 * i),
                           data={"step": 10 * i, "location": "/ck", "blocked_s": 0.01})
             for i in range(1, 6)]
    Recorder(spec, paths, store, ["train.py"]).messages.handle(batch, attempt=0)
    commits = saves(store)
    assert [c.sent_at for c in commits] == [round(m.at.timestamp(), 3) for m in batch]
    g = SimpleNamespace(wall_s=60.0, seconds=lambda cause: 0.0)
    a = interval_advice(g, [], commits)  # type: ignore[arg-type]
    assert a.current_s is not None and abs(a.current_s - 0.1) < 0.002, a


def test_a_failed_save_at_breakpoint_is_an_event_that_says_the_step_is_not_in_storage(
        tmp_path: Path) -> None:
    """Walk-through 27: the agent's persistence of the memory snapshots hit a full disk and
    only a console line and persist.log said so."""
    h, seen = handler(tmp_path)
    h.handle([WorkerMessage(kind="checkpoint_save_failed", rank=None, at=NOW, data={
        "step": 30, "error": "[Errno 28] No space left on device", "location": "/ck",
        "source": "memory"})], attempt=0)
    ((level, reason, message),) = seen
    assert (level, reason) == (Level.WARNING, Reason.CHECKPOINT_SAVE_FAILED)
    assert message == ("the save at breakpoint of step 30 from memory failed: [Errno 28] No "
                       "space left on device; that step is kept only in the node's memory, "
                       "not in storage (/ck)")


def test_faults_not_fired_are_named_unless_the_controller_took_the_job_over(
        tmp_path: Path, monkeypatch: Any) -> None:
    """Walk-through 35 F6, review 39 #2: each rank says once per process which inject
    function it calls; a controller that took over a running job never heard it."""
    monkeypatch.setenv("TRAINGUARD_FAULT", "log:x@step=2;crash@rank=5,step=3")
    h, _ = handler(tmp_path)
    assert h.faults_note() is not None and "2 of its 2 fault(s) never fired" in str(
        h.faults_note())
    h.handle([msg("faults", call="inject"), msg("faults", call="inject", fired=0)], attempt=0)
    note = h.faults_note()
    assert note is not None and note.startswith(
        "TRAINGUARD_FAULT was set, but 1 of its 2 fault(s) never fired: crash@step 3, rank 5, "
        "attempt 0: the ranks called inject(), but never at step 3, rank 5, attempt 0. Fix:")
    h.saw_whole_job = False  # Recorder.adopt
    assert h.faults_note() is None


def test_each_in_process_restart_of_one_attempt_has_its_resumed(tmp_path: Path) -> None:
    """Walk-through 37 #2: a second in-process restart in one attempt said no Resumed (one
    per attempt and source), so its recovery record had no `resumed_from`. What is kept to
    say it once per incident stays bounded however many incidents the job has."""
    from trainguard.controller.faults import Fault
    from trainguard.controller.worker_messages import RESUMES_KEPT
    from trainguard.policy.decision import Action, Decision, History, Rung
    from trainguard.protocol import Progress
    from trainguard.records import FaultScenario, StartType, incidents_of, utcnow

    h, seen = handler(tmp_path)
    book = h._book
    book.attempt_started(0, StartType.FIRST_START, 29500)
    inproc = Decision(Action.RESTART_RANKS, "rank 1 starts again", History(),
                      rung=Rung.IN_PROCESS_RESTART)
    steps = range(10, 70, 10)
    for step in steps:
        p = Progress(first_step=1, first_step_at=utcnow(), last_step=step + 5,
                     last_step_at=utcnow())
        t = utcnow()
        book.record(0, inproc, Fault(FaultScenario.JOB_FAILED, "x", "x", "worker-1", t, t, t, p))
        h.handle([msg("resumed", step=step, source="memory")], attempt=0)
        h.handle([msg("resumed", step=step, source="memory")], attempt=0)  # the other rank
    assert [m for _, r, m in seen if r == Reason.RESUMED] == [
        f"resumed from the node's memory snapshot of step {s}" for s in steps]
    records = incidents_of([book.current] if book.current else [])
    assert [(r.resumed_step, r.resumed_from) for r in records] == [(s, "memory")
                                                                   for s in steps]
    assert len(h._resumed_sources) == RESUMES_KEPT < len(steps)


def test_a_relaunch_that_finds_no_checkpoint_says_the_storage_lost_the_job_s(
        tmp_path: Path) -> None:
    """Walk-through 37 #5: the job's earlier launches committed step 30, the dir was wiped;
    the relaunch trained from scratch with no CheckpointMissing (the committed step was
    the launcher's memory only)."""
    from trainguard.controller.recorder import Recorder
    from trainguard.paths import JobPaths
    from trainguard.spec_build import build_spec

    spec = build_spec(None, {"entrypoint": "train.py", "run_id": "r"})
    paths = JobPaths(tmp_path / "job", tmp_path / "job" / "logs", tmp_path / "job" / "ck")
    paths.make()
    store = JobStore.create(paths.job_dir, "r")
    first = Recorder(spec, paths, store, ["train.py"])
    first.begin()
    first.messages.handle([msg("checkpoint_saved", step=30, location="/ck")], attempt=0)
    store.set_meta(state="failed", attempt=0)
    again = Recorder(spec, paths, store, ["train.py"])  # the same command, in the morning
    attempt, _ = again.begin()
    again.messages.handle([msg("no_checkpoint", location="/ck")], attempt=attempt)
    said = [e.message for _, e in store.events() if e.reason == Reason.CHECKPOINT_MISSING.value]
    assert len(said) == 1 and "this job committed step 30 there" in said[0], said
    assert again.messages.newest_commit == (30, "/ck")  # where (review 44 #1: a bucket gone)
