"""What the third new-user walk-through found, each through the real command
(`python -m trainguard`, a real job store and files)."""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

from tests.unit.helpers import TG, tg
from trainguard.controller.store import JobStore
from trainguard.exitcodes import ExitCode
from trainguard.records import Event, Involved, Level, utcnow


def a_job(job: Path) -> Path:
    with JobStore.create(job, "run-n") as s:
        s.set_meta(state="succeeded", log_dir=str(job / "logs"))
        log = job / "logs" / "attempt-0" / "rank-0.log"
        log.parent.mkdir(parents=True)
        log.write_text("2026-01-01T00:00:00+00:00 out hello\n")
        s.add_event(Event(utcnow(), Level.INFO, "JobCreated", "job created", Involved("run-n")))
    return job


def test_read_commands_piped_into_a_reader_that_stops_end_quietly(tmp_path: Path) -> None:
    job = a_job(tmp_path / "j")
    for cmd in (["status", str(job)], ["status", "--json", str(job)], ["events", str(job)],
                ["diagnose", str(job)], ["logs", str(job)], ["ls", str(tmp_path)]):
        read, write = os.pipe()
        os.close(read)  # `| head` that has already gone
        r = subprocess.run([*TG, *cmd], stdout=write, stderr=subprocess.PIPE, text=True,
                           timeout=60, check=False)
        os.close(write)
        assert r.stderr == "", cmd
        assert r.returncode == ExitCode.OUTPUT_CLOSED, cmd


def test_status_of_a_hung_job_names_its_ranks_as_a_list_people_read(tmp_path: Path) -> None:
    job = tmp_path / "hung"
    with JobStore.create(job, "run-h") as s:
        s.set_meta(state="running", attempt=0, launcher_pid=os.getpid(),
                   launcher_host=socket.gethostname())
        s.add_event(Event(utcnow(), Level.WARNING, "HangConfirmed", "hang",
                          Involved("run-h", attempt=0),
                          {"stuck_ranks": [0, 1], "culprit": {"reason": "rank 1 sleeps"}}))
    out = tg("status", str(job)).stdout
    assert "on rank(s) 0, 1; culprit: rank 1 sleeps" in out, out


def test_an_invalid_choice_is_one_line_naming_the_valid_values_and_the_fix() -> None:
    r = tg("run", "--scenario", "bogus", "train.py")
    assert r.returncode == ExitCode.USAGE and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr == ("trainguard run: error: --scenario: 'bogus' is not a valid choice. "
                        "Fix: pass one of llm, multi-node, single-node\n")
    missing = tg("stop")  # (the reading commands default to the last job: no longer missing)
    assert missing.stderr.count("\n") == 1
    assert "Fix: see `trainguard stop --help`" in missing.stderr
