"""Rung 1a, in-process restart: a process restart the ladder decided, done in place. Pure.

When a rank's process dies, or a hang has one culprit, and every other rank runs its
training function in trainguard.run_resilient: only that rank is killed and started again,
and the others re-enter their function in their own processes (no interpreter start, no
imports). It spends what the process restart would (the restart budget after a crash, the
suspension budget after a hang) and waits no backoff: the survivors wait for it.

Also after GROUP_FAILED (every rank's group broke, every process lives): every rank that
waits re-enters, and only a rank blocked in the broken collective (it made no step since,
judge_waiting) is replaced. Downgrades to the process restart (rung 1b), recorded with
why, when: no single rank can be named to replace (a hang with no culprit), no rank
survived, or the last in-process restart made no progress (a restart in place that fails
again is not tried twice in a row).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, replace

from trainguard.policy.decision import (
    Action,
    Decision,
    Incident,
    IncidentKind,
    Rung,
    Tried,
)
from trainguard.records import RecoverResult, rank_list
from trainguard.states import WorkerState

REFUSE_AFTER_S = 5.0  # a waiting rank, while another ran on, is told NO_RESTART after this
# a rank that neither waits nor made a step of its own since the first waiting report, after
# this long, is blocked in the broken collective: gloo wakes it only when a peer's socket closes
# (review 35 #7: with 4 ranks, rank 3 waited on a live peer that was itself waiting)
BLOCKED_AFTER_S = 1.0


@dataclass(frozen=True)
class GroupVerdict:
    """What the ranks waiting for a restart in place add up to (judge_waiting): nothing yet
    (the default); `broken`: every rank's group broke, and `blocked` names those stuck in the
    broken collective, to start again; or `refuse`: these waiting ranks are told
    NO_RESTART, with `reason`."""

    broken: bool = False
    blocked: tuple[int, ...] = ()
    refuse: tuple[int, ...] = ()
    reason: str = ""


def judge_waiting(states: Mapping[int, WorkerState], waiting: Mapping[int, float],
                  steps: Mapping[int, int | None], leaving: Collection[int],
                  now: float, before: Mapping[int, int | None]) -> GroupVerdict:
    """`states`: every rank's; `waiting`: the waiting ranks, each with when (monotonic) its
    report came; `steps`: each rank's last step seen; `before`: each rank's last step seen
    when the first waiting report came; `leaving`: ranks told NO_RESTART that still run. A
    rank that does not wait and made no step of its own since the first report is blocked in
    the broken collective, not running on. Each rank is judged against itself: ranks' step
    sources differ (step lines on rank 0 only; review 37 #1)."""
    if not waiting or WorkerState.FAILED in states.values():
        return GroupVerdict()  # a death: the controller decides about it now
    done = [r for r, s in states.items() if s == WorkerState.SUCCEEDED]
    if done:  # (walk-through 34 #11: the survivor waited --in-process-timeout, 60 s)
        return GroupVerdict(refuse=tuple(sorted(waiting)), reason=(
            f"rank(s) {rank_list(done)} ended the script (exit 0): the job is ending, "
            "nothing to restart in place"))
    if any(s.ended for s in states.values()):
        return GroupVerdict()
    others = sorted(r for r in states if r not in waiting and r not in leaving)
    ran_on = {r: (before.get(r), s) for r in others if (s := steps.get(r)) is not None
              and ((b := before.get(r)) is None or s > b)}
    if not ran_on and not leaving:
        if not others:
            return GroupVerdict(broken=True)
        if now - min(waiting.values()) >= BLOCKED_AFTER_S:
            return GroupVerdict(broken=True, blocked=tuple(others))
        return GroupVerdict()
    seen = []
    if ran_on:
        seen.append(f"rank(s) {rank_list(sorted(ran_on))} ran on since the group failed ("
                    + ", ".join(f"rank {r}: step {'none' if b is None else b} -> {s}"
                                for r, (b, s) in sorted(ran_on.items())) + ")")
    if leaving:
        seen.append(f"rank(s) {rank_list(sorted(leaving))}, told no restart, are ending")
    due = tuple(sorted(r for r, since in waiting.items() if now - since >= REFUSE_AFTER_S))
    return GroupVerdict(refuse=due, reason=(
        f"no rank's process ended within {REFUSE_AFTER_S:g}s of the failure and "
        f"{'; '.join(seen)}: nothing to restart in place")) if due else GroupVerdict()


def in_place(d: Decision, incident: Incident) -> Decision:
    """`d` (decided for `incident`), carried out in-process where it can be."""
    case = incident.in_process
    if d.action != Action.RESTART or d.rung != Rung.PROCESS_RESTART or case is None:
        return d
    h = replace(d.history, in_process_in_a_row=0) if incident.made_progress else d.history
    why = None
    if incident.kind == IncidentKind.HANG and not case.ranks:
        why = "no single rank to replace (the hang has no one culprit)"
    elif not case.survivors:
        why = "no rank survived to restart in place"
    elif h.in_process_in_a_row >= 1:
        why = ("the last in-process restart made no new progress (no step beyond the "
               "furthest before it)")
    if why is not None:
        return replace(d, history=replace(h, in_process_in_a_row=0),
                       tried=(*d.tried, Tried(Rung.IN_PROCESS_RESTART, RecoverResult.DOWNGRADE,
                                              why)),
                       reason=f"{d.reason}; as processes: {why}")
    who = "no process starts again" if not case.ranks else (
        f"only {_rank_words(case.ranks)} start{'s' if len(case.ranks) == 1 else ''} again")
    return replace(d, action=Action.RESTART_RANKS, rung=Rung.IN_PROCESS_RESTART,
                   history=replace(h, in_process_in_a_row=h.in_process_in_a_row + 1),
                   ranks=case.ranks, delay_s=0.0,
                   reason=f"{d.reason}, in-process: {who}; {_rank_words(case.survivors)} "
                          f"{'re-enters its' if len(case.survivors) == 1 else 're-enter their'}"
                          " training function in place")


def _rank_words(ranks: tuple[int, ...] | list[int]) -> str:
    """`rank 0`, `ranks 0-2,5`, or `no other rank`."""
    if not ranks:
        return "no other rank"
    return f"rank {rank_list(ranks)}" if len(ranks) == 1 else f"ranks {rank_list(ranks)}"
