"""What a node holds in memory for fast recovery, for `trainguard status` (NodeUsage): the
standby workers ready and their resident memory, and the /dev/shm bytes of the job's
snapshot region (the copies kept for a neighbour node among them).

Measured at most every MEASURE_EVERY_S (a report goes up every 0.25 s; a region holds a few
files per rank, a standby one /proc read). Bytes are what tmpfs allocated (st_blocks), the
memory the region takes whether or not its slots are full.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

from trainguard.node.peer import PEER
from trainguard.protocol import NodeUsage

MEASURE_EVERY_S = 1.0
_PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_bytes(pid: int) -> int:
    """The resident memory of one process (0 when it is gone)."""
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return 0


def allocated_bytes(path: Path, part: str | None = None) -> tuple[int, int]:
    """The bytes the files under `path` take (a file or link: its own), and those under its
    subdirectory `part` among them, in one walk ((0, 0) when it is not there)."""
    if os.path.islink(path) or not os.path.isdir(path):
        try:
            return os.lstat(path).st_blocks * 512, 0
        except OSError:
            return 0, 0
    total = inside = 0
    sub = os.path.join(path, part) if part is not None else None
    for root, _dirs, files in os.walk(path):
        within = sub is not None and (root == sub or root.startswith(sub + os.sep))
        for name in files:
            try:
                n = os.lstat(os.path.join(root, name)).st_blocks * 512
            except OSError:
                continue  # replaced or removed while walked
            total += n
            inside += n if within else 0
    return total, inside


class UsageMeter:
    """The node's NodeUsage, measured again when the last is older than MEASURE_EVERY_S."""

    def __init__(self, node: str, standby_pids: Callable[[], list[int]],
                 standby_warm: Callable[[], int], region: Callable[[], Path | None]) -> None:
        self._node, self._pids, self._warm, self._region = (node, standby_pids, standby_warm,
                                                             region)
        self._last: NodeUsage | None = None
        self._at = 0.0

    def now(self) -> NodeUsage:
        if self._last is not None and time.monotonic() - self._at < MEASURE_EVERY_S:
            return self._last
        pids = self._pids()
        region = self._region()
        shm, peer = allocated_bytes(region, PEER) if region is not None else (0, 0)
        warm = self._warm()
        self._last = NodeUsage(node=self._node, standby_ready=warm,
                               standby_warming=max(len(pids) - warm, 0),
                               standby_rss_bytes=sum(rss_bytes(p) for p in pids),
                               shm_bytes=shm, shm_peer_bytes=peer)
        self._at = time.monotonic()
        return self._last
