"""`diagnose JOB_DIR`'s reading of a job store (cli/diagnose_job.py) over a real store in a
temporary dir: which attempt is diagnosed, and when none failed."""

from __future__ import annotations

import shutil
import socket
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from trainguard.cli.diagnose_job import job_reader, read_job_dir
from trainguard.controller.faults import LOST_END_REASON
from trainguard.controller.store import JobStore, WorkerRow
from trainguard.diagnosis.silent_peer import silent_peer
from trainguard.diagnosis.sources import diagnose_paths
from trainguard.diagnosis.taxonomy import (
    Category,
    Culprit,
    Diagnosis,
    Evidence,
    FaultDomain,
    RestartHelps,
)
from trainguard.records import (
    FaultScenario,
    RecoverRecord,
    RecoverResult,
    RunningRecord,
    StartType,
)
from trainguard.states import WorkerState

T0 = datetime(2026, 12, 3, 12, 0, tzinfo=timezone.utc)


def test_an_attempt_lost_with_its_launcher_then_one_that_succeeded_is_no_failure(
        tmp_path: Path) -> None:
    """Walk-through 10: `stop --force` lost attempt 0, the relaunch succeeded; diagnose said
    'attempt 1 succeeded, and no known error ...' instead of 'no failure found'."""
    job = tmp_path / "job"
    with JobStore.create(job, "run-1") as s:
        s.put_running(RunningRecord(0, T0, StartType.FIRST_START, T0 + timedelta(seconds=9),
                                    LOST_END_REASON))
        s.put_running(RunningRecord(1, T0 + timedelta(seconds=20), StartType.RELAUNCH,
                                    T0 + timedelta(seconds=40), "succeeded"))
        s.put_workers(0, [WorkerRow(0, r, r, "node0", 100 + r, "running") for r in (0, 1)])
        s.put_workers(1, [WorkerRow(1, r, r, "node0", 200 + r, "succeeded", 0)
                          for r in (0, 1)])
    problems: list[str] = []
    got = read_job_dir(job, problems)
    assert got is not None and got.failed is False and got.files == [], got
    assert got.note == ("no attempt of the job failed (attempt 0 was lost with its launcher, "
                        "killed or crashed, and its ranks with it; attempt 1 succeeded)")


def lost_job(job: Path, log: str, nodes: list[Any] | None = None,
             workers: list[WorkerRow] | None = None) -> Path:
    """A job recorded as running attempt 0 (one rank on node-0, its log `log`; or
    `workers`) whose launcher is gone: `status` reads it lost."""
    with JobStore.create(job, "run-1") as s:
        s.set_meta(state="running", attempt=0, launcher_pid=2**22 + 12345,  # none such
                   launcher_host=socket.gethostname(), log_dir=str(job / "logs"))
        s.put_running(RunningRecord(0, T0, StartType.FIRST_START))
        s.put_workers(0, workers or [WorkerRow(0, 0, 0, "node-0", 100, "running")])
        if nodes:
            s.put_nodes(nodes)
    logs = job / "logs" / "attempt-0"
    logs.mkdir(parents=True)
    (logs / "rank-0.log").write_text(log)
    return job


def test_a_job_lost_with_its_launcher_and_not_relaunched_is_no_failure(tmp_path: Path) -> None:
    """Walk-through 38 #7: `stop --force` of a rank that ignored SIGTERM and said so; before
    a relaunch closes the lost attempt its end is unknown, and its log's 'got SIGTERM' was
    diagnosed as a kill from outside (exit 0). A job `status` reads lost is no failure."""
    job = lost_job(tmp_path / "job", "step 1\ngot SIGTERM, ignoring\nstep 2\n")
    got = read_job_dir(job, [])
    assert got is not None and got.failed is False and got.files == [], got
    assert got.note == ("no attempt of the job failed (attempt 0 was lost with its launcher, "
                        "killed or crashed, and its ranks with it)")


def test_a_lost_job_whose_agents_still_run_is_read_from_its_logs(tmp_path: Path) -> None:
    """Review 45 #3: a multi-node job whose launcher died while its node agents run on (they
    keep their ranks for a takeover): `status` says its ranks train on; diagnose is no
    'lost with its ranks', it reads their logs."""
    import subprocess
    import sys

    from trainguard.controller.store import NodeRow
    from trainguard.states import NodeState

    agent = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)",
                              "trainguard.node.main", "--node", "node-0"],
                             start_new_session=True)  # an agent as `live_agents` finds one
    try:
        job = lost_job(tmp_path / "job", "step 1\n", [NodeRow(
            "node-0", "h", NodeState.HEALTHY, agent.pid, 0, None, T0, "local")])
        got = read_job_dir(job, [])
        assert got is not None and got.note is None and len(got.files) == 1, got
    finally:
        agent.kill()
        agent.wait()


