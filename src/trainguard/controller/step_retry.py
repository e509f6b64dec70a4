"""Rung 0 for the controller: carries out the ladder's decisions on failed steps.

A rank's StepGuard reports a failed step (STEP_FAILED, with its process group's generation)
and waits. The reports of a (step, generation) become a STEP_FAILED incident for
policy.ladder.decide once every running rank reported, or reports_within_s after the first
(the ranks still silent then are blocked in the broken collective: the step is given up and
the in-process restart replaces them; review 37 #2); the verdict goes to every rank out of
band (AgentAPI.tell): REFORM with a fresh rendezvous port and the next generation, confirmed
by REFORM_GO once every running rank got it (taken back by GIVE_UP when one did not: no rank
waits in a rendezvous a peer never joins), or GIVE_UP (the ranks raise, and their exit is the
next rung's incident). The first STEP_REEXECUTED of that generation ends the incident.
Events: StepRetrying, StepReexecuted, StepRetryDowngraded; one recover record of type
`step_reexecution` per decision.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from trainguard.controller.faults import Fault
from trainguard.controller.recorder import Recorder
from trainguard.errors import LaunchError
from trainguard.policy.decision import (
    Action,
    Decision,
    Incident,
    IncidentKind,
    Rung,
    Tried,
)
from trainguard.policy.step import reports_within_s
from trainguard.protocol import AgentAPI, NodeReport, Tell, WorkerMessage
from trainguard.records import FaultScenario, Level, Reason, RecoverResult, utcnow
from trainguard.worker.contract import ControlKind, MessageKind


@dataclass
class _Reports:
    """The reports of one failed (step, generation) so far."""

    first: WorkerMessage
    since: float  # monotonic, when the first came
    ranks: set[int] = field(default_factory=set)


class StepRetries:
    def __init__(self, rec: Recorder, agent: AgentAPI,
                 decide: Callable[[Incident], Decision],
                 commit: Callable[[Decision], Decision] | None = None) -> None:
        self.rec, self.agent, self._decide = rec, agent, decide
        self._commit = commit  # the ladder's memory, set again when a decision is undone
        self._answered: set[tuple[int, int]] = set()  # (step, generation) of failures
        self._reports: dict[tuple[int, int], _Reports] = {}  # failures not decided yet
        self._reexecuting: tuple[int, int] | None = None  # (step, new generation)
        self._generation = 0  # the newest process group generation handed out
        self._floor = 0  # reports on older generations came before an in-process restart
        self._within_s = reports_within_s(rec.spec.step_retry_timeout_s)  # silent: blocked

    def new_attempt(self) -> None:
        self._answered.clear()
        self._reports.clear()
        self._reexecuting = None
        self._generation = self._floor = 0

    def next_generation(self) -> int:
        """A process group generation nobody used yet in this attempt (in-process restarts
        share the count)."""
        return self._generation + 1

    def restarted(self, generation: int) -> None:
        """The ranks restarted in place on `generation`: failed steps reported on an older
        group are of the functions they left."""
        self._generation = self._floor = generation
        self._answered.clear()
        self._reports.clear()
        self._reexecuting = None

    def observe(self, report: NodeReport, attempt: int) -> None:
        for m in report.messages:
            if m.kind == MessageKind.STEP_FAILED:
                self._reported(m)
            elif m.kind == MessageKind.STEP_REEXECUTED:
                self._reexecuted(m, attempt)
        running = {w.rank for w in report.workers if not w.state.ended}
        for key, got in list(self._reports.items()):
            silent = tuple(sorted(running - got.ranks))
            if silent and time.monotonic() - got.since < self._within_s:
                continue  # a rank's collective may still fail: every rank reports the step
            del self._reports[key]
            self._answered.add(key)
            self._failed(got.first, attempt, report, silent)

    def _reported(self, m: WorkerMessage) -> None:
        key = int(m.data["step"]), int(m.data["generation"])
        if key[1] < self._floor:
            return  # from before an in-process restart: that function was left
        if key in self._answered:
            return  # another rank of the same failure, or a report sent again: answered
        got = self._reports.setdefault(key, _Reports(m, time.monotonic()))
        if m.rank is not None:
            got.ranks.add(m.rank)

    def _failed(self, m: WorkerMessage, attempt: int, report: NodeReport,
                silent: tuple[int, ...]) -> None:
        step, generation = int(m.data["step"]), int(m.data["generation"])
        error = str(m.data.get("error") or "")
        first = (error.strip().splitlines() or ["?"])[0]
        first = first if len(first) <= 160 else first[:157] + "..."
        running = [w.rank for w in report.workers if not w.state.ended]
        ended = tuple(sorted(w.rank for w in report.workers if w.state.ended))
        decision = self._decide(Incident(IncidentKind.STEP_FAILED, step=step, why=error,
                                         ended_ranks=ended, silent_ranks=silent,
                                         stale_group=generation < self._generation))
        fault = Fault(FaultScenario.ERROR_IN_LOG, f"step {step} failed: {first}",
                      f"step {step} failed", f"worker-{m.rank}" if m.rank is not None else "job",
                      m.at, utcnow(), utcnow(), report.progress, "nccl_communication_error")
        if decision.action == Action.REEXECUTE:
            decision = self._reform(step, generation + 1, len(running), decision)
        if decision.action == Action.REEXECUTE:
            self.rec.book.step_incident(attempt, decision, fault, step)
            self.rec.event(Level.WARNING, Reason.STEP_RETRYING,
                           f"rank {m.rank}: step {step} failed ({first}); {decision.reason}: "
                           f"{len(running)} rank(s) re-form the process group (generation "
                           f"{self._generation})", rank=m.rank, attempt=attempt)
            return
        told = self._tell({"kind": ControlKind.GIVE_UP.value, "step": step,
                           "reason": decision.reason})
        self._reexecuting = None
        self.rec.book.step_incident(attempt, decision, fault, step)
        self.rec.event(Level.WARNING, Reason.STEP_RETRY_DOWNGRADED,
                       f"rank {m.rank}: step {step} failed ({first}); not re-executed: "
                       f"{decision.reason}; {told} rank(s) raise it and the next level of the "
                       "recovery ladder takes over", rank=m.rank, attempt=attempt)

    def _reform(self, step: int, generation: int, ranks: int, decision: Decision) -> Decision:
        """Hand every rank a fresh rendezvous; the decision as carried out (a DOWNGRADE when
        the port or the delivery failed: a rank left waiting would only time out)."""
        try:
            addr, port = self.agent.rendezvous(self.rec.spec.master_addr, None)
            told = self.agent.tell(Tell(control={
                "kind": ControlKind.REFORM.value, "step": step, "generation": generation,
                "master_addr": addr, "master_port": port}))
            why = None if told >= ranks else f"only {told} of {ranks} rank(s) got the verdict"
            if why is None:  # every rank has the address: now they may join (worker/step.py)
                self.agent.tell(Tell(control={"kind": ControlKind.REFORM_GO.value,
                                              "step": step, "generation": generation}))
        except (LaunchError, OSError) as e:
            why = f"no new rendezvous could be handed out ({e})"
        if why is None:
            self._generation, self._reexecuting = generation, (step, generation)
            return replace(decision, reason=f"{decision.reason} on port {port}")
        # nothing was re-executed: the budget the decision took is given back
        h = decision.history
        undone = replace(decision, action=Action.DOWNGRADE, result=RecoverResult.DOWNGRADE,
                         reason=why, tried=(Tried(Rung.STEP_REEXECUTION,
                                                  RecoverResult.DOWNGRADE, why),),
                         history=replace(h, step_retries=max(0, h.step_retries - 1),
                                         retried_step_count=max(0, h.retried_step_count - 1)))
        return self._commit(undone) if self._commit is not None else undone

    def _tell(self, control: dict[str, object]) -> int:
        try:
            return self.agent.tell(Tell(control=control))
        except (LaunchError, OSError):
            return 0

    def _reexecuted(self, m: WorkerMessage, attempt: int) -> None:
        key = (int(m.data["step"]), int(m.data["generation"]))
        if key != self._reexecuting:
            return  # another rank of the same success, or a stale report
        self._reexecuting = None
        retry_s = m.data.get("retry_s")
        self.rec.book.step_reexecuted(m.at)
        self.rec.event(Level.INFO, Reason.STEP_REEXECUTED,
                       f"step {key[0]} re-executed on every rank on process group generation "
                       f"{key[1]}" + (f", {float(retry_s):.3f}s after it failed" if retry_s
                                      is not None else "") + "; no process was restarted",
                       attempt=attempt)
