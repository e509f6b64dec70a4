"""A console that stops reading without closing (a terminal paused with Ctrl-S, a stalled
pipe) used to freeze the job: the launcher's loop and the thread that reads the ranks' pipes
blocked on the full console pipe, and the ranks blocked on their own prints (the job stood at
step 60 of 2000 for as long as nobody read). Real launcher, real rank, a pipe nobody reads."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from tests.integration.conftest import TG, read_json


def test_a_console_that_does_not_read_never_stops_the_job(tmp_path: Path) -> None:
    (tmp_path / "t.py").write_text(
        "import time\nfor s in range(1, 2001):\n"
        "    print(f'step {s} ' + 'x' * 1000, flush=True)\n    time.sleep(0.002)\n")
    env = {k: v for k, v in os.environ.items() if k != "TRAINGUARD_FAULT"}
    proc = subprocess.Popen([*TG, "run", "--nproc-per-node", "1", "--job-dir", "j",
                             "--no-standby-workers", "t.py"], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        state = None
        while state != "succeeded":  # 2 MB of console lines; nobody reads them yet
            assert time.monotonic() < deadline, f"the job stood still: {state}"
            time.sleep(1)
            if (tmp_path / "j" / "trainguard.db").exists():
                state = read_json("status", tmp_path / "j").get("state")
        assert proc.stdout is not None
        out = proc.stdout.read().decode()  # now the console reads again
        assert proc.wait(timeout=60) == 0
    finally:
        proc.kill()
    lines = out.splitlines()
    # a notice where lines were dropped (a shorter batch that still fit may split a run of
    # drops in two, each with its notice)
    notices = [ln for ln in lines if "console line(s) dropped: the console was not reading"
               in ln]
    assert notices, out[-2000:]
    shown = sum(ln.startswith("[rank 0] step ") for ln in lines)
    assert shown + sum(int(n.split()[1]) for n in notices) == 2000  # each shown or counted
    assert "Info JobSucceeded: all 1 worker(s) exited 0" in out  # the last lines still fit
    log = (tmp_path / "j" / "logs" / "attempt-0" / "rank-0.log").read_text()
    assert log.count(" out step ") == 2000  # the job dir keeps every line
