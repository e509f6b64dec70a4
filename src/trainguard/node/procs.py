"""Worker processes: spawn each in its own session, stop them all with one deadline, reap.

Stopping: SIGTERM (and SIGCONT, as systemd does, for a stopped one) to every process group,
one shared grace period, SIGKILL to the groups still alive, then reap (the launcher is a
child subreaper, so grandchildren orphaned by a dead worker come back to it and are reaped
too). If the launcher itself dies, even by SIGKILL, the guardian (trainguard.node.guardian,
a tiny process in its own session) sees its pipe close and kills every group it was told
about.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from datetime import datetime

import psutil

from trainguard.records import utcnow
from trainguard.worker.contract import ENV_MARKER

log = logging.getLogger(__name__)

_PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> bool:
    """Make orphaned descendants re-parent to this process (Linux); False where unsupported."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


class Guardian:
    """Kills registered process groups when this process dies, however it dies."""

    def __init__(self, marker: str) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "trainguard.node.guardian", marker],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, start_new_session=True,
        )
        self.groups: set[int] = set()  # watched now (the worker channel admits these)

    def _send(self, line: str) -> None:
        stdin = self._proc.stdin
        if stdin is None:
            return
        with contextlib.suppress(BrokenPipeError, ValueError):
            stdin.write(f"{line}\n".encode())
            stdin.flush()

    def watch(self, pgid: int) -> None:
        self.groups.add(pgid)
        self._send(f"+{pgid}")

    def forget(self, pgid: int) -> None:
        self.groups.discard(pgid)
        self._send(f"-{pgid}")

    def free_on_death(self, path: str) -> None:
        """Remove `path` (a shared-memory region) when this process dies without closing."""
        self._send(f"={path}")

    @property
    def pid(self) -> int:
        return self._proc.pid

    def close(self) -> None:
        """Normal shutdown: tell the guardian everything is reaped and let it exit."""
        self._send("exit")
        if self._proc.stdin is not None:
            with contextlib.suppress(BrokenPipeError):
                self._proc.stdin.close()
        try:
            self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


def spawn(argv: list[str], env: dict[str, str], cwd: str | None,
          stdin: int = subprocess.DEVNULL, pass_fds: tuple[int, ...] = ()
          ) -> subprocess.Popen[bytes]:
    """Start one worker in a new session with its stdout/stderr on pipes (and `pass_fds`
    left open in it)."""
    return subprocess.Popen(
        argv, env=env, cwd=cwd, stdin=stdin,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        start_new_session=True, close_fds=True, pass_fds=pass_fds,
    )


