"""A stop under way (`status`'s STOPPING, the dashboard's badge, `stop` not signalling
again): one rule, controller/shown.stop_under_way, over the newest launch event, read with
one indexed query (JobStore.last_event) however many events the job has."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

from trainguard.controller.shown import HANG_REASONS, LAUNCH_REASONS, stop_under_way
from trainguard.controller.store import JobStore
from trainguard.records import Event, Involved, Level, Reason

T0 = datetime(2026, 12, 7, 1, 0, tzinfo=timezone.utc)


def _event(reason: Reason, minute: int, data: dict[str, object] | None = None) -> Event:
    return Event(T0 + timedelta(minutes=minute), Level.INFO, reason.value, reason.value,
                 Involved("r"), data)


def test_the_newest_launch_event_says_whether_a_stop_is_under_way(tmp_path: Path) -> None:
    with JobStore.create(tmp_path / "job", "r") as s:
        assert s.last_event(LAUNCH_REASONS) is None
        s.add_event(_event(Reason.JOB_CREATED, 0))
        s.add_event(_event(Reason.STOP_REQUESTED, 1, {"signal": "SIGTERM", "grace_s": 30}))
        for _ in range(50):
            s.add_event(_event(Reason.CHECKPOINT_SAVED, 2))
        last = s.last_event(LAUNCH_REASONS)
        assert last is not None and last.reason == Reason.STOP_REQUESTED.value
        assert stop_under_way("running", last) == {
            "requested_at": "2026-12-07T01:01:00.000+00:00", "signal": "SIGTERM", "grace_s": 30}
        # a job that reads ended (stopped, or lost in its stop) has none under way
        assert stop_under_way("lost", last) is None
        assert stop_under_way("stopped", last) is None
        s.add_event(_event(Reason.JOB_RELAUNCHED, 3))  # the stop was of the launch before
        relaunched = s.last_event(LAUNCH_REASONS)
        assert relaunched is not None and relaunched.reason == Reason.JOB_RELAUNCHED.value
        assert stop_under_way("running", relaunched) is None
        assert s.last_event(HANG_REASONS) is None


def test_the_newest_launch_event_is_read_through_the_index(tmp_path: Path) -> None:
    """The query JobStore.last_event runs searches the index by reason, not every event
    newest first until a launch event (a long job's JobCreated lies under hundreds of
    thousands of others)."""
    with JobStore.create(tmp_path / "job", "r") as s:
        s.add_event(_event(Reason.JOB_CREATED, 0))
        ran: list[str] = []
        s._conn.set_trace_callback(ran.append)
        s.last_event(LAUNCH_REASONS)
        s._conn.set_trace_callback(None)
        (query,) = [q for q in ran if q.lstrip().upper().startswith("SELECT")]
        plan = " ".join(str(r) for r in s._conn.execute(f"EXPLAIN QUERY PLAN {query}"))
    assert "USING INDEX events_by_reason" in plan, plan
