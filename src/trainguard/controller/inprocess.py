"""Rung 1a for the controller: carries out the ladder's in-process restarts.

Each rank that runs its training function in trainguard.run_resilient says so (RESILIENT,
with the process group generation it joins). When a rank dies or a hang has one culprit and
every rank said so, the ladder may decide RESTART_RANKS: a fresh rendezvous and the next
generation go to the agent (AgentAPI.restart_ranks), which kills the named ranks, tells the
others to re-enter in place and starts only the named ones again. The restart is done when
every rank entered the new generation (InProcessRestarted). A survivor that reports its
group broke (RESTART_WAITING) while no rank died and no restart comes is told NO_RESTART
after REFUSE_AFTER_S: it raises, and its exit is the incident.
"""

from __future__ import annotations

import time
from dataclasses import replace

from trainguard.controller.recorder import Recorder
from trainguard.controller.step_retry import StepRetries
from trainguard.errors import LaunchError
from trainguard.policy.decision import Action, Decision, InProcessCase, Rung, Tried
from trainguard.protocol import AgentAPI, NodeReport, RestartRanks
from trainguard.records import Level, Reason, RecoverResult, StartType
from trainguard.worker.contract import MessageKind

REFUSE_AFTER_S = 5.0  # a survivor waits this long for a death before it is told NO_RESTART


class InProcessRestarts:
    def __init__(self, rec: Recorder, agent: AgentAPI, steps: StepRetries,
                 single_node: bool) -> None:
        self.rec, self.agent, self._steps = rec, agent, steps
        self.enabled = rec.spec.in_process_restart and single_node
        self._resilient: dict[int, int] = {}  # rank -> the generation it last entered
        self._waiting: dict[int, tuple[int, float]] = {}  # rank -> (generation, since)
        self._pending: tuple[int, float, int] | None = None  # (generation, since, ranks)

    def new_attempt(self) -> None:
        self._resilient.clear()
        self._waiting.clear()
        self._pending = None

    def case(self, report: NodeReport, ranks: tuple[int, ...]) -> InProcessCase | None:
        """The in-process case for replacing `ranks`, or None when the rung does not apply
        (off, more than one node, a rank that does not run in run_resilient)."""
        if not self.enabled or not report.workers:
            return None
        if any(w.rank not in self._resilient for w in report.workers):
            return None
        survivors = tuple(w.rank for w in report.workers
                          if not w.state.ended and w.rank not in ranks)
        return InProcessCase(ranks, survivors)

    def observe(self, report: NodeReport, attempt: int) -> None:
        for m in report.messages:
            if m.rank is None:
                continue
            if m.kind == MessageKind.RESILIENT:
                self._resilient[m.rank] = int(m.data["generation"])
                self._waiting.pop(m.rank, None)
            elif m.kind == MessageKind.RESTART_WAITING:
                self._waiting.setdefault(m.rank, (int(m.data["generation"]), time.monotonic()))
        self._done(report, attempt)
        self._refuse(report)

    def carry_out(self, attempt: int, decision: Decision) -> Decision:
        """Restart decision.ranks in place; the decision as carried out (a process restart,
        with why, when the agent could not do it)."""
        assert decision.action == Action.RESTART_RANKS
        generation = self._steps.next_generation()
        try:
            addr, port = self.agent.rendezvous(self.rec.spec.master_addr, None)
            told = self.agent.restart_ranks(RestartRanks(
                ranks=list(decision.ranks), generation=generation, master_addr=addr,
                master_port=port, reason=decision.reason))
        except (LaunchError, OSError) as e:
            why = f"the in-process restart could not be carried out ({e})"
            return replace(decision, action=Action.RESTART, rung=Rung.PROCESS_RESTART,
                           start_type=decision.start_type or StartType.AUTO_RESTART,
                           reason=f"{decision.reason}; as processes: {why}",
                           tried=(*decision.tried, Tried(Rung.IN_PROCESS_RESTART,
                                                         RecoverResult.DOWNGRADE, why)))
        self._steps.restarted(generation)
        self._waiting.clear()
        self._pending = (generation, time.monotonic(), len(self._resilient))
        ranks = ", ".join(map(str, decision.ranks))
        self.rec.event(Level.WARNING, Reason.IN_PROCESS_RESTARTING,
                       f"{decision.reason}: rank(s) {ranks} killed and started again, {told} "
                       f"rank(s) told to re-enter on process group generation {generation} "
                       f"({addr}:{port})", attempt=attempt,
                       rank=decision.ranks[0] if len(decision.ranks) == 1 else None)
        return decision

    def _done(self, report: NodeReport, attempt: int) -> None:
        if self._pending is None:
            return
        generation, since, _ = self._pending
        ranks = [w.rank for w in report.workers]
        if all(self._resilient.get(r, -1) >= generation for r in ranks):
            self._pending = None
            self.rec.event(Level.INFO, Reason.IN_PROCESS_RESTARTED,
                           f"all {len(ranks)} rank(s) entered their training function on "
                           f"process group generation {generation}, "
                           f"{time.monotonic() - since:.3f}s after the restart began; the "
                           "surviving processes were not restarted", attempt=attempt)

    def _refuse(self, report: NodeReport) -> None:
        """Survivors waiting for a restart that will not come (nothing died, none planned)."""
        if not self._waiting or self._pending is not None:
            return
        if any(w.state.ended for w in report.workers):
            return  # a death: the controller decides about it now
        now = time.monotonic()
        due = [r for r, (_, since) in self._waiting.items() if now - since >= REFUSE_AFTER_S]
        if not due:
            return
        generation = min(self._waiting[r][0] for r in due)
        reason = (f"no rank's process ended within {REFUSE_AFTER_S:g}s of the failure: "
                  "nothing to restart in place")
        try:
            self.agent.refuse_restart(due, generation, reason)
        except (LaunchError, OSError):
            return
        for r in due:
            self._waiting.pop(r, None)
