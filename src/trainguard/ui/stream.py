"""One server-sent-event stream per job page (browsers allow 6 connections per host on
HTTP/1.1, so everything rides on one):

- `event: event` with `id:` = the event's row id, for every new job event (ids only grow,
  so a reconnecting EventSource's `Last-Event-ID` says exactly what it missed: the rows
  after it are sent again);
- `event: job` (no id) with the job's live parts (state, attempts and their recover records,
  ranks, nodes) whenever they change, first on connect;
- `event: end` once the job has ended and every event is out (the page closes the stream;
  an EventSource would otherwise reconnect for ever);
- `: ping` comments every PING_S of silence, so proxies keep the connection.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio.to_thread
from starlette.requests import Request

from trainguard.controller.store import JobStore
from trainguard.records import Event
from trainguard.ui.eventlog import PAGE, EventLog
from trainguard.ui.jobs import live_parts

POLL_S = 0.5
PING_S = 15.0
RETRY_MS = 2000
BACKLOG = 200  # events a page that has seen none gets first


def frame(kind: str, data: Any, eid: int | None = None) -> str:
    """One SSE message; JSON on one `data:` line (json.dumps writes no newline)."""
    head = f"event: {kind}\n" + (f"id: {eid}\n" if eid is not None else "")
    return f"{head}data: {json.dumps(data, separators=(',', ':'))}\n\n"


def event_doc(eid: int, ev: Event) -> dict[str, Any]:
    return {"id": eid, **ev.to_dict()}


def start_after(request: Request, newest: int) -> int:
    """Where a stream starts: after `Last-Event-ID` (a reconnect), or `?after=N`, else
    the newest BACKLOG events."""
    for raw in (request.headers.get("last-event-id"), request.query_params.get("after")):
        if raw is not None and raw.strip().isdigit():
            return int(raw.strip())
    return max(newest - BACKLOG, 0)


@dataclass
class _Poll:
    events: list[tuple[int, Event]]
    parts: dict[str, Any]
    ended: bool  # read before the events: nothing after these will come


class JobFeed:
    """The reads behind one stream: a store and an event log held open while it lasts."""

    def __init__(self, job_dir: Path) -> None:
        self.store = JobStore.open(job_dir)
        try:
            self.log = EventLog(job_dir)
        except BaseException:
            self.store.close()
            raise

    def poll(self, after: int) -> _Poll:
        meta = self.store.meta()
        parts = live_parts(self.store, meta, self.store.running_records())
        return _Poll(self.log.after(after, PAGE), parts, bool(parts["ended"]))

    def close(self) -> None:
        self.log.close()
        self.store.close()


async def job_stream(request: Request, feed: JobFeed) -> AsyncIterator[str]:
    """The frames of one job page's stream, until the client goes or the job has ended;
    closes `feed` at the end."""
    try:
        last = start_after(request, await anyio.to_thread.run_sync(feed.log.last_id))
        yield f"retry: {RETRY_MS}\n\n"
        shown: str | None = None
        quiet_since = time.monotonic()
        while True:
            got = await anyio.to_thread.run_sync(feed.poll, last)
            out = [frame("event", event_doc(i, ev), i) for i, ev in got.events]
            if got.events:
                last = got.events[-1][0]
            parts = json.dumps(got.parts, sort_keys=True)
            if parts != shown:
                shown = parts
                out.append(frame("job", got.parts))
            if got.ended and not got.events:
                yield "".join(out) + frame("end", {"last_id": last})
                return
            if out:
                yield "".join(out)
                quiet_since = time.monotonic()
            elif time.monotonic() - quiet_since >= PING_S:
                yield ": ping\n\n"
                quiet_since = time.monotonic()
            if len(got.events) < PAGE:  # caught up: wait for more
                if await request.is_disconnected():
                    return
                await anyio.sleep(POLL_S)
    finally:
        await anyio.to_thread.run_sync(feed.close)
