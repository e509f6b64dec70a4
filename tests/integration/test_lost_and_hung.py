"""A job whose launcher was killed (`lost`) and one whose confirmed hang was left running,
then stopped: what `status`, `recovery`, `report` and a relaunch say of them, through the
real commands on real jobs."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from datetime import datetime, timezone
from pathlib import Path

from tests.integration.conftest import EXAMPLE, TG, read_json, reasons

# steps until the first attempt is killed; a relaunch (attempt > 0) runs 2 steps and ends
_STEPS = ('n=200; [ "$TRAINGUARD_ATTEMPT" -gt 0 ] && n=2; i=1; '
          'while [ $i -le $n ]; do echo step $i; i=$((i+1)); sleep 0.1; done')


def _wait(pred, timeout: float = 60.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.2)


def _step(job: Path) -> int:
    if not (job / "trainguard.db").is_file():
        return 0
    return int(read_json("status", job)["last_progress"]["step"] or 0)


def test_a_relaunch_of_a_lost_job_closes_its_open_attempt_as_lost(tmp_path: Path) -> None:
    job = tmp_path / "j"
    args = ["run", "--job-dir", str(job), "--no-python", "sh", "-c", _STEPS]
    launcher = subprocess.Popen([*TG, *args], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
    try:
        _wait(lambda: _step(job) >= 3)
        stop = subprocess.run([*TG, "stop", str(job), "--timeout", "0", "--force"],
                              capture_output=True, text=True, timeout=60, check=False)
        assert "SIGKILL" in stop.stdout, stop.stdout + stop.stderr
        launcher.wait(timeout=30)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait(timeout=10)
    status = read_json("status", job)
    assert status["state"] == "lost"
    last = status["last_progress"]["time"]
    log = job / "logs" / "attempt-0" / "rank-0.log"
    last_output = datetime.fromtimestamp(log.stat().st_mtime, timezone.utc)

    again = subprocess.run([*TG, *args], capture_output=True, text=True, timeout=120,
                           check=False)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "launch ended lost (its launcher died: last sign of life " in again.stderr, \
        again.stderr
    assert "ended running" not in again.stderr
    rec = read_json("recovery", job)
    first, second = rec["running_records"]
    assert first["end_reason"].startswith("lost: its launcher died")
    assert first["start_at"] < first["end_at"] < second["start_at"]
    assert first["end_at"] >= last  # its last sign of life: the last step or later
    # ... or its ranks' last output, and the step of its log's last step line, which may be
    # past the one status showed (walk-through 14: status, recovery and the logs read three
    # different last steps and an end before the output; walk-through 40 #3: the steps of the
    # launcher's last second were in the logs only)
    assert datetime.fromisoformat(first["end_at"]) >= last_output.replace(microsecond=0)
    logged = [int(m) for m in re.findall(r" out step (\d+)", log.read_text())]
    assert first["last_step"] == logged[-1] >= status["last_progress"]["step"], (first, status)
    assert second["end_reason"] == "succeeded" and rec["state"] == "succeeded"
    text = subprocess.run([*TG, "recovery", str(job)], capture_output=True, text=True,
                          timeout=60, check=True).stdout
    assert "→ running" not in text and "ended: lost" in text, text
    assert "JobRelaunched" in reasons(job)


def test_a_hang_left_running_then_stopped_is_an_incident_and_counts_for_the_mtbf(
        tmp_path: Path) -> None:
    job = tmp_path / "h"
    env = {**os.environ, "TRAINGUARD_FAULT": "hang@rank=0,step=8"}
    launcher = subprocess.Popen(
        [*TG, "run", "--nproc-per-node", "2", "--hang-floor", "3", "--save-on-exit",
         "--grace-period", "30", "--job-dir", str(job), str(EXAMPLE), "--steps", "200",
         "--step-time", "0.05", "--ckpt-every", "2"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait(lambda: (job / "trainguard.db").is_file()
              and "HangConfirmed" in reasons(job), timeout=90)
        open_rec = read_json("recovery", job)
        t0 = time.monotonic()
        launcher.send_signal(signal.SIGTERM)
        assert launcher.wait(timeout=60) == 143
        # the hung ranks' save on the way out never runs: 3 s, not the 30 s grace period
        # (walk-through 33 #4)
        assert time.monotonic() - t0 < 20
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait(timeout=10)
    (left,) = open_rec["running_records"][0]["recover_records"]
    assert (left["fault_scenario"], left["recover"]) == ("job_hanged", "none")
    assert left["recover_end_at"] is None  # left running: not over yet
    rec = read_json("recovery", job)
    (inc,) = rec["running_records"][0]["recover_records"]
    assert (inc["fault_scenario"], inc["recover"], inc["recover_result"]) == (
        "job_hanged", "none", "terminated")
    assert inc["related_task"] == "worker-0" and inc["recover_end_at"] is not None
    assert rec["summary"]["incidents"] == 1 and rec["summary"]["restarts"] == 0
    report = read_json("report", job)
    assert [i["fault_scenario"] for i in report["incidents"]] == ["job_hanged"]
    assert report["incidents"][0]["hang_culprit"]
    assert report["checkpoint_interval"]["mtbf_s"] is not None
    assert not any("no failure yet" in a for a in report["advice"])
    assert report["goodput"]["badput_s"]["hang"] > 3  # confirmed, then left running
