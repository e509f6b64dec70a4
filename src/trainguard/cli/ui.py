"""`trainguard ui [JOB_DIR ...] [--root DIR]`: a read-only web dashboard of jobs
(docs/ui.md). Exit codes: 0 stopped (Ctrl-C), 2 bad arguments or the port cannot be had."""

from __future__ import annotations

import argparse
import errno
import socket
from pathlib import Path

from trainguard.cli.fmt import complain
from trainguard.exitcodes import ExitCode
from trainguard.paths import DEFAULT_RUNS_DIR
from trainguard.ui.catalog import Catalog

DEFAULT_PORT = 8642


def add_ui_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    text = "serve a read-only web dashboard of jobs (loopback by default)"
    p = sub.add_parser("ui", help=text, description=text + "; see docs/ui.md.")
    p.add_argument("job_dirs", nargs="*", metavar="JOB_DIR",
                   help="job dirs to show (printed by `trainguard run`); with none and no "
                   f"--root: every job under ./{DEFAULT_RUNS_DIR}, the default job dirs")
    p.add_argument("--root", metavar="DIR",
                   help="also show every job dir under DIR (two levels down), looked for "
                        "again on each listing")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (127.0.0.1); any other than loopback needs "
                        "a token, made and printed unless --token is given")
    p.add_argument("--port", type=int, default=DEFAULT_PORT,
                   help=f"port to listen on ({DEFAULT_PORT}; 0: any free one)")
    p.add_argument("--token", help="the token every request must carry (?token= or "
                                    "Authorization: Bearer); default: none on loopback, a "
                                    "new one elsewhere")
    p.set_defaults(func=_run)


MIN_TOKEN_CHARS = 16  # a made one (secrets.token_urlsafe(24)) has 32


def _run(ns: argparse.Namespace) -> int:
    if not ns.job_dirs and ns.root is None:  # the jobs `trainguard run` put in the default
        if not Path(DEFAULT_RUNS_DIR).is_dir():
            complain("ui", f"no JOB_DIR given and ./{DEFAULT_RUNS_DIR} (where `trainguard run` "
                     "puts a job given no --job-dir) is not here. Fix: trainguard ui JOB_DIR, or "
                     "trainguard ui --root DIR")
            return ExitCode.USAGE
        ns.root = DEFAULT_RUNS_DIR
        complain("ui", f"every job under ./{DEFAULT_RUNS_DIR} (the default job dirs)", "note")
    if ns.root is not None and not Path(ns.root).is_dir():
        complain("ui", f"--root {ns.root} is not a directory")
        return ExitCode.USAGE
    if ns.token is not None and len(ns.token) < MIN_TOKEN_CHARS:
        complain("ui", f"--token has {len(ns.token)} characters: one that short can be guessed "
                 f"and guards nothing. Fix: give {MIN_TOKEN_CHARS} or more (python3 -c "
                 "'import secrets; print(secrets.token_urlsafe())'), or leave --token out: "
                 "off loopback a random one is made and printed")
        return ExitCode.USAGE
    if not 0 <= ns.port <= 65535:
        complain("ui", f"--port {ns.port} is not a TCP port (0-65535; 0 picks a free one)")
        return ExitCode.USAGE
    from trainguard.ui.server import serve  # starlette, uvicorn: only for this command

    catalog = Catalog([Path(d) for d in ns.job_dirs],
                      Path(ns.root) if ns.root is not None else None)
    try:
        serve(catalog, ns.host, ns.port, ns.token or None)
    except OSError as e:
        fix = ("give --host an address of this machine (127.0.0.1, or 0.0.0.0 for all)"
               if e.errno in (errno.EADDRNOTAVAIL, socket.EAI_NONAME) or isinstance(
                   e, socket.gaierror) else "pick another --port (0 picks a free one)")
        complain("ui", f"cannot listen on {ns.host}:{ns.port}: {e}. Fix: {fix}")
        return ExitCode.USAGE
    except KeyboardInterrupt:
        pass
    return ExitCode.SUCCESS