def signal_group(pgid: int, sig: int) -> bool:
    """Send `sig` to a process group; False when the group is gone."""
    try:
        os.killpg(pgid, sig)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        log.warning("no permission to signal process group %s", pgid)
        return False


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def reap(known: dict[int, subprocess.Popen[bytes]], idtype: int = os.P_ALL, id_: int = 0) -> None:
    """Reap exited children (of one group, or all): ours via Popen, orphans directly.

    Peeks with WNOWAIT first so a worker's exit status always reaches its Popen.
    """
    while True:
        try:
            info = os.waitid(idtype, id_, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return
        if info is None:
            return
        proc = known.get(info.si_pid)
        if proc is not None:
            proc.poll()
        else:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(info.si_pid, 0)


def wait_any_exit(children: list[subprocess.Popen[bytes]], timeout: float) -> None:
    """Block until one of the children exits or `timeout` passes (pidfds where available)."""
    fds: list[int] = []
    try:
        for p in children:
            try:
                fds.append(os.pidfd_open(p.pid))
            except ProcessLookupError:
                return  # already gone: nothing to wait for
        select.select(fds, [], [], timeout)
    except (AttributeError, OSError):  # no pidfd_open here: plain sleep
        time.sleep(timeout)
    finally:
        for fd in fds:
            os.close(fd)


def exit_status(pid: int) -> int | None:
    """A child's exit status as Popen reports it, without reaping it (None: still running).

    Leaving an exited worker unreaped until the attempt is stopped keeps its pid, and so its
    process group id, ours: signalling the group later can never hit a stranger.
    """
    try:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return None
    if info is None:
        return None
    return info.si_status if info.si_code == os.CLD_EXITED else -info.si_status


def reap_strays(keep: set[int]) -> None:
    """Reap zombie children we do not track (a dead worker's orphans, re-parented to us)."""
    try:
        children = psutil.Process().children()
    except psutil.Error:
        return
    for c in children:
        if c.pid in keep:
            continue
        try:
            if c.status() == psutil.STATUS_ZOMBIE:
                os.waitpid(c.pid, os.WNOHANG)
        except (psutil.Error, ChildProcessError):
            continue


def kill_marked(marker: str) -> int:
    """SIGKILL every process whose environment has TRAINGUARD_MARKER=marker (not us)."""
    if not marker:
        return 0
    me, killed = os.getpid(), 0
    for p in psutil.process_iter(["pid"]):
        if p.pid == me:
            continue
        try:
            if p.environ().get(ENV_MARKER) == marker:
                p.kill()
                killed += 1
        except (psutil.Error, OSError):
            continue
    return killed


def stop_groups(
    procs: Iterable[subprocess.Popen[bytes]], grace_s: float, marker: str = "",
    poll_s: float = 0.05, cut_short: Callable[[], bool] = lambda: False,
    meanwhile: Callable[[], None] = lambda: None, meanwhile_every_s: float = 1.0,
    longer: tuple[float, Callable[[], bool]] | None = None,
) -> dict[int, datetime]:
    """SIGTERM every group, wait up to one shared grace period (or until `cut_short()`: a
    second Ctrl-C), SIGKILL the rest, reap; then kill any process still carrying the job's
    marker (children that left their group). `meanwhile()` runs every `meanwhile_every_s`
    of the grace period (ranks that ignore SIGTERM train on: their progress is reported).
    `longer` = (seconds, still): the grace period goes on up to that long from the SIGTERM
    while `still()` (a rank saves on the way out). Returns when each leader was seen
    exited (to within `poll_s`)."""
    procs = list(procs)
    known = {p.pid: p for p in procs}
    exited: dict[int, datetime] = {}

    def stamp() -> None:
        for p in procs:
            if p.returncode is not None and p.pid not in exited:
                exited[p.pid] = utcnow()
    pgids = list(known)  # each worker leads its own session and group
    for pgid in pgids:
        signal_group(pgid, signal.SIGTERM)
        # a stopped process (SIGSTOP, Ctrl-Z, a debugger) acts on SIGTERM only once it runs
        # again: without this it cost the whole grace period, then SIGKILL (walk-through 24)
        signal_group(pgid, signal.SIGCONT)

    next_at = time.monotonic() + meanwhile_every_s

    def wait_a_little(left_s: float) -> None:
        nonlocal next_at
        stamp()
        if time.monotonic() >= next_at:
            next_at = time.monotonic() + meanwhile_every_s
            meanwhile()
        leaders = [p for p in procs if p.returncode is None]
        if leaders:
            wait_any_exit(leaders, min(poll_s, left_s))
        else:
            time.sleep(min(poll_s, left_s))

    began = time.monotonic()
    done = _reap_until_gone(known, pgids, began + grace_s, wait_a_little, cut_short)
    if not done and longer is not None and longer[1]() and not cut_short():
        _reap_until_gone(known, pgids, began + longer[0], wait_a_little,
                         lambda: cut_short() or not longer[1]())
    stamp()
    for pgid in pgids:
        if group_alive(pgid):
            log.info("process group %s outlived the grace period; sending SIGKILL", pgid)
            signal_group(pgid, signal.SIGKILL)
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            log.warning("pid %s does not die even after SIGKILL (uninterruptible I/O?)", p.pid)
    if not _reap_until_gone(known, pgids, time.monotonic() + 5.0,
                            lambda _left_s: time.sleep(0.02)):
        log.warning("process groups %s still have members after SIGKILL", pgids)
    if kill_marked(marker):
        log.info("killed processes of this job that had left their process group")
        time.sleep(0.05)
        reap(known)
    stamp()
    return exited


def _reap_until_gone(
    known: dict[int, subprocess.Popen[bytes]], pgids: list[int], deadline: float,
    wait: Callable[[float], None], cut_short: Callable[[], bool] = lambda: False,
) -> bool:
    """Reap every group's exited members until no group has one alive (True) or the
    monotonic `deadline` passes or `cut_short()` (False); `wait(seconds left)` between
    rounds."""
    while time.monotonic() < deadline and not cut_short():
        for pgid in pgids:
            reap(known, os.P_PGID, pgid)
        if not any(group_alive(g) for g in pgids):
            return True
        wait(max(deadline - time.monotonic(), 0))
    return False
