"""A remote agent keeps the worker messages the controller makes events of until the
controller acknowledges them, and sends them again, marked resent, after a reconnect
(node/outbox.py: pure)."""

from __future__ import annotations

from datetime import datetime, timezone

from trainguard.controller.incidents import IncidentBook
from trainguard.controller.worker_messages import WorkerMessages
from trainguard.node.outbox import RECORDED_KINDS, Outbox
from trainguard.protocol import NodeReport, Progress, WorkerMessage
from trainguard.worker.contract import MessageKind

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def report(*kinds: str, attempt: int = 0) -> NodeReport:
    return NodeReport(node="n0", attempt=attempt, workers=[], progress=Progress(), at=T0,
                      messages=[WorkerMessage(kind=k, rank=0, at=T0, data={"i": i})
                                for i, k in enumerate(kinds)])


def test_it_keeps_what_the_controller_makes_events_of_and_nothing_else() -> None:
    made = set(WorkerMessages(lambda *a, **k: None, IncidentBook(None))._handlers)  # type: ignore[arg-type]
    # metrics, snapshot blocking and snapshots taken say what is true now; a report lost in
    # a takeover costs a few seconds of blocking unbooked (a resend must not book it twice),
    # and the next snapshot says again that the ranks take them
    assert made - {MessageKind.TRAIN_METRICS, MessageKind.SNAPSHOT_BLOCKING,
                   MessageKind.SNAPSHOT_TAKEN} == RECORDED_KINDS


def test_a_report_with_nothing_to_keep_is_not_numbered() -> None:
    box = Outbox()
    sent = box.number(report("progress", "train_metrics", "phase", "step_failed"))
    assert sent.seq is None and len(sent.messages) == 4 and len(box) == 0
    assert all(m.id is None for m in sent.messages)


def test_a_kept_message_gets_an_id_and_its_attempt_that_its_copies_keep() -> None:
    box = Outbox(epoch=77)
    sent = box.number(report("progress", "checkpoint_saved", attempt=3))
    assert (sent.seq, sent.epoch) == (1, 77)
    assert [(m.kind, m.id, m.attempt) for m in sent.messages] == [
        ("progress", None, None), ("checkpoint_saved", "77-1-1", 3)]
    box.reconnected()
    again = box.number(report(attempt=4))  # a later attempt's report carries it
    assert [(m.id, m.attempt, m.resent) for m in again.messages] == [("77-1-1", 3, True)]


def test_an_unacknowledged_message_is_sent_again_once_after_a_reconnect() -> None:
    box = Outbox()
    first = box.number(report("checkpoint_saved", "progress"))
    second = box.number(report("resumed"))
    assert (first.seq, second.seq) == (1, 2) and len(box) == 2
    box.acknowledged(1, box.epoch)  # the controller recorded the first report only
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
    box.acknowledged(2, box.epoch + 1)  # meant for another agent process of the node
    assert len(box) == 3
    box.acknowledged(2, box.epoch)
    assert len(box) == 1
    box.acknowledged(2, box.epoch)  # again (a duplicate frame): nothing more
    assert len(box) == 1
    box.acknowledged(3, box.epoch)
    box.reconnected()
    assert box.number(report()).messages == []


def test_a_controller_that_never_acknowledges_costs_a_bounded_memory() -> None:
    box = Outbox(max_kept=5)
    for _ in range(8):
        box.number(report("checkpoint_saved"))
    assert len(box) == 5 and box.dropped == 3
    box.reconnected()
    assert [m.data["i"] for m in box.number(report()).messages] == [0] * 5


