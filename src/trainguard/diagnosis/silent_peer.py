"""A rank that went silent just before a peer lost its connection to it: the likely culprit
of an attempt whose ranks' ends nobody recorded. Pure.

When the launcher died with the attempt (its node was lost, or it was SIGKILLed), no rank's
exit is known. The one error the logs show may then be a survivor's `Connection closed by
peer` (gloo) or `remote process exited` (NCCL): a symptom of the peer that died, printed on
a healthy node, and `diagnose` named the rank that printed it, and its node (walk-through
42 #1: the controller's node n1 died with rank 0, whose log ended at step 66 without an
error; rank 1 on n2 logged the lost connection 0.17 s later, and was called the culprit).
A rank whose log stopped without an error within WINDOW before such a symptom is named
instead: its process or its node most likely ended first.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from datetime import datetime, timedelta

from trainguard.diagnosis.taxonomy import Category, Culprit, Diagnosis
from trainguard.records import rank_list

# a lost connection, not a timeout: a timeout comes long after the peer stopped, and a
# silent log then says little of which rank stopped first
LOST_PEER = frozenset({Category.NETWORK_OR_RENDEZVOUS, Category.NCCL_COMMUNICATION_ERROR})
WINDOW = timedelta(seconds=10)  # a log that stopped this long before the symptom, or less
SLACK = timedelta(seconds=1)  # the symptom's and the silent log's clocks (other nodes')


def silent_peer(d: Diagnosis | None,
                last_lines: Mapping[int, tuple[datetime, str | None]]) -> Diagnosis | None:
    """`d`, or, when it is a peer's lost connection, `d` naming the rank(s) whose log stopped
    without an error just before. `last_lines`: rank -> (its log's last line's time, its
    node), for the ranks whose end is unknown and whose log shows no error."""
    if d is None or d.category not in LOST_PEER or d.evidence is None or d.evidence.at is None:
        return d
    seen, who = d.evidence.at, d.culprit.rank
    silent = sorted((at, rank, node) for rank, (at, node) in last_lines.items()
                    if rank != who and seen - WINDOW <= at <= seen + SLACK)
    if not silent:
        return d
    at, rank, node = silent[0]
    ranks = sorted(r for _, r, _ in silent)
    nodes = sorted({n for _, _, n in silent if n})
    where = f" (node {', '.join(nodes)})" if nodes else ""
    one = len(nodes) <= 1  # else milliseconds, or different nodes' clocks, would pick one:
    # none is named (review 52 #7)
    when = f"{(seen - at).total_seconds():.2f}s" if one else \
        f"within {WINDOW.total_seconds():g}s"
    which = "its process or node" if one else "one of those nodes or processes"
    return replace(
        d, culprit=Culprit(rank, node) if one else Culprit(),
        confidence=min(d.confidence, 0.6 if one else 0.45),
        summary=(f"rank(s) {rank_list(ranks)}{where} stopped logging without an error {when} "
                 f"before rank {who} lost its connection: {which} most likely ended first "
                 f"({d.summary.rstrip('.')})"),
        advice=(f"Find out why rank {rank} ended{where}: its node (power, kernel log, the "
                "cluster's node state) or its process (killed from outside, OOM). " if one
                else f"Find out which of {', '.join(nodes)} ended first: the cluster's node "
                "states, each node's kernel log. ") + d.advice)
