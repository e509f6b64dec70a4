"""A launcher killed in a restart's backoff left its incident `recovering` for good: the
relaunch closed the attempt (lost) but not the incident, so the report showed a succeeded job
still recovering and the ledger booked the 10 minutes to the relaunch as recovery, not queued
(walk-through 30, #12)."""

from __future__ import annotations

import os
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from trainguard.controller.incidents import IncidentBook
from trainguard.controller.store import JobStore
from trainguard.records import (
    Event,
    FaultScenario,
    Involved,
    Level,
    RecoverRecord,
    RecoverResult,
    RunningRecord,
    StartType,
    iso,
    recoveries_by_rung,
    utcnow,
)

T0 = datetime(2026, 12, 5, 19, 52, tzinfo=timezone.utc)


def at(s: float) -> datetime:
    return T0 + timedelta(seconds=s)


def test_a_relaunch_ends_the_incident_the_lost_launch_was_recovering_from(
        tmp_path: Path) -> None:
    rec = RunningRecord(0, at(0), StartType.FIRST_START)
    rec.recover_records.append(RecoverRecord(
        attempt=0, recover_start_at=at(12), fault_scenario=FaultScenario.JOB_FAILED,
        reason="rank 1 was killed by SIGKILL", related_task="worker-1",
        recover="process_restart", decided_at=at(12.1)))  # then its 30 s backoff
    with JobStore.create(tmp_path / "job", "r") as store:
        store.put_running(rec)
        IncidentBook(store).launch_lost(at(20))  # its last sign of life, in the backoff
        (after,) = store.running_records()
    (rr,) = after.recover_records
    assert (rr.recover_result, rr.recover_end_at) == (RecoverResult.TERMINATED, at(20))
    assert after.end_at == at(20) and recoveries_by_rung([after]) == {}  # it never restarted


def relaunch(tmp_path: Path, lines: list[tuple[float, str]], stored: list[tuple[int, float]],
             *, cut: str = "", rank1: list[tuple[float, str]] | None = None,
             own_events: int = 0, **meta: Any
             ) -> tuple[RunningRecord, list[tuple[int, int, float]], str | None]:
    """A launch lost in attempt 0 (its store's samples `stored`, rank 0's log `lines` and
    then `cut`, a last line with no newline; rank 1's `rank1`), relaunched through a real
    Recorder.begin: (the attempt's record, the store's samples, the JobRelaunched event's
    text)."""
    from trainguard.controller.recorder import Recorder
    from trainguard.paths import JobPaths
    from trainguard.spec_build import build_spec

    spec = build_spec(None, {"entrypoint": "train.py", "run_id": "r"})
    job = tmp_path / "job"
    paths = JobPaths(job, job / "logs", str(job / "ck"))
    paths.make()
    rank0 = paths.log_dir / "attempt-0" / "rank-0.log"
    rank0.parent.mkdir(parents=True)
    rank0.write_text("".join(f"{at(s).isoformat()} out {text}\n" for s, text in lines) + cut)
    os.utime(rank0, (at(lines[-1][0]).timestamp(),) * 2)  # written with its last line
    if rank1 is not None:
        (rank0.parent / "rank-1.log").write_text(
            "".join(f"{at(s).isoformat()} out {text}\n" for s, text in rank1))
    with JobStore.create(job, "r") as store:
        store.set_meta(state="running", attempt=0, last_step=stored[-1][0],
                       created_at=at(0).isoformat(), launches=1, **meta)
        store.put_running(RunningRecord(0, at(0), StartType.FIRST_START))
        store.add_progress([(0, step, at(t).timestamp()) for step, t in stored])
        for _ in range(own_events):  # this launch's own, before it looks (a failed takeover)
            store.add_event(Event(utcnow(), Level.WARNING, "ControllerRestarted", "cannot",
                                  Involved("r", None, None, None)))
        Recorder(spec, paths, store, ["train.py"]).begin()
        (lost,) = store.running_records()
        said = [e.message for _, e in store.events() if e.reason == "JobRelaunched"]
        return lost, store.progress(), said[0] if said else None


