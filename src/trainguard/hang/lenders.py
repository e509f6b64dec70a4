"""Which rank in a marked phase lends its allowance to a rank outside any phase (walk-through
33 #1), found once a poll: the rank outside waits for the marked work (rank 0 evaluates or
saves, the others wait in a barrier or the next step's collective) and gets the longest
allowance of the phases open, but a `checkpoint` phase only where it did its own part of that
save first (review of walk-through 33 #13: a rank hung outside any phase hid for 30 minutes
behind its peer's checkpoint phase).

Asked for every rank of a poll, a scan of every phased rank cost O(N^2) while every rank saves
(review 34 #7: 1.4 s a poll at 2,048 ranks): the phases other than `checkpoint` lend to every
rank, so their best is found once; the checkpoint phases lend to a rank that left a phase at
`left` to those that began by `left + threshold`, so they are kept sorted by their start with
a running best, and a rank's lender is one bisection.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from datetime import datetime, timedelta

from trainguard.protocol import RankLiveness
from trainguard.worker.contract import CHECKPOINT_PHASE

# (allowance, -position in the poll's list): the longest allowance, the first rank of the
# list among equals, as max() over the list picks
_Key = tuple[float, int]


class Lenders:
    def __init__(self, phased: list[RankLiveness],
                 allowance: Callable[[RankLiveness], float]) -> None:
        self._best: tuple[_Key, RankLiveness] | None = None
        saves: list[tuple[datetime, _Key, RankLiveness]] = []
        for i, q in enumerate(phased):
            key = (allowance(q), -i)
            if q.phase != CHECKPOINT_PHASE:
                if self._best is None or key > self._best[0]:
                    self._best = (key, q)
            elif q.phase_since is not None:
                saves.append((q.phase_since, key, q))
        saves.sort(key=lambda s: s[0])
        self._since = [s[0] for s in saves]
        self._running: list[tuple[_Key, RankLiveness]] = []
        for _, key, q in saves:
            if not self._running or key > self._running[-1][0]:
                self._running.append((key, q))
            else:
                self._running.append(self._running[-1])

    def lender(self, left: datetime | None, threshold: float) -> RankLiveness | None:
        """The phased rank whose allowance a rank outside any phase gets, or None: `left`,
        when that rank last left a phase (None: never, in this attempt)."""
        found = [self._best] if self._best is not None else []
        if left is not None and self._since:
            k = bisect.bisect_right(self._since, left + timedelta(seconds=threshold))
            if k:
                found.append(self._running[k - 1])
        return max(found, key=lambda f: f[0])[1] if found else None
