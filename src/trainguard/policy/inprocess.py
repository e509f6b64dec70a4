"""Rung 1a, in-process restart: a process restart the ladder decided, done in place. Pure.

When a rank's process dies, or a hang has one culprit, and every other rank runs its
training function in trainguard.run_resilient: only that rank is killed and started again,
and the others re-enter their function in their own processes (no interpreter start, no
imports). It spends what the process restart would (the restart budget after a crash, the
suspension budget after a hang) and waits no backoff: the survivors wait for it.

Also after GROUP_FAILED (every rank's group broke, every process lives): no rank is
replaced, every rank re-enters. Downgrades to the process restart (rung 1b), recorded with
why, when: no single rank can be named to replace (a hang with no culprit), no rank
survived, or the last in-process restart made no progress (a restart in place that fails
again is not tried twice in a row).
"""

from __future__ import annotations

from dataclasses import replace

from trainguard.policy.decision import (
    Action,
    Decision,
    Incident,
    IncidentKind,
    Rung,
    Tried,
)
from trainguard.records import RecoverResult, rank_list


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
