"""A rank whose own code raises, under --save-on-exit: it saves its last step at exit while
its peer waits for it in a collective. Walk-through 11 found the launcher confirming a hang
during that save (the peer made no progress for longer than the hang floor), restarting the
job "upon suspension" and diagnosing a hang instead of the exception."""

from __future__ import annotations

from pathlib import Path

from tests.integration.conftest import EXAMPLE, read_json, reasons, run_tg


def test_a_crash_under_save_on_exit_is_a_crash_not_a_hang(tmp_path: Path) -> None:
    job = tmp_path / "job"
    # the save waits up to half the grace period (15 s) for the peer's part, well past the
    # hang floor (8 s); the phase it runs in must reach the launcher long before that
    r = run_tg(["run", "--nproc-per-node", "2", "--save-on-exit", "--max-restarts", "2",
                "--hang-floor", "8", "--grace-period", "30", "--job-dir", str(job),
                str(EXAMPLE), "--steps", "40", "--ckpt-every", "5", "--step-time", "0.05",
                "--progress"], cwd=tmp_path, fault="crash@rank=0,step=12")
    assert r.returncode == 1, r.stderr[-3000:]
    got = reasons(job)
    assert "HangConfirmed" not in got and "WorkersRestarted" not in got, got
    assert got[-2:] == ["FailureDiagnosed", "JobFailed"], got
    diagnosed = [e for e in read_json("events", job) if e["reason"] == "FailureDiagnosed"]
    assert "user_code_error" in diagnosed[0]["message"], diagnosed
    saved = [e for e in read_json("events", job) if e["reason"] == "CheckpointSaved"
             and (e.get("data") or {}).get("on_exit")]
    assert saved and "waiting for this rank in a collective" in saved[0]["message"], saved


def test_a_peer_crash_under_step_reexecution_ends_the_other_rank_at_once_with_its_save(
        tmp_path: Path) -> None:
    """Walk-through 12: with --operator-reexecution (the llm preset) a rank's crash sent its
    peer a REFORM that only it received, then a GIVE_UP; the peer was already waiting in a
    rendezvous nobody joined, ignored the launcher's SIGTERM (the on-exit save's handler
    cannot run there) and was SIGKILLed after the grace period, with no save of step 15."""
    job = tmp_path / "job"
    r = run_tg(["run", "--nproc-per-node", "2", "--save-on-exit", "--operator-reexecution",
                "--max-restarts", "0", "--grace-period", "20", "--job-dir", str(job),
                str(EXAMPLE), "--steps", "30", "--quiet"], cwd=tmp_path,
               fault="crash@rank=1,step=15")
    assert r.returncode == 1, r.stderr[-3000:]
    rank0 = (job / "logs" / "attempt-0" / "rank-0.log").read_text()
    assert "step 16 is not re-executed" in rank0, rank0[-2000:]
    assert "process group re-formed" not in rank0
    status = read_json("status", job)
    ranks = {w["rank"]: w for w in status["ranks"]}
    assert ranks[0]["signal"] != "SIGKILL", ranks  # it raised: no grace period ran out
    # nothing was re-executed: no step re-execution budget was used (walk-through 14)
    assert status["budgets"]["step_retries"]["used"] == 0, status["budgets"]
    saved = [e["data"]["step"] for e in read_json("events", job)
             if e["reason"] == "CheckpointSaved" and (e.get("data") or {}).get("on_exit")]
    assert saved == [15], saved