def test_a_lost_job_s_ranks_whose_agent_ended_with_the_launcher_are_lost_not_failed(
        tmp_path: Path) -> None:
    """Review 46 #2: node-0's agent runs on, node-1's ended with the launcher: `status`
    reads rank 1 lost; diagnose read its log (a stop's 'got SIGTERM, ignoring') as a kill
    from outside. Its log and exit are left out, and the note says it was lost."""
    import subprocess
    import sys

    from trainguard.controller.store import NodeRow
    from trainguard.states import NodeState

    agent = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)",
                              "trainguard.node.main", "--node", "node-0"],
                             start_new_session=True)  # an agent as `live_agents` finds one
    try:
        job = lost_job(tmp_path / "job", "step 1\nstep 2\n", [
            NodeRow("node-0", "h", NodeState.HEALTHY, agent.pid, 0, None, T0, "local"),
            NodeRow("node-1", "h", NodeState.HEALTHY, 2**22 + 999, 1, None, T0, "local")],
            [WorkerRow(0, 0, 0, "node-0", 100, "running"),
             WorkerRow(0, 1, 0, "node-1", 101, "running")])
        (job / "logs" / "attempt-0" / "rank-1.log").write_text(
            "step 1\ngot SIGTERM, ignoring\nstep 2\n")
        got = read_job_dir(job, [])
        assert got is not None and got.failed is False, got
        assert [name for _, name in got.files] == ["logs/attempt-0/rank-0.log"], got.files
        assert [e.rank for e in got.exits] == [0], got.exits
        assert got.note == ("attempt 0: rank(s) 1 were lost with the launcher (their node's "
                            "agent ended with it); the others run on under their node "
                            "agents, for a controller to take the job over")
        report = diagnose_paths([job], read_job=job_reader(None))
        assert report.attempt_failed is False and report.note == got.note, report
        assert report.diagnosis is None or "SIGTERM" not in str(report.diagnosis), report
    finally:
        agent.kill()
        agent.wait()


NCCL = "RuntimeError: NCCL error: unhandled system error (run with NCCL_DEBUG=INFO)"


def _in_process(result: RecoverResult, *, detected: float, decided: float,
                end: float | None) -> RecoverRecord:
    return RecoverRecord(0, T0 + timedelta(seconds=detected), FaultScenario.ERROR_IN_LOG,
                         "nccl_communication_error", "worker-1", recover="in_process_restart",
                         recover_result=result, detected_at=T0 + timedelta(seconds=detected),
                         decided_at=T0 + timedelta(seconds=decided),
                         recover_end_at=None if end is None else T0 + timedelta(seconds=end))


def _job_with(tmp_path: Path, records: list[RecoverRecord], lines: dict[int, list[str]]) -> Path:
    """A store whose attempt 0 failed (every rank exited 1) with `records`, and rank logs."""
    job = tmp_path / "job"
    with JobStore.create(job, "run-1") as s:
        s.put_running(RunningRecord(0, T0, StartType.FIRST_START, T0 + timedelta(seconds=30),
                                    "failed", recover_records=records))
        s.put_workers(0, [WorkerRow(0, r, r, "node0", 100 + r, WorkerState.FAILED, 1,
                                    ended_at=T0 + timedelta(seconds=21)) for r in (0, 1)])
    logs = job / "logs" / "attempt-0"
    logs.mkdir(parents=True)
    for rank, texts in lines.items():
        (logs / f"rank-{rank}.log").write_text("".join(
            f"{(T0 + timedelta(seconds=s)).isoformat()} err {t}\n" for s, t in texts))
    return job


def test_an_in_process_restart_that_did_not_recover_bounds_the_window_where_it_began(
        tmp_path: Path) -> None:
    """Review 36 #7: a downgraded record (the rung did not act: no rank survived) ends at the
    failure's detection, and the window from there left that failure no line ('rank 0 exited
    with code 1 and left no known error') where the live verdict named the NCCL error. Now a
    downgrade leaves every line in; a restart that made no progress (closed at the next
    failure's detection) keeps the lines after it began, not after its close; one that
    recovered keeps the lines after its first step."""
    # rank 1: the NCCL error the first restart answered (5 s); a line read between that
    # restart's decision and its first step (7 s); the error the second restart answered,
    # after the first one's step and before the second began (9 s). Rank 0: a later error.
    lines = {1: [(5.0, "[trainguard.faults] injecting log at step 4"), (5.0, NCCL),
                 (7.0, "RuntimeError: CUDA error: an illegal memory access was encountered"),
                 (9.0, "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB")],
             0: [(19.0, "ValueError: invalid literal for int() with base 10: 'abc'")]}
    cases = [  # (records, the deciding line's category)
        # downgraded: the attempt's own failure, from all its lines (none left out: before
        # the fix none was left in, and the verdict was 'exited with code 1 and left no
        # known error'); of rank 1's, the OOM explains the NCCL error
        ([_in_process(RecoverResult.DOWNGRADE, detected=20, decided=20.1, end=20)],
         "gpu_oom"),
        # recovered at 8 s, then one that did not recover began at 10.1 s: after it began
        ([_in_process(RecoverResult.SUCCESS, detected=6, decided=6.1, end=8),
          _in_process(RecoverResult.FAILED, detected=10, decided=10.1, end=20)],
         "user_code_error"),
        # recovered at 8 s (its first step), not at its decision (6.1 s): the 9 s line decides
        ([_in_process(RecoverResult.SUCCESS, detected=6, decided=6.1, end=8)], "gpu_oom"),
    ]
    for i, (records, want) in enumerate(cases):
        job = _job_with(tmp_path / str(i), records, lines)
        report = diagnose_paths([job], read_job=job_reader(None))
        d = report.diagnosis
        assert d is not None, report.problems
        assert d.category.value == want and d.evidence is not None, (i, d)
        assert d.evidence.file.endswith("rank-0.log" if i == 1 else "rank-1.log"), (i, d)


