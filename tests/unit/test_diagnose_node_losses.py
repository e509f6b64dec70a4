"""cli/diagnose_job.node_losses: how each node of an attempt was lost, as `diagnose JOB_DIR`
says it (review 53 #7, #8): the NodeLost event's data, an older store's event words, or
(neither) the recover record's reason; every node lost, not the first only."""

from __future__ import annotations

from datetime import datetime, timezone

from trainguard.cli.diagnose_job import node_losses
from trainguard.records import (
    Event,
    FaultScenario,
    Involved,
    Level,
    RecoverRecord,
    RunningRecord,
    StartType,
)

T0 = datetime(2026, 12, 7, 16, 0, tzinfo=timezone.utc)
DOWNGRADE = "node-1: no spare node to replace it with"  # the ladder's words, not the loss's


def record(*nodes: str) -> RunningRecord:
    return RunningRecord(0, T0, StartType.FIRST_START, recover_records=[
        RecoverRecord(0, T0, FaultScenario.NODE_FAULT, DOWNGRADE, f"node/{n}") for n in nodes])


def lost(node: str, message: str, data: dict[str, object] | None) -> Event:
    return Event(T0, Level.WARNING, "NodeLost", message, Involved("mn", node, None, 0),
                 data=data)


def test_the_event_s_data_says_how_each_node_was_lost() -> None:
    events = [lost("node-1", "node node-1 was lost: its agent process ended; kept out",
                   {"why": "its agent process ended", "not_blamed": None}),
              lost("node-2", "node node-2 was lost: x; y",
                   {"why": "its agent got SIGTERM", "not_blamed": "its agent was ended"})]
    assert node_losses([record("node-1", "node-2")], events) == {0: [
        ("node-1", "its agent process ended", None),
        ("node-2", "its agent got SIGTERM", "its agent was ended")]}


def test_an_older_store_s_event_words_then_the_record_s_reason() -> None:
    words = lost("node-1", "node node-1 was lost: no heartbeat for 10s (node timeout); "
                 "drained in Slurm (reason: trainguard: lost)", None)
    assert node_losses([record("node-1")], [words]) == {0: [
        ("node-1", "no heartbeat for 10s (node timeout)", None)]}
    assert node_losses([record("node-1")], []) == {0: [("node-1", DOWNGRADE, None)]}
    # a node's second record (a downgrade, then the job-level rung) counts it once
    assert node_losses([record("node-1", "node-1")], [words]) == {0: [
        ("node-1", "no heartbeat for 10s (node timeout)", None)]}
