"""Wire one single-node job: job dir, store, node agent, controller. Returns the exit code."""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

from trainguard.agent import ConsoleOptions, NodeAgent
from trainguard.controller import Controller
from trainguard.errors import SpecError
from trainguard.paths import JobPaths
from trainguard.recorder import Recorder, console_printer
from trainguard.spec import JobSpec
from trainguard.store import JobStore

LOCK_NAME = ".lock"


def launch(spec: JobSpec, argv: list[str], marker: str) -> int:
    check_master_addr(spec.master_addr)
    paths = JobPaths.for_spec(spec, Path.cwd())
    try:
        paths.make()
    except OSError as e:
        raise SpecError("--job-dir", f"cannot create {e.filename or paths.job_dir} "
                        f"({e.strerror})", "choose a writable directory") from None
    filt = frozenset(spec.local_ranks_filter) if spec.local_ranks_filter is not None else None
    with job_lock(paths.job_dir), JobStore.create(paths.job_dir, spec.run_id) as store:
        if spec.multi_node:
            from trainguard.cluster.launch import launch_cluster

            code = launch_cluster(spec, argv, marker, paths, store)
            _job_dir_line(paths)
            return code
        agent = NodeAgent("node-0", sys.stdout, ConsoleOptions(spec.redirects, filt),
                          spec.step_pattern, marker)
        recorder = Recorder(spec, paths, store, argv, on_event=console_printer())
        code = Controller(recorder, agent).run()
    _job_dir_line(paths)
    return code


def _job_dir_line(paths: JobPaths) -> None:
    with contextlib.suppress(OSError, ValueError):
        print(f"[trainguard] job dir: {paths.job_dir}  (trainguard recovery {paths.job_dir})",
              file=sys.stderr, flush=True)


@contextlib.contextmanager
def job_lock(job_dir: Path) -> Iterator[None]:
    """One launcher per job dir: a second one is refused, naming the one that runs."""
    path = job_dir / LOCK_NAME
    with open(path, "a+", encoding="utf-8") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip() or "another process"
            raise SpecError("--job-dir", f"{job_dir} is in use by a running launcher "
                            f"(pid {holder})", "wait for it to end, or use another "
                            "--job-dir / --run-id") from None
        f.seek(0)
        f.truncate()
        f.write(str(os.getpid()))
        f.flush()
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def check_master_addr(addr: str) -> None:
    """The rendezvous address must be one this node can listen on."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((addr, 0))
    except OSError as e:
        raise SpecError("--master-addr", f"cannot listen on {addr!r} on this node "
                        f"({e.strerror or e})", "use 127.0.0.1 or one of this node's "
                        "addresses") from None
