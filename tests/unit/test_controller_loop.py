"""The controller's attempt loop, driven by a scripted fake node agent: no processes."""

from __future__ import annotations

import signal
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from trainguard.controller.loop import Controller
from trainguard.controller.recorder import Recorder
from trainguard.controller.store import JobStore
from trainguard.diagnosis.sources import scan_lines
from trainguard.errors import StoreError
from trainguard.exitcodes import ExitCode
from trainguard.node.ports import free_port
from trainguard.paths import JobPaths
from trainguard.protocol import (
    AgentAPI,
    DumpStacks,
    FrameMsg,
    NodeReport,
    Progress,
    RankLiveness,
    StackDump,
    StartWorkers,
    StopWorkers,
    ThreadMsg,
    WorkerFact,
)
from trainguard.records import Event, RecoverResult, StartType
from trainguard.spec import JobSpec
from trainguard.spec_build import build_spec
from trainguard.states import StopCause, WorkerState

T0 = datetime(2025, 3, 1, 12, 0, 0, tzinfo=timezone.utc)
FIRST_PORT = 29500  # below Linux's ephemeral range, so a fresh port always differs
RUNNING, FAILED, SUCCEEDED = WorkerState.RUNNING, WorkerState.FAILED, WorkerState.SUCCEEDED


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


@dataclass(frozen=True)
class W:
    """One worker in a scripted report."""

    state: WorkerState
    returncode: int | None = None
    tail: tuple[str, ...] = ()


def report(attempt: int, *workers: W, first: int | None = None, last: int | None = None,
           seconds: float = 0.0) -> NodeReport:
    facts = [
        WorkerFact(rank=r, local_rank=r, pid=1000 * (attempt + 1) + r, state=w.state,
                   returncode=w.returncode, started_at=at(seconds),
                   ended_at=at(seconds) if w.state.ended else None, start_count=attempt + 1,
                   findings=scan_lines(w.tail, f"rank-{r}.log", r), error_file=None)
        for r, w in enumerate(workers)
    ]
    progress = Progress(first_step=first, first_step_at=None if first is None else at(seconds),
                        last_step=last, last_step_at=None if last is None else at(seconds))
    return NodeReport(node="node-0", attempt=attempt, workers=facts, progress=progress,
                      at=at(seconds))


class ScriptedAgent:
    """An AgentAPI that plays back one list of reports per attempt.

    The first report answers start_workers, the rest answer poll() in order (the last one
    repeats). stop_workers marks what still runs as STOPPED.
    """

    def __init__(self, attempts: Sequence[Sequence[NodeReport]]) -> None:
        self._attempts = [list(a) for a in attempts]
        self._queue: Iterator[NodeReport] = iter(())
        self._last: NodeReport | None = None
        self.started: list[StartWorkers] = []
        self.stops: list[StopWorkers] = []
        self.polls = 0
        self.closed = False

    def start_workers(self, cmd: StartWorkers) -> NodeReport:
        assert len(self.started) < len(self._attempts), "more attempts than scripted"
        script = self._attempts[len(self.started)]
        self.started.append(cmd)
        self._queue = iter(script[1:])
        self._last = script[0]
        return script[0]

    def poll(self, wait_s: float = 0.0) -> NodeReport:
        self.polls += 1
        self._last = next(self._queue, self._last)
        assert self._last is not None
        return self._last

    def stop_workers(self, cmd: StopWorkers, meanwhile: object = None) -> NodeReport:
        self.stops.append(cmd)
        assert self._last is not None
        workers = [w if w.state.ended else w.model_copy(update={
            "state": WorkerState.STOPPED, "returncode": -signal.SIGTERM,
            "ended_at": self._last.at}) for w in self._last.workers]
        self._last = self._last.model_copy(update={"workers": workers})
        return self._last

    def rendezvous(self, addr: str, preferred_port: int | None) -> tuple[str, int]:
        return addr, preferred_port or free_port(addr)

    def close(self) -> None:
        self.closed = True


@dataclass
class Run:
    code: int
    agent: ScriptedAgent
    store: JobStore
    events: list[Event]

    @property
    def reasons(self) -> list[str]:
        return [e.reason for e in self.events]


@pytest.fixture
def job(tmp_path: Path) -> Iterator[Any]:
    stores: list[JobStore] = []

    def run(attempts: Sequence[Sequence[NodeReport]], ckpt: str | None = None,
            **values: Any) -> Run:
        spec: JobSpec = build_spec(None, {
            "entrypoint": "train.py", "run_id": "loop-test", "nproc_per_node": 2,
            "monitor_interval": 0.001, "restart_backoff_s": 0, "restart_backoff_max_s": 0,
            "grace_period_s": 0, "master_port": FIRST_PORT, **values})
        paths = JobPaths(tmp_path / "job", tmp_path / "job" / "logs",
                         ckpt or str(tmp_path / "job" / "ckpt"))
        paths.make()
        store = JobStore.create(paths.job_dir, spec.run_id)
        stores.append(store)
        agent = ScriptedAgent(attempts)
        seen: list[Event] = []
        api: AgentAPI = agent
        recorder = Recorder(spec, paths, store, ["python", "train.py"], on_event=seen.append)
        code = Controller(recorder, api).run()
        assert [e for _, e in store.events()] == seen
        return Run(code, agent, store, seen)

    yield run
    for s in stores:
        s.close()


CRASH_THEN_RECOVER = [
    [report(0, W(RUNNING), W(RUNNING)),
     report(0, W(RUNNING), W(RUNNING), first=1, last=8, seconds=1),
     report(0, W(RUNNING), W(FAILED, -signal.SIGKILL), first=1, last=15, seconds=2)],
    [report(1, W(RUNNING), W(RUNNING), seconds=3),
     report(1, W(SUCCEEDED, 0), W(SUCCEEDED, 0), first=11, last=20, seconds=4)],
]


