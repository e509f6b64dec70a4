"""Placed nodes whose agent got SIGTERM from outside the launcher (node/term.py: a person's
kill, the cluster ending its step or the whole allocation, a shutdown). The agent stops its
workers with the grace period and says so in its reports (`terminating`); the node is
leaving, so it leaves the job: lost, not blamed (never drained), its ranks
placed again (pod-level onto a spare, else job-level) or, when every placed node's agent got
it, the job stopped (exit 143: the cluster ending the allocation). Review 53 #2: a rank
stopped so while its peers were not in a collective left the job running with no event,
and a restart was placed on a node whose agent was ending."""

from __future__ import annotations

import time
from collections.abc import Callable

from trainguard.controller.fleet import Fleet
from trainguard.controller.recorder import Recorder
from trainguard.controller.stopping import agents_signalled, stop, stopped_outside
from trainguard.protocol import AgentAPI, NodeReport
from trainguard.states import AGENT_TERMINATED

# how long the other placed nodes get to say their agent got SIGTERM too: the cluster signals
# every step of an allocation within moments, not at one instant
SETTLE_S = 3.0
WHY = (f"{AGENT_TERMINATED} (a person's kill, the cluster ending its step or allocation, a "
       "shutdown) and stopped its workers")


def ending_nodes(fleet: Fleet, report: NodeReport,
                 seen: Callable[[NodeReport], None]) -> dict[str, str]:
    """The placed nodes whose agent got SIGTERM, with why, once the others had SETTLE_S to
    say so too ({} when none did). Each report polled meanwhile goes to `seen` (recorded,
    and to the resume agreement and in-process bookkeeping as the watch's would: review 54
    #4, they were only recorded); a node lost meanwhile is in fleet.lost after it."""
    ending = set(report.terminating_nodes)
    deadline = time.monotonic() + SETTLE_S
    while ending and not set(fleet.placement) <= ending and time.monotonic() < deadline:
        report = fleet.poll(wait_s=0.2)
        seen(report)
        ending |= set(report.terminating_nodes)
    return dict.fromkeys(sorted(ending), WHY)


def every_one_ending(placement: list[str], lost: dict[str, str]) -> bool:
    """Every placed node is leaving because its agent got SIGTERM: the allocation ends."""
    return bool(placement) and all(lost.get(n) == WHY for n in placement)


def ended_outside(agent: AgentAPI, rec: Recorder, attempt: int, nodes: list[str]) -> int:
    """Every placed node's agent got SIGTERM from outside (controller/ending_nodes.py): the
    cluster ends the allocation (a requeue, a time limit, scancel) or a person stops every
    node; what is left is stopped and the job ends stopped, exit 143, whatever its ranks did
    in between (a peer failing before its own node's signal came)."""
    report = stop(agent, rec, "every node's agent got SIGTERM")
    return stopped_outside(rec, attempt, report, agents_signalled(nodes))
