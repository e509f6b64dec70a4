"""`trainguard.progress(step)` under the real launcher: the last step a script reports reaches
the job's status, `ls` and metrics, even when steps come faster than the reporting interval
and the script then sleeps or ends (the throttle used to drop the held-back last step)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from tests.integration.conftest import TG, read_json, run_tg

pytestmark = pytest.mark.integration

FAST_STEPS = """
import sys, time
from pathlib import Path
import trainguard

for step in range(1, 31):
    trainguard.progress(step)
    time.sleep(0.03)
if len(sys.argv) > 1:  # reported, now sleep (evaluation, a slow data loader) until told
    Path(sys.argv[1], "reported").touch()
    deadline = time.monotonic() + 60
    while not Path(sys.argv[1], "go").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
"""


def last_step(job: Path) -> int | None:
    step = read_json("status", job)["last_progress"]["step"]
    return None if step is None else int(step)


def test_the_last_step_reaches_the_status_while_the_script_sleeps_after_it(
        tmp_path: Path) -> None:
    script = tmp_path / "fast.py"
    script.write_text(FAST_STEPS)
    job = tmp_path / "job"
    proc = subprocess.Popen([*TG, "run", "--nproc-per-node", "1", "--job-dir", str(job),
                             str(script), str(tmp_path)], cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "reported").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert (tmp_path / "reported").exists(), "the script never reported its steps"
        # the controller writes every second; each look is a `status` process (1 s or more
        # on a loaded machine); the script sleeps up to 60 s, so 30 s still tells
        deadline, seen = time.monotonic() + 30, None
        while time.monotonic() < deadline and (seen := last_step(job)) != 30:
            time.sleep(0.2)
        assert seen == 30  # the script still sleeps: no later call, no exit, sent anyway
    finally:
        (tmp_path / "go").touch()
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err[-2000:]


def test_the_last_step_of_a_script_that_ends_right_after_it_is_the_jobs_last_step(
        tmp_path: Path) -> None:
    (tmp_path / "fast.py").write_text(FAST_STEPS)
    job = tmp_path / "job"
    r = run_tg(["run", "--nproc-per-node", "1", "--job-dir", str(job), "fast.py"],
               cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert last_step(job) == 30
    (listed,) = read_json("ls", tmp_path)
    assert listed["last_step"] == 30
    metrics = subprocess.run([*TG, "metrics", str(job)], capture_output=True, text=True,
                             check=True, timeout=60).stdout
    assert "\ntrainguard_step 30.0\n" in metrics


EVAL_BAR = """
import sys, time
import trainguard

for step in range(1, 6):
    trainguard.progress(step)
    time.sleep(0.2)
    if step == 3:  # an evaluation's progress bar (tqdm), as HF Trainer draws it
        for i in range(1, 501, 50):
            print(f"{i * 100 // 500}%|###| {i}/500 [00:01<00:00, 400.0it/s]", flush=True)
        print("100%|#####| 500/500 [00:01<00:00, 400.0it/s]", flush=True)
        time.sleep(0.5)
"""


def test_a_rank_that_reports_its_steps_is_not_read_from_its_progress_bars(
        tmp_path: Path) -> None:
    """Walk-through 29: an HF job (its callback reports global_step) evaluating 500 batches
    read as "step 1500" of 30 (status, metrics, the ledger: 490 steps lost for 3)."""
    script = tmp_path / "eval_bar.py"
    script.write_text(EVAL_BAR)
    job = tmp_path / "job"
    r = run_tg(["run", "--nproc-per-node", "1", "--job-dir", str(job), str(script)],
               cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert last_step(job) == 5
