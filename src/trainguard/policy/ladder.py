"""The recovery ladder: one pure decide() for every incident. The controller only carries
the Decision out (controller/loop.py, controller/nodes.py).

| incident        | rung tried first                  | then                             |
|-----------------|-----------------------------------|----------------------------------|
| CRASH           | 3 if the culprit's node is to     | 1a: in-process restart (the dead |
|                 |   blame (isolate / repeat offender)|   rank only; run_resilient), else|
|                 |                                   |   1b: process restart (restart   |
|                 |                                   |   policy) or give up             |
| HANG            | 1a/1b: restart upon suspension    | give up (HangRestartLimitReached)|
| NODE_LOST       | 2: pod-level (a spare takes over) | 3: job-level, else give up       |
| PRECHECK_FAILED | isolate, spares take the slots    | give up when none come (queuing) |
|                 |   (one check failing everywhere:  |                                  |
|                 |   give up at once, exit 2)        |                                  |
| STEP_FAILED     | 0: re-form the group, re-run step | downgrade: the ranks raise, then |
|                 |   (--operator-reexecution)        |   their exit is a CRASH (rung 1) |
| GROUP_FAILED    | 1a: every rank re-enters in place | the ranks raise: their exit is a |
|                 |   (run_resilient, restart budget; |   CRASH (rung 1b)                |
|                 |   a blocked rank is replaced)     |                                  |

docs/architecture.md has the full table (triggers, budgets, downgrade targets, records).
"""

from __future__ import annotations

from dataclasses import replace

from trainguard.policy import inprocess, nodes, process, step
from trainguard.policy.decision import (
    Decision,
    HAPolicy,
    History,
    Incident,
    IncidentKind,
    Isolation,
)


def decide(incident: Incident, hist: History, pol: HAPolicy) -> Decision:
    """What follows `incident`, given what the ladder remembers and its budgets."""
    if incident.kind == IncidentKind.HANG:
        return inprocess.in_place(process.after_hang(incident.made_progress, hist, pol),
                                  incident)
    if incident.kind == IncidentKind.NODE_LOST:
        return nodes.after_node_trouble(True, incident.node or "?", f"was lost ({incident.why})",
                                        incident.placement, incident.spares, hist, pol)
    if incident.kind == IncidentKind.GROUP_FAILED:
        return inprocess.in_place(process.after_group_failure(
            incident.made_progress, hist, pol.restart), incident)
    if incident.kind == IncidentKind.STEP_FAILED:
        return step.after_step_failure(incident.step or 0, hist, pol, incident.ended_ranks,
                                       incident.stale_group, incident.silent_ranks)
    if incident.kind == IncidentKind.PRECHECK_FAILED:
        return nodes.after_precheck(incident.failing, incident.checked, incident.placement,
                                    hist)
    diag = incident.diagnosis
    if diag is None:
        raise ValueError("a CRASH incident needs its diagnosis")
    node = incident.node
    if node is None or node not in incident.placement or not nodes.blames_node(diag):
        return inprocess.in_place(
            process.after_crash(diag, incident.made_progress, hist, pol.restart), incident)
    hist, count = nodes.implicate(hist, node, incident.now_s, pol)
    why = nodes.why_isolated(diag, count, pol)
    if why is None:  # implicated, not (yet) isolated: the processes restart in place
        return replace(process.after_crash(diag, incident.made_progress, hist, pol.restart),
                       node=node)
    return nodes.after_node_trouble(False, node, f"is faulty ({why})", incident.placement,
                                    incident.spares, hist, pol, isolate=(Isolation(node, why),))
