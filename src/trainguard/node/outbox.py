"""The worker messages a remote agent sent its controller and has not had acknowledged.

A controller that is killed (and taken over by a new one, `trainguard run` again) or a link
that breaks may lose what was in flight: a report the agent sent into a socket that nobody
read any more, or one the controller read but died before it recorded. So the agent numbers
each report that carries a message worth keeping (`NodeReport.seq`) and keeps those messages
until the controller acknowledges the report (protocol.ACK_FRAME, sent by controller/fleet.py
once the loop recorded the report: when it merges the next one). After a reconnect the first
report sends what was not acknowledged again, marked `resent`; the controller records a
resent message only if its event is not in the job store yet (controller/worker_messages.py):
each message is recorded once. Progress and train metrics are not kept: the next one says
more. Pure bookkeeping, no I/O: node/main.py sends and reads the frames.
"""

from __future__ import annotations

import logging
from collections import deque

from trainguard.protocol import NodeReport, WorkerMessage
from trainguard.worker.channel import LOSSY_KINDS

log = logging.getLogger(__name__)

MAX_KEPT = 10_000  # messages; beyond it the oldest are dropped (a controller that never acks)


class Outbox:
    def __init__(self, max_kept: int = MAX_KEPT) -> None:
        self._seq = 0
        self._kept: deque[tuple[int, WorkerMessage]] = deque()  # (seq of its report, message)
        self._max = max_kept
        self._resend = False
        self.dropped = 0  # messages dropped unacknowledged past max_kept

    def number(self, report: NodeReport) -> NodeReport:
        """The report to send: numbered when it carries messages worth keeping, and after a
        reconnect led by every message no controller acknowledged (once, marked resent)."""
        ahead: list[WorkerMessage] = []
        if self._resend:
            self._resend = False
            ahead = [m if m.resent else m.model_copy(update={"resent": True})
                     for _, m in self._kept]
            self._kept.clear()
        kept = ahead + [m for m in report.messages if m.kind not in LOSSY_KINDS]
        if not kept:
            return report
        self._seq += 1
        self._kept.extend((self._seq, m) for m in kept)
        while len(self._kept) > self._max:
            self._kept.popleft()
            self.dropped += 1
            if self.dropped == 1:
                log.warning("the controller acknowledges no reports: dropping the oldest "
                            "worker messages kept for it (more than %d)", self._max)
        return report.model_copy(update={"seq": self._seq,
                                         "messages": ahead + report.messages})

    def acknowledged(self, seq: int) -> None:
        """The controller recorded the messages of every report up to `seq`."""
        while self._kept and self._kept[0][0] <= seq:
            self._kept.popleft()

    def reconnected(self) -> None:
        """A new link: the next report sends what the last one left unacknowledged."""
        self._resend = bool(self._kept)

    def __len__(self) -> int:
        return len(self._kept)