def test_a_killed_rank_is_restarted_and_the_job_succeeds(job: Any) -> None:
    run = job(CRASH_THEN_RECOVER, max_restarts=3)
    assert run.code == ExitCode.SUCCESS
    assert run.reasons == [
        "JobCreated", "JobRunning", "WorkerFailed", "WorkersStopped", "FailureDiagnosed",
        "RestartScheduled", "WorkersRestarted", "JobSucceeded"]
    assert run.agent.closed


def test_the_failed_event_and_the_diagnosis_name_the_killed_rank(job: Any) -> None:
    run = job(CRASH_THEN_RECOVER, max_restarts=3)
    by_reason = {e.reason: e for e in run.events}
    failed, diagnosed = by_reason["WorkerFailed"], by_reason["FailureDiagnosed"]
    assert (failed.involved.rank, failed.involved.attempt) == (1, 0)
    assert "SIGKILL" in failed.message
    assert diagnosed.involved.rank == 1
    assert diagnosed.message.startswith("host_oom (infrastructure, restart helps: maybe)")


def test_the_recovery_record_counts_the_steps_lost_and_the_resumed_step(job: Any) -> None:
    run = job(CRASH_THEN_RECOVER, max_restarts=3)
    first, second = run.store.running_records()
    assert (first.start_type, second.start_type) == (StartType.FIRST_START,
                                                     StartType.AUTO_RESTART)
    (inc,) = first.recover_records
    assert inc.recover_result == RecoverResult.SUCCESS
    assert (inc.last_step_before, inc.resumed_step, inc.steps_lost) == (15, 10, 5)
    assert inc.category == "host_oom"
    assert inc.related_task == "worker-1"
    assert inc.first_progress_at == at(4)
    assert second.recover_records == []
    assert (second.first_step, second.last_step) == (11, 20)


def test_each_attempt_gets_a_fresh_master_port(job: Any) -> None:
    run = job(CRASH_THEN_RECOVER, max_restarts=3)
    ports = [cmd.master_port for cmd in run.agent.started]
    assert ports[0] == FIRST_PORT
    assert ports[1] != FIRST_PORT
    assert [r.master_port for r in run.store.running_records()] == ports


def test_start_commands_count_the_starts_of_each_rank(job: Any) -> None:
    run = job(CRASH_THEN_RECOVER, max_restarts=3)
    first, second = run.agent.started
    assert (first.attempt, second.attempt) == (0, 1)
    assert [w.start_count for w in first.workers] == [1, 1]
    assert [w.start_count for w in second.workers] == [2, 2]
    assert [(w.rank, w.local_rank) for w in second.workers] == [(0, 0), (1, 1)]
    assert first.world_size == 2 and first.max_restarts == 3
    assert first.argv == ["python", "train.py"]


def test_start_commands_turn_standbys_and_in_process_restart_on_by_default(job: Any) -> None:
    on = job(CRASH_THEN_RECOVER, max_restarts=3).agent.started[0]
    assert on.standby and on.env["TRAINGUARD_IN_PROCESS_RESTART"] == "1"
    assert on.env["TRAINGUARD_PG_GENERATION"] == "0"  # never one from the launcher's env


def test_start_commands_carry_the_flags_that_turn_them_off(job: Any) -> None:
    off = job(CRASH_THEN_RECOVER, max_restarts=3, standby_workers=False,
              in_process_restart=False).agent.started[0]
    assert not off.standby and off.env["TRAINGUARD_IN_PROCESS_RESTART"] == "0"


def test_the_other_ranks_are_stopped_once_per_failed_attempt(job: Any) -> None:
    run = job(CRASH_THEN_RECOVER, max_restarts=3)
    assert [s.reason for s in run.agent.stops] == ["a worker failed", "every worker exited 0"]


def test_the_store_meta_ends_succeeded_with_the_restarts_used(job: Any) -> None:
    meta = job(CRASH_THEN_RECOVER, max_restarts=3).store.meta()
    assert (meta["state"], meta["exit_code"], meta["restarts_used"]) == ("succeeded", 0, 1)
    assert meta["last_step"] == 20


def test_worker_rows_are_kept_per_attempt(job: Any) -> None:
    run = job(CRASH_THEN_RECOVER, max_restarts=3)
    first = run.store.workers(0)
    assert [(w.rank, w.state, w.signal) for w in first] == [
        (0, "stopped", "SIGTERM"), (1, "failed", "SIGKILL")]
    assert [w.state for w in run.store.workers(1)] == ["succeeded", "succeeded"]


USER_BUG = ("[rank1]: Traceback (most recent call last):",
            '[rank1]:   File "/workspace/train.py", line 42, in <module>',
            "[rank1]:     raise ValueError('labels out of range')",
            "[rank1]: ValueError: labels out of range")


def test_a_user_code_failure_exits_1_without_a_restart(job: Any) -> None:
    attempts = [[report(0, W(RUNNING), W(RUNNING)),
                 report(0, W(RUNNING), W(FAILED, 1, USER_BUG), first=1, last=3, seconds=1)]]
    run = job(attempts, max_restarts=3)
    assert run.code == ExitCode.FAILED
    assert len(run.agent.started) == 1
    assert "RestartScheduled" not in run.reasons
    assert run.reasons[-2:] == ["FailureDiagnosed", "JobFailed"]
    assert "labels out of range" in run.events[-1].message
    # the cause, then why it was not restarted: no parentheses inside parentheses
    assert "; not restarted: " in run.events[-1].message, run.events[-1].message
    assert "((" not in run.events[-1].message and "))" not in run.events[-1].message
    (inc,) = run.store.running_records()[0].recover_records
    assert (inc.recover, inc.recover_result) == ("none", RecoverResult.FAILED)
    assert run.store.meta()["state"] == "failed"


