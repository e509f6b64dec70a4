"""Node-level recovery for the controller: carries out what the ladder decided about nodes.

The decisions are policy.ladder's (pure); this module acts on the fleet and writes them
down: pre-check runs, NodeLost (with the loss's FailureDiagnosed) / NodeIsolated /
PodRescheduled / JobRescheduled / RescheduleDowngraded / Queuing / Precheck* events, and one
recover record per rung tried.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timedelta

from trainguard.controller.faults import Fault
from trainguard.controller.fleet import Fleet
from trainguard.controller.link_loss import excused
from trainguard.controller.recorder import Recorder
from trainguard.controller.replies import plain_judge
from trainguard.controller.stopping import stop
from trainguard.diagnosis.attempt import diagnose_node_loss
from trainguard.exitcodes import ExitCode
from trainguard.policy.decision import (
    Action,
    Decision,
    History,
    Incident,
    IncidentKind,
    Isolation,
    Rung,
)
from trainguard.policy.nodes import lost_isolation
from trainguard.policy.precheck import CHECK_AGENT, PrecheckConfig, PrecheckReport
from trainguard.protocol import NodeReport, Op
from trainguard.records import FaultScenario, Level, Reason, RecoverResult, utcnow
from trainguard.states import AGENT_TERMINATED, NOT_THE_NODE, JobState, NodeState

PRECHECK_TIMEOUT_S = 300.0

Times = tuple[datetime, datetime, datetime]  # the fault's first sign, its detection, the stop


class NodeRecovery:
    def __init__(self, rec: Recorder, fleet: Fleet) -> None:
        self.rec, self.fleet = rec, fleet
        # the controller's: a signal ends a wait for nodes at once (Slurm's time limit sends
        # SIGTERM, then SIGKILL after KillWait)
        self.stop_requested: Callable[[], bool] = lambda: False
        fleet.on_spare_lost = self._spare_lost
        rec.stop_cause = self.cluster_cancelled  # a stop Slurm made says so (42 #5)
        fleet.stop_requested = lambda: self.stop_requested()
        fleet.disruption.say = lambda down, text: self.rec.event(
            Level.WARNING if down else Level.INFO,
            Reason.LINKS_DOWN if down else Reason.LINKS_RESTORED, text)

    def _spare_lost(self, name: str, why: str) -> None:
        """A lost spare implicates its node as a placed one's loss does: drained (walk-
        through 42 #10: only a lost training node was), unless every link went down."""
        self.rec.event(Level.WARNING, Reason.NODE_LOST, f"spare node {name} was lost: {why}; "
                       f"it is no longer a spare; {self._drain_lost(name, why)[0]}", node=name)

    def _drain_lost(self, name: str, why: str) -> tuple[str, str | None]:
        """Drain a lost node (lost_isolation says whether): what was done, said, and when it
        was not drained, why the node is not at fault."""
        iso = lost_isolation(name, why, excused(why, self.fleet.disruption.suspect(name)))
        if iso.drain:
            return self.fleet.backend.isolate(name, f"trainguard: {iso.why}"), None
        not_blamed = ("the cluster ended its agent's step" if NOT_THE_NODE in why
                      else "its agent was ended from outside (SIGTERM)"
                      if AGENT_TERMINATED in why else "every node's link went down at once")
        return f"not drained: {not_blamed}", not_blamed

    def cluster_cancelled(self) -> str | None:
        """Why a stop came, when the cluster cancelled the agents' steps (Slurm's requeue, a
        time limit, a node failure without --no-kill: walk-through 42 #5)."""
        return next((said for node in self.fleet.nodes.values() if node.handle is not None
                     and (said := node.handle.cancelled()) is not None), None)

    def snapshot(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """The placement (slot -> node) and the spare nodes ready now."""
        return tuple(self.fleet.placement), tuple(self.fleet.spares())

    def implicated(self, node: str) -> None:
        """The ladder counted an implication of `node`: shown in `trainguard status`."""
        if node in self.fleet.nodes:
            self.fleet.nodes[node].times_implicated += 1
            self.fleet.publish()

    # -- before an attempt ----------------------------------------------------------------

    def precheck_incident(self, attempt: int) -> Incident | None:
        """Pre-check the placed nodes and the spares; None when every one passed."""
        if not self.rec.spec.precheck:
            return None
        # the spares too: a broken one is found before it is needed, and their import
        # checks are cached for the restart that needs them
        reports = self.precheck([*self.fleet.placement, *self.fleet.spares()], attempt)
        failing = tuple(r for r in reports.values() if not r.ok)
        if not failing:
            return None
        placement, spares = self.snapshot()
        return Incident(IncidentKind.PRECHECK_FAILED, failing=failing, checked=len(reports),
                        placement=placement, spares=spares)

    def carry_out_replace(self, attempt: int, d: Decision) -> Decision:
        """Isolate the nodes that failed the pre-check; spares take the placed ones' slots
        (queuing for them); GIVE_UP when none came in time."""
        for iso in d.isolate:
            self.isolate(iso, attempt)
        if not d.missing:
            return d
        placement = self._refill(attempt)
        if placement is None:
            failed = ", ".join(i.node for i in d.isolate)
            return replace(d, action=Action.GIVE_UP, result=RecoverResult.FAILED,
                           exit_code=ExitCode.FAILED, reason=(
                               f"not enough healthy nodes: {failed} failed the pre-check and "
                               f"no spare took their place within "
                               f"{self.rec.spec.queue_timeout_s:g}s"))
        moved = tuple(i for i, (a, b) in enumerate(zip(self.fleet.placement, placement,
                                                       strict=True)) if a != b)
        self.fleet.place(list(placement), moved)
        return d

    def _refill(self, attempt: int) -> list[str] | None:
        """The placement with every slot whose node is out given to a spare (queuing for
        spares when there are too few); None when the queue timed out."""
        def fill() -> tuple[list[str] | None, int]:
            spares = list(self.fleet.spares())
            out = [i for i, n in enumerate(self.fleet.placement) if not self.fleet.ready(n)]
            if len(spares) < len(out):
                return None, len(out) - len(spares)
            new = list(self.fleet.placement)
            for i in out:
                new[i] = spares.pop(0)
            return new, 0

        return self._queue(attempt, fill)

    def precheck(self, names: list[str], attempt: int) -> dict[str, PrecheckReport]:
        s, paths = self.rec.spec, self.rec.paths
        cfg = PrecheckConfig.model_validate({
            "python": sys.executable, "paths": [str(paths.job_dir), str(paths.checkpoint_dir)],
            "min_free_disk_mb": s.min_free_disk_mb,
            "expect_accelerators": s.expect_accelerators})
        live = [n for n in names if self.fleet.ready(n)]
        self.rec.event(Level.INFO, Reason.PRECHECK_STARTED,
                       f"pre-check of {', '.join(live)}: free disk, /dev/shm, accelerators, "
                       "python and torch, ports, open files", attempt=attempt)
        plain = plain_judge(self.fleet.hub.links_now, s.reconnect_grace_s, None)
        replies = self.fleet.hub.call(
            {n: (Op.PRECHECK, cfg.model_dump(mode="json")) for n in live}, PRECHECK_TIMEOUT_S,
            judge=lambda names: {n: "a stop was requested" for n in names}
            if self.stop_requested() else plain(names))
        if self.stop_requested():  # a stop ends the pre-check (up to 300 s): no node is
            return {}  # judged by it, none isolated nor queued for (review 46 #4)
        out: dict[str, PrecheckReport] = {}
        for name, r in replies.items():
            if r.ok:
                report = PrecheckReport.model_validate(r.body)
            else:  # no answer (silent, gone, or the check itself broke): not a usable node
                link = self.fleet.hub.links.get(name)  # (an ended agent: not "unreachable")
                why = self.fleet.why_ended(name) if self.fleet.agent_ended(name) else r.error
                report = PrecheckReport.model_validate({
                    "node": name, "host": link.host if link is not None and link.host else "",
                    "at": utcnow(), "checks": [{
                        "name": CHECK_AGENT, "ok": False, "detail": f"no pre-check answer: "
                        f"{why}", "fix": f"read {self.rec.paths.job_dir}/cluster/"
                        f"{name}.agent.log"}]})
            out[name] = report
            data = {"checks": [c.model_dump() for c in report.checks]}
            if report.ok:
                self.rec.event(Level.INFO, Reason.PRECHECK_COMPLETED,
                               f"{name} passed its pre-check ({len(report.checks)} checks)",
                               node=name, attempt=attempt, data=data)
            else:
                self.rec.event(Level.WARNING, Reason.PRECHECK_FAILED,
                               f"{name} failed its pre-check: {report.summary()}",
                               node=name, attempt=attempt, data=data)
        return out

    # -- after an attempt -----------------------------------------------------------------

    def lost(self, attempt: int, lost: dict[str, str]) -> tuple[NodeReport, Times]:
        """Placed nodes were lost: each is marked and drained (a lost agent implicates its
        node), then the workers left on the other nodes are stopped."""
        detected = utcnow()
        first = detected - timedelta(seconds=self.fleet.heard_ago(list(lost)))
        kept: dict[str, str | None] = {}  # not drained: why the node is not at fault
        for name, why in lost.items():
            done, kept[name] = self._drain_lost(name, why)
            self.rec.event(Level.WARNING, Reason.NODE_LOST, f"node {name} was lost: {why}; "
                           f"{done}", node=name, attempt=attempt,
                           data={"why": why, "not_blamed": kept[name]})  # (diagnose JOB_DIR)
            self.fleet.mark(name, NodeState.LOST, why)
        if self.fleet.peer is not None:  # save at breakpoint: the last copied step to storage
            self.fleet.peer.newest(set(lost))  # the lost ranks' newest step, from their tails
            self.fleet.peer.persist(set(lost))
        k = self.rec.spec.nproc_per_node  # slot s (the placement's index) runs ranks s*k..
        dead = [s * k + i for s, n in enumerate(self.fleet.placement) if n in lost
                for i in range(k)]
        # the workers left on the placed nodes (they restart in the next attempt); `dead`: the
        # ranks of lost nodes, whose part a survivor's save on the way out does not wait for
        report = stop(self.fleet, self.rec, f"node {', '.join(lost)} was lost", dead)
        for name, why in lost.items():  # the verdict `diagnose` gives, for the UI and metrics
            ranks = [s * k + i for s, n in enumerate(self.fleet.placement) if n == name
                     for i in range(k)]  # (walk-through 42 #7: a node loss had none)
            self.rec.diagnosed(diagnose_node_loss(report.workers, name, why, ranks, detected,
                                                  kept.get(name)), attempt, [])
        return report, (first, detected, utcnow())

    def isolate(self, iso: Isolation, attempt: int) -> None:
        """Keep the node out of the job; `drain`: also out of the cluster (Slurm: DRAIN)."""
        what = (self.fleet.backend.isolate(iso.node, f"trainguard: {iso.why}"[:200]) if iso.drain
                else "kept out of the job's placement (not drained: every node checked "
                     "failed the pre-check)")
        self.fleet.mark(iso.node, NodeState.ISOLATED, iso.why)
        self.rec.event(Level.WARNING, Reason.NODE_ISOLATED,
                       f"node {iso.node} isolated: {iso.why}; {what}", node=iso.node,
                       attempt=attempt)

    # -- carrying out a node-level decision -----------------------------------------------

    def carry_out(self, attempt: int, d: Decision, report: NodeReport, times: Times,
                  crash: Fault | None = None) -> Decision:
        """Isolate, place the ranks again (queuing for nodes when some are missing) and write
        the records; the decision as carried out (GIVE_UP when no placement was possible)."""
        node = d.node or "?"
        for iso in d.isolate:
            self.isolate(iso, attempt)
        for i, t in enumerate(d.tried):
            then = ("trying the next level" if i + 1 < len(d.tried) or d.rung is not None
                    else "no level is left: the job fails")
            self.rec.event(Level.WARNING, Reason.RESCHEDULE_DOWNGRADED,
                           f"{t.rung.value} not possible for {node}: {t.why} "
                           f"({t.result.value}); {then}", node=node, attempt=attempt)
        placement: list[str] | None = list(d.placement)
        fault_at, detected, stopped = times
        if d.action == Action.GIVE_UP:  # out of every budget: the last rung tried says why
            d = replace(d, reason=f"{node}: {d.tried[-1].why}" if d.tried else d.reason)

        def fault(reason: str) -> Fault:
            return Fault(crash.scenario if crash else FaultScenario.NODE_FAULT, reason,
                         f"node {node}: {reason}", f"node/{node}", fault_at, detected, stopped,
                         report.progress, crash.category if crash else None)

        # decided now, whatever the wait: `recovery` shows the rung recovering while it
        # queues (the downgrade before it too), and its budget is spent once placed
        self.rec.book.record(attempt, d, fault(d.reason))
        queued_at = time.monotonic()
        if d.action == Action.RESCHEDULE and d.missing:
            self.rec.set_meta(**_unspent(d).to_meta())  # status says so while it queues
            placement = self._wait_for_nodes(d, attempt)
            if placement is not None:
                self.rec.set_meta(**d.history.to_meta())
        if placement is None and self.stop_requested():  # stopped while it queued: the
            h = _unspent(d)  # user ended it, no timeout did (walk-through 26)
            d = replace(d, action=Action.GIVE_UP, result=RecoverResult.TERMINATED, history=h,
                        exit_code=ExitCode.FAILED, reason=(
                            f"{node} is out; stopped after waiting "
                            f"{time.monotonic() - queued_at:.0f}s for a healthy node"))
            self.rec.book.recovery_failed(fault(d.reason), RecoverResult.TERMINATED)
        elif placement is None:  # nothing was rescheduled: its budget is not spent
            h = _unspent(d)
            d = replace(d, action=Action.GIVE_UP, result=RecoverResult.FAILED, history=h,
                        exit_code=ExitCode.FAILED, reason=(
                            f"{node} is out and not enough healthy nodes are left for "
                            f"{self.fleet.nnodes} (waited {self.rec.spec.queue_timeout_s:g}s "
                            "for one)"))
            self.rec.book.recovery_failed(fault(d.reason))
        elif d.action != Action.GIVE_UP:
            self.fleet.place(list(placement), d.moved_slots)
            pol, h = self.rec.spec, d.history
            pod = d.rung == Rung.POD_RESCHEDULE
            used, budget = ((h.pod_used, pol.max_pod_reschedules) if pod
                            else (h.job_used, pol.max_job_reschedules))
            self.rec.event(Level.WARNING,
                           Reason.POD_RESCHEDULED if pod else Reason.JOB_RESCHEDULED,
                           f"{d.reason} ({d.rung.value if d.rung else '-'} {used}/{budget}); "
                           f"placement: {placement_text(placement, self._lost_nodes())}",
                           node=node, attempt=attempt, data={
                               "rung": d.rung.value if d.rung else None, "used": used,
                               "budget": budget, "placement": list(placement),
                               "moved_slots": list(d.moved_slots)})
        return d

    def _lost_nodes(self) -> set[str]:
        """Every node marked lost (a lost node is never placed again)."""
        return {n for n, node in self.fleet.nodes.items() if node.state == NodeState.LOST}

    def _wait_for_nodes(self, d: Decision, attempt: int) -> list[str] | None:
        """Enough ready nodes for the decision: its healthy ones first, then spares."""
        def fill() -> tuple[list[str] | None, int]:
            placed = [n for n in d.placement if self.fleet.ready(n)]
            pool = placed + [s for s in self.fleet.spares() if s not in placed]
            need = self.fleet.nnodes
            return (pool[:need], 0) if len(pool) >= need else (None, need - len(pool))

        return self._queue(attempt, fill)

    def _queue(self, attempt: int,
               fill: Callable[[], tuple[list[str] | None, int]]) -> list[str] | None:
        """Queuing: `fill` gives the placement, or how many nodes are missing; wait for
        them up to the queue timeout (a signal ends the wait). None: still missing."""
        timeout = self.rec.spec.queue_timeout_s
        deadline = time.monotonic() + timeout
        announced = False
        while True:
            placement, missing = fill()
            if placement is not None:
                return placement
            if not announced:
                announced = True
                self.rec.set_meta(state=JobState.QUEUING.value)
                self.rec.event(Level.WARNING, Reason.QUEUING,
                               f"waiting up to {timeout:g}s for {missing} more healthy "
                               f"node(s): the job needs {self.fleet.nnodes}", attempt=attempt)
            if time.monotonic() > deadline or self.stop_requested():
                return None
            time.sleep(0.5)


def _unspent(d: Decision) -> History:
    """The decision's history without its own reschedule (not placed: not spent)."""
    h = d.history
    return (replace(h, pod_used=max(0, h.pod_used - 1)) if d.rung == Rung.POD_RESCHEDULE
            else replace(h, job_used=max(0, h.job_used - 1)))


def placement_text(placement: list[str], lost: set[str]) -> str:
    """A reschedule's placement as its event says it: a slot still on a node lost in the same
    round is marked (walk-through 36 #10: two nodes lost at once, the first one's
    PodRescheduled placed rank 1 on the second as if it were fine); the next decision moves
    it, or gives up (review 41 #4: not promised here)."""
    return ", ".join(f"{i}:{n}" + (" (lost too)" if n in lost else "")
                     for i, n in enumerate(placement))
