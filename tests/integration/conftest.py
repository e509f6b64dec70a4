"""Helpers for integration tests: the real `trainguard` command, real worker processes."""

from __future__ import annotations

import contextlib
import fcntl
import io
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "train_ddp.py"
TG = [sys.executable, "-m", "trainguard"]


def run_tg(args: list[str], *, cwd: Path, fault: str | None = None, timeout: float = 180,
           env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    e = dict(os.environ)
    e.pop("TRAINGUARD_FAULT", None)
    if fault:
        e["TRAINGUARD_FAULT"] = fault
    e.update(env or {})
    return subprocess.run([*TG, *args], cwd=cwd, env=e, capture_output=True, text=True,
                          timeout=timeout, check=False)


def read_json(cmd: str, job_dir: Path) -> Any:
    """`trainguard CMD JOB_DIR --json`, read by the command's own code (trainguard.cli.main)
    in this process: a `python -m trainguard` per read costs about 0.75 s of CPU, and the
    waits read `status` every half second beside the job under test. A failure raises what
    the subprocess did (CalledProcessError, with the output and the error text). A store read
    in the milliseconds its launcher creates it says so ('the job is still being created; try
    again', exit 2): read again, as a user would (a wait read that instant once in CI)."""
    from trainguard.cli import main

    argv = [cmd, str(job_dir), "--json"]
    for _ in range(50):
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(argv)
            except SystemExit as e:  # argparse's refusals
                code = e.code if isinstance(e.code, int) else 2
        if code == 0 or "the job is still being created" not in err.getvalue():
            break
        time.sleep(0.1)
    if code != 0:
        raise subprocess.CalledProcessError(code, [*TG, *argv], out.getvalue(), err.getvalue())
    return json.loads(out.getvalue())


def reasons(job_dir: Path) -> list[str]:
    return [e["reason"] for e in read_json("events", job_dir)]


def trainer_result(stdout: str) -> tuple[list[list[float]], str]:
    """The `losses [...]` and `weights sha256 HEX` lines rank 0 of a trainer example prints
    (the same again when torch aborted a rank at exit and the finished job was restarted from
    its last checkpoint: test_integrations_hf.aborted_at_exit)."""
    losses = re.findall(r"^\[rank 0\] losses (\[.*\])$", stdout, re.M)
    digest = re.findall(r"^\[rank 0\] weights sha256 ([0-9a-f]{64})$", stdout, re.M)
    assert len(set(losses)) == 1 and len(set(digest)) == 1, stdout[-3000:]
    return json.loads(losses[0]), digest[0]


@pytest.fixture
def job_dir(tmp_path: Path) -> Path:
    return tmp_path / "job"


@pytest.fixture(scope="session")
def clean_digest(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The final weights (SHA-256) of the example DDP job, 2 ranks, 14 steps, a checkpoint
    every 4, without any fault: what every exact recovery of that job must end with. Run once
    per `pytest -n` run: the first xdist worker to ask runs the job, the other reads its
    digest (four files on both workers ran it twice, 10-40 s each on the 2-core machine)."""
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        return _clean_digest(tmp_path_factory.mktemp("clean"))
    shared = tmp_path_factory.getbasetemp().parent  # this run's, above each worker's own
    with open(shared / "clean-digest.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        done = shared / "clean-digest.txt"
        if not done.exists():
            done.write_text(_clean_digest(tmp_path_factory.mktemp("clean")))
        return done.read_text()


def _clean_digest(tmp: Path) -> str:
    r = run_tg(["run", "--nproc-per-node", "2", "--job-dir", str(tmp / "job"), str(EXAMPLE),
                "--steps", "14", "--ckpt-every", "4", "--digest"], cwd=tmp)
    assert r.returncode == 0, r.stderr[-3000:]
    found = re.findall(r"weights sha256 ([0-9a-f]{64})", r.stdout)
    assert len(found) == 1, r.stdout[-2000:]
    return str(found[0])


def drained_step(r: subprocess.CompletedProcess[str], job_dir: Path) -> int:
    """The step a job stopped by `trainguard stop` drained at: it exited as stopped (143),
    having asked its ranks to drain, and committed exactly one checkpoint on the way out."""
    assert r.returncode == 143, (r.returncode, r.stderr[-3000:])
    events = read_json("events", job_dir)
    assert "DrainRequested" in [e["reason"] for e in events]
    saves = [e for e in events if e["reason"] == "CheckpointSaved"
             and "drained" in (e.get("data") or {}).get("on_exit", "")]
    assert len(saves) == 1, [e["message"] for e in events]
    # (walk-through 25) said as a drain, and the drained ranks read stopped, not failed
    (stopped,) = [e["message"] for e in events if e["reason"] == "JobStopped"]
    assert "every rank drained: saved a checkpoint at its next step end" in stopped, stopped
    ranks = read_json("status", job_dir)["ranks"]  # -6: torch's abort at interpreter exit
    assert all(w["state"] == "stopped" or w["exit_code"] == -6 for w in ranks), ranks
    return int(saves[0]["data"]["step"])


def assert_train_metrics(job_dir: Path, last: list[float]) -> None:
    """`status --json` and `trainguard metrics` show rank 0's last logged [step, loss]."""
    from prometheus_client.parser import text_string_to_metric_families

    (m,) = read_json("status", job_dir)["training"]
    assert (m["rank"], m["step"], m["loss"]) == (0, last[0], last[1])
    assert isinstance(m["learning_rate"], float)
    text = subprocess.run([*TG, "metrics", str(job_dir)], capture_output=True, text=True,
                          check=True, timeout=60).stdout
    got = {(s.name, s.labels.get("rank")): s.value
           for f in text_string_to_metric_families(text) for s in f.samples}
    assert got[("trainguard_train_loss", "0")] == last[1]
    assert got[("trainguard_learning_rate", "0")] == m["learning_rate"]
    assert got[("trainguard_train_metrics_step", "0")] == last[0]
