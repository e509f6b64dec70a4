"""The controller's own stall: its process did not run for a while (the launcher stopped by
SIGSTOP, a paused VM, starved of CPU). What the nodes sent meanwhile waits unread (the hub's
reader stopped with it), so right after it every rank looks without progress: that is the
controller's silence, not the nodes' (walk-through 36 #8: a `HangSuspected` said their
agents had been silent). A ticker thread notices such a gap in its own ticks (the watch's
own work, a stack dump, does not stop it); then a `ControllerStalled` Warning says the
controller did not run, and hang detection waits until each node was heard again. The
rules are pure functions; `ControllerStall` keeps the times and says it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping

from trainguard.controller.recorder import Recorder
from trainguard.protocol import report_interval
from trainguard.records import Level, Reason

TICK_S = 0.5  # the ticker's beat
STALL_S = 3.0  # a tick this late: the process did not run (no thread of it did)
# an agent reports every 0.25-2 s and beats every second: silent longer, it is unheard
SILENT_AGENT_S = 3.0


def stalled(last_tick: float, now: float) -> bool:
    """Whether the ticker's beat came back so late that the process did not run."""
    return now - last_tick >= STALL_S


def caught_up(since_s: float, silent: Mapping[str, float], report_s: float) -> bool:
    """Whether, `since_s` after the controller ran again, what the nodes said is current
    again: each node heard since then and a report interval gone by (its report, not
    only the backlog read at once); or past SILENT_AGENT_S and an interval more, a node
    still unheard is silent in its own right (hang detection says so)."""
    if since_s >= SILENT_AGENT_S + report_s:
        return True
    return since_s >= report_s and all(s < since_s for s in silent.values())


class ControllerStall:
    """`silent`: each placed node's seconds since its agent's last frame (multi-node; None:
    one node, whose agent runs in this process and is read at each poll: nothing to do)."""

    def __init__(self, rec: Recorder, silent: Callable[[], dict[str, float]] | None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.rec, self._silent, self._clock = rec, silent, clock
        self._report_s: float | None = None  # the agents' report interval, once asked
        self._lock = threading.Lock()
        self._gaps: list[tuple[float, float]] = []  # the ticker's: (last tick, the late one)
        self._back: float | None = None  # when the last stall ended, until caught up
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _tick(self) -> None:
        last = self._clock()
        while not self._stop.wait(TICK_S):
            now = self._clock()
            if stalled(last, now):
                with self._lock:
                    self._gaps.append((last, now))
            last = now

    def holds(self, attempt: int) -> bool:
        """Asked at each poll the watch judges: whether what the nodes said is older than
        a stall the controller just came back from (hang detection waits meanwhile); each
        stall is said once."""
        if self._silent is None:
            return False
        if self._thread is None:
            self._thread = threading.Thread(target=self._tick, name="trainguard-stall",
                                            daemon=True)
            self._thread.start()
        with self._lock:
            gaps, self._gaps = self._gaps, []
        for last, now in gaps:
            self._back = now
            self.rec.event(Level.WARNING, Reason.CONTROLLER_STALLED, (
                f"the controller did not run for {now - last:.1f}s (the launcher stopped, or "
                "starved of CPU): nothing was heard from the nodes meanwhile, so the silence "
                "is the controller's, not theirs; hang detection waits until each node is "
                "heard again"), attempt=attempt, data={"stalled_s": round(now - last, 3)})
        if self._report_s is None:  # the fleet's size is set at the start
            spec = self.rec.spec
            self._report_s = report_interval(spec.nnodes + spec.spare_nodes,
                                             spec.monitor_interval)
        if self._back is not None and caught_up(self._clock() - self._back, self._silent(),
                                                self._report_s):
            self._back = None
        return self._back is not None

    def close(self) -> None:
        """Stop the ticker (the controller's end)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
