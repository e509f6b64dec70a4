"""The worker messages a remote agent sent its controller and has not had acknowledged.

A controller that is killed (and taken over by a new one, `trainguard run` again) or a link
that breaks may lose what was in flight: a report the agent sent into a socket that nobody
read any more, or one the controller read but died before it recorded. So the agent numbers
each report that carries a message the controller makes an event of (RECORDED_KINDS: a
committed or failed checkpoint, a resume), gives each such message an id and the report's
attempt, and keeps them until the controller acknowledges the report (protocol.ACK_FRAME,
sent by controller/fleet.py once the loop recorded it: when it merges the next one). After
a reconnect the first report sends what was not acknowledged again, marked `resent`; the
controller records a message with an id it recorded already (in its store, or in its memory:
a command's reply answered again from the agent's memory) only once
(controller/worker_messages.py), under the attempt it was first sent in. Liveness signals
(progress, phases, step verdicts, metrics) are not kept: they say what is true now, and a
controller that takes over must not act again on an old step verdict. Pure bookkeeping, no
I/O: node/main.py sends and reads the frames.
"""

from __future__ import annotations

import logging
import os
from collections import deque

from trainguard.protocol import NodeReport, WorkerMessage
from trainguard.worker.contract import MessageKind

log = logging.getLogger(__name__)

# what controller/worker_messages.py makes events of (tests/unit/test_outbox.py checks)
RECORDED_KINDS = frozenset({
    MessageKind.CHECKPOINT_SAVED, MessageKind.CHECKPOINT_EXIT_SKIPPED,
    MessageKind.CHECKPOINT_SAVE_SKIPPED,
    MessageKind.CHECKPOINT_SAVE_FAILED, MessageKind.CHECKPOINT_CORRUPT,
    MessageKind.NO_CHECKPOINT, MessageKind.RESUMED, MessageKind.LOG_WRITE_FAILED,
    MessageKind.CONTROL_UNREACHABLE, MessageKind.AUTO_RESUME_UNUSED,
    MessageKind.FAULTS})  # sent once per process: a lost one is a false FaultsNotFired
# messages; beyond it the oldest are dropped (a controller that never acknowledges). A
# message is at most a datagram (worker.contract.MAX_DATAGRAM_BYTES), so a report that sends
# them all again stays well inside a wire frame
MAX_KEPT = 500


class Outbox:
    def __init__(self, max_kept: int = MAX_KEPT, epoch: int | None = None) -> None:
        self._seq = 0
        self.epoch = os.getpid() if epoch is None else epoch  # ids differ across agents
        self._kept: deque[tuple[int, WorkerMessage]] = deque()  # (seq of its report, message)
        self._max = max_kept
        self._resend = False
        self.dropped = 0  # messages dropped unacknowledged past max_kept

    def number(self, report: NodeReport) -> NodeReport:
        """The report to send: numbered when it carries messages to keep (each with its id
        and attempt), and after a reconnect led by every message no controller acknowledged
        (once, marked resent)."""
        ahead: list[WorkerMessage] = []
        if self._resend:
            self._resend = False
            ahead = [m if m.resent else m.model_copy(update={"resent": True})
                     for _, m in self._kept]
            self._kept.clear()
        if not ahead and not any(m.kind in RECORDED_KINDS for m in report.messages):
            return report
        self._seq += 1
        messages = [m.model_copy(update={"id": f"{self.epoch}-{self._seq}-{i}",
                                         "attempt": report.attempt})
                    if m.kind in RECORDED_KINDS else m
                    for i, m in enumerate(report.messages)]
        self._kept.extend((self._seq, m) for m in ahead)
        self._kept.extend((self._seq, m) for m in messages if m.id is not None)
        while len(self._kept) > self._max:
            self._kept.popleft()
            self.dropped += 1
            if self.dropped == 1:
                log.warning("the controller acknowledges no reports: dropping the oldest "
                            "worker messages kept for it (more than %d)", self._max)
        return report.model_copy(update={"seq": self._seq, "epoch": self.epoch,
                                         "messages": ahead + messages})

    def acknowledged(self, seq: int, epoch: int | None) -> None:
        """The controller recorded the messages of every report up to `seq` this agent
        process (`epoch`) numbered; an acknowledgement meant for another is ignored."""
        while epoch == self.epoch and self._kept and self._kept[0][0] <= seq:
            self._kept.popleft()

    def reconnected(self) -> None:
        """A new link: the next report sends what the last one left unacknowledged."""
        self._resend = bool(self._kept)

    def __len__(self) -> int:
        return len(self._kept)
