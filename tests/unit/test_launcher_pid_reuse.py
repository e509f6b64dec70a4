"""A lost job whose launcher's pid another process took is lost, not running (walk-through
30, #10: pids wrap within an hour on a busy machine; a job killed last night read
`restarting` in status, ls, the metrics and the dashboard, and prune never took it). The store
records the launcher's start time with its pid."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

from trainguard.controller.shown import launcher_dead, process_started, shown_state


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


def test_a_job_is_created_when_its_launcher_started(tmp_path: Path) -> None:
    """Walk-through 30, #11: the job's wall time ran from its store's creation, 0.7-5.7 s
    after the command began (imports, checks, the job dir): time no goodput cause held."""
    import time
    from datetime import datetime

    from tests.unit.helpers import tg
    from trainguard.controller.shown import launched_at
    from trainguard.controller.store import JobStore

    assert launched_at().timestamp() <= time.time()
    (tmp_path / "t.py").write_text("print('step 1', flush=True)\n")
    before = time.time()
    assert tg("run", "--nproc-per-node", "1", "--job-dir", "j", "t.py",
              cwd=tmp_path).returncode == 0
    with JobStore.open(tmp_path / "j") as s:
        created = datetime.fromisoformat(str(s.meta()["created_at"])).timestamp()
    assert before - 0.05 <= created <= before + 0.5, created - before  # the launcher's start

