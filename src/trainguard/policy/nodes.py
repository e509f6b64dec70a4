"""Rungs 2 and 3, node-level recovery: which rung answers a lost or faulty node, and when a
node is to blame at all. Pure.

When a node is *lost* (agent gone, silent, its step ended) the first rung is pod-level
rescheduling: its ranks move to a spare, the other nodes restart their processes in place.
When a node is *implicated* (the diagnosis says isolate it, or it is a repeat offender) the
answer is isolated job-level rescheduling: the node is isolated and every rank is placed
again on healthy + spare nodes. Each rung has its own budget; a rung that cannot act (no
spare) is tried with `downgrade`, one out of budget with `quotaExceeded`, and the next rung
answers. A pre-check failure isolates the failing nodes (drained only when the check did not
fail everywhere: a full shared file system is no node's fault) and gives their slots to spares;
the same check failing on every node fails the job at once (no node can pass it).
"""

from __future__ import annotations

from dataclasses import replace

from trainguard.diagnosis.taxonomy import Diagnosis, FaultDomain
from trainguard.exitcodes import ExitCode
from trainguard.policy.decision import (
    Action,
    Decision,
    HAPolicy,
    History,
    Isolation,
    Rung,
    Tried,
)
from trainguard.policy.precheck import PrecheckReport, everywhere_fix, failed_everywhere
from trainguard.records import RecoverResult, StartType
from trainguard.states import AGENT_TERMINATED, NOT_THE_NODE


def implicate(hist: History, node: str, now_s: float, pol: HAPolicy) -> tuple[History, int]:
    """Count one implication of `node`; how many it has within the window (itself included)."""
    recent = tuple((n, t) for n, t in hist.implicated if now_s - t <= pol.repeat_window_s)
    recent += ((node, now_s),)
    return replace(hist, implicated=recent), sum(1 for n, _ in recent if n == node)


def recent_implications(hist: History, now_s: float, pol: HAPolicy) -> dict[str, int]:
    """node -> its implications within the window: what the next one is counted with."""
    out: dict[str, int] = {}
    for n, t in hist.implicated:
        if now_s - t <= pol.repeat_window_s:
            out[n] = out.get(n, 0) + 1
    return out


def is_repeat_offender(count: int, pol: HAPolicy) -> bool:
    return pol.repeat_offender_count > 0 and count >= pol.repeat_offender_count


def blames_node(diag: Diagnosis) -> bool:
    """Whether a failure implicates the node it ran on: a bug in the user's code or the
    framework follows the rank wherever it runs, unless the diagnosis says isolate."""
    return diag.isolate_node or diag.fault_domain not in (FaultDomain.USER_CODE,
                                                          FaultDomain.FRAMEWORK)


def why_isolated(diag: Diagnosis, count: int, pol: HAPolicy) -> str | None:
    """Why an implicated node is isolated now; None: it is not (yet)."""
    if diag.isolate_node:
        return f"{diag.category.value}: {diag.summary.rstrip('.')}"
    if is_repeat_offender(count, pol):
        return (f"a repeat offender: implicated {count} times within "
                f"{pol.repeat_window_s / 3600:g} h (last: {diag.category.value})")
    return None


def lost_isolation(node: str, why: str, full_disruption: bool = False) -> Isolation:
    """A lost agent implicates its node: it is drained (the reconnect grace, spent before a
    node counts as lost, keeps a network blip from doing it), unless every node's link
    went down at once (then the controller's side is as likely to blame, and no node is) or
    the cluster ended the agent's step on purpose (NOT_THE_NODE: a requeue, a time limit)."""
    return Isolation(node, f"lost ({why})", drain=not full_disruption
                     and NOT_THE_NODE not in why and AGENT_TERMINATED not in why)


