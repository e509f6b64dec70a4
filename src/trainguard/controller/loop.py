"""The controller: one per job. Owns the attempt loop and the restart policy.

start -> watch -> (failure) stop -> diagnose -> decide -> (backoff) -> start again.
It talks to node agents only through protocol messages; the Recorder writes everything
down as it happens. Signal handlers only record the signal; the loop acts on it.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from dataclasses import dataclass
from types import FrameType
from typing import TYPE_CHECKING

from trainguard.controller.hang_watch import HangConfirmation, HangWatch
from trainguard.controller.recorder import Recorder
from trainguard.diagnosis.attempt import diagnose_attempt
from trainguard.diagnosis.taxonomy import Diagnosis
from trainguard.errors import LaunchError, NodesUnavailable
from trainguard.exitcodes import ExitCode, describe_exit
from trainguard.policy.process import Action, Decision, History, decide
from trainguard.protocol import (
    AgentAPI,
    NodeReport,
    StartWorkers,
    StopWorkers,
    WorkerAssignment,
    WorkerState,
)
from trainguard.records import JobState, Level, Reason, RecoverResult, StartType, utcnow

if TYPE_CHECKING:
    from trainguard.controller.nodes import NodeRecovery

log = logging.getLogger(__name__)

# A job that never prints a step line still makes progress if an attempt lived this long.
MIN_UPTIME_FOR_PROGRESS_S = 60.0


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


# restart upon suspension: at most this many in a row (progress resets the count)
MAX_HANG_RESTARTS = 3


@dataclass
class _Outcome:
    report: NodeReport
    signal: int | None = None
    hang: HangConfirmation | None = None
    lost: dict[str, str] | None = None  # multi-node: placed nodes lost, with why


class Controller:
    """Runs one job to the end and returns the launcher's exit code. A multi-node job's
    agent is the fleet, and `nodes` carries out node-level recovery (cluster.recovery)."""

    def __init__(self, recorder: Recorder, agent: AgentAPI, nodes: NodeRecovery | None = None,
                 adopt: bool = False) -> None:
        self.rec, self.agent, self.nodes, self._adopt = recorder, agent, nodes, adopt
        if nodes is not None:
            nodes.stop_requested = lambda: self._signals.received is not None
        self.spec = recorder.spec
        self._hist = History()
        self._signals = SignalReceiver()
        self._max_step_seen: int | None = None
        self._max_committed_before: int | None = None
        self._started_any = False
        self._hangs = HangWatch(recorder, agent)
        self._hang_restarts = 0

    def run(self) -> int:
        with self._signals:
            try:
                return self._run()
            except BaseException as e:  # a bug or an interrupt: never leave the job "running"
                self.rec.event(Level.ERROR, Reason.JOB_FAILED,
                               f"the launcher failed: {type(e).__name__}: {e}")
                self.rec.finish(JobState.FAILED, ExitCode.FAILED)
                raise
            finally:
                self.agent.close()

    def _run(self) -> int:
        adopted: int | None = self.rec.adopt() if self._adopt else None
        attempt, start_type = (adopted, StartType.AUTO_RESTART) if adopted is not None \
            else self.rec.begin()
        self._hist = History(restarts_used=int(self.rec.store.meta().get("restarts_used") or 0))
        self._max_step_seen = self.rec.previous_max_step
        while True:
            try:
                if adopted is not None:  # a restarted controller: the workers run on
                    self._started_any, adopted = True, None
                    self._hangs.start_attempt(attempt, utcnow())
                    outcome = self._watch()
                else:
                    outcome = self._run_attempt(attempt, start_type)
            except LaunchError as e:
                return self._not_started(attempt, e)
            if outcome.signal is not None:
                return self._stopped(attempt, outcome.signal)
            if outcome.lost and self.nodes is not None:
                next_type = self._node_level(attempt, self.nodes.after_loss(attempt, outcome.lost))
                if isinstance(next_type, int):
                    return next_type
                attempt, start_type = attempt + 1, next_type
                continue
            if outcome.hang is not None:
                next_type = self._after_hang(attempt, outcome.report, outcome.hang)
                if isinstance(next_type, int):
                    return next_type
                attempt, start_type = attempt + 1, next_type
                continue
            if not any(w.state == WorkerState.FAILED for w in outcome.report.workers):
                return self._succeeded(attempt)
            next_type = self._after_failure(attempt, outcome.report)
            if isinstance(next_type, int):
                return next_type
            attempt, start_type = attempt + 1, next_type

    def _run_attempt(self, attempt: int, start_type: StartType) -> _Outcome:
        if self.nodes is not None:
            why = self.nodes.prepare(attempt)
            if why is not None:
                raise NodesUnavailable(why)
        addr, port = self.agent.rendezvous(
            self.spec.master_addr, self.spec.master_port if attempt == 0 else None)
        self.rec.book.attempt_started(attempt, start_type, port)
        self.rec.messages.new_attempt()
        report = self.agent.start_workers(self._start_cmd(attempt, port, addr))
        self._started_any = True
        self.rec.book.workers_started(report.at)
        self._hangs.start_attempt(attempt, report.at)
        self.rec.sync(report)
        pids = ", ".join(f"rank {w.rank}: pid {w.pid}" for w in report.workers)
        if start_type in (StartType.FIRST_START, StartType.RELAUNCH):
            self.rec.event(Level.INFO, Reason.JOB_RUNNING,
                           f"started {len(report.workers)} worker(s) ({pids}), port {port}",
                           attempt=attempt)
        else:
            self.rec.event(Level.INFO, Reason.WORKERS_RESTARTED,
                           f"the job has been restarted ({start_type.value}, attempt {attempt}): "
                           f"{pids}, port {port}", attempt=attempt)
        self.rec.set_meta(state=JobState.RUNNING.value, attempt=attempt)
        return self._watch()

    def _start_cmd(self, attempt: int, port: int, addr: str) -> StartWorkers:
        n = self.spec.nproc_per_node
        base = self.spec.node_rank * n
        ranks = range(self.spec.world_size) if self.nodes is not None else range(base, base + n)
        paths = self.rec.paths
        return StartWorkers(
            run_id=self.spec.run_id, attempt=attempt, argv=self.rec.argv,
            env={"TRAINGUARD_GRACE_PERIOD_S": f"{self.spec.grace_period_s:g}",
                 "TRAINGUARD_SAVE_ON_EXIT": "1" if self.spec.save_on_exit else "0"},
            workers=[WorkerAssignment(rank=r, local_rank=r % n, start_count=attempt + 1,
                                      schedule_count=self.rec.launches) for r in ranks],
            world_size=self.spec.world_size, group_rank=self.spec.node_rank,
            group_world_size=self.spec.nnodes, master_addr=addr,
            master_port=port, max_restarts=self.spec.max_restarts,
            log_dir=str(paths.log_dir), job_dir=str(paths.job_dir),
            checkpoint_dir=str(paths.checkpoint_dir), cwd=os.getcwd())

    def _watch(self) -> _Outcome:
        while True:
            if self._signals.received is not None:
                return _Outcome(self.agent.poll(), self._signals.received)
            report = self.agent.poll(wait_s=self.spec.monitor_interval)
            self.rec.sync(report)
            if report.lost_nodes and self.nodes is not None:
                return _Outcome(report, lost=self.nodes.fleet.lost)
            states = [w.state for w in report.workers]
            if WorkerState.FAILED in states or all(s.ended for s in states):
                return _Outcome(report)
            hang = self._hangs.observe(report)
            if hang is not None and self.spec.restart_on_hang:
                return _Outcome(report, hang=hang)

    def _stop(self, reason: str, dead: list[int] | None = None) -> NodeReport:
        """Stop what is left of the attempt (workers, their children) and read all logs."""
        report = self.agent.stop_workers(StopWorkers(grace_s=self.spec.grace_period_s,
                                                     reason=reason, dead_ranks=dead or []))
        self.rec.sync(report, force=True)
        return report

    # -- after an attempt -----------------------------------------------------------------

    def _after_failure(self, attempt: int, report: NodeReport) -> StartType | int:
        detected = utcnow()
        failed = [w for w in report.workers if w.state == WorkerState.FAILED]
        for w in failed:
            self.rec.event(Level.WARNING, Reason.WORKER_FAILED,
                           f"rank {w.rank} (pid {w.pid}) {describe_exit(w.returncode)}",
                           rank=w.rank, attempt=attempt)
        report = self._stop("a worker failed", [w.rank for w in failed])
        stopped = utcnow()
        self.rec.event(Level.INFO, Reason.WORKERS_STOPPED,
                       f"stopped the other workers (grace {self.spec.grace_period_s:g}s)",
                       attempt=attempt)
        if self.nodes is not None:  # a peer's failure may be the sign of a node's loss
            lost = self.nodes.fleet.settle()
            if lost:
                return self._node_level(attempt, self.nodes.after_loss(attempt, lost))
        diag = diagnose_attempt(report.workers, detected, node=report.node)
        if diag is None:  # pragma: no cover - _watch returns only with a failed worker
            raise RuntimeError("no failed worker to diagnose")
        self.rec.event(Level.WARNING, Reason.FAILURE_DIAGNOSED, diagnosis_message(diag),
                       rank=diag.culprit_rank, attempt=attempt, data=diag.to_dict())
        if self.nodes is not None:
            first = min((w.ended_at for w in failed if w.ended_at), default=detected)
            node_level = self.nodes.after_failure(attempt, report, diag,
                                                  (first, detected, stopped))
            if node_level is not None:
                return self._node_level(attempt, node_level)
        decision = decide(diag, self._made_progress(report), self._hist,
                          self.spec.restart_policy)
        self._hist = decision.history
        first_fail = min((w.ended_at for w in failed if w.ended_at), default=detected)
        self.rec.book.attempt_failed(attempt, diag, decision, first_fail, detected, stopped,
                                     report.progress)
        self.rec.set_meta(restarts_used=self._hist.restarts_used)
        if decision.action == Action.RESTART:
            return self._backoff(attempt, decision)
        return self._failed(attempt, decision, diag)

    def _after_hang(self, attempt: int, report: NodeReport,
                    hang: HangConfirmation) -> StartType | int:
        """Restart upon suspension: stop the ranks, restart them in place (the restart budget
        is not used); at most MAX_HANG_RESTARTS in a row without progress."""
        if self._made_progress(report, allow_uptime=False):
            self._hang_restarts = 0
        report = self._stop("a hang was confirmed")
        stopped = utcnow()
        self.rec.event(Level.INFO, Reason.WORKERS_STOPPED,
                       f"stopped the hung workers (grace {self.spec.grace_period_s:g}s)",
                       attempt=attempt)
        restart = self._hang_restarts < MAX_HANG_RESTARTS
        self.rec.book.attempt_hanged(attempt, hang.culprit.reason, hang.culprit.rank,
                                     hang.verdict.last_progress_at, hang.confirmed_at, stopped,
                                     report.progress, restart)
        if not restart:
            self.rec.event(Level.ERROR, Reason.HANG_RESTART_LIMIT_REACHED,
                           f"{MAX_HANG_RESTARTS} restarts upon suspension in a row made no "
                           "progress; giving up", attempt=attempt)
            self.rec.event(Level.ERROR, Reason.JOB_FAILED,
                           f"job failed: hung again after {MAX_HANG_RESTARTS} restarts in place",
                           rank=hang.culprit.rank, attempt=attempt)
            self.rec.finish(JobState.FAILED, ExitCode.FAILED)
            return int(ExitCode.FAILED)
        self._hang_restarts += 1
        self.rec.set_meta(state=JobState.RESTARTING.value)
        self.rec.event(Level.INFO, Reason.RESTART_SCHEDULED,
                       f"restart upon suspension {self._hang_restarts}/{MAX_HANG_RESTARTS} in a "
                       "row (the restart budget is not used); restarting in place",
                       attempt=attempt)
        return StartType.SUSPENSION_RESTART

    def _backoff(self, attempt: int, decision: Decision) -> StartType | int:
        self.rec.set_meta(state=JobState.RESTARTING.value)
        self.rec.event(Level.INFO, Reason.RESTART_SCHEDULED,
                       f"{decision.reason}; restarting in {decision.delay_s:.1f}s",
                       attempt=attempt)
        deadline = time.monotonic() + decision.delay_s
        while time.monotonic() < deadline:
            if self._signals.received is not None:
                return self._stopped_in_backoff(attempt, self._signals.received)
            time.sleep(min(0.05, max(deadline - time.monotonic(), 0)))
        return decision.start_type or StartType.AUTO_RESTART

    def _made_progress(self, report: NodeReport, allow_uptime: bool = True) -> bool:
        """New ground: a checkpoint or a step beyond every earlier one (or a long life, for
        crashes: a hang always lives long, so it does not count there)."""
        committed = self.rec.messages.committed_this_attempt
        last = report.progress.last_step
        new_ckpt = committed is not None and committed > (self._max_committed_before or -1)
        new_step = last is not None and (self._max_step_seen is None or last > self._max_step_seen)
        if committed is not None:
            self._max_committed_before = max(committed, self._max_committed_before or committed)
        if last is not None:
            self._max_step_seen = max(last, self._max_step_seen or last)
        if new_ckpt or new_step:
            return True
        record = self.rec.book.current
        if allow_uptime and last is None and self._max_step_seen is None and record is not None:
            return (utcnow() - record.start_at).total_seconds() >= MIN_UPTIME_FOR_PROGRESS_S
        return False

    def _node_level(self, attempt: int, outcome: StartType | str) -> StartType | int:
        """After node-level recovery: restart (the start type) or fail (why)."""
        if self._signals.received is not None:  # stopped while waiting for nodes
            return self._record_stop(attempt, self._signals.received)
        if isinstance(outcome, StartType):
            self.rec.set_meta(state=JobState.RESTARTING.value)
            return outcome
        self.rec.event(Level.ERROR, Reason.JOB_FAILED, f"job failed: {outcome}",
                       attempt=attempt)
        self.rec.finish(JobState.FAILED, ExitCode.FAILED)
        return int(ExitCode.FAILED)

    # -- endings --------------------------------------------------------------------------

    def _failed(self, attempt: int, decision: Decision, diag: Diagnosis) -> int:
        if decision.action == Action.GIVE_UP_NO_PROGRESS:
            self.rec.event(Level.ERROR, Reason.NO_PROGRESS, f"giving up: {decision.reason}",
                           attempt=attempt)
            code = ExitCode.NO_PROGRESS
        else:
            if decision.result == RecoverResult.QUOTA_EXCEEDED:
                self.rec.event(Level.ERROR, Reason.RESTART_LIMIT_REACHED, decision.reason,
                               attempt=attempt)
            code = ExitCode.FAILED
        self.rec.event(Level.ERROR, Reason.JOB_FAILED,
                       f"job failed: {diag.summary} ({decision.reason})",
                       rank=diag.culprit_rank, attempt=attempt)
        self.rec.finish(JobState.FAILED, code)
        return int(code)

    def _succeeded(self, attempt: int) -> int:
        report = self._stop("every worker exited 0")  # reaps leftovers, reads the last lines
        self.rec.book.attempt_succeeded(attempt, report.progress)
        self.rec.event(Level.INFO, Reason.JOB_SUCCEEDED,
                       f"all {len(report.workers)} worker(s) exited 0 after {attempt + 1} "
                       "attempt(s)", attempt=attempt)
        self.rec.finish(JobState.SUCCEEDED, ExitCode.SUCCESS)
        return int(ExitCode.SUCCESS)

    def _stopped(self, attempt: int, signum: int) -> int:
        name = signal.Signals(signum).name
        report = self._stop(f"launcher got {name}")
        self.rec.book.attempt_stopped(attempt, f"launcher received {name}", report.progress)
        return self._record_stop(attempt, signum)

    def _stopped_in_backoff(self, attempt: int, signum: int) -> int:
        self.rec.book.backoff_interrupted()
        return self._record_stop(attempt, signum)

    def _record_stop(self, attempt: int, signum: int) -> int:
        self.rec.event(Level.WARNING, Reason.JOB_STOPPED,
                       f"stopped by {signal.Signals(signum).name}: workers got SIGTERM and "
                       f"{self.spec.grace_period_s:g}s to exit", attempt=attempt)
        self.rec.finish(JobState.STOPPED, 128 + signum)
        return 128 + signum

    def _not_started(self, attempt: int, e: LaunchError) -> int:
        self.rec.book.attempt_not_started(attempt, str(e))
        code = (ExitCode.FAILED if self._started_any or isinstance(e, NodesUnavailable)
                else ExitCode.USAGE)
        self.rec.event(Level.ERROR, Reason.JOB_FAILED, f"job failed: {e}", attempt=attempt)
        self.rec.finish(JobState.FAILED, code)
        return int(code)


def diagnosis_message(d: Diagnosis) -> str:
    """The FailureDiagnosed event's text: verdict, evidence location, advice."""
    parts = [f"{d.category.value} ({d.fault_domain.value}, restart helps: "
             f"{d.restart_helps.value}{', isolate node' if d.isolate_node else ''}): "
             f"{d.summary.rstrip('.')}."]
    if d.evidence is not None:
        parts.append(f"Evidence: {d.evidence.where()}.")
    if d.symptoms:
        parts.append(f"Explains {len(d.symptoms)} symptom(s).")
    parts.append(d.advice)
    return " ".join(parts)
