"""Node-level recovery: which rung of the ladder answers a faulty or lost node. Pure.

The ladder (ARCHITECTURE.md, "The policy ladder"), finest first:
  process restart in place (policy.decide) -> pod-level rescheduling (replace only the
  faulty node with a spare; healthy nodes restart their processes in place) -> isolated
  job-level rescheduling (isolate the node, re-place every rank on healthy + spare nodes).
Each rung has its own budget. A rung that cannot act (no spare) says `downgrade`, one out
of budget says `quotaExceeded`, and the next rung is tried; the controller writes one
recover record per rung tried.

When a node is *lost* (agent gone, silent, its step ended) the first rung is pod-level: the
node is replaced. When a node is *implicated* (diagnosis says isolate, pre-check failed, a
repeat offender) the answer is isolated job-level rescheduling.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import Enum

from trainguard.records import RecoverResult


class Rung(str, Enum):
    PROCESS_RESTART = "process_restart"
    POD_RESCHEDULE = "pod_reschedule"
    JOB_RESCHEDULE = "job_reschedule_with_taint"


class Trigger(str, Enum):
    LOST = "lost"  # the node's agent is gone
    FAULTY = "faulty"  # the node is implicated: diagnosis, pre-check, repeat offender


@dataclass(frozen=True)
class LadderPolicy:
    max_pod_reschedules: int = 3
    max_job_reschedules: int = 3
    repeat_offender_count: int = 3  # implicated this many times in the window: isolated
    repeat_window_s: float = 3600.0


@dataclass(frozen=True)
class LadderHistory:
    pod_used: int = 0
    job_used: int = 0
    implicated: tuple[tuple[str, float], ...] = ()  # (node, time in s) per implication


@dataclass(frozen=True)
class Tried:
    """A rung that could not act: why, and what its record says."""

    rung: Rung
    result: RecoverResult
    why: str


@dataclass(frozen=True)
class NodePlan:
    rung: Rung | None  # None: give up
    node: str  # the faulty or lost node
    placement: tuple[str, ...]  # the new slot -> node list (all slots filled when not waiting)
    moved_slots: tuple[int, ...]  # slots whose ranks land on another node
    tried: tuple[Tried, ...]
    reason: str
    history: LadderHistory
    missing: int = 0  # job-level without enough nodes: how many are missing (wait, then fail)
    result: RecoverResult = RecoverResult.RECOVERING


def implicate(hist: LadderHistory, node: str, now_s: float,
              pol: LadderPolicy) -> tuple[LadderHistory, int]:
    """Count one implication of `node`; how many it has within the window (itself included)."""
    recent = tuple((n, t) for n, t in hist.implicated if now_s - t <= pol.repeat_window_s)
    recent += ((node, now_s),)
    return replace(hist, implicated=recent), sum(1 for n, _ in recent if n == node)


def is_repeat_offender(count: int, pol: LadderPolicy) -> bool:
    return pol.repeat_offender_count > 0 and count >= pol.repeat_offender_count


def plan(trigger: Trigger, node: str, why: str, placement: tuple[str, ...],
         spares: tuple[str, ...], hist: LadderHistory, pol: LadderPolicy) -> NodePlan:
    """The rung that answers `node` being lost or faulty, given the current placement
    (slot -> node) and the spare nodes ready now (connected, healthy, not placed)."""
    tried: list[Tried] = []
    if trigger == Trigger.LOST:
        pod = _pod(node, why, placement, spares, hist, pol)
        if isinstance(pod, NodePlan):
            return pod
        tried.append(pod)
    return _job(node, why, placement, spares, hist, pol, tuple(tried))


def _pod(node: str, why: str, placement: tuple[str, ...], spares: tuple[str, ...],
         hist: LadderHistory, pol: LadderPolicy) -> NodePlan | Tried:
    if hist.pod_used >= pol.max_pod_reschedules:
        return Tried(Rung.POD_RESCHEDULE, RecoverResult.QUOTA_EXCEEDED,
                     f"pod-level rescheduling budget spent ({pol.max_pod_reschedules})")
    if not spares:
        return Tried(Rung.POD_RESCHEDULE, RecoverResult.DOWNGRADE,
                     "no spare node to replace it with")
    slots = tuple(i for i, n in enumerate(placement) if n == node)
    new = list(placement)
    for s in slots:
        new[s] = spares[0]
    return NodePlan(Rung.POD_RESCHEDULE, node, tuple(new), slots, (),
                    f"{node} {why}: its ranks move to spare {spares[0]}; the other nodes "
                    "restart their processes in place",
                    replace(hist, pod_used=hist.pod_used + 1))


def _job(node: str, why: str, placement: tuple[str, ...], spares: tuple[str, ...],
         hist: LadderHistory, pol: LadderPolicy, tried: tuple[Tried, ...]) -> NodePlan:
    if hist.job_used >= pol.max_job_reschedules:
        last = Tried(Rung.JOB_RESCHEDULE, RecoverResult.QUOTA_EXCEEDED,
                     f"isolated job-level rescheduling budget spent ({pol.max_job_reschedules})")
        return NodePlan(None, node, placement, (), (*tried, last),
                        f"{node} {why}; {last.why}", hist, result=RecoverResult.QUOTA_EXCEEDED)
    pool = [n for n in placement if n != node] + [s for s in spares if s not in placement]
    need = len(placement)
    new = tuple(pool[:need])
    missing = max(need - len(new), 0)
    return NodePlan(Rung.JOB_RESCHEDULE, node, new, tuple(range(need)), tried,
                    f"{node} {why}: isolated; every rank is placed again on "
                    f"{', '.join(new) or 'no node'}"
                    + (f" ({missing} node(s) missing: waiting)" if missing else ""),
                    replace(hist, job_used=hist.job_used + 1), missing=missing)
