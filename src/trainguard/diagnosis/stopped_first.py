"""Ranks stopped from outside the launcher (a SIGTERM to their node agent: a person's kill,
the cluster ending the node's job step, the node shutting down; node/term.py) while their
peers trained: the peers fail next in a collective that waits for them (gloo's `Connection
closed by peer`, NCCL's remote peer gone), which read as the network's fault (the one-agent
SIGTERM test: `nccl_communication_error` on rank 1 of node-0, node-1's stop unnamed). So when
the verdict is such a symptom and ranks their node agent stopped on its SIGTERM (the agent
records who stopped each rank: states.StopCause; review 53: times and exit codes could not
tell, a handler may exit 0) ended before the first rank that failed, the verdict is that
stop. Pure."""

from __future__ import annotations

from collections.abc import Sequence

from trainguard.diagnosis.candidates import RankExit
from trainguard.diagnosis.early_exit import (
    blamed_first,
    early_verdict,
    ended_before_failure,
    exited_early,
    failed_ranks,
    is_peer_symptom,
)
from trainguard.diagnosis.taxonomy import Category, Diagnosis, FaultDomain, RestartHelps
from trainguard.states import StopCause

SUBCATEGORY = "stopped_from_outside"
ADVICE = ("Something outside trainguard sent SIGTERM to a node's agent and ranks (a person's "
          "kill, the cluster ending the node's job step: scancel, a time limit, a preemption; "
          "the node shutting down); the node agent's log says when it got it. A restart "
          "resumes from the last checkpoint; if the node is going away, give the job a spare "
          "(--spare-nodes).")


def by_outside(e: RankExit) -> bool:
    """Stopped by its node agent on a SIGTERM from outside (whatever its exit: 143, 0 from a
    handler, -9 after the grace), as the agent recorded it (review 53 #1, #3, #4)."""
    return e.stopped and e.stopped_by == StopCause.OUTSIDE.value


def ended_first(d: Diagnosis | None, exits: Sequence[RankExit]) -> Diagnosis | None:
    """`d`, or the cause its peers' symptom points to: ranks stopped from outside, or a
    rank that ended its script (early_exit), whichever ended first (review 53 #9)."""
    if d is None or not is_peer_symptom(d):
        return d
    stopped = ended_before_failure(exits, by_outside)
    early = ended_before_failure(exits, exited_early)
    s_at = stopped[0].ended_at if stopped else None
    e_at = early[0].ended_at if early else None
    if s_at is not None and (e_at is None or s_at <= e_at):
        return stop_verdict(d, stopped, exits)
    return early_verdict(d, early, exits) if early else d


def stopped_first(d: Diagnosis | None, exits: Sequence[RankExit]) -> Diagnosis | None:
    """`d`, or the outside stop of ranks stopped before the first failed rank when `d` is
    what their peers print about them."""
    stopped = ended_before_failure(exits, by_outside)
    return stop_verdict(d, stopped, exits) if stopped and d is not None and \
        is_peer_symptom(d) else d


def stop_verdict(d: Diagnosis, stopped: list[RankExit], exits: Sequence[RankExit]
                 ) -> Diagnosis:
    """The peers' symptom `d` blamed on the ranks `stopped` from outside first."""
    nodes = sorted({e.node for e in stopped if e.node})
    on = f" (node {', '.join(nodes)})" if nodes else ""
    return blamed_first(
        d, stopped, Category.KILLED_BY_SIGNAL_UNKNOWN, FaultDomain.INFRASTRUCTURE,
        RestartHelps.YES, SUBCATEGORY, ADVICE, 0.8,
        f"rank(s) {', '.join(str(e.rank) for e in stopped)}{on} were stopped by a SIGTERM "
        f"from outside the launcher before rank(s) {failed_ranks(exits)} failed in a "
        f"collective that waited for them (what the peers printed: {d.summary.rstrip('.')})")
