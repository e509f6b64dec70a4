"""The controller: one per job. Owns the attempt loop and the restart policy.

start -> watch -> (failure) stop -> diagnose -> decide -> (backoff) -> start again.
It talks to node agents only through protocol messages and records everything in the
job store as it happens. Signals are only recorded by their handlers; the loop acts.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType
from typing import TextIO

from trainguard.agent import AgentAPI
from trainguard.diagnose import Diagnosis, diagnose_attempt
from trainguard.errors import LaunchError
from trainguard.exitcodes import ExitCode
from trainguard.incidents import IncidentBook
from trainguard.paths import JobPaths
from trainguard.policy import Action, History, decide
from trainguard.protocol import NodeReport, StartWorkers, StopWorkers, WorkerAssignment, WorkerState
from trainguard.records import Event, Involved, JobState, Level, Reason, StartType, utcnow
from trainguard.spec import JobSpec
from trainguard.store import JobStore, WorkerRow

log = logging.getLogger(__name__)

# A job that never prints a step line still makes progress if an attempt lived this long.
MIN_UPTIME_FOR_PROGRESS_S = 60.0


def free_port(addr: str) -> int:
    """A port nobody listens on right now (each attempt gets a fresh one)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((addr if addr not in ("localhost",) else "127.0.0.1", 0))
        return int(s.getsockname()[1])


