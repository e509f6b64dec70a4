"""One server-sent-event stream per job page (browsers allow 6 connections per host on
HTTP/1.1, so everything rides on one):

- `event: event` with `id:` = the event's row id, for every new job event (ids only grow,
  so a reconnecting EventSource's `Last-Event-ID` says exactly what it missed: the rows
  after it are sent again);
- `event: job` (no id) with the job's live parts (state, attempts and their recover records,
  ranks, nodes): first on connect, then whenever they change, before the events of the same
  read (they were read first);
- `event: end` once the job has ended and every event is out (the page closes the stream;
  an EventSource would otherwise reconnect for ever);
- `: ping` comments every PING_S of silence, so proxies keep the connection.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio.to_thread
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from trainguard.controller.store import JobStore
from trainguard.errors import StoreError
from trainguard.records import Event
from trainguard.ui.eventlog import PAGE, EventLog
from trainguard.ui.jobs import live_parts

log = logging.getLogger(__name__)
POLL_S = 0.5
PING_S = 15.0
RETRY_MS = 2000
BACKLOG = 200  # events a page that has seen none gets first
MAX_INT = 2**63 - 1  # SQLite's largest integer: event ids and every number asked for


def frame(kind: str, data: Any, eid: int | None = None) -> str:
    """One SSE message; JSON on one `data:` line (json.dumps writes no newline)."""
    head = f"event: {kind}\n" + (f"id: {eid}\n" if eid is not None else "")
    return f"{head}data: {json.dumps(data, separators=(',', ':'))}\n\n"


def event_doc(eid: int, ev: Event) -> dict[str, Any]:
    return {"id": eid, **ev.to_dict()}


def whole_number(name: str, raw: str, low: int = 0, high: int = MAX_INT) -> int:
    """`raw` as an int in low..high, else HTTP 400 naming the range (SQLite's integers end
    at MAX_INT: a bigger one made the query fail with a 500, walk-through 32 #10)."""
    text = raw.strip()
    shown = repr(text) if len(text) <= 24 else f"{text[:20]!r}... ({len(text)} characters)"
    if not (text.isascii() and text.lstrip("-").isdigit()):
        raise HTTPException(400, f"{name}={shown} is not a whole number")
    if len(text.lstrip("-0")) > len(str(high)) or not low <= int(text) <= high:
        raise HTTPException(400, f"{name}={shown} is out of range: give {low} to {high}")
    return int(text)


def start_after(request: Request, newest: int) -> int:
    """Where a stream starts: after `Last-Event-ID` (a reconnect), or `?after=N`, else
    the newest BACKLOG events (an empty value is not given, as on `/events`). A value that is
    no whole number in range is HTTP 400 naming it, as `/events` answers (walk-through 34
    #7: `?after=abc` and `Last-Event-ID: x` started a stream at the backlog)."""
    for name, raw in (("Last-Event-ID", request.headers.get("last-event-id")),
                      ("after", request.query_params.get("after"))):
        if raw is not None and raw != "":
            return whole_number(name, raw)
    return max(newest - BACKLOG, 0)


@dataclass
class Poll:
    """One read of a job for its stream (JobFeed.poll)."""

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

    def poll(self, after: int) -> Poll:
        meta = self.store.meta()
        parts = live_parts(self.store, meta, self.store.running_records())
        return Poll(self.log.after(after, PAGE), parts, bool(parts["ended"]))

    def close(self) -> None:
        try:
            self.log.close()
        finally:
            self.store.close()


class FeedResponse(StreamingResponse):
    """A stream of `job_stream` frames that closes its feed however it ends. A client that
    goes away cancels the response (and may leave the generator suspended, never resumed);
    closing in the generator's `finally` then never ran (walk-through 32 #6: every dropped
    stream kept its two store connections), so the close is here, shielded."""

    def __init__(self, request: Request, feed: JobFeed, after: int, first: Poll,
                 **kw: Any) -> None:
        super().__init__(job_stream(request, feed, after, first), **kw)
        self.feed = feed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(self.feed.close)


async def job_stream(request: Request, feed: JobFeed, after: int,
                     first: Poll) -> AsyncIterator[str]:
    """The frames of one job page's stream from after event `after`, `first` its first read
    (done before the response began: a store that cannot be read is a 503, not a 200 cut
    off), until the client goes or the job has ended (FeedResponse closes `feed`). A store
    that cannot be read later ends the stream: the client's reconnect gets the 503."""
    last = after
    yield f"retry: {RETRY_MS}\n\n"
    shown: str | None = None
    quiet_since = time.monotonic()
    got: Poll | None = first
    while True:
        if got is None:
            try:
                got = await anyio.to_thread.run_sync(feed.poll, last)
            except StoreError as e:
                log.warning("stream of %s ended: %s", feed.store.job_dir, e)
                return
        parts = json.dumps(got.parts, sort_keys=True)
        out = [] if parts == shown else [frame("job", got.parts)]  # first: read first
        shown = parts
        out += [frame("event", event_doc(i, ev), i) for i, ev in got.events]
        if got.events:
            last = got.events[-1][0]
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
        got = None
