"""Rung 0, step re-execution: a transient collective failure is re-run in the same processes.

Real `trainguard run`, real worker processes, real torch DDP over gloo. The `collective`
fault makes rank 1 shut down its TCP connections inside a step, so every rank's collective
fails with a real gloo error ("Connection closed by peer") while the processes live on.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.integration.conftest import EXAMPLE, read_json, reasons, run_tg

pytestmark = pytest.mark.integration

STEPS = 14


def job(job_dir: Path, *flags: str) -> list[str]:
    return ["run", "--nproc-per-node", "2", "--job-dir", str(job_dir), "--restart-backoff",
            "0.1", "--grace-period", "5", *flags, str(EXAMPLE), "--steps", str(STEPS),
            "--ckpt-every", "4", "--digest"]


def digest(stdout: str) -> str:
    found = re.findall(r"weights sha256 ([0-9a-f]{64})", stdout)
    assert len(found) == 1, stdout[-2000:]
    return found[0]


def started_pids(job_dir: Path) -> set[int]:
    """The pids the first attempt started with (its JobRunning event)."""
    running = next(e for e in read_json("events", job_dir) if e["reason"] == "JobRunning")
    return {int(p) for p in re.findall(r"pid (\d+)", running["message"])}


def final_ranks(job_dir: Path) -> list[tuple[int, int]]:
    """(pid, process start count) of each rank at the end."""
    return [(int(r["pid"]), int(r["start_count"])) for r in read_json("status", job_dir)["ranks"]]


def test_a_transient_collective_failure_is_reexecuted_in_place_with_exact_weights(
        tmp_path: Path, job_dir: Path, clean_digest: str) -> None:
    r = run_tg(job(job_dir, "--operator-reexecution"), cwd=tmp_path,
               fault="collective@rank=1,step=6")
    assert r.returncode == 0, r.stderr[-3000:]
    assert digest(r.stdout) == clean_digest  # bit-identical to the uninterrupted run
    got = reasons(job_dir)
    assert got.count("StepRetrying") == 1 and got.count("StepReexecuted") == 1
    assert "WorkerFailed" not in got and "WorkersRestarted" not in got
    assert got[-1] == "JobSucceeded"
    records = read_json("recovery", job_dir)["running_records"]
    assert len(records) == 1  # one attempt: no process was restarted
    (rr,) = records[0]["recover_records"]
    assert (rr["recover"], rr["recover_result"], rr["resumed_step"], rr["steps_lost"]) == (
        "step_reexecution", "success", 5, 0)
    assert rr["related_task"] in ("worker-0", "worker-1")  # the first rank to report it
    ranks = final_ranks(job_dir)  # the same processes from start to end
    assert {pid for pid, _ in ranks} == started_pids(job_dir) and {n for _, n in ranks} == {1}
    out = r.stdout + r.stderr  # the ranks' lines, with their console prefixes
    assert "shut down" in out and "re-executed on process group generation 1" in out


def test_a_step_that_fails_again_downgrades_to_a_process_restart(
        tmp_path: Path, job_dir: Path) -> None:
    r = run_tg(job(job_dir, "--operator-reexecution", "--max-restarts", "2"), cwd=tmp_path,
               fault="collective:2@rank=1,step=6")
    assert r.returncode == 0, r.stderr[-3000:]
    got = reasons(job_dir)
    assert got.count("StepRetrying") == 1 and got.count("StepRetryDowngraded") == 1
    assert "StepReexecuted" not in got
    assert got.index("StepRetryDowngraded") < got.index("WorkersRestarted")
    downgraded = next(e for e in read_json("events", job_dir)
                      if e["reason"] == "StepRetryDowngraded")
    assert "--step-retries 1" in downgraded["message"]
    first, second = read_json("recovery", job_dir)["running_records"]
    kinds = [(x["recover"], x["recover_result"]) for x in first["recover_records"]]
    assert kinds == [("step_reexecution", "failed"), ("step_reexecution", "quotaExceeded"),
                     ("process_restart", "success")]
    assert second["start_type"] == "auto_restart"


def test_a_later_failure_is_diagnosed_by_its_own_line_not_the_re_executed_steps(
        tmp_path: Path, job_dir: Path) -> None:
    """Walk-through 34 #10: step 4 re-executed, step 8 failed the same way with the budget
    spent: the verdict named step 4's line, the failure the job had recovered from (its
    steps are faster than the one-second margin for errors trained past). The rank's own
    "step 4 re-executed" line retires what its log holds before it."""
    r = run_tg(job(job_dir, "--operator-reexecution", "--max-step-retries", "1",
                   "--max-restarts", "1"), cwd=tmp_path,
               fault="collective@rank=1,step=4;collective@rank=1,step=8")
    assert r.returncode == 0, r.stderr[-3000:]
    got = reasons(job_dir)
    assert got.count("StepReexecuted") == 1 and "WorkersRestarted" in got, got
    diagnosed = [e["data"] for e in read_json("events", job_dir)
                 if e["reason"] == "FailureDiagnosed"]
    assert len(diagnosed) == 1, diagnosed
    (d,) = diagnosed
    assert d["category"] == "nccl_communication_error", d
    assert "step 8 failed" in d["evidence"]["text"], d["evidence"]


# make test-long: the baseline (a fault without the flag costs a process restart, resumed
# exactly) is tests/integration/test_restart.py's and the chaos run's in make test
@pytest.mark.long
def test_without_operator_reexecution_the_same_fault_costs_a_process_restart(
        tmp_path: Path, job_dir: Path, clean_digest: str) -> None:
    r = run_tg(job(job_dir, "--max-restarts", "2"), cwd=tmp_path,
               fault="collective@rank=1,step=6")
    assert r.returncode == 0, r.stderr[-3000:]
    got = reasons(job_dir)
    assert "StepRetrying" not in got and "WorkersRestarted" in got
    assert {n for _, n in final_ranks(job_dir)} == {2}  # every rank's process was new
    assert digest(r.stdout) == clean_digest  # resumed from its checkpoint: exact as well
