"""Ranks stopped from outside the launcher (a SIGTERM to their node agent: a person's kill,
the cluster ending the node's job step, the node shutting down; node/term.py) while their
peers trained: the peers fail next in a collective that waits for them (gloo's `Connection
closed by peer`, NCCL's remote peer gone), which read as the network's fault (the one-agent
SIGTERM test: `nccl_communication_error` on rank 1 of node-0, node-1's stop unnamed). So when
the verdict is such a symptom and a rank ended `stopped` on SIGTERM before the first rank that
failed (the launcher stops the others only after it), the verdict is that stop. Pure."""

from __future__ import annotations

import signal
from collections.abc import Sequence
from dataclasses import replace

from trainguard.diagnosis.candidates import RankExit, signal_of
from trainguard.diagnosis.early_exit import PEER_SYMPTOMS
from trainguard.diagnosis.taxonomy import Category, Culprit, Diagnosis, FaultDomain, RestartHelps

SUBCATEGORY = "stopped_from_outside"
ADVICE = ("Something outside trainguard sent SIGTERM to a node's agent and ranks (a person's "
          "kill, the cluster ending the node's job step: scancel, a time limit, a preemption; "
          "the node shutting down); the node agent's log says when it got it. A restart "
          "resumes from the last checkpoint; if the node is going away, give the job a spare "
          "(--spare-nodes).")


def stopped_first(d: Diagnosis | None, exits: Sequence[RankExit]) -> Diagnosis | None:
    """`d`, or the outside stop of ranks that ended on SIGTERM, not failed, before the first
    failed rank when `d` is what their peers print about them."""
    if d is None or d.category not in PEER_SYMPTOMS:
        return d
    failed = [e.ended_at for e in exits if e.failed and e.ended_at is not None]
    stopped = sorted((e for e in exits if not e.failed and e.ended_at is not None and failed
                      and signal_of(e.returncode) == signal.SIGTERM
                      and e.ended_at < min(failed)), key=lambda e: (e.ended_at, e.rank))
    if not stopped:
        return d
    first = stopped[0]
    nodes = sorted({e.node for e in stopped if e.node})
    on = f" (node {', '.join(nodes)})" if nodes else ""
    left = sorted({e.rank for e in exits if e.failed})
    return replace(
        d, category=Category.KILLED_BY_SIGNAL_UNKNOWN, fault_domain=FaultDomain.INFRASTRUCTURE,
        restart_helps=RestartHelps.YES, subcategory=SUBCATEGORY,
        summary=(f"rank(s) {', '.join(str(e.rank) for e in stopped)}{on} were stopped by a "
                 f"SIGTERM from outside the launcher before rank(s) "
                 f"{', '.join(map(str, left))}, which then failed in a collective that waited "
                 f"for them ({d.summary.rstrip('.')})"),
        advice=ADVICE, culprit=Culprit(first.rank, first.node), isolate_node=False,
        confidence=min(d.confidence, 0.8), rule=None)