class SignalReceiver:
    """Records SIGINT/SIGTERM/SIGHUP for the main loop; restores the old handlers on exit."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __init__(self) -> None:
        self.received: int | None = None
        self._old: dict[int, object] = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.received is None:
            self.received = signum

    def __enter__(self) -> SignalReceiver:
        for s in self.SIGNALS:
            self._old[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for s, h in self._old.items():
            signal.signal(s, h)  # type: ignore[arg-type]


@dataclass
class _Outcome:
    report: NodeReport
    signal: int | None = None


class Controller:
    """Runs one single-node job to the end and returns the launcher's exit code."""

    def __init__(self, spec: JobSpec, paths: JobPaths, store: JobStore, agent: AgentAPI,
                 argv: list[str], on_event: Callable[[Event], None] | None = None) -> None:
        self.spec, self.paths, self.store, self.agent, self.argv = spec, paths, store, agent, argv
        self._on_event = on_event
        self._book = IncidentBook(store)
        self._hist = History()
        self._signals = SignalReceiver()
        self._max_step_seen: int | None = None
        self._workers_sig: object = None
        self._progress_written = 0.0
        self._launches = 1

    # -- events ---------------------------------------------------------------------------

    def event(self, level: Level, reason: Reason, message: str, *, rank: int | None = None,
              attempt: int | None = None) -> None:
        ev = Event(utcnow(), level, reason.value, message,
                   Involved(job=self.spec.run_id, node=None if rank is None else "node-0",
                            rank=rank, attempt=attempt))
        self.store.add_event(ev)
        if self._on_event is not None:
            self._on_event(ev)

    # -- the loop -------------------------------------------------------------------------

    def run(self) -> int:
        with self._signals:
            try:
                return self._run()
            finally:
                self.agent.close()

    def _run(self) -> int:
        previous = self.store.meta()
        self._launches = int(previous.get("launches") or 0) + 1
        last = previous.get("last_step")
        self._max_step_seen = last if isinstance(last, int) else None
        self.store.set_meta(launches=self._launches, run_id=self.spec.run_id,
                            state=JobState.PENDING.value,
                            command=self.argv, job_dir=str(self.paths.job_dir),
                            nproc_per_node=self.spec.nproc_per_node, scenario=self.spec.scenario,
                            max_restarts=self.spec.max_restarts, restarts_used=0,
                            created_at=previous.get("created_at") or utcnow().isoformat(),
                            exit_code=None, ended_at=None)
        what = (f"{self.spec.nproc_per_node} worker(s), max {self.spec.max_restarts} restarts, "
                f"job dir {self.paths.job_dir}")
        attempt, start_type = 0, StartType.FIRST_START
        if isinstance(previous.get("attempt"), int):  # the same job launched again (a requeue)
            attempt, start_type = previous["attempt"] + 1, StartType.RELAUNCH
            self.event(Level.INFO, Reason.JOB_RELAUNCHED,
                       f"job {self.spec.run_id} launched again after its previous launch ended "
                       f"{previous.get('state')} at attempt {previous['attempt']}: {what}")
        else:
            self.event(Level.INFO, Reason.JOB_CREATED, f"job {self.spec.run_id} created: {what}")
        while True:
            try:
                outcome = self._run_attempt(attempt, start_type)
            except LaunchError as e:
                self.event(Level.ERROR, Reason.JOB_FAILED, f"job failed: {e}", attempt=attempt)
                self._finish(JobState.FAILED, ExitCode.USAGE)
                return int(ExitCode.USAGE)
            if outcome.signal is not None:
                return self._stopped(attempt, outcome.signal)
            failed = [w for w in outcome.report.workers if w.state == WorkerState.FAILED]
            if not failed:
                return self._succeeded(attempt, outcome.report)
            next_type = self._after_failure(attempt, outcome.report)
            if isinstance(next_type, int):
                return next_type
            attempt, start_type = attempt + 1, next_type

    def _run_attempt(self, attempt: int, start_type: StartType) -> _Outcome:
        port = (self.spec.master_port if attempt == 0 and self.spec.master_port
                else free_port(self.spec.master_addr))
        self._book.attempt_started(attempt, start_type, port)
        report = self.agent.start_workers(self._start_cmd(attempt, port))
        self._book.workers_started(report.at)
        self._sync_workers(report)
        pids = ", ".join(f"rank {w.rank}: pid {w.pid}" for w in report.workers)
        if start_type in (StartType.FIRST_START, StartType.RELAUNCH):
            self.event(Level.INFO, Reason.JOB_RUNNING,
                       f"started {len(report.workers)} worker(s) ({pids}), port {port}",
                       attempt=attempt)
        else:
            self.event(Level.INFO, Reason.WORKERS_RESTARTED,
                       f"the job has been restarted ({start_type.value}, attempt {attempt}): "
                       f"{pids}, port {port}", attempt=attempt)
        self.store.set_meta(state=JobState.RUNNING.value, attempt=attempt)
        return self._watch(attempt)

    def _start_cmd(self, attempt: int, port: int) -> StartWorkers:
        n = self.spec.nproc_per_node
        base = self.spec.node_rank * n
        return StartWorkers(
            run_id=self.spec.run_id, attempt=attempt, argv=self.argv, env={},
            workers=[WorkerAssignment(rank=base + i, local_rank=i, start_count=attempt + 1,
                                      schedule_count=self._launches) for i in range(n)],
            world_size=self.spec.world_size, group_rank=self.spec.node_rank,
            group_world_size=self.spec.nnodes, master_addr=self.spec.master_addr,
            master_port=port, max_restarts=self.spec.max_restarts,
            log_dir=str(self.paths.log_dir), job_dir=str(self.paths.job_dir),
            checkpoint_dir=str(self.paths.checkpoint_dir), cwd=os.getcwd())

    def _watch(self, attempt: int) -> _Outcome:
        while True:
            if self._signals.received is not None:
                return _Outcome(self.agent.poll(), self._signals.received)
            report = self.agent.poll(wait_s=self.spec.monitor_interval)
            self._sync_workers(report)
            self._sync_progress(report)
            states = [w.state for w in report.workers]
            if WorkerState.FAILED in states or all(s.ended for s in states):
                return _Outcome(report)

    # -- after an attempt -----------------------------------------------------------------

    def _after_failure(self, attempt: int, report: NodeReport) -> StartType | int:
        detected = utcnow()
        failed = [w for w in report.workers if w.state == WorkerState.FAILED]
        for w in failed:
            self.event(Level.WARNING, Reason.WORKER_FAILED,
                       f"rank {w.rank} (pid {w.pid}) {describe_exit(w.returncode)}",
                       rank=w.rank, attempt=attempt)
        report = self.agent.stop_workers(StopWorkers(grace_s=self.spec.grace_period_s,
                                                     reason="a worker failed"))
        stopped = utcnow()
        self._sync_workers(report)
        self._sync_progress(report)
        self.event(Level.INFO, Reason.WORKERS_STOPPED,
                   f"stopped the other workers (grace {self.spec.grace_period_s:g}s)",
                   attempt=attempt)
        diag = diagnose_attempt(report.workers, detected)
        if diag is None:  # pragma: no cover - _watch returns only with a failed worker
            raise RuntimeError("no failed worker to diagnose")
        self.event(Level.WARNING, Reason.FAILURE_DIAGNOSED,
                   f"{diag.category} ({diag.fault_domain}, restart helps: "
                   f"{diag.restart_helps.value}): {diag.summary.rstrip('.')}. {diag.advice}",
                   rank=diag.culprit_rank, attempt=attempt)
        progressed = self._made_progress(report)
        decision = decide(diag, progressed, self._hist, self.spec.restart_policy)
        self._hist = decision.history
        first_fail = min((w.ended_at for w in failed if w.ended_at), default=detected)
        self._book.attempt_failed(attempt, diag, decision, first_fail, detected, stopped,
                                  report.progress)
        self.store.set_meta(restarts_used=self._hist.restarts_used)
        if decision.action == Action.RESTART:
            return self._schedule_restart(attempt, decision.delay_s, decision.reason,
                                          decision.start_type or StartType.AUTO_RESTART)
        return self._failed(attempt, decision.action, decision.reason, diag)

    def _schedule_restart(self, attempt: int, delay: float, reason: str,
                          start_type: StartType) -> StartType | int:
        self.store.set_meta(state=JobState.RESTARTING.value)
        self.event(Level.INFO, Reason.RESTART_SCHEDULED,
                   f"{reason}; restarting in {delay:.1f}s", attempt=attempt)
        deadline = time.monotonic() + delay
        while time.monotonic() < deadline:
            if self._signals.received is not None:
                return self._stopped(attempt, self._signals.received)
            time.sleep(min(0.05, max(deadline - time.monotonic(), 0)))
        return start_type

    def _made_progress(self, report: NodeReport) -> bool:
        last = report.progress.last_step
        record = self._book.current
        if last is None:
            if self._max_step_seen is not None or record is None:
                return False
            return (utcnow() - record.start_at).total_seconds() >= MIN_UPTIME_FOR_PROGRESS_S
        progressed = self._max_step_seen is None or last > self._max_step_seen
        self._max_step_seen = max(last, self._max_step_seen or last)
        return progressed

    def _failed(self, attempt: int, action: Action, reason: str, diag: Diagnosis) -> int:
        if action == Action.GIVE_UP_NO_PROGRESS:
            self.event(Level.ERROR, Reason.NO_PROGRESS, f"giving up: {reason}", attempt=attempt)
            code = ExitCode.NO_PROGRESS
        else:
            if "budget" in reason or "in a row" in reason:
                self.event(Level.ERROR, Reason.RESTART_LIMIT_REACHED, reason, attempt=attempt)
            code = ExitCode.FAILED
        self.event(Level.ERROR, Reason.JOB_FAILED,
                   f"job failed: {diag.summary} ({reason})", rank=diag.culprit_rank,
                   attempt=attempt)
        self._finish(JobState.FAILED, code)
        return int(code)

    def _succeeded(self, attempt: int, report: NodeReport) -> int:
        self._sync_progress(report, force=True)
        self._book.attempt_succeeded(attempt, report.progress)
        self.event(Level.INFO, Reason.JOB_SUCCEEDED,
                   f"all {len(report.workers)} worker(s) exited 0 after {attempt + 1} attempt(s)",
                   attempt=attempt)
        self._finish(JobState.SUCCEEDED, ExitCode.SUCCESS)
        return int(ExitCode.SUCCESS)

    def _stopped(self, attempt: int, signum: int) -> int:
        name = signal.Signals(signum).name
        report = self.agent.stop_workers(StopWorkers(grace_s=self.spec.grace_period_s,
                                                     reason=f"launcher got {name}"))
        self._sync_workers(report)
        self._book.attempt_stopped(attempt, f"launcher received {name}", report.progress)
        self.event(Level.WARNING, Reason.JOB_STOPPED,
                   f"stopped by {name}: workers got SIGTERM and "
                   f"{self.spec.grace_period_s:g}s to exit", attempt=attempt)
        code = 128 + signum
        self._finish(JobState.STOPPED, code)
        return code

    def _finish(self, state: JobState, code: int) -> None:
        self.store.set_meta(state=state.value, exit_code=int(code), ended_at=utcnow().isoformat())

    # -- store sync -----------------------------------------------------------------------

    def _sync_workers(self, report: NodeReport) -> None:
        sig = tuple((w.pid, w.state, w.returncode) for w in report.workers)
        if sig != self._workers_sig:
            self._workers_sig = sig
            self.store.put_workers(report.attempt or 0, workers_rows(report))

    def _sync_progress(self, report: NodeReport, force: bool = False) -> None:
        p = report.progress
        now = time.monotonic()
        if p.last_step is None or (not force and now - self._progress_written < 1.0):
            if p.first_step_at is not None:
                self._book.progress_seen(p)
            return
        self._progress_written = now
        self._book.progress_seen(p)
        self.store.set_meta(last_step=p.last_step,
                            last_progress_at=p.last_step_at.isoformat() if p.last_step_at else None)


def workers_rows(report: NodeReport) -> list[WorkerRow]:
    return [WorkerRow(attempt=report.attempt or 0, rank=w.rank, local_rank=w.local_rank,
                      node=report.node, pid=w.pid, state=w.state.value,
                      exit_code=w.returncode, signal=_signame(w.signal_number),
                      started_at=w.started_at, ended_at=w.ended_at, start_count=w.start_count)
            for w in report.workers]


def _signame(sig: int | None) -> str | None:
    if sig is None:
        return None
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def describe_exit(returncode: int | None) -> str:
    if returncode is None:
        return "is still running"
    if returncode < 0:
        return f"was killed by {_signame(-returncode)}"
    return f"exited with code {returncode}"


def console_printer(stream: TextIO = sys.stderr) -> Callable[[Event], None]:
    """Supervisor-style, greppable launcher lines: `[trainguard] HH:MM:SS Level Reason: msg`."""

    def show(ev: Event) -> None:
        t = ev.time.astimezone().strftime("%H:%M:%S")
        print(f"[trainguard] {t} {ev.level.value} {ev.reason}: {ev.message}", file=stream,
              flush=True)

    return show
