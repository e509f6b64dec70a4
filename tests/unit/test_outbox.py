"""A remote agent keeps the worker messages it sent up until the controller acknowledges
them, and sends them again, marked resent, after a reconnect (node/outbox.py: pure)."""

from __future__ import annotations

from datetime import datetime, timezone

from trainguard.node.outbox import Outbox
from trainguard.protocol import NodeReport, Progress, WorkerMessage

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def report(*kinds: str) -> NodeReport:
    return NodeReport(node="n0", attempt=0, workers=[], progress=Progress(), at=T0,
                      messages=[WorkerMessage(kind=k, rank=0, at=T0, data={"i": i})
                                for i, k in enumerate(kinds)])


def test_a_report_with_nothing_worth_keeping_is_not_numbered() -> None:
    box = Outbox()
    sent = box.number(report("progress", "train_metrics"))
    assert sent.seq is None and len(sent.messages) == 2 and len(box) == 0


def test_an_unacknowledged_message_is_sent_again_once_after_a_reconnect() -> None:
    box = Outbox()
    first = box.number(report("checkpoint_saved", "progress"))
    second = box.number(report("resumed"))
    assert (first.seq, second.seq) == (1, 2) and len(box) == 2
    box.acknowledged(1)  # the controller recorded the first report only
    box.reconnected()
    again = box.number(report("progress"))
    assert [(m.kind, m.resent) for m in again.messages] == [("resumed", True),
                                                            ("progress", False)]
    assert again.seq == 3
    assert box.number(report()).messages == []  # once: not with every report
    box.reconnected()  # lost again before the ack: still resent, still marked
    assert [(m.kind, m.resent) for m in box.number(report()).messages] == [("resumed", True)]


def test_an_acknowledgement_drops_every_report_up_to_it_and_no_more() -> None:
    box = Outbox()
    for _ in range(3):
        box.number(report("checkpoint_saved"))
    box.acknowledged(2)
    assert len(box) == 1
    box.acknowledged(2)  # again (a duplicate frame): nothing more
    assert len(box) == 1
    box.acknowledged(3)
    box.reconnected()
    assert box.number(report()).messages == []


def test_a_controller_that_never_acknowledges_costs_a_bounded_memory() -> None:
    box = Outbox(max_kept=5)
    for _ in range(8):
        box.number(report("checkpoint_saved"))
    assert len(box) == 5 and box.dropped == 3
    box.reconnected()
    assert [m.data["i"] for m in box.number(report()).messages] == [0] * 5
