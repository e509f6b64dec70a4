"""The dashboard's routes: two pages (job list, job view), the JSON API they read, one event
stream per job page, and the static assets shipped in the package. Read-only: GET only."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from trainguard.controller.store import JobStore
from trainguard.errors import StoreError
from trainguard.ui import hangs, jobfiles, jobs, logview
from trainguard.ui.auth import Guard
from trainguard.ui.catalog import Catalog
from trainguard.ui.eventlog import PAGE, EventLog
from trainguard.ui.goodput_view import GoodputCache
from trainguard.ui.stream import FeedResponse, JobFeed, event_doc, start_after, whole_number

STATIC = Path(__file__).resolve().parent / "static"
_NO_CACHE = {"cache-control": "no-store"}
_PAGE_HEADERS = {  # the pages load only their own scripts and styles, and leak no URL
    **_NO_CACHE, "content-security-policy": "default-src 'self'; img-src 'self' data:; "
    "frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
    "referrer-policy": "no-referrer", "x-content-type-options": "nosniff",
}


def create_app(catalog: Catalog, token: str | None = None) -> Starlette:
    """The ASGI app over the catalog's jobs; `token` None: loopback Hosts only."""
    def page(name: str) -> Callable[[Request], Response]:
        def serve(request: Request) -> Response:
            if "jid" in request.path_params:
                _job_dir(request)
            return FileResponse(STATIC / name, headers=_PAGE_HEADERS)
        return serve

    routes = [
        Route("/", page("index.html")),
        Route("/jobs/{jid}", page("job.html")),
        Route("/api/jobs", list_jobs),
        Route("/api/jobs/{jid}", job_detail),
        Route("/api/jobs/{jid}/events", job_events),
        Route("/api/jobs/{jid}/logs", job_logs),
        Route("/api/jobs/{jid}/logs/{attempt}/{rank}", rank_log),  # numbers: whole_number
        Route("/api/jobs/{jid}/hangs", job_hangs),
        Route("/api/jobs/{jid}/goodput", job_goodput),
        Route("/api/jobs/{jid}/stream", job_events_stream),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ]
    app = Starlette(routes=routes, middleware=[Middleware(Guard, token=token)],
                    exception_handlers={HTTPException: _http_error, StoreError: _store_error,
                                        jobfiles.Refused: _refused})
    app.state.catalog = catalog
    app.state.goodput = GoodputCache()
    return app


def _json(doc: Any) -> JSONResponse:
    return JSONResponse(doc, headers=_NO_CACHE)


async def _http_error(request: Request, exc: Exception) -> Response:
    status = exc.status_code if isinstance(exc, HTTPException) else 500
    detail = exc.detail if isinstance(exc, HTTPException) else str(exc)
    return JSONResponse({"error": detail}, status_code=status)


async def _store_error(request: Request, exc: Exception) -> Response:
    return JSONResponse({"error": str(exc)}, status_code=503)


async def _refused(request: Request, exc: Exception) -> Response:
    """A file the dashboard does not serve (ui/jobfiles.py): 403 with why."""
    return JSONResponse({"error": str(exc)}, status_code=403)


def _job_dir(request: Request) -> Path:
    jid = request.path_params["jid"]
    found: Path | None = request.app.state.catalog.find(jid)
    if found is None:
        raise HTTPException(404, f"no job {jid!r} on this dashboard")
    jobfiles.check_store(found)  # its store is its own, not a symlink to another's
    return found


def _int(request: Request, name: str, default: int | None, low: int = 0) -> int | None:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return default
    return whole_number(name, raw, low)


def list_jobs(request: Request) -> Response:
    catalog: Catalog = request.app.state.catalog
    return _json([jobs.summary(jid, d, request.app.state.goodput)
                  for jid, d in catalog.jobs().items()])


def job_detail(request: Request) -> Response:
    return _json(jobs.detail(request.path_params["jid"], _job_dir(request),
                             request.app.state.goodput))


def job_events(request: Request) -> Response:
    """`?after=N` (the next page after an id, oldest first) or the newest `limit`."""
    job_dir = _job_dir(request)
    after = _int(request, "after", None)
    limit = _int(request, "limit", PAGE) or 0
    with EventLog(job_dir) as log:
        got = log.after(after, limit) if after is not None else log.newest(limit)
        last = log.last_id()
    return _json({"events": [event_doc(i, ev) for i, ev in got], "last_id": last})


def job_logs(request: Request) -> Response:
    return _json(logview.list_logs(_job_dir(request)))


def rank_log(request: Request) -> Response:
    """`?tail=N` (200) lines from the end, or `?line=L&context=C` (20) around line L."""
    job_dir = _job_dir(request)
    # parsed here, not by the route's `int` convertor: it ran int() on 5,000 digits (a 500
    # with a traceback; review of walk-through 32 #7)
    attempt = whole_number("attempt", request.path_params["attempt"])
    rank = whole_number("rank", request.path_params["rank"])
    lines = _int(request, "tail", 200) or 0
    line = _int(request, "line", None, low=1)
    context = _int(request, "context", 20) or 0
    try:
        doc = logview.read_log(job_dir, attempt, rank, lines=lines, line=line,
                               context=context)
    except FileNotFoundError:
        raise HTTPException(404, f"no log of rank {rank} in attempt {attempt}") from None
    return _json(doc)


def job_hangs(request: Request) -> Response:
    return _json(hangs.hangs(_job_dir(request)))


def job_goodput(request: Request) -> Response:
    job_dir = _job_dir(request)
    with JobStore.open(job_dir) as store, EventLog(job_dir) as log:
        return _json(jobs.goodput_for(request.app.state.goodput, job_dir, store, store.meta(),
                                      log.last_id()))


def job_events_stream(request: Request) -> Response:
    feed = JobFeed(_job_dir(request))  # a job that cannot be read fails here, not mid-stream
    try:  # so do a bad Last-Event-ID or ?after= (a 400) and a first read that fails (a 503)
        after = start_after(request, feed.log.last_id())
        first = feed.poll(after)
    except BaseException:
        feed.close()
        raise
    return FeedResponse(request, feed, after, first, media_type="text/event-stream",
                        headers={**_NO_CACHE, "x-accel-buffering": "no"})