def test_a_numbered_reply_that_came_after_its_call_gave_up_is_not_lost() -> None:
    """An acknowledgement is cumulative: a reply the hub threw away (its call had timed out)
    was never recorded, and the acknowledgement of a later pushed report dropped its
    messages at the agent. The hub keeps them; the next pushed report carries them first."""
    from trainguard.controller.hub import Hub
    from trainguard.controller.links import NodeLink
    from trainguard.wire import new_token

    box = Outbox(epoch=7)
    late = box.number(report(MessageKind.CHECKPOINT_SAVED))  # a reply whose call gave up
    pushed = box.number(report(MessageKind.RESUMED))
    hub = Hub(new_token(), "127.0.0.1")
    try:
        link = NodeLink("n0")
        hub._frame(link, {"type": "reply", "id": "gone-1", "ok": True,
                          "body": late.model_dump(mode="json")})
        hub._frame(link, {"type": "reply", "id": "gone-2", "ok": True,
                          "body": {"stacks": []}})  # not a report: nothing kept
        assert link.take_reports() == []  # nothing pushed yet: kept for the next
        hub._frame(link, {"type": "report", "body": pushed.model_dump(mode="json")})
        (first,) = link.take_reports()
        assert [m.kind for m in first.messages] == [MessageKind.CHECKPOINT_SAVED,
                                                    MessageKind.RESUMED]
        assert first.seq == pushed.seq  # its acknowledgement covers both, recorded now
        assert link.take_reports() == [] and not link.late
        # (review) with no pushed report to carry them, a command's reply does (Fleet._take)
        hub._frame(link, {"type": "reply", "id": "gone-3", "ok": True,
                          "body": box.number(report(MessageKind.CHECKPOINT_SAVED))
                          .model_dump(mode="json")})
        hub.links["n0"] = link
        reply = box.number(report(MessageKind.RESUMED))
        (only,) = hub.take_reports("n0", then=reply)
        assert [m.kind for m in only.messages] == [MessageKind.CHECKPOINT_SAVED,
                                                   MessageKind.RESUMED]
        assert only.seq == reply.seq and not link.late
    finally:
        hub.close()


def test_a_reply_that_comes_as_its_node_is_given_up_on_is_not_lost() -> None:
    """(review) A node given up on (unreachable) within a call, that came back and answered
    before the call ended: its reply sat in the call's replies and was dropped with them.
    A reply that comes while its node is judged is its answer (review 41 #1: the hub asks
    the judge, then takes every reply that came); one that comes after its node was given
    up on, while the call waits for another, is kept as late (the call's `finally`; review
    42 #7)."""
    from trainguard.controller.hub import Hub
    from trainguard.controller.links import NodeLink
    from trainguard.protocol import Op
    from trainguard.wire import new_token

    box = Outbox(epoch=7)
    hub = Hub(new_token(), "127.0.0.1")
    try:
        n0 = hub.links["n0"] = NodeLink("n0", disconnected_at=0.0)  # gone long ago
        n1 = hub.links["n1"] = NodeLink("n1", disconnected_at=0.0)
        reply = box.number(report(MessageKind.CHECKPOINT_SAVED)).model_dump(mode="json")

        def cid_of(name: str) -> str:
            return next(c for c, (n, _) in hub._pending.items() if n == name)

        def answers_as_judged(names: list[str]) -> dict[str, str]:
            hub._frame(n0, {"type": "reply", "id": cid_of("n0"), "ok": True, "body": reply})
            return dict.fromkeys(names, "given up")

        out = hub.call({"n0": (Op.STOP, {})}, 5, 0.0, judge=answers_as_judged)
        assert out["n0"].ok and out["n0"].body == reply and not n0.late
        rounds: list[list[str]] = []

        def n0_now_n1_later(names: list[str]) -> dict[str, str]:
            rounds.append(names)
            if len(rounds) == 1:
                return {"n0": "given up"}
            hub._frame(n0, {"type": "reply", "id": cid_of("n0"), "ok": True, "body": reply})
            return {"n1": "given up"}

        out = hub.call({"n0": (Op.STOP, {}), "n1": (Op.STOP, {})}, 5, 0.0,
                       judge=n0_now_n1_later)
        assert out["n0"].error == "given up" and rounds == [["n0", "n1"], ["n1"]]
        assert [m.kind for m in n0.late] == [MessageKind.CHECKPOINT_SAVED] and not n1.late
    finally:
        hub.close()
