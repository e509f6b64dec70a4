"""When a node counts as lost by its link (its agent unheard), judged over one snapshot of
the links (Hub.links_now) and the full disruption's state: pure.

A link down past the reconnect grace is lost, and so is one silent past the node timeout,
but silence counts only while others are heard: every node silent at once (of four or more:
most) is this controller stalled (SIGSTOP, a paused VM, a reader behind on thousands of
links), not the cluster gone. During a full disruption a cut link's silence is the cut, and
no link counts as lost before the disruption's wait (controller/disruption.py). One judge
for both questions: which placed nodes are lost (Fleet.lost_now), and which nodes a command
gives up on (Fleet._call, asked at most every Hub.JUDGE_S of Hub.call).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from enum import Enum

from trainguard.controller.disruption import Disruption
from trainguard.controller.links import LinkState

# how a node lost by its link is said: only such a loss may be a full disruption's (not
# drained); an agent's end or Slurm's verdict is the node's own
LINK_LOST = "its agent has been "
# said of a link loss judged while a full disruption made it suspect: the verdict that it is
# not drained travels with the reason (a link back before the loss is handled is no longer
# the disruption's, and was drained: review 42 #9)
SUSPECT_NOTE = " (every node's link went down at once)"
NEVER = LinkState(False, float("inf"), float("inf"))  # a node whose agent never connected


class Patience(Enum):
    """How long a judge waits for a link cut in a full disruption: as the disruption counts
    it (WAIT: a poll's losses, a spare; PLACING: a rendezvous or a start, until a stop is
    requested), or not at all (NONE: a stop, a tell, a stack dump: review 41 #2)."""

    WAIT = "wait"
    PLACING = "placing"
    NONE = "none"


def excused(why: str, suspect_now: bool) -> bool:
    """Whether a loss for `why` is not drained: a link loss while a full disruption made it
    suspect, then (SUSPECT_NOTE) or now (review 40 #4: a loss of the node's own is drained)."""
    return why.startswith(LINK_LOST) and (SUSPECT_NOTE in why or suspect_now)


def heard_lately(links: Mapping[str, LinkState], names: Collection[str],
                 node_timeout_s: float) -> bool:
    """Whether enough of `names` were heard within the node timeout for one node's silence
    to be its own."""
    heard = sum(1 for n in names if links.get(n, NEVER).silent_s <= node_timeout_s)
    return heard > 0 and (len(names) < 4 or 2 * heard > len(names))


def link_lost(link: LinkState, grace_s: float, node_timeout_s: float, *, waiting: bool,
              others_heard: bool, suspect: bool) -> str | None:
    """Why a node with `link` (as the disruption counts it) is lost, or None. `waiting`: a
    full disruption not waited out yet; `suspect`: its loss may be this controller's side."""
    if link.disconnected_s > grace_s and not waiting:
        return (f"{LINK_LOST}disconnected for over {grace_s:g}s"
                + (SUSPECT_NOTE if suspect else ""))
    if link.silent_s > node_timeout_s and others_heard and not (
            waiting and not link.connected):  # a cut link's silence is the cut
        return f"{LINK_LOST}silent for over {node_timeout_s:g}s"
    return None


def given_up(names: Collection[str], links: Mapping[str, LinkState], grace_s: float,
             node_timeout_s: float, *, ended: Callable[[str], str | None],
             heard_from: Collection[str], disruption: Disruption | None = None,
             live: Collection[str] = (), reported: Mapping[str, str] | None = None,
             ) -> dict[str, str]:
    """Of `names`, those lost now, with why, in this order: its agent ended or it is known
    gone (`ended` says why), its link is lost (link_lost; silence counts while most of
    `heard_from` are heard), the cluster reports it down (`reported`: Slurm's verdict). With
    `disruption` (placed nodes, a command that places ranks) a link cut in a full disruption
    is judged as the disruption counts it, and none before its wait (`live`: the nodes in
    play); without (a stop, a tell: a cut node cannot be reached) the link as it is."""
    others_heard = heard_lately(links, heard_from, node_timeout_s)
    waiting = disruption is not None and disruption.update(live, links)
    out: dict[str, str] = {}
    for name in names:
        link = links.get(name, NEVER)
        why = ended(name) or link_lost(
            link if disruption is None else disruption.counted(name, link), grace_s,
            node_timeout_s, waiting=waiting, others_heard=others_heard,
            suspect=disruption is not None and disruption.suspect(name)) or (
            f"Slurm reports it {reported[name]}" if reported and name in reported else None)
        if why:
            out[name] = why
    return out