def test_with_auto_restart_off_a_restartable_failure_still_ends_the_job(job: Any) -> None:
    attempts = [[report(0, W(RUNNING), W(FAILED, -signal.SIGKILL), last=5)]]
    run = job(attempts, max_restarts=0)
    assert run.code == ExitCode.FAILED
    assert len(run.agent.started) == 1
    (inc,) = run.store.running_records()[0].recover_records
    assert inc.recover_result == RecoverResult.TERMINATED


def crash_at_step_15(attempt: int) -> list[NodeReport]:
    """Every attempt resumes from step 10 and is killed at step 15 again."""
    first = 1 if attempt == 0 else 11
    return [report(attempt, W(RUNNING), W(RUNNING), seconds=10 * attempt),
            report(attempt, W(FAILED, -signal.SIGKILL), W(RUNNING), first=first, last=15,
                   seconds=10 * attempt + 1)]


def test_attempts_that_make_no_progress_give_up_with_exit_86(job: Any) -> None:
    run = job([crash_at_step_15(a) for a in range(10)], max_restarts=10, no_progress_limit=2)
    assert run.code == ExitCode.NO_PROGRESS
    assert int(ExitCode.NO_PROGRESS) == 86
    # attempt 0 made progress; attempts 1 and 2 did not get past step 15
    assert len(run.agent.started) == 3
    assert run.reasons[-2:] == ["NoProgress", "JobFailed"]
    assert run.store.meta()["state"] == "failed"
    assert run.store.meta()["exit_code"] == 86


def test_a_spent_restart_budget_exits_1_with_restart_limit_reached(job: Any) -> None:
    attempts = [[report(a, W(FAILED, -signal.SIGKILL), W(RUNNING), first=1, last=10 * (a + 1))]
                for a in range(3)]
    run = job(attempts, max_restarts=2)
    assert run.code == ExitCode.FAILED
    assert len(run.agent.started) == 3
    assert "RestartLimitReached" in run.reasons
    last_inc = run.store.running_records()[-1].recover_records[-1]
    assert last_inc.recover_result == RecoverResult.QUOTA_EXCEEDED


def test_job_created_says_auto_resume_is_on_and_when_it_takes_effect(job: Any) -> None:
    """(walk-through 22) `--auto-resume hf` on a script that never imports transformers does
    nothing: JobCreated says it is on, and that it needs the framework's Trainer."""
    attempts = [[report(0, W(RUNNING), W(RUNNING)),
                 report(0, W(SUCCEEDED, 0), W(SUCCEEDED, 0), first=1, last=100, seconds=5)]]
    run = job(attempts, auto_resume="hf")
    created = next(e for e in run.events if e.reason == "JobCreated")
    assert "auto-resume hf on (takes effect when the script imports transformers' " \
        "Trainer)" in created.message


def test_a_job_that_succeeds_at_once_has_no_recovery(job: Any) -> None:
    attempts = [[report(0, W(RUNNING), W(RUNNING)),
                 report(0, W(SUCCEEDED, 0), W(SUCCEEDED, 0), first=1, last=100, seconds=5)]]
    run = job(attempts)
    assert run.code == ExitCode.SUCCESS
    assert run.reasons == ["JobCreated", "JobRunning", "JobSucceeded"]
    assert [s.reason for s in run.agent.stops] == ["every worker exited 0"]  # leftovers
    (rec,) = run.store.running_records()
    assert rec.recover_records == [] and rec.last_step == 100


