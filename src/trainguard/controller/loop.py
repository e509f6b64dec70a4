"""The controller: one per job. Owns the attempt loop; carries out the ladder's decisions.

start -> watch -> (incident) stop -> diagnose -> decide (policy.ladder) -> carry out
(backoff, node-level rescheduling) -> start again, or end the job (Recorder.end_job). An
in-process restart (controller/inprocess.py) leaves the survivors running: the watch goes on.
It talks to node agents only through protocol messages; the Recorder writes everything
down as it happens. Signal handlers only record the signal; the loop acts on it.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from trainguard.controller.drain import drain, finish_saves
from trainguard.controller.ending_nodes import ended_outside, ending_nodes, every_one_ending
from trainguard.controller.faults import Fault, fault_scenario, fault_time, stopped_by, task_of
from trainguard.controller.hang_evidence import HangConfirmation, hang_fault
from trainguard.controller.hang_watch import HangWatch
from trainguard.controller.high_water import HighWater
from trainguard.controller.inprocess import InProcessRestarts
from trainguard.controller.outcome import Next, Outcome
from trainguard.controller.recorder import Recorder
from trainguard.controller.resume_agree import ResumeAgreement
from trainguard.controller.signals import SignalReceiver
from trainguard.controller.start import resume_note, start_command, started
from trainguard.controller.step_retry import StepRetries
from trainguard.controller.stopping import HUNG_GRACE_S, ended_well, stop, stop_rest
from trainguard.diagnosis.attempt import diagnose_attempt
from trainguard.errors import LaunchError, NodesUnavailable
from trainguard.exitcodes import ExitCode
from trainguard.policy.decision import (
    Action,
    Decision,
    HAPolicy,
    History,
    Incident,
    IncidentKind,
    InProcessCase,
    Rung,
)
from trainguard.policy.ladder import decide
from trainguard.protocol import AgentAPI, NodeReport
from trainguard.records import Level, Reason, StartType, utcnow
from trainguard.states import JobState, WorkerState

if TYPE_CHECKING:
    from trainguard.controller.nodes import NodeRecovery

class Controller:
    """Runs one job to the end and returns the launcher's exit code. After every incident it
    asks the ladder (policy.ladder.decide) what to do and carries the Decision out; a
    multi-node job's agent is the fleet, and `nodes` carries out node-level decisions."""

    def __init__(self, recorder: Recorder, agent: AgentAPI, nodes: NodeRecovery | None = None,
                 adopt: bool = False, hurry: Callable[[], None] | None = None) -> None:
        """`hurry`: ends the grace period of a stop under way on a second Ctrl-C (the
        single-node agent's, or a multi-node job's agents' through a signals.Hurrier)."""
        self.rec, self.agent, self.nodes, self._adopt = recorder, agent, nodes, adopt
        self.spec = recorder.spec
        self._policy = HAPolicy.from_spec(self.spec)
        self._hist = History()
        self._signals = SignalReceiver()
        self._signals.on_repeat = hurry
        if nodes is not None:  # a signal ends a wait for nodes at once
            nodes.stop_requested = lambda: self._signals.received is not None
        self._marks = HighWater()
        self._started_any = False
        self._hangs = HangWatch(recorder, agent, None if nodes is None else nodes.fleet.silent_s)
        self._steps = StepRetries(recorder, agent, self._decide, self._commit)
        self._inproc = InProcessRestarts(recorder, agent, self._steps, nodes is None)
        self._resume = ResumeAgreement(agent, self.spec.world_size)

    def run(self) -> int:
        with self._signals:
            try:
                return self._run()
            except BaseException as e:  # a bug or an interrupt: never leave the job "running"
                self.rec.end_job(JobState.FAILED, ExitCode.FAILED,
                                 f"the launcher failed: {type(e).__name__}: {e}")
                raise
            finally:
                self._hangs.stall.close()
                self.agent.close()

    def _run(self) -> int:
        adopted: int | None = self.rec.adopt() if self._adopt else None
        attempt, start_type = (adopted, StartType.AUTO_RESTART) if adopted is not None \
            else self.rec.begin()
        self._hist = History.from_meta(self.rec.store.meta())
        self._marks = HighWater(self.rec.previous_max_step, self.rec.previous_committed)
        watch_on = adopted is not None  # a restarted controller: the workers run on
        while True:
            try:
                if watch_on:  # (or an in-process restart: the attempt goes on)
                    self._started_any, watch_on = True, False
                    self._hangs.start_attempt(attempt, utcnow())
                    outcome = self._watch()
                else:
                    ran = self._run_attempt(attempt, start_type)
                    if ran is None:  # its events name this launch's attempt at a first
                        # start or a relaunch, else (a restart) the one that ran before
                        first = start_type in (StartType.FIRST_START, StartType.RELAUNCH)
                        return self.rec.stopped_idle(attempt - (not first),
                                                     self._signals.received or signal.SIGTERM,
                                                     "waiting for nodes")
                    outcome = ran
            except LaunchError as e:
                return self.rec.not_started(attempt, e, self._started_any)
            if outcome.signal is not None:
                return self._stopped(attempt, outcome.signal)
            nxt: Next | None
            if outcome.lost:
                nxt = self._after_loss(attempt, outcome.lost)
            elif outcome.hang is not None:
                nxt = self._after_hang(attempt, outcome.report, outcome.hang)
            elif outcome.broken is not None:
                nxt = self._after_broken(attempt, outcome.report, outcome.broken)
            elif not any(w.state == WorkerState.FAILED for w in outcome.report.workers):
                return ended_well(self.agent, self.rec, attempt, outcome.report)
            else:
                nxt = self._after_failure(attempt, outcome.report)
            if nxt is not None and nxt.outside:
                return ended_outside(self.agent, self.rec, attempt, nxt.outside)
            if nxt is None or nxt.decision.action == Action.RESTART_RANKS:
                watch_on = True  # restarted in place, or nothing decided yet: the attempt goes on
                continue
            decision = nxt.decision
            if nxt.node_level and self._signals.received is not None:
                return self.rec.stopped_idle(attempt, self._signals.received, "waiting for nodes")
            if decision.action == Action.GIVE_UP:
                if decision.limit == Reason.NO_PROGRESS:  # say where the attempts got stuck
                    decision = replace(decision, reason=f"{decision.reason}: "
                                       f"{self._marks.stuck()}")
                finish_saves(self.agent, self.rec, self._signals.stopping)
                return self.rec.give_up(attempt, decision, nxt.failure, nxt.rank)
            if nxt.node_level:
                self.rec.set_meta(state=JobState.RESTARTING.value)
            if decision.delay_s > 0 and not self._signals.sleep(decision.delay_s):
                return self.rec.stopped_idle(attempt, self._signals.received or signal.SIGTERM,
                                             "waiting to restart (the backoff)")
            attempt, start_type = attempt + 1, decision.start_type or StartType.AUTO_RESTART

    def _run_attempt(self, attempt: int, start_type: StartType) -> Outcome | None:
        # a stop before, during or after the waits for nodes starts nothing (review 45 #5; a
        # stop ends the pre-check's wait for spares; review 43 #3: the rendezvous's reachable
        # nodes' ranks started)
        if self._signals.stopping():
            return None
        if self.nodes is not None:
            self._precheck(attempt)
            if self._signals.stopping():
                return None
        addr, port = self.agent.rendezvous(
            self.spec.master_addr, self.spec.master_port if attempt == 0 else None)
        if self._signals.stopping():
            return None
        self.rec.book.attempt_started(attempt, start_type, port)
        self.rec.messages.new_attempt()
        self._steps.new_attempt()
        self._inproc.new_attempt()
        self._resume.new_attempt(attempt)
        self._hist = replace(self._hist, retried_step=None, retried_step_count=0)
        report = self.agent.start_workers(start_command(
            self.rec, attempt, port, addr, all_ranks=self.nodes is not None,
            in_process=self._inproc.enabled))
        self._started_any = True
        self.rec.book.workers_started(report.at, [w.standby for w in report.workers])
        self._hangs.start_attempt(attempt, report.at)
        self.rec.sync(report)
        self.rec.event(Level.INFO, *started(report, start_type, attempt, port, self.spec.world_size,
                                            resume_note(self.rec)), attempt=attempt)
        self.rec.set_meta(state=JobState.RUNNING.value, attempt=attempt)
        return self._watch()

    def _watch(self) -> Outcome:
        while True:
            signalled = self._signals.received
            report = self.agent.poll(wait_s=0.0 if signalled else self.spec.monitor_interval)
            self.rec.sync(report)  # before the next poll acknowledges its messages
            if signalled is not None:
                return Outcome(report, signalled)
            if report.lost_nodes and self.nodes is not None:  # (and those leaving with them)
                return self._leaving(report, self.nodes.fleet.lost)
            states = [w.state for w in report.workers]
            if WorkerState.FAILED in states or all(s.ended for s in states):
                return Outcome(report)  # a rank's exit wins over its peers' failed steps
            if report.terminating_nodes and self.nodes is not None:  # (review 53 #2; after
                return self._leaving(report, {})  # the end: review 54 #2)
            self._observe(report)
            if self._inproc.broken is not None:
                return Outcome(report, broken=self._inproc.broken)
            hang = self._hangs.observe(report)
            if hang is not None and self.spec.restart_on_hang:
                return Outcome(report, hang=hang)

    def _leaving(self, report: NodeReport, lost: dict[str, str]) -> Outcome:
        """Placed nodes lost, those whose agent got SIGTERM (controller/ending_nodes) and
        those lost while it waited for the others' (review 55 #4: left placed, the next
        attempt started on a dead node)."""
        assert self.nodes is not None
        ending = ending_nodes(self.nodes.fleet, report, self._seen)
        return Outcome(report, lost={**lost, **self.nodes.fleet.lost, **ending})

    def _observe(self, report: NodeReport) -> None:
        """What the ranks said, to the resume agreement, step re-execution and rung 1a."""
        self._resume.observe(report)
        self._steps.observe(report, report.attempt or 0)
        self._inproc.observe(report, report.attempt or 0)

    def _seen(self, report: NodeReport) -> None:
        """A poll after a death (InProcessRestarts.settled): not to step re-execution, as in
        the watch (review 35 #1: the survivors' failed steps made a StepRetryDowngraded)."""
        self.rec.sync(report)
        self._resume.observe(report)
        self._inproc.observe(report, report.attempt or 0)

    def _in_place(self, attempt: int, decision: Decision, case: InProcessCase | None,
                  reason: str, dead: list[int] | None = None) -> Decision:
        """Carry out an in-process restart; any other decision stops the ranks first."""
        if decision.action == Action.RESTART_RANKS:
            decision = self._inproc.carry_out(attempt, decision)
        if case is not None and decision.action != Action.RESTART_RANKS:
            stop_rest(self.agent, self.rec, attempt, reason, dead)
        return decision

    # -- after an attempt: ask the ladder, carry out its decision -------------------------

    def _decide(self, incident: Incident) -> Decision:
        return self._commit(decide(incident, self._hist, self._policy))

    def _commit(self, decision: Decision) -> Decision:  # the ladder's memory, persisted
        self._hist = decision.history
        self.rec.set_meta(**self._hist.to_meta())
        return decision

    def _precheck(self, attempt: int) -> None:
        """Pre-check the nodes; failing ones are isolated and spares take their slots."""
        assert self.nodes is not None
        incident = self.nodes.precheck_incident(attempt)
        if incident is None or self._signals.stopping():  # (a stop ends it: review 46 #4)
            return
        decision = self.nodes.carry_out_replace(attempt, self._decide(incident))
        # (a stop that ended the wait for spares: the job stops, it does not fail: review
        # 44 #3) USAGE: a check failed on every node, the job's own setting (exit 2 when
        # nothing ran); else the nodes are the cluster's
        if decision.action == Action.GIVE_UP and self._signals.received is None:
            raise (LaunchError if decision.exit_code == ExitCode.USAGE
                   else NodesUnavailable)(decision.reason)

    def _after_loss(self, attempt: int, lost: dict[str, str]) -> Next:
        """Placed nodes were lost: each one's ranks are placed again (pod-level, else job)."""
        assert self.nodes is not None
        if every_one_ending(self.nodes.fleet.placement, lost):
            return Next(Decision(Action.GIVE_UP, "", self._hist), outside=sorted(lost))
        report, times = self.nodes.lost(attempt, lost)
        decision = Decision(Action.RESTART, "", self._hist, start_type=StartType.AUTO_RESTART)
        for name, why in lost.items():
            placement, spares = self.nodes.snapshot()
            decision = self.nodes.carry_out(attempt, self._decide(Incident(
                IncidentKind.NODE_LOST, node=name, why=why, placement=placement,
                spares=spares)), report, times)
            if decision.action == Action.GIVE_UP:
                break
        return Next(decision, decision.reason, node_level=True)

    def _after_failure(self, attempt: int, report: NodeReport) -> Next:
        detected = utcnow()
        report = self._inproc.settled(report, self._seen)  # ranks killed together
        failed = [w for w in report.workers if w.state == WorkerState.FAILED]
        self.rec.workers_failed(failed, attempt, report.node)
        case = self._inproc.case(report, tuple(w.rank for w in failed))
        if case is None:  # else the survivors run on until the ladder decided
            report = stop_rest(self.agent, self.rec, attempt, "a worker failed",
                               [w.rank for w in failed])
        # restarted in place, nothing was stopped: the settle is the decision's time
        stopped = utcnow() if case is None else detected  # (review 35 #6)
        if self.nodes is not None:  # a peer's failure may be the sign of a node's loss
            outcome = self._leaving(report, self.nodes.fleet.settle())
            if outcome.lost:
                return self._after_loss(attempt, outcome.lost)
        diag = diagnose_attempt(report.workers, detected, node=report.node)
        if diag is None:  # pragma: no cover - _watch returns only with a failed worker
            raise RuntimeError("no failed worker to diagnose")
        self.rec.diagnosed(diag, attempt, [f.text for w in failed for f in w.findings])
        first = fault_time(failed, diag.evidence, detected)
        placement, spares = self.nodes.snapshot() if self.nodes is not None else ((), ())
        node = next((w.node for w in report.workers
                     if w.rank == diag.culprit_rank and w.node), None)
        incident = Incident(IncidentKind.CRASH, made_progress=self._made_progress(report),
                            diagnosis=diag, node=node if self.nodes is not None else None,
                            placement=placement, spares=spares, now_s=time.time(),
                            in_process=case)
        decision = self._in_place(attempt, self._decide(incident), case,
                                  "a worker failed", [w.rank for w in failed])
        if self.nodes is not None and decision.node is not None:
            self.nodes.implicated(decision.node)
        fault = Fault(fault_scenario(diag), diag.summary, f"{diag.category.value}: {diag.summary}",
                      task_of(diag.culprit_rank), first, detected, stopped, report.progress,
                      diag.category.value)
        if decision.rung in (Rung.POD_RESCHEDULE, Rung.JOB_RESCHEDULE) or decision.isolate:
            assert self.nodes is not None
            decision = self.nodes.carry_out(attempt, decision, report,
                                            (first, detected, stopped), fault)
            return Next(decision, decision.reason, node_level=True)
        self._note_progress(report)  # the high-water marks move on the process path only
        self.rec.book.record(attempt, decision, fault)
        if decision.action == Action.GIVE_UP:
            return Next(decision, f"{diag.summary}; {decision.reason}", diag.culprit_rank)
        if decision.action != Action.RESTART_RANKS:
            self.rec.set_meta(state=JobState.RESTARTING.value)
            self.rec.event(Level.INFO, Reason.RESTART_SCHEDULED, f"{decision.reason}; "
                           f"restarting in {decision.delay_s:.1f}s", attempt=attempt)
        return Next(decision)

    def _after_broken(self, attempt: int, report: NodeReport, error: str) -> Next | None:
        """Every rank's group broke under it (a transient collective error), every process
        lives: all re-enter in place, or (None) are told to raise: their exit is a CRASH.
        The record's fault: the first rank's failure; detected: the last rank's report."""
        incident = Incident(IncidentKind.GROUP_FAILED, why=error, in_process=self._inproc.case(
            report, self._inproc.blocked), made_progress=self._made_progress(report))
        decision = decide(incident, self._hist, self._policy)  # committed when carried out
        fault = self._inproc.broken_fault(report.progress, utcnow())  # (a hang's `stopped`)
        if decision.action == Action.RESTART_RANKS:
            self._note_progress(report)
            decision = self._inproc.carry_out(attempt, self._commit(decision))
        if decision.action != Action.RESTART_RANKS:
            self._inproc.refuse(f"not restarted in place: {decision.reason}")
            return None
        self.rec.book.record(attempt, decision, fault)  # decided: when carried out
        return Next(decision)

    def _after_hang(self, attempt: int, report: NodeReport,
                    hang: HangConfirmation) -> Next | None:
        """Restart upon suspension: stop the ranks, restart them in place (None: every rank
        had exited 0 meanwhile, the job was ending: the watch sees it succeed)."""
        made_progress = self._made_progress(report, allow_uptime=False)
        self._note_progress(report)
        culprit = hang.culprit.rank
        case = self._inproc.case(report, () if culprit is None else (culprit,))
        if case is None:
            report = stop_rest(self.agent, self.rec, attempt, "a hang was confirmed")
            if all(w.state == WorkerState.SUCCEEDED for w in report.workers):
                self.rec.event(Level.INFO, Reason.HANG_CLEARED, "every rank exited 0 while "
                               "the hang was confirmed: the job was ending, not hung",
                               attempt=attempt)
                return None
        stopped = utcnow()
        decision = self._in_place(attempt, self._decide(Incident(
            IncidentKind.HANG, made_progress=made_progress, in_process=case)), case,
            "a hang was confirmed")
        self.rec.book.record(attempt, decision, hang_fault(hang, stopped, report.progress))
        if decision.action == Action.GIVE_UP:
            return Next(decision, f"hung again after {self._policy.max_hang_restarts} restarts "
                         "in place", hang.culprit.rank)
        if decision.action != Action.RESTART_RANKS:
            self.rec.set_meta(state=JobState.RESTARTING.value)
            self.rec.event(Level.INFO, Reason.RESTART_SCHEDULED, decision.reason, attempt=attempt)
        return Next(decision)

    def _made_progress(self, report: NodeReport, allow_uptime: bool = True) -> bool:
        return self._marks.made_progress(report, self.rec.messages.committed_this_attempt,
                                         self.rec.book.current, allow_uptime)

    def _note_progress(self, report: NodeReport) -> None:
        self._marks.note(report, self.rec.messages.committed_this_attempt)

    # -- endings: every one goes through Recorder.end_job ---------------------------------

    def _stopped(self, attempt: int, signum: int) -> int:
        name = signal.Signals(signum).name
        hung = self._hangs.confirmed is not None  # a hang left running: no step end will come
        grace = min(self.spec.grace_period_s, HUNG_GRACE_S) if hung else self.spec.grace_period_s
        self.rec.stop_requested(attempt, name, grace, hung)
        drained = not hung and drain(  # (a hung rank reaches no step end: walk-through 39)
            self.agent, self.rec, attempt, grace, f"the launcher got {name}",
            cut_short=lambda: self._signals.cut_short)
        report = stop(self.agent, self.rec, f"launcher got {name}", grace=grace)
        self.rec.book.attempt_stopped(attempt, stopped_by(name), report.progress)
        killed = sorted(w.rank for w in report.workers if w.returncode == -signal.SIGKILL)
        return self.rec.stopped_by(attempt, signum, grace, killed, self._signals.cut_short,
                                   drained)
