"""`trainguard diagnose JOB_DIR` of real jobs: a job that succeeded has no failure, whatever
its logs print; after an in-process restart the verdict is the job's own."""

from __future__ import annotations

import json
from pathlib import Path

from tests.integration.conftest import EXAMPLE, read_json, run_tg

NOISY = """\
import os, sys
print("training", flush=True)
if os.environ["RANK"] == "1":  # a caught error, printed, and the run goes on
    print("Traceback (most recent call last):", file=sys.stderr)
    print('  File "/x/train.py", line 5, in <module>', file=sys.stderr)
    print("FileNotFoundError: [Errno 2] No such file or directory: 'ckpt/last.pt'",
          file=sys.stderr)
    print("checkpoint on the way out failed: [Errno 2] No such file", file=sys.stderr)
sys.exit(0)
"""


def test_a_job_that_succeeded_has_no_failure_though_its_log_shows_an_error(
        tmp_path: Path, job_dir: Path) -> None:
    script = tmp_path / "noisy.py"
    script.write_text(NOISY, encoding="utf-8")
    r = run_tg(["run", "--nproc-per-node", "2", "--job-dir", str(job_dir), str(script)],
               cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    d = run_tg(["diagnose", str(job_dir)], cwd=tmp_path)
    assert d.returncode == 1, d.stdout
    assert d.stdout.startswith("no failure found: no attempt of the job failed "
                               "(attempt 0 succeeded);"), d.stdout
    assert "checkpoint_load_error" not in d.stdout
    out = json.loads(run_tg(["diagnose", str(job_dir), "--json"], cwd=tmp_path).stdout)
    assert out["diagnosis"] is None and out["attempt_failed"] is False
    # asked for: its logs are read, but it is not said to have failed
    a = run_tg(["diagnose", str(job_dir), "--attempt", "0"], cwd=tmp_path)
    assert a.returncode == 0, a.stdout + a.stderr
    assert a.stdout.startswith("attempt 0 succeeded: no failure;"), a.stdout
    aj = json.loads(run_tg(["diagnose", str(job_dir), "--attempt", "0", "--json"],
                           cwd=tmp_path).stdout)
    assert aj["attempt_failed"] is False and aj["diagnosis"]["culprit"]["rank"] == 1


def test_after_an_in_process_restart_diagnose_gives_the_jobs_own_verdict(
        tmp_path: Path, job_dir: Path) -> None:
    r = run_tg(["run", "--nproc-per-node", "2", "--max-restarts", "3", "--job-dir",
                str(job_dir), str(EXAMPLE), "--steps", "40", "--resilient"], cwd=tmp_path,
               fault="signal:KILL@rank=1,step=25")
    assert r.returncode == 0, r.stderr[-3000:]
    events = read_json("events", job_dir)
    assert "InProcessRestarted" in [e["reason"] for e in events]
    own = next(e["data"] for e in events if e["reason"] == "FailureDiagnosed")
    d = read_json("diagnose", job_dir)
    got = d["diagnosis"]
    assert (got["category"], got["culprit"]["rank"]) == (own["category"], 1), got
    assert d["attempt"] == 0 and d["attempt_failed"] is True
    assert got["category"] == "killed_by_signal_unknown", got
    assert "rank 1 was killed by SIGKILL" in got["summary"]
    died = next(e["data"] for e in events if e["reason"] == "WorkerFailed")
    assert died["exit_code"] == -9 and died["node"] == "node-0", died


def test_a_job_of_one_rank_that_hangs_names_that_rank(tmp_path: Path, job_dir: Path) -> None:
    r = run_tg(["run", "--nproc-per-node", "1", "--hang-floor", "3", "--restart-on-hang",
                "--max-restarts", "1", "--job-dir", str(job_dir), str(EXAMPLE), "--steps",
                "10"], cwd=tmp_path, fault="hang@step=5", timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    confirmed = next(e for e in read_json("events", job_dir)
                     if e["reason"] == "HangConfirmed")
    assert "Culprit: rank 0" in confirmed["message"], confirmed["message"]
    doc = read_json("diagnose", job_dir)
    d = doc["diagnosis"]
    assert d["culprit"]["rank"] == 0 and "the only rank" in d["summary"], d
    assert "no single culprit" not in d["summary"]
    # the files it read include the verdict and the stack dump its evidence is in (walk-
    # through 40 #9: `files` listed the rank logs only, and the text said "read 1 file(s)")
    stacks = "logs/attempt-0/stacks/"
    assert {stacks + "hang.json", stacks + "rank-0.txt"} <= set(doc["files"]), doc["files"]
    assert d["evidence"]["file"] == stacks + "rank-0.txt", d["evidence"]


