"""Mistakes on the everyday commands, with real commands on a real job: each gets a clear
error and the documented exit code, never silence."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from tests.integration.conftest import TG, read_json, reasons
from tests.tmpfs import mount_tmpfs

SLOW = "import time\nfor i in range(1, 400):\n    print(f'step {i}', flush=True)\n" \
       "    time.sleep(0.1)\n"


def tg(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*TG, *args], capture_output=True, text=True, timeout=timeout,
                          check=False)


def _wait_for(path: Path, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.is_file():
        assert time.monotonic() < deadline, f"no {path}"
        time.sleep(0.2)


def test_logs_follow_of_an_attempt_the_job_does_not_have_is_an_error(tmp_path: Path) -> None:
    """`logs -f --attempt 9` names the attempts with a log and exits 2, while the job runs
    (-f goes into later attempts by itself, it does not wait for a given one) and after it
    ended; `-f --attempt` of the current attempt follows it."""
    script, job = tmp_path / "slow.py", tmp_path / "job"
    script.write_text(SLOW)
    launcher = subprocess.Popen([*TG, "run", "--nproc-per-node", "1", "--job-dir", str(job),
                                 str(script)], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
    try:
        _wait_for(job / "logs" / "attempt-0" / "rank-0.log")
        running = tg("logs", str(job), "-f", "--attempt", "9", timeout=20)
        assert running.returncode == 2, running.stdout + running.stderr
        assert "no log of rank 0 in attempt 9" in running.stderr
        assert "attempts with one: 0" in running.stderr
        follower = subprocess.Popen([*TG, "logs", str(job), "-f", "--attempt", "0"],
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert tg("stop", str(job), "--timeout", "60").returncode == 0
        out, err = follower.communicate(timeout=30)
        assert follower.returncode == 0 and "step 1" in out, err
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
    ended = tg("logs", str(job), "-f", "--attempt", "9")
    assert ended.returncode == 2, ended.stdout + ended.stderr
    assert "no log of rank 0 in attempt 9" in ended.stderr, ended.stderr


STUBBORN = """\
import signal, time, trainguard
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a script that will not stop on SIGTERM
for step in range(1, 100000):
    trainguard.progress(step)
    time.sleep(0.1)
"""


def test_stop_force_says_the_launcher_was_killed_and_how_to_continue(tmp_path: Path) -> None:
    """A job `stop --force` leaves lost has no exit code: the output says why and what to do
    next (not "exit code -"); exit 0, the job has ended (cli.md)."""
    script, job = tmp_path / "stubborn.py", tmp_path / "job"
    script.write_text(STUBBORN)
    launcher = subprocess.Popen([*TG, "run", "--nproc-per-node", "1", "--grace-period", "60",
                                 "--job-dir", str(job), str(script)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_for(job / "logs" / "attempt-0" / "rank-0.log")
        forced = tg("stop", str(job), "--timeout", "1", "--force")
        launcher.wait(timeout=30)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
    assert forced.returncode == 0, forced.stdout + forced.stderr
    assert "exit code -" not in forced.stdout, forced.stdout
    assert "lost (the launcher was killed, so there is no exit code)" in forced.stdout
    assert f"Continue it: run the same `trainguard run` command with --job-dir " \
           f"{job.resolve()}" in forced.stdout, forced.stdout


def test_a_checkpoint_dir_on_a_read_only_mount_is_said_to_be_read_only(tmp_path: Path) -> None:
    """Walk-through 19: a read-only mount was reported as 'Permission denied' (os.access
    says only 'not writable'), so a user (root, too) looked at permissions, not the mount."""
    (tmp_path / "t.py").write_text("print('hi')\n")
    for ro in mount_tmpfs(tmp_path / "ro", "ro,size=1m"):
        r = subprocess.run([*TG, "run", "--checkpoint-dir", str(ro / "ck"), "--dry-run",
                            "t.py"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
        assert r.returncode == 2
        assert f"cannot create {ro / 'ck'} (Read-only file system)" in r.stderr, r.stderr


FILLED = """import os, sys, time
i = 0
while not os.path.exists(sys.argv[1]) or i < 10:  # steps until the disk was filled
    i += 1
    print(f"step {i}", flush=True)
    time.sleep(0.1)
