"""Rung 1a for the controller: carries out the ladder's in-process restarts.

Each rank that runs its training function in trainguard.run_resilient says so (RESILIENT,
with the process group generation it joins). When a rank dies or a hang has one culprit and
every rank said so, the ladder may decide RESTART_RANKS: a fresh rendezvous and the next
generation go to the agent (AgentAPI.restart_ranks), which kills the named ranks, tells the
others to re-enter in place and starts only the named ones again. The restart is done when
every rank entered the new generation (InProcessRestarted). When every rank reports its
group broke under it (RESTART_WAITING), or the ranks that do not made no step since
(`blocked`: stuck in the broken collective), and every process lives, `broken` says so: the
controller asks the ladder (GROUP_FAILED), the waiting ranks re-enter and only the blocked
ones are replaced. A rank that waits while another ran on, with nothing dead, is told
NO_RESTART after REFUSE_AFTER_S: it raises, and its exit is the incident
(policy.inprocess.judge_waiting decides which).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timezone

from trainguard.controller.faults import GROUP_FAILED_REASON, Fault, task_of
from trainguard.controller.recorder import Recorder
from trainguard.controller.step_retry import StepRetries
from trainguard.errors import LaunchError
from trainguard.policy.decision import Action, Decision, InProcessCase, Rung, Tried
from trainguard.policy.inprocess import judge_waiting
from trainguard.protocol import AgentAPI, NodeReport, Progress, RestartRanks, Tell
from trainguard.records import (
    FaultScenario,
    Level,
    Reason,
    RecoverResult,
    StartType,
    plural,
    rank_list,
    utcnow,
)
from trainguard.states import WorkerState
from trainguard.worker.contract import ControlKind, MessageKind

# after a death, how long the rung waits to see whether its survivors die too: ranks killed
# together (an OOM killer, a `kill -9` of the job, a shared library's crash) exit within
# milliseconds of each other, and an in-process restart around a survivor already dying spent
# a restart that restarted nothing and a second one after it (walk-through 34 #1: 25 ms apart)
SETTLE_S = 0.1


class InProcessRestarts:
    def __init__(self, rec: Recorder, agent: AgentAPI, steps: StepRetries,
                 single_node: bool) -> None:
        self.rec, self.agent, self._steps = rec, agent, steps
        self.enabled = rec.spec.in_process_restart and single_node
        self._resilient: dict[int, int] = {}  # rank -> the generation it last entered
        # rank -> (generation, since, the error its group failed with)
        self._waiting: dict[int, tuple[int, float, str]] = {}
        self._pending: tuple[int, float] | None = None  # (generation, since)
        self._replaced: set[int] = set()  # the ranks the pending restart starts again
        self._refused: set[int] = set()  # told NO_RESTART: they raise and exit
        self.broken: str | None = None  # every rank waits, none died: the first error
        self.blocked: tuple[int, ...] = ()  # with it: the ranks blocked in the broken collective
        self._broken_on: tuple[int, ...] = ()  # with it: the ranks whose group failed (waiting)
        # with it, (fault, detected): the first rank's failure, the last one's report seen
        self.broken_at: tuple[datetime, datetime] | None = None
        self._failed_at: dict[int, datetime] = {}  # rank -> when its group failed (waiting)
        # each rank's last step when the first waiting report of this episode came: a rank is
        # judged by its own progress since (review 37 #1: step lines on rank 0 only)
        self._steps_before: dict[int, int | None] | None = None

    def new_attempt(self) -> None:
        self._resilient.clear()
        self._waiting.clear()
        self._steps_before = None
        self._refused.clear()
        self._pending, self.broken, self.blocked = None, None, ()

    def case(self, report: NodeReport, ranks: tuple[int, ...]) -> InProcessCase | None:
        """The in-process case for replacing `ranks`, or None when the rung does not apply
        (off, more than one node, a rank that does not run in run_resilient)."""
        if not self.enabled or not report.workers:
            return None
        if any(w.rank not in self._resilient for w in report.workers):
            return None
        if any(not w.state.ended and w.rank in self._refused for w in report.workers):
            return None  # told to raise: about to exit
        survivors = tuple(w.rank for w in report.workers
                          if not w.state.ended and w.rank not in ranks)
        return InProcessCase(ranks, survivors)

    def settled(self, report: NodeReport, seen: Callable[[NodeReport], None]) -> NodeReport:
        """`report` (a rank died), or, where the rung would restart in place around survivors,
        the report after they had SETTLE_S to die too (each poll's report to `seen`): the
        ladder then sees every rank that died with it, and no survivor where none is."""
        failed = tuple(w.rank for w in report.workers if w.state == WorkerState.FAILED)
        case = self.case(report, failed)
        if case is None or not case.survivors:
            return report
        deadline = time.monotonic() + SETTLE_S
        while (left := deadline - time.monotonic()) > 0 and \
                not all(w.state.ended for w in report.workers):
            report = self.agent.poll(wait_s=left)
            seen(report)
        return report

    def observe(self, report: NodeReport, attempt: int) -> None:
        for m in report.messages:
            if m.rank is None:
                continue
            if m.kind == MessageKind.RESILIENT:
                self._resilient[m.rank] = int(m.data["generation"])
                self._waiting.pop(m.rank, None)
                self._refused.discard(m.rank)  # (re-)entered: not on its way out
            elif m.kind == MessageKind.RESTART_WAITING and m.rank not in self._refused:
                if m.rank not in self._waiting:  # (a report sent again: the first one's)
                    failed = m.data.get("failed_at")
                    self._failed_at[m.rank] = m.at if not isinstance(failed, (int, float)) \
                        else datetime.fromtimestamp(failed, timezone.utc)
                self._waiting.setdefault(m.rank, (int(m.data["generation"]), time.monotonic(),
                                                  str(m.data["error"])))
        self._done(report, attempt)
        if self._pending is not None:
            return
        states = {w.rank: w.state for w in report.workers}
        steps = {lv.rank: lv.last_step for lv in report.liveness}
        if not self._waiting:
            self._steps_before = None
        elif self._steps_before is None:
            self._steps_before = steps
        verdict = judge_waiting(
            states, {r: since for r, (_, since, _) in self._waiting.items()}, steps,
            [r for r in self._refused if r in states and not states[r].ended], time.monotonic(),
            self._steps_before or {})
        if verdict.refuse:
            self.refuse(verdict.reason, list(verdict.refuse))
        if not verdict.broken:
            return
        first = min(self._waiting, key=lambda r: self._waiting[r][1])
        if self.broken is None:  # (walk-through 34 #6: recorded as after the decision)
            self.broken_at = (min(self._failed_at[r] for r in self._waiting), utcnow())
        self.broken = f"rank {first}: {self._waiting[first][2]}"
        self.blocked, self._broken_on = verdict.blocked, tuple(sorted(self._waiting))

    def broken_fault(self, progress: Progress, stopped: datetime) -> Fault:
        """The record's fault for the broken group (before carry_out): the ranks it failed on,
        and the blocked ones killed (review 37 #6: it said "failed on every rank", `job`);
        `stopped`: when the controller went to kill them (as a hang's record books it)."""
        fault_at, detected = self.broken_at or (utcnow(), utcnow())
        where = "every rank" if not self.blocked else (
            f"rank(s) {rank_list(self._broken_on)}; rank(s) {rank_list(self.blocked)} "
            "blocked in the broken collective, killed")
        return Fault(FaultScenario.ERROR_IN_LOG,
                     f"{GROUP_FAILED_REASON}{where}: {self.broken}", "group failed",
                     task_of(self.blocked[0]) if len(self.blocked) == 1 else "job",
                     fault_at, detected, max(stopped, detected), progress,
                     "nccl_communication_error")

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
        blocked = f"; rank(s) {rank_list(self.blocked)} made no step since the group failed " \
            "(blocked in the broken collective): killed" if self.blocked else ""
        self._waiting.clear()
        self._steps_before = None
        self.broken, self.blocked = None, ()
        self._pending = (generation, time.monotonic())
        self._replaced = set(decision.ranks)
        self.rec.event(Level.WARNING, Reason.IN_PROCESS_RESTARTING,
                       f"{decision.reason}{blocked} ({plural(told, 'rank')} told so; the new "
                       f"process group: generation {generation} at {addr}:{port})", attempt=attempt,
                       rank=decision.ranks[0] if len(decision.ranks) == 1 else None)
        return decision

    def _done(self, report: NodeReport, attempt: int) -> None:
        if self._pending is None:
            return
        generation, since = self._pending
        ranks = [w.rank for w in report.workers]
        if all(self._resilient.get(r, -1) >= generation for r in ranks):
            self._pending = None
            warm = [w.rank for w in report.workers if w.standby and w.start_count > 1]
            # the record's workers_from: the processes this restart started (none: a broken
            # group re-entered in place)
            self.rec.book.started_from([w.standby for w in report.workers
                                        if w.rank in self._replaced])
            self.rec.event(Level.INFO, Reason.IN_PROCESS_RESTARTED,
                           f"all {len(ranks)} rank(s) entered their training function on "
                           f"process group generation {generation}, "
                           f"{time.monotonic() - since:.3f}s after the restart began; the "
                           "surviving processes were not restarted" + (
                               f"; rank(s) {rank_list(warm)} from a pre-warmed "
                               "standby" if warm else ""), attempt=attempt)

    def refuse(self, reason: str, ranks: list[int] | None = None) -> None:
        """Tell waiting ranks (all, unless `ranks`) that no in-process restart comes."""
        due = list(self._waiting) if ranks is None else ranks
        if not due:
            return
        generation = min(self._waiting[r][0] for r in due)
        try:
            self.agent.tell(Tell(ranks=due, control={
                "kind": ControlKind.NO_RESTART.value, "generation": generation,
                "reason": reason}))
        except (LaunchError, OSError):
            return  # they give up by themselves after --in-process-timeout
        for r in due:
            self._waiting.pop(r, None)
            self._refused.add(r)
        self.broken, self.blocked = None, ()
