"""A lost job whose launcher's pid another process took is lost, not running (walk-through
30, #10: pids wrap within an hour on a busy machine; a job killed last night read
`restarting` in status, ls, the metrics and the dashboard, and prune never took it). The store
records the launcher's start time with its pid."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

from trainguard.controller.store_rows import launcher_dead, process_started, shown_state


def meta_of(pid: int, started: int | None) -> dict[str, object]:
    return {"state": "restarting", "launcher_pid": pid, "launcher_host": socket.gethostname(),
            "launcher_started": started}


def test_a_launcher_pid_another_process_took_is_a_dead_launcher() -> None:
    me = os.getpid()
    started = process_started(me)
    assert isinstance(started, int)
    assert not launcher_dead(meta_of(me, started))
    assert launcher_dead(meta_of(me, started - 1))  # this pid, another process: reused
    assert shown_state(meta_of(me, started - 1)) == "lost"
    assert not launcher_dead(meta_of(me, None))  # a store from before the field: pid only


def test_an_ended_launcher_is_dead_whatever_its_start_time() -> None:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    started = process_started(p.pid)
    p.wait()
    assert launcher_dead(meta_of(p.pid, started))
    assert process_started(p.pid) is None
