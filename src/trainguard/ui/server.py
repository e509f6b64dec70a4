"""Serving the dashboard with uvicorn: the listening socket bound first (so the printed URL
has the real port, `--port 0` included), the token made when one is needed."""

from __future__ import annotations

import secrets
import socket
import sys
from pathlib import Path
from typing import TextIO

import uvicorn

from trainguard.controller.store_rows import holds_job_dirs
from trainguard.paths import DB_NAME
from trainguard.ui.app import create_app
from trainguard.ui.auth import is_loopback
from trainguard.ui.catalog import Catalog


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on host:port (OSError when it cannot be had)."""
    family, kind, proto, _, addr = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(addr)
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def url_of(sock: socket.socket, host: str, token: str | None) -> str:
    """The URL to print; a wildcard address (every interface) shows this host's name."""
    port = sock.getsockname()[1]
    shown = socket.gethostname() if host in ("", "0.0.0.0", "::") else host
    shown = f"[{shown}]" if ":" in shown else shown
    return f"http://{shown}:{port}/" + (f"?token={token}" if token else "")


def serve(catalog: Catalog, host: str, port: int, token: str | None,
          out: TextIO = sys.stdout) -> None:
    """Serve until SIGINT/SIGTERM. Off loopback a token is required: `token`, or a new one,
    printed in the URL."""
    if token is None and not is_loopback(host):
        token = secrets.token_urlsafe(24)
    sock = bind(host, port)
    app = create_app(catalog, token=token)
    # proxy_headers off: uvicorn would otherwise take the client's address from any
    # loopback client's X-Forwarded-For, and the owner check with it (review of
    # walk-through 32 #1); a dashboard behind a proxy uses --token
    config = uvicorn.Config(app, log_level="warning", access_log=False, proxy_headers=False,
                            timeout_graceful_shutdown=1, lifespan="off")
    count = len(catalog.jobs())
    print(f"trainguard ui: {count} job(s) at {url_of(sock, host, token)}", file=out,
          flush=True)
    for note in missing_notes(catalog.dirs):
        print(note, file=sys.stderr, flush=True)
    try:
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        sock.close()


def missing_notes(dirs: list[Path]) -> list[str]:
    """A note for each job dir given that holds no job yet: a typo would go unnoticed in a
    row of the page; a dir of job dirs is shown with --root (walk-through 39)."""
    out = []
    for d in dirs:
        if not (d / DB_NAME).is_file():
            fix = (f"it holds job dirs: `trainguard ui --root {d}` shows them all"
                   if holds_job_dirs(d) else "check the path if you meant a job that ran")
            out.append(f"trainguard ui: note: no trainguard job at {d} yet (no {DB_NAME}): "
                       f"listed, and shown once a job runs there; {fix}")
    return out