def test_a_relaunch_reads_the_lost_launch_s_last_step_from_its_rank_logs(
        tmp_path: Path) -> None:
    """Walk-through 40 #3: a launcher killed with SIGKILL at step 230 left the store at step
    227 (progress reaches it in batches); the relaunch ended the attempt at the time of the
    logs' last line, `step 230`, but with step 227, and counted 7 steps done again, not 10.
    The logs' last labelled step is the attempt's last step, and a progress sample; the
    relaunch's event says when the lost launch was last alive, and at which step."""
    lost, samples, said = relaunch(tmp_path, [
        (27.0, "step 227 loss 0.61"), (28.0, "step 230 loss 0.62"),
        (28.5, "  3%|▏   | 300/9000 [00:01<00:30]"),  # a bar (an evaluation's?): not read
        (29.0, "saving: resumed from step 500")], [(227, 27.0)])  # no step: not the pattern's
    assert lost.end_reason is not None and lost.last_step == 230, lost
    assert samples[-1] == (0, 230, at(28).timestamp()), samples
    assert said is not None and "ended lost (its launcher died: last sign of life " \
        f"{iso(at(29))}, at step 230) at attempt 0" in said, said


def test_a_lost_launch_s_last_step_is_its_last_line_s_not_the_highest(tmp_path: Path) -> None:
    """Review 49 #4: an in-process restart stays in the same log: the steps before it are
    higher and older. The attempt ended at step 210 (after a restart from 200), not 230, and
    the sample the store had (208) is not added twice."""
    restarted = [(30.0 + i, f"step {200 + i} loss 0.5") for i in range(1, 11)]
    _, samples, _ = relaunch(tmp_path, [(28.0, "step 230 loss 0.62"), *restarted],
                             [(230, 28.0), (201, 31.0), (208, 38.0)])
    assert samples == [(0, 230, at(28).timestamp()), (0, 201, at(31).timestamp()),
                       (0, 208, at(38).timestamp()), (0, 210, at(40).timestamp())], samples


def test_a_relaunch_s_own_events_are_no_sign_of_the_lost_launch_s_life(tmp_path: Path) -> None:
    """Walk-through 42 #1: the node of the controller died; the resubmitted launcher waited
    20 s to take the attempt over, failed, wrote ControllerRestarted and NodeReady, then
    closed the lost attempt at its own last event: 94 s after the real last sign of life,
    all of it booked as the lost attempt's `other`, none as `queued`."""
    lost, _, said = relaunch(tmp_path, [(27.0, "step 227"), (29.0, "step 229")], [(227, 27.0)],
                             own_events=4)
    assert lost.end_at == at(29), lost.end_at
    assert said is not None and f"last sign of life {iso(at(29))}, at step 229" in said, said


def test_a_lost_launch_s_logs_never_lower_its_step(tmp_path: Path) -> None:
    """Review 50 #4: an evaluation's `iter N` lines after the last training step, or a last
    line cut short (`step 23` of `step 230`, no newline), became the attempt's end and a
    progress sample the ledger read as an in-process restart (26 steps done again). The logs'
    step counts only when it is higher than the store's last sample (the agent's high-water),
    and a line with no newline is not read."""
    evals = [(29.0 + i, f"iter {i} eval loss 0.4") for i in range(1, 6)]
    lost, samples, said = relaunch(tmp_path, [(28.0, "step 230 loss 0.62"), *evals],
                                   [(220, 20.0), (227, 27.0)])
    assert lost.last_step == 227 and samples[-1] == (0, 227, at(27).timestamp())
    assert said is not None and ", at step 227) at attempt 0" in said, said
    lost, samples, _ = relaunch(tmp_path / "cut", [(27.5, "step 228 loss 0.6")],
                                [(227, 27.0)], cut=f"{at(28).isoformat()} out step 23")
    assert samples[-1] == (0, 228, at(27.5).timestamp()), samples