def after_precheck(failing: tuple[PrecheckReport, ...], checked: int,
                   placement: tuple[str, ...], hist: History) -> Decision:
    """Isolate the nodes that failed the pre-check; the placed ones are replaced by spares.
    A check that failed on every node is the job's (a setting, or the environment every
    node shares): no node can take their place, so the job fails at once (walk-through 36
    #6: it queued for the whole queue timeout)."""
    common = failed_everywhere(failing, checked)
    if common:
        what = "; ".join(f"{c.name}: {' '.join(c.detail.split())}" for c in common)
        fix = "; ".join(everywhere_fix(c) for c in common)
        return Decision(Action.GIVE_UP, (
            f"every node checked ({', '.join(r.node for r in failing)}) failed the same "
            f"pre-check, {what}: a setting of the job or of every node's environment, not a "
            f"node's fault, so no spare can pass it either. Fix: {fix}"), hist,
            result=RecoverResult.FAILED, exit_code=ExitCode.USAGE)
    own = len(failing) < checked  # a check failing everywhere is not one node's fault
    isolations = tuple(Isolation(r.node, f"pre-check failed: {r.summary()}", drain=own)
                       for r in failing)
    out = [r.node for r in failing if r.node in placement]
    return Decision(Action.REPLACE, f"{', '.join(out) or 'no placed node'} failed the pre-check",
                    hist, isolate=isolations, node=out[0] if out else None,
                    missing=len(out))


def after_node_trouble(lost: bool, node: str, why: str, placement: tuple[str, ...],
                       spares: tuple[str, ...], hist: History, pol: HAPolicy,
                       isolate: tuple[Isolation, ...] = ()) -> Decision:
    """The rung that answers `node` being lost (pod-level first) or faulty (job-level),
    given the placement (slot -> node) and the spare nodes ready now."""
    tried: list[Tried] = []
    if lost:
        pod = _pod(node, why, placement, spares, hist, pol, isolate)
        if isinstance(pod, Decision):
            return pod
        tried.append(pod)
    return _job(node, why, placement, spares, hist, pol, tuple(tried), isolate)


def _pod(node: str, why: str, placement: tuple[str, ...], spares: tuple[str, ...],
         hist: History, pol: HAPolicy, isolate: tuple[Isolation, ...]) -> Decision | Tried:
    if hist.pod_used >= pol.max_pod_reschedules:
        return Tried(Rung.POD_RESCHEDULE, RecoverResult.QUOTA_EXCEEDED,
                     f"pod-level rescheduling budget spent ({pol.max_pod_reschedules}, "
                     "--max-pod-reschedules)")
    if not spares:
        return Tried(Rung.POD_RESCHEDULE, RecoverResult.DOWNGRADE,
                     "no spare node to replace it with")
    slots = tuple(i for i, n in enumerate(placement) if n == node)
    new = list(placement)
    for s in slots:
        new[s] = spares[0]
    return Decision(Action.RESCHEDULE,
                    f"{node} {why}: its ranks move to spare {spares[0]}; the other nodes "
                    "restart their processes in place",
                    replace(hist, pod_used=hist.pod_used + 1), rung=Rung.POD_RESCHEDULE,
                    start_type=StartType.POD_RESCHEDULE, isolate=isolate, node=node,
                    placement=tuple(new), moved_slots=slots)


def _job(node: str, why: str, placement: tuple[str, ...], spares: tuple[str, ...],
         hist: History, pol: HAPolicy, tried: tuple[Tried, ...],
         isolate: tuple[Isolation, ...]) -> Decision:
    if hist.job_used >= pol.max_job_reschedules:
        last = Tried(Rung.JOB_RESCHEDULE, RecoverResult.QUOTA_EXCEEDED,
                     f"isolated job-level rescheduling budget spent ({pol.max_job_reschedules}, "
                     "--max-job-reschedules; the job's reschedules are counted across "
                     "relaunches of its job dir)")
        return Decision(Action.GIVE_UP, f"{node} {why}; {last.why}", hist, tried=(*tried, last),
                        isolate=isolate, node=node, placement=placement,
                        result=RecoverResult.QUOTA_EXCEEDED, exit_code=ExitCode.FAILED)
    pool = [n for n in placement if n != node] + [s for s in spares if s not in placement]
    need = len(placement)
    new = tuple(pool[:need])
    missing = max(need - len(new), 0)
    return Decision(Action.RESCHEDULE,
                    f"{node} {why}: isolated; every rank is placed again on "
                    f"{', '.join(new) or 'no node'}"
                    + (f" ({missing} node(s) missing: waiting)" if missing else ""),
                    replace(hist, job_used=hist.job_used + 1), rung=Rung.JOB_RESCHEDULE,
                    start_type=StartType.JOB_RESCHEDULE, tried=tried, isolate=isolate,
                    node=node, placement=new, moved_slots=tuple(range(need)), missing=missing)