for _ in range(12):  # and 12 more, past the store's once-a-second progress write
    i += 1
    print(f"step {i}", flush=True)
    time.sleep(0.1)
"""


def _fill(fs: Path) -> None:
    """Write zeros to `fs` until it is full."""
    with open(fs / "fill", "wb") as f:
        try:
            while True:
                f.write(b"\0" * (1 << 20))
                f.flush()
        except OSError:
            pass


def test_a_job_whose_job_dir_disk_fills_up_still_records_that_it_succeeded(
        tmp_path: Path) -> None:
    """Walk-through 24: a job-dir disk filled up while a job ran; the job succeeded (exit 0)
    but its end was never written: status read `lost` at the step the disk filled, with
    `continue it: run the same command` (which trains it again). Room kept beside the store
    (controller/reserve.py) takes the end."""
    script, flag = tmp_path / "filled.py", tmp_path / "filled"
    script.write_text(FILLED)
    for fs in mount_tmpfs(tmp_path / "fs", "size=24m"):
        job = fs / "job"
        launcher = subprocess.Popen([*TG, "run", "--nproc-per-node", "1", "--job-dir",
                                     str(job), "--checkpoint-dir", str(tmp_path / "ck"),
                                     str(script), str(flag)], stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True)
        try:
            _wait_for(job / "logs" / "attempt-0" / "rank-0.log")
            time.sleep(1)
            _fill(fs)
            time.sleep(1.5)  # a progress write fails
            behind = read_json("status", job)  # (walk-through 24: nothing said it was behind)
            assert behind["state"] == "running" and behind["store_disk_full"], behind
            said = subprocess.run([*TG, "status", str(job)], capture_output=True, text=True,
                                  timeout=60)
            assert "store: the job dir's disk has 0 B free: the launcher cannot write the " \
                "job's store, so this status may be behind" in said.stdout, said.stdout
            flag.touch()
            out, _ = launcher.communicate(timeout=120)
        finally:
            if launcher.poll() is None:
                launcher.kill()
        assert launcher.returncode == 0, out[-3000:]
        assert "StoreWriteFailed: cannot write the job store" in out, out[-3000:]
        status = read_json("status", job)
        assert status["state"] == "succeeded" and status["exit_code"] == 0, status
        assert not status["store_disk_full"]  # ended: its end was written
        assert reasons(job)[-1] == "JobSucceeded"
        assert not (job / ".trainguard-reserve").exists()  # the room went with the job


LAST_SAVE = """import os, sys, time, torch
from trainguard.checkpoint import Checkpointer
model = torch.nn.Linear(4, 4)
ckpt = Checkpointer(every_steps=1)
ckpt.maybe_save(1, {"model": model})
ckpt.wait()
print("saved 1", flush=True)
while not os.path.exists(sys.argv[1]):  # the test fills the checkpoint disk meanwhile
    time.sleep(0.1)
ckpt.maybe_save(2, {"model": torch.nn.Linear(512, 4096)})  # 8 MiB: more than is left
ckpt.close()  # the last save is durable, or this raises
print("closed", flush=True)
"""


def test_a_job_whose_last_checkpoint_save_fails_is_not_succeeded(tmp_path: Path) -> None:
    """Walk-through 27: the final checkpoint hit a full disk, close() returned, and the job
    read `succeeded` with its last steps kept nowhere (a Warning event the only trace)."""
    script, flag, job = tmp_path / "last.py", tmp_path / "filled", tmp_path / "job"
    script.write_text(LAST_SAVE)
    for fs in mount_tmpfs(tmp_path / "ck", "size=4m,mode=0700"):
        launcher = subprocess.Popen([*TG, "run", "--nproc-per-node", "1", "--max-restarts",
                                     "0", "--job-dir", str(job), "--checkpoint-dir", str(fs),
                                     str(script), str(flag)], stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True)
        try:
            _wait_for(fs / "step-000000001" / "manifest.json")
            _fill(fs)
            flag.touch()
            out, _ = launcher.communicate(timeout=120)
        finally:
            if launcher.poll() is None:
                launcher.kill()
        assert launcher.returncode != 0, out[-3000:]
        assert "closed" not in out
        assert "the last checkpoint save (step 2) failed and no save follows" in out, out[-3000:]
        assert read_json("status", job)["state"] == "failed"
        assert reasons(job)[-1] == "JobFailed"