def test_a_lost_launch_s_step_is_the_newest_of_its_ranks_last_lines(tmp_path: Path) -> None:
    """Review 50 #5: rank 1 labels a line only every ten steps; rank 0 went through an
    in-process restart the store never saw. Rank 1's older, higher `step 230` is not the
    attempt's end: the newest line is rank 0's `step 205`, lower than the store's 227, so
    the store's step stands (a second short, as before, rather than a made-up end)."""
    restarted = [(24.0 + i, f"step {201 + i} loss 0.5") for i in range(5)]
    lost, samples, _ = relaunch(tmp_path, [(19.0, "step 228"), (20.0, "step 229"), *restarted],
                                [(227, 19.5)], rank1=[(10.0, "step 220"), (22.0, "step 230")])
    assert samples == [(0, 227, at(19.5).timestamp())], samples
    assert lost.last_step == 227, lost


def test_a_lost_launch_whose_ranks_reported_their_own_steps_keeps_the_store_s(
        tmp_path: Path) -> None:
    """Review 49 #5: a rank that calls trainguard.progress numbers its steps itself; its log's
    `step N` lines may count micro-batches (the agent ignores them then): the store's step
    300 stays, not the log's 1200."""
    lost, samples, said = relaunch(tmp_path, [(28.0 + i, f"step {1160 + 10 * i} loss 0.5")
                                              for i in range(5)], [(300, 27.0)],
                                   self_reported_attempt=0)
    assert lost.last_step == 300 and samples == [(0, 300, at(27).timestamp())]
    assert said is not None and ", at step 300) at attempt 0" in said, said


def test_the_recorder_keeps_which_attempt_reported_its_own_steps(tmp_path: Path) -> None:
    """What the relaunch reads above: the recorder writes the attempt in which a rank sent
    trainguard.progress (the node agent forwards the message in its report)."""
    from trainguard.controller.lost_launch import SELF_REPORTED
    from trainguard.controller.recorder import Recorder
    from trainguard.paths import JobPaths
    from trainguard.protocol import NodeReport, Progress, WorkerMessage
    from trainguard.spec_build import build_spec
    from trainguard.worker.contract import MessageKind

    spec = build_spec(None, {"entrypoint": "train.py", "run_id": "r"})
    paths = JobPaths(tmp_path / "job", tmp_path / "job" / "logs", str(tmp_path / "job" / "ck"))
    paths.make()

    def sync(attempt: int, *kinds: MessageKind) -> object:
        rec.sync(NodeReport(node="node-0", attempt=attempt, workers=[], progress=Progress(),
                            at=at(1), messages=[WorkerMessage(kind=k, rank=0, at=at(1),
                                                              data={"step": 3}) for k in kinds]))
        return store.meta().get(SELF_REPORTED)

    with JobStore.create(paths.job_dir, "r") as store:
        rec = Recorder(spec, paths, store, ["train.py"])
        assert sync(0) is None and sync(0, MessageKind.TRAIN_METRICS) is None
        assert sync(0, MessageKind.PROGRESS) == 0
        assert sync(1) == 0 and sync(1, MessageKind.PROGRESS) == 1


def test_a_relaunch_s_resume_tells_what_an_unresumed_incident_lost(tmp_path: Path) -> None:
    """Walk-through 42 #2: a node lost at step 65, the job stopped while it queued for a
    node, relaunched: it resumed from step 60, and the incident still read `steps lost -`
    (`unknown in 1`) beside `done again 5`."""
    rec = RunningRecord(0, at(0), StartType.FIRST_START)
    rec.recover_records.append(RecoverRecord(
        attempt=0, recover_start_at=at(12), fault_scenario=FaultScenario.NODE_FAULT,
        reason="node n2 lost", related_task="node-n2", recover="pod_reschedule",
        decided_at=at(12.1), last_step_before=65, recover_result=RecoverResult.TERMINATED))
    with JobStore.create(tmp_path / "job", "r") as store:
        store.put_running(rec)
        book = IncidentBook(store)
        book.attempt_started(1, StartType.RELAUNCH, 29500)
        book.resumed(60, "storage")
        book.resumed(50, "storage")  # a later resume of this launch is its own incident's
        first, *_ = store.running_records()
    (inc,) = first.recover_records
    assert inc.steps_lost == 5 and inc.recover_result == RecoverResult.TERMINATED
