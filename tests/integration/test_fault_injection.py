"""A job run with TRAINGUARD_FAULT says which of its faults never fired, and why
(walk-through 35 F6: a script that never called inject() ignored the variable, and the job
succeeded as if it had survived the kill it never had). Real `trainguard run`, two ranks of
a plain Python loop (no torch)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.conftest import read_json, reasons, run_tg

pytestmark = pytest.mark.integration

LOOP = """\
import time
from trainguard.testing.faults import inject
for step in range(1, 9):
    print(f"step {step}", flush=True)
    time.sleep(0.05)
    {call}
"""


def run(tmp_path: Path, call: str, fault: str) -> list[dict[str, object]]:
    script = tmp_path / "loop.py"
    script.write_text(LOOP.replace("{call}", call))
    job = tmp_path / "job"
    r = run_tg(["run", "--nproc-per-node", "2", "--job-dir", str(job), str(script)],
               cwd=tmp_path, fault=fault)
    assert r.returncode == 0, r.stderr[-3000:]
    return [e for e in read_json("events", job) if e["reason"] == "FaultsNotFired"]


def test_a_script_that_never_calls_inject_is_told_its_fault_never_fired(
        tmp_path: Path) -> None:
    (note,) = run(tmp_path, "pass", "signal:KILL@rank=1,step=3")
    assert note["level"] == "Warning"
    assert note["message"].startswith(
        "TRAINGUARD_FAULT was set, but 1 of its 1 fault(s) never fired: signal@step 3, rank "
        "1, attempt 0: no rank called trainguard.testing.faults.inject(). Fix: call "
        "trainguard.testing.faults.inject(step) after each step"), note["message"]
    assert reasons(tmp_path / "job")[-2:] == ["FaultsNotFired", "JobSucceeded"]


def test_a_fault_on_a_rank_the_job_does_not_have_is_named_and_one_that_fired_is_not(
        tmp_path: Path) -> None:
    (note,) = run(tmp_path, "inject(step)", "log:hello@step=2;crash@rank=5,step=3")
    assert note["message"].startswith(
        "TRAINGUARD_FAULT was set, but 1 of its 2 fault(s) never fired: crash@step 3, rank 5, "
        "attempt 0: the ranks called inject(), but never at step 3, rank 5, attempt 0. "), \
        note["message"]


def test_faults_that_all_fired_say_nothing(tmp_path: Path) -> None:
    assert run(tmp_path, "inject(step)", "log:hello@step=2") == []


def test_a_job_launched_again_says_nothing_of_faults_its_earlier_launch_heard(
        tmp_path: Path) -> None:
    """Review 39 #2: the relaunch's controller never heard the fault fire in the first
    launch (attempt 0), and said it never fired."""
    assert run(tmp_path, "inject(step)", "log:hello@step=2") == []
    assert run(tmp_path, "inject(step)", "log:hello@step=2") == []  # JobRelaunched
    assert "JobRelaunched" in reasons(tmp_path / "job")