def test_a_lost_launch_s_peer_error_names_the_rank_whose_log_just_stopped(
        tmp_path: Path) -> None:
    """Walk-through 42 #1: the controller's node n1 died with rank 0, whose log ended at
    step 66 without an error; rank 1 on n2 logged gloo's lost connection 0.17 s later. The
    relaunch closed attempt 0 as lost; `diagnose --attempt 0` named rank 1 on n2 (the node
    that survived) the culprit. Now the rank whose log just stopped is named."""
    job = tmp_path / "job"

    def make(rank0_tail: str, gap_s: float) -> Path:
        shutil.rmtree(job, ignore_errors=True)
        with JobStore.create(job, "run-1") as s:
            s.set_meta(log_dir=str(job / "logs"))
            s.put_running(RunningRecord(0, T0, StartType.FIRST_START,
                                        T0 + timedelta(seconds=60), LOST_END_REASON))
            s.put_running(RunningRecord(1, T0 + timedelta(seconds=90), StartType.RELAUNCH,
                                        T0 + timedelta(seconds=120), "succeeded"))
            s.put_workers(0, [WorkerRow(0, r, r, f"n{r + 1}", 100 + r, "running")
                              for r in (0, 1)])
            s.put_workers(1, [WorkerRow(1, r, r, f"n{r + 1}", 200 + r, "succeeded", 0)
                              for r in (0, 1)])
        logs = job / "logs" / "attempt-0"
        logs.mkdir(parents=True)
        (logs / "rank-0.log").write_text(
            "2026-12-03T12:00:20.100 out step 65\n"
            f"2026-12-03T12:00:24.614 out {rank0_tail}\n")
        err = datetime(2026, 12, 3, 12, 0, 24, 787000) + timedelta(seconds=gap_s)
        (logs / "rank-1.log").write_text(
            "2026-12-03T12:00:24.500 out step 66\n"
            f"{err.isoformat(timespec='milliseconds')} err [rank1]: RuntimeError: "
            "[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer "
            "[10.0.0.1]:41231\n")
        return job

    def verdict(job: Path) -> Any:
        report = diagnose_paths([job], read_job=job_reader(0))
        assert report.diagnosis is not None, report
        return report.diagnosis

    d = verdict(make("step 66", 0.0))
    assert d.category.value in ("nccl_communication_error", "network_or_rendezvous"), d
    assert (d.culprit.rank, d.culprit.node) == (0, "n1"), d
    assert d.summary.startswith("rank(s) 0 (node n1) stopped logging without an error 0.17s "
                                "before rank 1 lost its connection"), d.summary
    assert d.evidence is not None and d.evidence.rank == 1  # the line is still rank 1's
    # a rank whose log shows an error of its own did not just stop
    d = verdict(make("RuntimeError: CUDA error: an illegal memory access was encountered",
                     0.0))
    assert d.culprit.rank != 0 or not d.summary.startswith("rank(s) 0"), d
    # a log that stopped long before says nothing of which rank ended first
    d = verdict(make("step 66", 30.0))
    assert (d.culprit.rank, d.culprit.node) == (1, "n2"), d


def test_ranks_of_two_nodes_that_stopped_alike_name_no_single_culprit() -> None:
    """Review 52 #7: two ranks on two nodes whose logs both stopped before the symptom, a
    few milliseconds (or their nodes' clocks) apart, decided which healthy node was blamed."""
    at = datetime(2026, 12, 3, 12, 0, 24, 787000, tzinfo=timezone.utc)
    peer = Diagnosis(Category.NCCL_COMMUNICATION_ERROR, FaultDomain.NETWORK, RestartHelps.YES,
                     "gloo: connection closed by peer", "retry", Culprit(0, "n1"),
                     Evidence("logs/attempt-0/rank-0.log", 2, "Connection closed by peer", 0,
                              at), confidence=0.45)
    both = silent_peer(peer, {1: (at - timedelta(milliseconds=300), "n2"),
                              2: (at - timedelta(milliseconds=302), "n3")})
    assert both is not None and both.culprit == Culprit(), both.culprit
    assert both.summary.startswith("rank(s) 1, 2 (node n2, n3) stopped logging without an "
                                   "error within 10s before rank 0 lost its connection"), both
    one = silent_peer(peer, {1: (at - timedelta(milliseconds=300), "n2"),
                             3: (at - timedelta(milliseconds=302), "n2")})
    assert one is not None and one.culprit.node == "n2"  # one node: named
