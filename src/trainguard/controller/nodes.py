"""Node-level recovery for the controller: pre-check, lost nodes, implicated nodes, queuing.

The decisions are ladder.plan's (pure); this module carries them out on the fleet and
writes them down: NodeLost / NodeIsolated / PodRescheduled / JobRescheduled /
RescheduleDowngraded / Queuing / Precheck* events and one recover record per rung tried.
A method returns the next attempt's start type, or a sentence saying why the job fails.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections.abc import Callable
from datetime import datetime

from trainguard.controller.fleet import ISOLATED, LOST, Fleet
from trainguard.controller.incidents import fault_scenario
from trainguard.controller.recorder import Recorder
from trainguard.diagnosis.taxonomy import Diagnosis, FaultDomain
from trainguard.policy.nodes import (
    LadderHistory,
    LadderPolicy,
    NodePlan,
    Rung,
    Trigger,
    implicate,
    is_repeat_offender,
    plan,
)
from trainguard.policy.precheck import PrecheckConfig, PrecheckReport
from trainguard.protocol import OP_PRECHECK, NodeReport, StopWorkers
from trainguard.records import FaultScenario, Level, Reason, RecoverResult, StartType, utcnow

PRECHECK_TIMEOUT_S = 300.0


class NodeRecovery:
    def __init__(self, rec: Recorder, fleet: Fleet) -> None:
        self.rec, self.fleet = rec, fleet
        s = rec.spec
        self.policy = LadderPolicy(max_pod_reschedules=s.max_pod_reschedules,
                                   max_job_reschedules=s.max_job_reschedules,
                                   repeat_offender_count=s.repeat_offender)
        meta = rec.store.meta()
        implicated: tuple[tuple[str, float], ...] = ()
        with contextlib.suppress(TypeError, ValueError):  # [[node, unix time], ...]
            seen = json.loads(meta.get("implicated") or "[]")
            implicated = tuple((str(n), float(t)) for n, t in seen)
        self.hist = LadderHistory(implicated=implicated,
                                  pod_used=int(meta.get("pod_reschedules_used") or 0),
                                  job_used=int(meta.get("job_reschedules_used") or 0))
        # the controller's: a signal ends a wait for nodes at once (Slurm's time limit sends
        # SIGTERM, then SIGKILL after KillWait)
        self.stop_requested: Callable[[], bool] = lambda: False

    def _stop(self, reason: str) -> NodeReport:
        """Stop the workers left on the placed nodes (they restart in the next attempt)."""
        report = self.fleet.stop_workers(StopWorkers(grace_s=self.rec.spec.grace_period_s,
                                                     reason=reason))
        self.rec.sync(report, force=True)
        return report

    # -- before an attempt ----------------------------------------------------------------

    def prepare(self, attempt: int) -> str | None:
        """Pre-check the placed nodes and the spares; a failing one is isolated and a placed
        one replaced by a spare. None when the placement is ready, else why the job cannot start."""
        if not self.rec.spec.precheck:
            return None
        # the spares too: a broken one is found before it is needed, and their import
        # checks are cached for the restart that needs them
        names = [*self.fleet.placement, *self.fleet.spares()]
        reports = self.precheck(names, attempt)
        failing = {n: r for n, r in reports.items() if not r.ok}
        # drained in the cluster only when it is this node's own fault: a check that fails
        # everywhere (a full shared file system, a broken shared venv) is not the node's
        node_own = len(failing) < len(reports)
        for name, report in failing.items():
            self.isolate(name, f"pre-check failed: {report.summary()}", attempt,
                         drain=node_own)
        if not any(n in failing for n in self.fleet.placement):
            return None
        placement = self._refill(attempt)
        if placement is None:
            return (f"not enough healthy nodes: {', '.join(failing)} failed the pre-check and "
                    f"no spare took their place within {self.rec.spec.queue_timeout_s:g}s")
        moved = tuple(i for i, (a, b) in enumerate(zip(self.fleet.placement, placement,
                                                       strict=True)) if a != b)
        self.fleet.place(list(placement), moved)
        return None

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
        replies = self.fleet.hub.call({n: (OP_PRECHECK, cfg.model_dump(mode="json"))
                                       for n in live}, PRECHECK_TIMEOUT_S, s.reconnect_grace_s)
        out: dict[str, PrecheckReport] = {}
        for name, r in replies.items():
            if r.ok:
                report = PrecheckReport.model_validate(r.body)
            else:  # no answer (silent, gone, or the check itself broke): not a usable node
                report = PrecheckReport.model_validate({
                    "node": name, "host": "", "at": utcnow(), "checks": [{
                        "name": "agent", "ok": False, "detail": f"no pre-check answer: "
                        f"{r.error}", "fix": f"read {self.rec.paths.job_dir}/cluster/"
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

    def after_loss(self, attempt: int, lost: dict[str, str]) -> StartType | str:
        detected = utcnow()
        for name, why in lost.items():  # a lost agent implicates its node: isolated too
            what = self.fleet.backend.isolate(name, f"trainguard: lost ({why})")
            self.rec.event(Level.WARNING, Reason.NODE_LOST,
                           f"node {name} was lost: {why}; {what}", node=name, attempt=attempt)
            self.fleet.mark(name, LOST, why)
        report = self._stop(f"node {', '.join(lost)} was lost")
        stopped = utcnow()
        start: StartType | str = StartType.AUTO_RESTART
        for name, why in lost.items():
            p = plan(Trigger.LOST, name, f"was lost ({why})", tuple(self.fleet.placement),
                     self.fleet.spares(), self.hist, self.policy)
            start = self._carry_out(p, attempt, report, detected, stopped)
            if isinstance(start, str):
                return start
        return start

    def after_failure(self, attempt: int, report: NodeReport, diag: Diagnosis,
                      times: tuple[datetime, datetime, datetime]) -> StartType | str | None:
        """`times`: the first failed worker's exit, the detection, the stop."""
        """An implicated node (the diagnosis says isolate it, or a repeat offender) is
        isolated and the job placed again; None: not a node matter (process restart)."""
        node = next((w.node for w in report.workers if w.rank == diag.culprit_rank and w.node),
                    None)
        if node is None or node not in self.fleet.placement:
            return None
        if diag.fault_domain in (FaultDomain.USER_CODE, FaultDomain.FRAMEWORK) and \
                not diag.isolate_node:
            return None  # a bug follows the rank wherever it runs: no node to blame
        self.hist, count = implicate(self.hist, node, time.time(), self.policy)
        self.rec.set_meta(implicated=json.dumps(self.hist.implicated))
        self.fleet.nodes[node].times_implicated += 1
        self.fleet.publish()
        if diag.isolate_node:
            why = f"{diag.category.value}: {diag.summary.rstrip('.')}"
        elif is_repeat_offender(count, self.policy):
            why = (f"a repeat offender: implicated {count} times within "
                   f"{self.policy.repeat_window_s / 3600:g} h (last: {diag.category.value})")
        else:
            return None
        self.isolate(node, why, attempt)
        p = plan(Trigger.FAULTY, node, f"is faulty ({why})", tuple(self.fleet.placement),
                 self.fleet.spares(), self.hist, self.policy)
        fault_at, detected, stopped = times
        return self._carry_out(p, attempt, report, detected, stopped, fault_at=fault_at,
                               category=diag.category.value, scenario=fault_scenario(diag))

    def isolate(self, node: str, why: str, attempt: int, drain: bool = True) -> None:
        """Keep `node` out of the job; `drain`: also out of the cluster (Slurm: DRAIN)."""
        what = (self.fleet.backend.isolate(node, f"trainguard: {why}"[:200]) if drain
                else "kept out of the job's placement (not drained: the same check failed "
                     "on every node)")
        self.fleet.mark(node, ISOLATED, why)
        self.rec.event(Level.WARNING, Reason.NODE_ISOLATED,
                       f"node {node} isolated: {why}; {what}", node=node, attempt=attempt)

    # -- carrying out a plan --------------------------------------------------------------

    def _carry_out(self, p: NodePlan, attempt: int, report: NodeReport, detected: datetime,
                   stopped: datetime, category: str | None = None,
                   scenario: FaultScenario = FaultScenario.NODE_FAULT,
                   fault_at: datetime | None = None) -> StartType | str:
        for t in p.tried:
            self.rec.event(Level.WARNING, Reason.RESCHEDULE_DOWNGRADED,
                           f"{t.rung.value} not possible for {p.node}: {t.why} "
                           f"({t.result.value}); trying the next level", node=p.node,
                           attempt=attempt)
        tried = [(t.rung.value, t.result, t.why) for t in p.tried]
        placement: list[str] | None = list(p.placement)
        if p.rung is not None and p.missing:
            placement = self._wait_for_nodes(p, attempt)
        if p.rung is None or placement is None:
            if p.rung is None:  # out of budget: the last rung tried is the last record
                recover, result, why = tried.pop()
                why = f"{p.node}: {why}"
            else:
                recover, result = p.rung.value, RecoverResult.FAILED
                why = (f"{p.node} is out and not enough healthy nodes are left for "
                       f"{self.fleet.nnodes} (waited {self.rec.spec.queue_timeout_s:g}s for "
                       "one)")
            self.rec.book.attempt_node_fault(
                attempt, node=p.node, reason=why, recover=recover, result=result, tried=tried,
                fault_at=fault_at or detected, detected=detected, stopped=stopped,
                progress=report.progress, category=category, scenario=scenario)
            return why
        self.hist = p.history
        self.rec.set_meta(pod_reschedules_used=self.hist.pod_used,
                          job_reschedules_used=self.hist.job_used)
        self.fleet.place(list(placement), p.moved_slots)
        pod = p.rung == Rung.POD_RESCHEDULE
        used, budget = ((self.hist.pod_used, self.policy.max_pod_reschedules) if pod
                        else (self.hist.job_used, self.policy.max_job_reschedules))
        self.rec.event(Level.WARNING, Reason.POD_RESCHEDULED if pod else Reason.JOB_RESCHEDULED,
                       f"{p.reason} ({p.rung.value} {used}/{budget}); placement: "
                       f"{', '.join(f'{i}:{n}' for i, n in enumerate(placement))}",
                       node=p.node, attempt=attempt)
        self.rec.book.attempt_node_fault(
            attempt, node=p.node, reason=p.reason, recover=p.rung.value,
            result=RecoverResult.RECOVERING, tried=tried, fault_at=fault_at or detected,
            detected=detected,
            stopped=stopped, progress=report.progress, category=category, scenario=scenario)
        return StartType.POD_RESCHEDULE if pod else StartType.JOB_RESCHEDULE

    def _wait_for_nodes(self, p: NodePlan, attempt: int) -> list[str] | None:
        """Enough ready nodes for the plan: its healthy ones first, then spares."""
        def fill() -> tuple[list[str] | None, int]:
            placed = [n for n in p.placement if self.fleet.ready(n)]
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
                self.rec.set_meta(state="queuing")
                self.rec.event(Level.WARNING, Reason.QUEUING,
                               f"waiting up to {timeout:g}s for {missing} more healthy "
                               f"node(s): the job needs {self.fleet.nnodes}", attempt=attempt)
            if time.monotonic() > deadline or self.stop_requested():
                return None
            time.sleep(0.5)
