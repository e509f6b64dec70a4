"""A full disruption: every node's link down at once (of four or more nodes: most), so this
controller's side (its network, a stall) is suspect (Kubernetes' node controller stops
evicting then). No link counts as lost for `wait_s`, and a node lost that way is not drained.

When it ends (enough links are back), the links still down were cut with the others and are
reconnecting at their own pace (each agent's back-off: 0.2 s doubling to 2 s, jittered): each
gets its reconnect grace counted from the disruption's end, not from the cut (walk-through 36
#10: a 25 s outage lost every node but the first back, and their training ranks with them),
and one lost after it is not drained either. The Fleet asks; the clock is injectable.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Mapping

from trainguard.controller.links import LinkState

log = logging.getLogger(__name__)


class Disruption:
    def __init__(self, wait_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.wait_s = wait_s
        self._clock = clock
        # how a disruption's start (True) and end are said: the controller makes them the
        # LinksDown / LinksRestored events (walk-through 42 #13: a log line only)
        self.say: Callable[[bool, str], None] = lambda down, text: log.warning("%s", text)
        self.since: float | None = None  # every link down since (monotonic)
        self.ended_at: float | None = None  # the last one ended then
        self._cut: set[str] = set()  # links down when it ended, not back since

    def update(self, live: Collection[str], links: Mapping[str, LinkState]) -> bool:
        """Whether links count as not lost now (a disruption not waited out yet)."""
        down = {n for n in live if n not in links or not links[n].connected}
        self._cut &= down  # back since: no longer the disruption's
        disrupted = bool(live) and (len(down) == len(live)
                                    or (len(live) >= 4 and 2 * len(down) > len(live)))
        now = self._clock()
        if not disrupted:
            if self.since is not None:
                self.say(False, f"the full disruption is over after "
                                f"{now - self.since:.1f}s: links are back; the {len(down)} "
                                "still down get their reconnect grace from now")
                self.ended_at, self._cut = now, down
            self.since = None
            return False
        if self.since is None:
            self.since = now
            self.say(True, f"every node's link is down at once (a full disruption): this "
                           f"controller's side is suspect; no node counts as lost for "
                           f"{self.wait_s:g}s, and none is drained")
        return now - self.since < self.wait_s

    def counted(self, name: str, link: LinkState) -> LinkState:
        """`name`'s link as its loss is judged: one cut in the disruption and not back since
        is down, and silent, only since the disruption ended."""
        if name in self._cut and self.ended_at is not None:
            since_end = self._clock() - self.ended_at
            return LinkState(link.connected, min(link.silent_s, since_end),
                             min(link.disconnected_s, since_end))
        return link

    def wait_left(self) -> float:
        """Seconds until a disruption under way is waited out (0: none is): a command that
        places ranks waits that long more for a cut node (review 41 #8: a restart's
        rendezvous gave up after its 30 s and ended the job 90 s into the wait)."""
        return 0.0 if self.since is None else max(0.0, self.wait_s - (self._clock() - self.since))

    def suspect(self, name: str) -> bool:
        """Whether `name`'s loss may be this controller's side: during a disruption, or its
        link cut in one and not back since (such a node is not drained)."""
        return self.since is not None or name in self._cut