def test_a_signal_during_the_restart_backoff_stops_the_job_and_terminates_the_incident(
        job: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    def interrupt_sleep(_: float) -> None:  # the first backoff sleep "receives" SIGINT
        signal.raise_signal(signal.SIGINT)

    monkeypatch.setattr("trainguard.controller.loop.time.sleep", interrupt_sleep)
    attempts = [[report(0, W(RUNNING), W(RUNNING), first=1, last=3),
                 report(0, W(RUNNING), W(FAILED, -9), first=1, last=15, seconds=1)]]
    run = job(attempts, restart_backoff_s=5, restart_backoff_max_s=5, max_restarts=3)
    assert run.code == 128 + signal.SIGINT
    # (walk-through 26) the stop is recorded, and no worker is said to get the grace period
    assert run.reasons[-3:] == ["RestartScheduled", "StopRequested", "JobStopped"]
    assert run.events[-1].message == ("stopped by SIGINT while waiting to restart (the "
                                      "backoff): no worker was running")
    (rec,) = run.store.running_records()
    assert rec.end_reason is not None and "SIGKILL" in rec.end_reason  # not overwritten
    (inc,) = rec.recover_records
    assert inc.recover_result == RecoverResult.TERMINATED
    assert inc.first_progress_at is None
    assert run.store.meta()["state"] == "stopped"


def test_a_stop_during_a_restart_s_rendezvous_starts_no_worker(
        job: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Review 43 #3: a stop requested while a restart's rendezvous waited for a cut node
    started the reachable nodes' ranks, then stopped them; now nothing starts."""
    meet = ScriptedAgent.rendezvous

    def rendezvous(self: ScriptedAgent, addr: str, port: int | None) -> tuple[str, int]:
        if self.started:  # the restart's: Ctrl-C lands while the fleet waits for a node
            signal.raise_signal(signal.SIGTERM)
        return meet(self, addr, port)

    monkeypatch.setattr(ScriptedAgent, "rendezvous", rendezvous)
    run = job(CRASH_THEN_RECOVER, max_restarts=3)
    assert run.code == 128 + signal.SIGTERM
    assert len(run.agent.started) == 1, run.reasons  # the first attempt's only
    assert run.reasons[-3:] == ["RestartScheduled", "StopRequested", "JobStopped"]
    assert run.events[-1].message == ("stopped by SIGTERM while waiting for nodes: no worker "
                                      "was running")
    assert {e.involved.attempt for e in run.events[-2:]} == {0}  # the last attempt that ran
    (rec,) = run.store.running_records()  # no record of an attempt that never ran
    (inc,) = rec.recover_records
    assert inc.recover_result == RecoverResult.TERMINATED


def test_an_error_inside_the_loop_leaves_the_job_failed_not_running(
        job: Any, tmp_path: Path) -> None:
    attempts = [[report(0, W(RUNNING), W(RUNNING), first=1, last=3)]]

    class Boom(RuntimeError):
        pass

    def broken_poll(self: ScriptedAgent, wait_s: float = 0.0) -> NodeReport:
        raise Boom("agent lost")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ScriptedAgent, "poll", broken_poll)
        with pytest.raises(Boom):
            job(attempts)
    with JobStore.open(tmp_path / "job") as store:
        assert store.meta()["state"] == "failed"
        assert [e.reason for _, e in store.events()][-1] == "JobFailed"


# --- hangs: restart upon suspension -------------------------------------------------------


def stale(attempt: int) -> NodeReport:
    """Both ranks run but made no progress for a long time (their last step: at T0)."""
    r = report(attempt, W(WorkerState.RUNNING), W(WorkerState.RUNNING), first=1, last=5,
               seconds=7200)
    return r.model_copy(update={"liveness": [
        RankLiveness(rank=rank, last_step=5, last_progress_at=at(0)) for rank in (0, 1)]})


class HangAgent(ScriptedAgent):
    def __init__(self, attempts: Sequence[Sequence[NodeReport]]) -> None:
        super().__init__(attempts)
        self.dumps: list[DumpStacks] = []

    def dump_stacks(self, cmd: DumpStacks) -> list[StackDump]:
        self.dumps.append(cmd)
        return [StackDump(rank=r, pid=1000 + r, error="py-spy is not installed") for r in (0, 1)]


def test_a_confirmed_hang_restarts_in_place_three_times_in_a_row_then_fails(
        job: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("tests.unit.test_controller_loop.ScriptedAgent", HangAgent)
    running = [report(a, W(WorkerState.RUNNING), W(WorkerState.RUNNING)) for a in range(4)]
    run = job([[running[a], stale(a)] for a in range(4)], restart_on_hang=True,
              max_restarts=0)
    assert run.code == ExitCode.NO_PROGRESS  # a job that hangs every time: do not requeue
    assert run.reasons.count("HangSuspected") == 4 and run.reasons.count("HangConfirmed") == 4
    assert run.reasons.count("WorkersRestarted") == 3  # the restart budget (0) is not used
    assert run.reasons[-2:] == ["HangRestartLimitReached", "JobFailed"]
    confirmed = [e for e in run.events if e.reason == "HangConfirmed"]
    assert confirmed[0].data is not None and confirmed[0].data["stuck_ranks"] == [0, 1]
    recs = run.store.running_records()
    assert [r.start_type for r in recs] == [StartType.FIRST_START] + [
        StartType.SUSPENSION_RESTART] * 3
    inc = recs[0].recover_records[0]
    assert inc.fault_scenario.value == "job_hanged" and inc.fault_at == at(0)
    assert recs[-1].recover_records[0].recover_result == RecoverResult.QUOTA_EXCEEDED


def test_without_restart_on_hang_a_hang_is_reported_and_the_job_left_running(
        job: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("tests.unit.test_controller_loop.ScriptedAgent", HangAgent)
    done = report(0, W(WorkerState.SUCCEEDED, 0), W(WorkerState.SUCCEEDED, 0))
    start = report(0, W(WorkerState.RUNNING), W(WorkerState.RUNNING))
    run = job([[start, stale(0), stale(0), stale(0), done]])
    assert run.code == ExitCode.SUCCESS
    assert "HangConfirmed" in run.reasons and "WorkersRestarted" not in run.reasons
    assert run.reasons[-1] == "JobSucceeded"


def test_a_job_store_that_cannot_be_written_for_a_while_does_not_end_a_healthy_job(
        job: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Audit D9: a full job-dir disk (SQLITE_FULL) while the job runs: the console says so,
    the events wait in memory and reach the store once it takes writes again; the job
    ends as it would have. (Walk-through 22) the running records too: a failed write of
    one ended the launcher (exit 2, its restarts unused); now it waits and is written."""
    failing = {"left": 0, "records": 0}
    real = {name: getattr(JobStore, name)
            for name in ("add_event", "put_workers", "add_progress", "set_meta",
                         "put_running")}

    def flaky(name: str) -> Any:
        def write(self: JobStore, *args: Any, **kwargs: Any) -> Any:
            key = "records" if name == "put_running" else "left"
            if failing[key] > 0:
                failing[key] -= 1
                raise StoreError("cannot add an event to the job store: database or disk is "
                                 "full")
            return real[name](self, *args, **kwargs)
        return write

    for name in real:
        monkeypatch.setattr(JobStore, name, flaky(name))
    original_start = ScriptedAgent.start_workers

    def start(self: ScriptedAgent, cmd: StartWorkers) -> NodeReport:
        if not self.started:
            failing["left"] = 12  # the disk fills up once the first attempt runs
            failing["records"] = 3
        return original_start(self, cmd)

    monkeypatch.setattr(ScriptedAgent, "start_workers", start)
    run = job(CRASH_THEN_RECOVER, max_restarts=3)
    assert run.code == ExitCode.SUCCESS
    assert "StoreWriteFailed" in run.reasons and run.reasons[-1] == "JobSucceeded"
    records = run.store.running_records()
    assert [r.attempt for r in records] == [0, 1]
    assert records[0].recover_records and records[0].recover_records[0].recover_result == \
        RecoverResult.SUCCESS


def test_a_running_record_the_store_cannot_take_waits_and_is_written_later(
        tmp_path: Path) -> None:
    """(walk-through 22) IncidentBook keeps a record a full disk refused and writes it at
    the next flush; the failure is told, never raised while the job runs."""
    from trainguard.controller.incidents import IncidentBook

    store = JobStore.create(tmp_path, "book-test")
    errors: list[Exception] = []
    book = IncidentBook(store, on_error=errors.append)
    real = JobStore.put_running
    full = {"on": True}

    def put(self: JobStore, rec: Any) -> None:
        if full["on"]:
            raise StoreError("cannot write a running record: database or disk is full")
        real(self, rec)

    JobStore.put_running = put  # type: ignore[method-assign]
    try:
        book.attempt_started(0, StartType.FIRST_START, 29500)
        assert len(errors) == 1 and store.running_records() == []
        full["on"] = False
        book.flush()
        assert [r.attempt for r in store.running_records()] == [0]
    finally:
        JobStore.put_running = real  # type: ignore[method-assign]


class EndingAgent(HangAgent):
    """The ranks were tearing down, not hung: by the time the confirmed hang is acted on,
    every one has exited 0."""

    def stop_workers(self, cmd: StopWorkers, meanwhile: object = None) -> NodeReport:
        self.stops.append(cmd)
        self._last = report(0, W(WorkerState.SUCCEEDED, 0), W(WorkerState.SUCCEEDED, 0))
        return self._last


def test_a_hang_confirmed_while_every_rank_was_exiting_0_is_not_restarted(
        job: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("tests.unit.test_controller_loop.ScriptedAgent", EndingAgent)
    start = report(0, W(WorkerState.RUNNING), W(WorkerState.RUNNING))
    run = job([[start, stale(0), stale(0), stale(0)]], restart_on_hang=True)
    assert run.code == ExitCode.SUCCESS
    assert "HangCleared" in run.reasons and "WorkersRestarted" not in run.reasons
    assert run.reasons[-1] == "JobSucceeded"


class ExitingAgent(HangAgent):
    """Under load a rank's exit outlasts the hang timeout: when the stacks are taken, rank 1
    has ended (its exit not reaped yet) and rank 0 runs the interpreter's shutdown."""

    def dump_stacks(self, cmd: DumpStacks) -> list[StackDump]:
        self.dumps.append(cmd)
        shutdown = ThreadMsg(thread_id=1, name="MainThread", frames=[
            FrameMsg(name="gc_collect_main", filename="gcmodule.c", line=1, native=True),
            FrameMsg(name="Py_FinalizeEx", filename="pylifecycle.c", line=2, native=True)])
        return [StackDump(rank=0, pid=1000, threads=[shutdown]),
                StackDump(rank=1, pid=1001, error="process 1001 has exited (not yet reaped)",
                          exited=True)]


def test_ranks_found_exiting_when_the_stacks_are_taken_are_not_confirmed_hung(
        job: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The walk-through's `make demo`: after the last step rank 1 had exited, unreaped, and
    rank 0 was shutting down; the hang was confirmed and rank 0 restarted (5 attempts)."""
    monkeypatch.setattr("tests.unit.test_controller_loop.ScriptedAgent", ExitingAgent)
    start = report(0, W(WorkerState.RUNNING), W(WorkerState.RUNNING))
    done = report(0, W(WorkerState.SUCCEEDED, 0), W(WorkerState.SUCCEEDED, 0))
    run = job([[start, stale(0), stale(0), done]], restart_on_hang=True)
    assert run.code == ExitCode.SUCCESS
    assert "HangConfirmed" not in run.reasons and "WorkersRestarted" not in run.reasons
    cleared = [e for e in run.events if e.reason == "HangCleared"]
    assert len(cleared) == 1 and "rank(s) 1 had exited" in cleared[0].message
    assert "rank(s) 0 were shutting down" in cleared[0].message
    assert run.reasons[-1] == "JobSucceeded"


def test_a_launcher_line_is_one_write_so_no_rank_line_lands_inside_it() -> None:
    """With PYTHONUNBUFFERED (common in containers) each write is a system call: print's
    separate write of the newline let a rank's line (another stream, the same pipe) land
    between a launcher line and its end."""
    from trainguard.console import console_printer
    from trainguard.records import Event, Involved, Level, utcnow

    class Writes:
        def __init__(self) -> None:
            self.calls: list[str] = []

        def write(self, s: str) -> int:
            self.calls.append(s)
            return len(s)

        def flush(self) -> None:
            pass

    out = Writes()
    show = console_printer(out)  # type: ignore[arg-type]
    show(Event(utcnow(), Level.WARNING, "WorkerFailed", "rank 0 was killed", Involved(job="j")))
    assert len(out.calls) == 1 and out.calls[0].endswith("WorkerFailed: rank 0 was killed\n")


class StubbornAgent(ScriptedAgent):
    """The user stops the job; rank 1 ignores SIGTERM (frozen) and the stop SIGKILLs it."""

    def poll(self, wait_s: float = 0.0) -> NodeReport:
        if self.polls == 1:
            signal.raise_signal(signal.SIGTERM)
        return super().poll(wait_s)

    def tell(self, cmd: Any) -> int:
        return 0  # no rank takes the drain request

    def stop_workers(self, cmd: StopWorkers, meanwhile: object = None) -> NodeReport:
        last = super().stop_workers(cmd)
        workers = [w.model_copy(update={"returncode": -signal.SIGKILL}) if w.rank == 1 else w
                   for w in last.workers]
        self._last = last.model_copy(update={"workers": workers})
        return self._last


def test_a_stop_that_had_to_sigkill_a_rank_says_so(
        job: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Walk-through 9: JobStopped said 'workers got SIGTERM and 6s to exit' of a job whose
    frozen rank got SIGKILL."""
    monkeypatch.setattr("tests.unit.test_controller_loop.ScriptedAgent", StubbornAgent)
    running = report(0, W(RUNNING), W(RUNNING), first=1, last=3)
    run = job([[running, running, running]])
    assert run.code == 128 + signal.SIGTERM
    assert run.reasons[-1] == "JobStopped"
    assert run.events[-1].message.endswith(
        "workers got SIGTERM and 0s to exit; rank 1 did not and got SIGKILL"), \
        run.events[-1].message


class KillingAgent(ScriptedAgent):
    """Rank 0, stopped after rank 1 failed, outlives the grace period: SIGKILL."""

    def stop_workers(self, cmd: StopWorkers, meanwhile: object = None) -> NodeReport:
        last = super().stop_workers(cmd)
        workers = [w.model_copy(update={"returncode": -signal.SIGKILL})
                   if w.rank == 0 and w.state == WorkerState.STOPPED else w
                   for w in last.workers]
        self._last = last.model_copy(update={"workers": workers})
        return self._last


def test_workers_stopped_says_which_rank_had_to_be_sigkilled(
        job: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Walk-through 12: 'stopped 1 other worker(s): rank(s) 0 (grace 15s)' after a silent 15 s
    in which rank 0 ignored SIGTERM."""
    monkeypatch.setattr("tests.unit.test_controller_loop.ScriptedAgent", KillingAgent)
    attempts = [[report(0, W(RUNNING), W(RUNNING)),
                 report(0, W(RUNNING), W(FAILED, 1, USER_BUG), first=1, last=3, seconds=1)]]
    run = job(attempts, max_restarts=0)
    (stopped,) = [e.message for e in run.events if e.reason == "WorkersStopped"]
    assert stopped.endswith("; rank(s) 0 did not exit within it and got SIGKILL)"), stopped


def test_the_report_of_the_poll_a_signal_ended_is_recorded(
        job: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its messages (a checkpoint committed just then) are recorded before the stop: a
    multi-node fleet acknowledges them to the agents at the next poll (node/outbox.py)."""
    from trainguard.protocol import WorkerMessage

    saved = report(0, W(RUNNING), W(RUNNING), first=1, last=10).model_copy(update={
        "messages": [WorkerMessage(kind="checkpoint_saved", rank=0, at=at(1),
                                   data={"step": 10, "location": "/ck"})]})
    polls = {"n": 0}
    play = ScriptedAgent.poll

    def poll(self: ScriptedAgent, wait_s: float = 0.0) -> NodeReport:
        polls["n"] += 1
        if polls["n"] == 2:  # Ctrl-C lands while the second poll waits; the next, the last
            # before the stop, returns `saved`
            signal.raise_signal(signal.SIGINT)
        r = play(self, wait_s)
        self._last = r.model_copy(update={"messages": []})  # an agent hands a message up once
        return r

    monkeypatch.setattr(ScriptedAgent, "poll", poll)
    monkeypatch.setattr(ScriptedAgent, "tell", lambda self, cmd: 0, raising=False)  # drain
    plain = report(0, W(RUNNING), W(RUNNING), first=1, last=10)
    running = report(0, W(RUNNING), W(RUNNING))
    run = job([[running, running, running, saved, plain]])
    assert run.code == 128 + signal.SIGINT
    got = [e.message for e in run.events if e.reason == "CheckpointSaved"]
    assert got == ["checkpoint of step 10 committed at /ck"], run.reasons


def test_a_relaunch_on_one_node_counts_the_node_moves_of_the_launches_before(
        tmp_path: Path, job: Any) -> None:
    """A job moved once off a lost node in a multi-node launch, then relaunched on this one
    node: its ranks have been placed three times (TRAINGUARD_SCHEDULE_COUNT)."""
    with JobStore.create(tmp_path / "job", "loop-test") as s:
        s.set_meta(state="stopped", launches=1, attempt=0, slot_moves='{"0": 1}')
    first = job(CRASH_THEN_RECOVER, max_restarts=3).agent.started[0]
    assert [w.schedule_count for w in first.workers] == [3, 3]


def test_a_crash_happened_when_its_deciding_line_was_written_not_when_the_rank_exited(
        ) -> None:
    """Walk-through 24: the traceback at :26.311, the exit (after 3.4 s of teardown) at
    :29.695: the fault was put at the exit, so detection read 0.2 s and the teardown a step
    cut short. A line from before the rank's last step began is not the fault's time."""
    from trainguard.controller.faults import fault_time
    from trainguard.diagnosis.taxonomy import Evidence
    from trainguard.protocol import WorkerFact

    def fact(rank: int, ended: float, second_last_step: float | None) -> WorkerFact:
        return WorkerFact(rank=rank, local_rank=rank, pid=1, state=FAILED, ended_at=at(ended),
                          second_last_step_at=None if second_last_step is None
                          else at(second_last_step))

    line = Evidence("logs/attempt-0/rank-1.log", 23, "RuntimeError: boom", rank=1, at=at(26.3))
    failed = [fact(1, 29.7, 25.0)]
    assert fault_time(failed, line, at(30)) == at(26.3)
    assert fault_time([fact(1, 29.7, 27.0)], line, at(30)) == at(29.7)  # trained past it
    assert fault_time(failed, None, at(30)) == at(29.7)  # an exit status decided
    other = Evidence("logs/attempt-0/rank-0.log", 5, "RuntimeError: boom", rank=0, at=at(26.3))
    assert fault_time(failed, other, at(30)) == at(29.7)  # not a failed rank's line
    assert fault_time([fact(1, 29.7, None)], line, at(30)) == at(26.3)  # no step lines


def test_a_restart_that_started_fewer_ranks_than_the_job_has_says_so(job: Any) -> None:
    """Walk-through 26 (F13): a node lost during the restart's backoff started none of its
    ranks, and WorkersRestarted said 'the job has been restarted' with rank 0 alone."""
    half = report(1, W(RUNNING), seconds=3)
    half = half.model_copy(update={"workers": half.workers[:1]})
    run = job([CRASH_THEN_RECOVER[0], [half, *CRASH_THEN_RECOVER[1][1:]]], max_restarts=3)
    (restarted,) = [e for e in run.events if e.reason == "WorkersRestarted"]
    assert "(auto_restart, attempt 1): only 1 of 2 rank(s) started: rank 0: pid" in \
        restarted.message, restarted.message


NO_BUCKET = ("botocore.errorfactory.NoSuchBucket: An error occurred (NoSuchBucket) when "
             "calling the ListObjectsV2 operation: The specified bucket does not exist")


def ckpt_error(location: str) -> str:
    """The ranks' CheckpointError line for `location`'s missing bucket, as the Checkpointer's
    Storage.check_bucket raises it over a store that answers NoSuchBucket (a fake of s3fs's
    error: an OSError caused by botocore's ClientError)."""
    from trainguard.checkpoint.errors import CheckpointError
    from trainguard.checkpoint.storage import Storage

    class ClientError(Exception):
        response = {"Error": {"Code": "NoSuchBucket"}}

    class GoneBucket:
        def ls(self, *args: Any, **kwargs: Any) -> list[str]:
            raise OSError("The specified bucket does not exist") from ClientError()

    storage = Storage(location)
    storage.fs = GoneBucket()  # type: ignore[assignment]
    with pytest.raises(CheckpointError) as e:
        storage.check_bucket()
    return f"{type(e.value).__module__}.{type(e.value).__name__}: {e.value}"


@pytest.mark.parametrize(("committed_at", "ckpt", "named", "said"), [
    ("s3://ckb/run4/step-00000010", "s3://ckb/run4", "s3://ckb/run4", True),
    (None, "s3://ckb/run4", "s3://ckb/run4", False),  # a first start's: a typo, as it looks
    # relaunched to a mistyped bucket
    ("s3://ckb/run4/step-00000010", "s3://ckbb/run4", "s3://ckbb/run4", False),
    ("/data/ckpt/step-00000010", "/data/ckpt", None, False),  # the script's bucket is missing
    # review 45 #6: S3 checkpoints, and the dataset's bucket is the missing one
    ("s3://ckb/run4/step-00000010", "s3://ckb/run4", None, False),
])
def test_a_bucket_gone_after_this_job_committed_to_it_says_its_checkpoints_are_lost(
        job: Any, committed_at: str | None, ckpt: str, named: str | None, said: bool) -> None:
    """Walk-through 37 #6: the restarted ranks found the bucket gone; the verdict's words
    pointed at a mistyped name. The bucket this job committed its newest checkpoint to is
    said to be gone with its checkpoints when the ranks' CheckpointError names it missing,
    once a launch (review 44 #1, #2: not for another bucket, and not again at each attempt
    of an unconditional restart)."""
    from trainguard.protocol import WorkerMessage

    saved = report(0, W(RUNNING), W(RUNNING), first=1, last=10).model_copy(update={
        "messages": [WorkerMessage(kind="checkpoint_saved", rank=0, at=at(1),
                                   data={"step": 10, "location": committed_at})]
        if committed_at else []})
    tail = (NO_BUCKET, *([ckpt_error(named)] if named else []))
    failed = [report(a, W(RUNNING), W(FAILED, 1, tail), first=1, last=12 + a,
                     seconds=2 + a) for a in range(2)]
    attempts = [[report(0, W(RUNNING), W(RUNNING)), saved, failed[0]], [failed[1]]]
    run = job(attempts, ckpt=ckpt, max_restarts=1, unconditional_restart=True)
    assert run.code == 1 and run.reasons.count("FailureDiagnosed") == 2, run.reasons
    missing = [e for e in run.events if e.reason == "CheckpointMissing"]
    if not said:
        assert missing == [], missing
        return
    (event,) = missing
    assert event.level == "Error" and event.message.startswith(
        "the bucket of s3://ckb/run4, where this job committed step 10, is gone: its "
        "checkpoints are lost; make the bucket again"), event
    assert run.reasons.index("FailureDiagnosed") < run.reasons.index("CheckpointMissing")


def test_a_bucket_gone_after_a_relaunch_to_it_says_the_relaunch_s_checkpoints_are_lost(
        tmp_path: Path) -> None:
    """Review 46 #3: a relaunch with --checkpoint-dir on another bucket committed step 5
    there, then that bucket went: the newest commit was the highest step's (100, in the
    first bucket), so the loss went unsaid; on the same bucket it named step 100."""
    from trainguard.protocol import WorkerMessage

    def saved(attempt: int, step: int, location: str) -> NodeReport:
        return report(attempt, W(RUNNING), W(RUNNING), first=1, last=step).model_copy(
            update={"messages": [WorkerMessage(kind="checkpoint_saved", rank=0, at=at(1),
                                               data={"step": step, "location": location})]})

    def launch(attempts: Sequence[Sequence[NodeReport]], ckpt: str) -> list[Event]:
        spec = build_spec(None, {
            "entrypoint": "train.py", "run_id": "loop-test", "nproc_per_node": 2,
            "monitor_interval": 0.001, "restart_backoff_s": 0, "restart_backoff_max_s": 0,
            "grace_period_s": 0, "master_port": FIRST_PORT, "max_restarts": 0})
        paths = JobPaths(tmp_path / "job", tmp_path / "job" / "logs", ckpt)
        paths.make()
        seen: list[Event] = []
        with JobStore.create(paths.job_dir, spec.run_id) as store:
            Controller(Recorder(spec, paths, store, ["python", "train.py"],
                                on_event=seen.append), ScriptedAgent(attempts)).run()
        return seen

    launch([[report(0, W(RUNNING), W(RUNNING)), saved(0, 100, "s3://a/run/step-100"),
             report(0, W(SUCCEEDED, 0), W(SUCCEEDED, 0), first=1, last=100, seconds=3)]],
           "s3://a/run")
    tail = (NO_BUCKET, ckpt_error("s3://b/run"))
    seen = launch([[report(1, W(RUNNING), W(RUNNING)), saved(1, 5, "s3://b/run/step-5"),
                    report(1, W(RUNNING), W(FAILED, 1, tail), first=1, last=7, seconds=4)]],
                  "s3://b/run")
    missing = [e.message for e in seen if e.reason == "CheckpointMissing"]
    assert len(missing) == 1 and missing[0].startswith(
        "the bucket of s3://b/run, where this job committed step 5, is gone"), missing


def test_a_stop_of_a_hang_left_running_asks_no_rank_to_drain(
        job: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Walk-through 39 #11: a stop of a job whose hang was confirmed and left running asked
    the hung ranks to save at their next step end (DrainRequested), which no hung rank
    reaches; it stops them with the hung grace at once."""
    class StoppedWhileHung(HangAgent):
        told = 0

        def tell(self, cmd: Any) -> int:
            StoppedWhileHung.told += 1
            return 2  # both ranks listen for a drain (a trainer integration)

        def poll(self, wait_s: float = 0.0) -> NodeReport:
            if self.polls == 40:
                signal.raise_signal(signal.SIGTERM)
            return super().poll(wait_s)

    monkeypatch.setattr("tests.unit.test_controller_loop.ScriptedAgent", StoppedWhileHung)
    run = job([[report(0, W(WorkerState.RUNNING), W(WorkerState.RUNNING)), stale(0)]],
              max_restarts=0)
    assert run.code == 128 + signal.SIGTERM, run.reasons
    assert run.reasons.index("HangConfirmed") < run.reasons.index("StopRequested")
    assert "DrainRequested" not in run.reasons and StoppedWhileHung.told == 0


def outside_stop(terminating: list[str]) -> NodeReport:
    """Both ranks ended `stopped` by their agents on a SIGTERM from outside, as the agents
    that got it report them (the fleet's `terminating_nodes`: those agents)."""
    r = report(0, W(WorkerState.STOPPED, 0), W(WorkerState.STOPPED, -signal.SIGTERM),
               first=1, last=12, seconds=1)
    return r.model_copy(update={"terminating_nodes": terminating, "workers": [
        w.model_copy(update={"stopped_by": StopCause.OUTSIDE}) for w in r.workers]})


@pytest.mark.parametrize("terminating", [["node-0", "node-1"], []])
def test_ranks_stopped_from_outside_end_the_job_stopped_in_the_words_of_the_agents_stop(
        job: Any, terminating: list[str]) -> None:
    """The ranks' exits on the agents' SIGTERM seen before the agents' flags (under load)
    said another text than the flags seen first (controller/ending_nodes.py): one test
    wanted the one, a loaded run got the other. Both name the agents now; a report without
    the flags (none here: an agent flags before it stops) keeps the ranks' words."""
    run = job([[report(0, W(RUNNING), W(RUNNING)), outside_stop(terminating)]])
    assert run.code == 128 + signal.SIGTERM
    (stopped,) = [e for e in run.events if e.reason == "JobStopped"]
    assert stopped.message == ("stopped from outside: the node agents of node-0, node-1 got a "
                               "SIGTERM this launcher did not send (rank(s) 0, 1 ended on it)"
                               if terminating else "stopped from outside: rank(s) 0, 1 ended "
                               "on a SIGTERM this launcher did not send (their node agents got "
                               "it too)")
    assert "JobSucceeded" not in run.reasons


def test_the_controller_says_when_it_was_last_alive(job: Any) -> None:
    """backends/orphans.GONE_AFTER_S: how long a lost job's agents may still run is counted
    from it (review 55 #3)."""
    from datetime import datetime

    from trainguard.backends.orphans import ALIVE_KEY

    run = job(CRASH_THEN_RECOVER, max_restarts=3)
    at = datetime.fromisoformat(run.store.meta()[ALIVE_KEY])
    assert abs((datetime.now(timezone.utc) - at).total_seconds()) < 60
