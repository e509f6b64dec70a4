"""Nits the seventeenth new-user walk-through met, with the real command."""

from __future__ import annotations

import json
from pathlib import Path

from tests.unit.helpers import tg


def test_status_says_a_budget_is_off_when_the_job_does_not_use_its_rung(
        tmp_path: Path) -> None:
    """`hang_restarts_in_a_row 0/3` read as if a confirmed hang would be restarted, though
    --restart-on-hang was off; the launcher records which rungs the job's flags leave out."""
    (tmp_path / "t.py").write_text("print('step 1', flush=True)\n")
    r = tg("run", "--nproc-per-node", "1", "--job-dir", "j", "--operator-reexecution", "t.py",
           cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    doc = json.loads(tg("status", "j", "--json", cwd=tmp_path).stdout)
    assert doc["budgets_off"] == ["hang_restarts_in_a_row"]
    out = tg("status", "j", cwd=tmp_path).stdout
    assert "hang_restarts_in_a_row off  step_retries 0/10" in out, out
    r = tg("run", "--nproc-per-node", "1", "--job-dir", "j", "--restart-on-hang", "t.py",
           cwd=tmp_path)  # a relaunch with other flags: what this launch uses
    assert r.returncode == 0, r.stderr
    doc = json.loads(tg("status", "j", "--json", cwd=tmp_path).stdout)
    assert doc["budgets_off"] == ["step_retries"]
    # (walk-through 23) relaunching a job that had succeeded is said, as a warning
    (again,) = [e for e in json.loads(tg("events", "j", "--json", cwd=tmp_path).stdout)
                if e["reason"] == "JobRelaunched"]
    assert again["level"] == "Warning" and "it had succeeded: its script runs again" in \
        again["message"], again


def test_ui_of_a_dir_without_a_job_says_so_at_start(tmp_path: Path) -> None:
    """A typo'd job dir was listed and served without a word on the console."""
    import os
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-m", "trainguard", "ui", str(tmp_path / "nothere"),
                             "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        assert proc.stdout is not None and proc.stderr is not None
        assert "1 job(s) at http://127.0.0.1:" in proc.stdout.readline()
        note = proc.stderr.readline()
        assert f"note: no trainguard job at {tmp_path / 'nothere'} yet" in note, note
    finally:
        proc.terminate()
        proc.wait(timeout=30)


KILLED_AT_3 = ("import time\nfrom trainguard.testing.faults import inject\n"
               "for s in range(1, 30):\n    print(f'step {s}', flush=True)\n"
               "    time.sleep(0.05)\n    inject(s)\n")


def test_a_failed_jobs_advice_names_max_restarts_when_restarts_were_off_or_spent(
        tmp_path: Path) -> None:
    """Nit 6: after --max-restarts 0 and a SIGKILL, `status` said to fix the cause and run
    again, without the flag that would have restarted it (only the JobFailed event said so)."""
    import os

    (tmp_path / "t.py").write_text(KILLED_AT_3)
    env = {**os.environ, "TRAINGUARD_FAULT": "signal:KILL@step=3,rank=0,attempt=*"}
    for job, flags, hint in (
            ("off", ["--max-restarts", "0"], "auto restart was off (--max-restarts 0): give "
                                             "--max-restarts N"),
            ("spent", ["--max-restarts", "1", "--restart-backoff", "0"],
             "its 1 restart(s) were spent: a larger --max-restarts gives it more")):
        r = tg("run", "--nproc-per-node", "1", "--job-dir", job, *flags, "t.py", cwd=tmp_path,
               env=env)
        assert r.returncode == 1, r.stderr
        out = tg("status", job, cwd=tmp_path).stdout
        advice = next(ln for ln in out.splitlines() if ln.startswith("continue it:"))
        assert hint in advice, out
