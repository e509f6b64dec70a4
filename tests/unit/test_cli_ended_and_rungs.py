"""What the read commands say of a job that ended (or was lost) and of a recovery that
restarted no process, through the real command (`python -m trainguard`) on a real store."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

from trainguard.controller.store import JobStore, WorkerRow
from trainguard.records import (
    FaultScenario,
    RecoverRecord,
    RecoverResult,
    RunningRecord,
    StartType,
    iso,
)
from trainguard.states import WorkerState

TG = [sys.executable, "-m", "trainguard"]
T0 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=timezone.utc)
USAGE = {"node-0": {"standby_ready": 1, "standby_rss_bytes": 1 << 20, "shm_bytes": 0,
                    "shm_peer_bytes": 0}}


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def tg(*args: str) -> str:
    return subprocess.run([*TG, *args], capture_output=True, text=True, timeout=60,
                          check=True).stdout


def a_job(job: Path, launcher_pid: int) -> Path:
    """A job recorded as running whose launcher is `launcher_pid`, with a standby ready."""
    with JobStore.create(job, "run-e") as s:
        s.put_running(RunningRecord(0, at(0), StartType.FIRST_START))
        s.put_workers(0, [WorkerRow(0, 0, 0, "node-0", 4321, WorkerState.RUNNING)])
        s.set_meta(state="running", attempt=0, created_at=iso(at(0)), node_usage=USAGE,
                   launcher_pid=launcher_pid, launcher_host=socket.gethostname(),
                   log_dir=str(job / "logs"))
    return job


def test_a_lost_job_shows_no_live_node_usage_a_running_one_does(tmp_path: Path) -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    lost = a_job(tmp_path / "lost", dead.pid)
    assert json.loads(tg("status", str(lost), "--json"))["node_usage"] == []
    text = tg("status", str(lost))
    assert "· lost ·" in text and "fast recovery" not in text, text
    live = a_job(tmp_path / "live", os.getpid())  # this process: a launcher still alive
    assert json.loads(tg("status", str(live), "--json"))["node_usage"][0]["standby_ready"] == 1
    assert "fast recovery on node-0: 1 standby worker(s) ready" in tg("status", str(live))


def test_a_step_reexecution_is_a_recovery_by_its_rung_not_a_restart(tmp_path: Path) -> None:
    job = tmp_path / "j"
    rec = RunningRecord(0, at(0), StartType.FIRST_START, end_at=at(30), end_reason="succeeded")
    rec.recover_records.append(RecoverRecord(
        attempt=0, recover_start_at=at(10), fault_scenario=FaultScenario.ERROR_IN_LOG,
        reason="a collective failed", related_task="worker-1", recover="step_reexecution",
        recover_result=RecoverResult.SUCCESS, recover_end_at=at(11), fault_at=at(10),
        detected_at=at(10), first_progress_at=at(11)))
    with JobStore.create(job, "run-s") as s:
        s.put_running(rec)
        s.set_meta(state="succeeded", attempt=0, created_at=iso(at(0)),
                   ended_at=iso(at(30)), exit_code=0)
    said = "1 recovery (1 step re-execution)"
    recovery = tg("recovery", str(job))
    assert f"summary: 1 attempt, {said}, 1 incident" in recovery, recovery
    assert "restart" not in recovery.split("summary:")[1]
    assert f"attempt 0 · {said}" in tg("status", str(job))
    assert f"1 attempt(s), {said} · wall" in tg("report", str(job))
    summary = json.loads(tg("recovery", str(job), "--json"))["summary"]
    assert (summary["restarts"], summary["restarts_by_rung"]) == (1, {"step_reexecution": 1})
    status = json.loads(tg("status", str(job), "--json"))
    assert (status["restarts"], status["restarts_by_rung"]) == (1, {"step_reexecution": 1})


def test_a_launcher_that_exited_but_is_not_reaped_yet_counts_as_dead() -> None:
    """`stop --force` SIGKILLs the launcher and reads the state at once: until the shell
    that started it reaps it, the launcher is a zombie, and the job read `running`."""
    import socket
    import subprocess
    import time

    from trainguard.controller.shown import launcher_dead

    child = subprocess.Popen(["true"])
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # exited, not reaped: a zombie
            with open(f"/proc/{child.pid}/stat", "rb") as f:
                if f.read().rsplit(b")", 1)[1].split()[0] == b"Z":
                    break
            time.sleep(0.01)
        assert launcher_dead({"launcher_pid": child.pid, "launcher_host": socket.gethostname()})
    finally:
        child.wait()
    alive = subprocess.Popen(["sleep", "30"])
    try:
        assert not launcher_dead({"launcher_pid": alive.pid,
                                  "launcher_host": socket.gethostname()})
    finally:
        alive.kill()
        alive.wait()


def test_an_ended_job_whose_launcher_pid_is_alive_gives_no_stop_hint(tmp_path: Path) -> None:
    """The launcher's pid outlives the job (its last writes, or a pid reused since): an
    ended job is not stopped again, so `status` does not say how to stop it."""
    live = a_job(tmp_path / "live", os.getpid())
    assert f"(stop the job: trainguard stop {live.resolve()})" in tg("status", str(live))
    with JobStore.create(live, "run-e") as s:
        s.set_meta(state="succeeded", ended_at=iso(at(30)), exit_code=0)
    text = tg("status", str(live))
    assert "· succeeded ·" in text and "trainguard stop" not in text, text


def test_a_reschedule_waiting_for_nodes_is_not_counted_until_its_workers_start() -> None:
    """Walk-through 26: a job reschedule queuing for nodes read `5 recoveries (... 2 job
    reschedules)`; stopped while it waited, the same job read 4: a count that went down."""
    from trainguard.records import recoveries_by_rung

    rec = RunningRecord(0, at(0), StartType.FIRST_START)
    waiting = RecoverRecord(
        attempt=0, recover_start_at=at(10), fault_scenario=FaultScenario.NODE_FAULT,
        reason="node-1 isolated", related_task="worker-1", recover="job_reschedule_with_taint",
        decided_at=at(11))
    rec.recover_records.append(waiting)
    assert recoveries_by_rung([rec]) == {}
    waiting.workers_started_at = at(20)  # placed: its workers started
    assert recoveries_by_rung([rec]) == {"job_reschedule_with_taint": 1}
    # walk-through 28: a restart whose workers started and failed again stays counted (the
    # job read `2 recoveries`, then `0 recoveries` beside `restarts 2/5`)
    waiting.recover_result = RecoverResult.FAILED
    assert recoveries_by_rung([rec]) == {"job_reschedule_with_taint": 1}


def test_a_job_out_of_reschedules_names_the_flags_and_the_rung_that_ended_it(
        tmp_path: Path) -> None:
    """Walk-through 26: out of reschedules, `status` said 'continue it: once its cause is
    fixed ... run the same command' (no flag; `ended_by` null), and the same command failed
    at the first node loss: the reschedule budgets are kept across relaunches."""
    job = tmp_path / "j"
    rec = RunningRecord(0, at(0), StartType.FIRST_START, end_at=at(30), end_reason="failed")
    rec.recover_records.append(RecoverRecord(
        attempt=0, recover_start_at=at(20), fault_scenario=FaultScenario.NODE_FAULT,
        reason="isolated job-level rescheduling budget spent (1, --max-job-reschedules; ...)",
        related_task="node/node-3", recover="job_reschedule_with_taint",
        recover_result=RecoverResult.QUOTA_EXCEEDED, recover_end_at=at(20)))
    with JobStore.create(job, "run-q") as s:
        s.put_running(rec)
        s.set_meta(state="failed", attempt=0, created_at=iso(at(0)), ended_at=iso(at(30)),
                   exit_code=1, max_restarts=2, pod_reschedules_used=1,
                   job_reschedules_used=1,
                   budgets={"max_pod_reschedules": 1, "max_job_reschedules": 1})
    assert json.loads(tg("status", str(job), "--json"))["ended_by"] == \
        "job_reschedule_with_taint"
    text = " ".join(tg("status", str(job)).split())
    assert "its node reschedules were spent: give --max-pod-reschedules and " \
        "--max-job-reschedules more than it used" in text, text


def test_a_failed_job_no_rung_acted_on_ended_by_none_of_them(tmp_path: Path) -> None:
    """Walk-through 30: `ended_by` read the string "none" (the record's no-rung mark) for a
    user error, a spent restart budget and the no-progress guard: null, as the docs say."""
    job = tmp_path / "j"
    rec = RunningRecord(0, at(0), StartType.FIRST_START, end_at=at(30), end_reason="failed")
    rec.recover_records.append(RecoverRecord(
        attempt=0, recover_start_at=at(20), fault_scenario=FaultScenario.JOB_FAILED,
        reason="restart budget spent", related_task="worker-1", recover="none",
        recover_result=RecoverResult.QUOTA_EXCEEDED, recover_end_at=at(20)))
    with JobStore.create(job, "run-n") as s:
        s.put_running(rec)
        s.set_meta(state="failed", attempt=0, created_at=iso(at(0)), ended_at=iso(at(30)),
                   exit_code=1)
    assert json.loads(tg("status", str(job), "--json"))["ended_by"] is None


def test_following_a_job_whose_launcher_died_ends_with_a_note_and_exit_3(
        tmp_path: Path) -> None:
    """Walk-through 30: `events --follow` and `logs -f` ended with exit 0 and no word when
    the launcher was killed: as a job that succeeded. Now a note and exit 3 (JOB_LOST)."""
    from tests.unit.helpers import tg as run

    dead = subprocess.Popen(["true"])
    dead.wait()
    job = a_job(tmp_path / "lost", dead.pid)
    (job / "logs" / "attempt-0").mkdir(parents=True)
    (job / "logs" / "attempt-0" / "rank-0.log").write_text("step 35\n")
    for cmd in (("events", str(job), "--follow"), ("logs", str(job), "-f")):
        r = run(*cmd)
        assert r.returncode == 3, (cmd, r.returncode, r.stderr)
        assert f"the job's launcher (pid {dead.pid}) is gone: the job is lost" in r.stderr
