"""Two jobs on one checkpoint dir (walk-through 31 #3): the second job's saves found every
step committed by the first and wrote nothing, it ended `succeeded`, and a restart of it
would have resumed the other job's weights. Now the checkpoint dir records its job, and a
job pointed at a dir that another running job writes is refused at launch (run and
--dry-run), naming that job and the fix; an ended job's dir is taken over (continuing from
its checkpoints), and the same job continued keeps its own."""

from __future__ import annotations

import fcntl
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.unit.helpers import TG, tg
from trainguard.controller.dir_owner import OWNER_NAME
from trainguard.errors import SpecError
from trainguard.launch_ckpt_dir import check_checkpoint_dir, claim_checkpoint_dir
from trainguard.paths import LOCK_NAME, JobPaths


def paths(job_dir: Path, ck: str) -> JobPaths:
    return JobPaths(job_dir, job_dir / "logs", ck, checkpoint_dir_key="checkpoint_dir")


def owned_by(ck: Path, job_dir: Path, host: str = "elsewhere", pid: int = 1) -> None:
    ck.mkdir(parents=True, exist_ok=True)
    (ck / OWNER_NAME).write_text(json.dumps({"run_id": "job-a", "job_dir": str(job_dir),
                                             "host": host, "pid": pid}))


def test_a_dir_a_running_job_writes_is_refused(tmp_path: Path) -> None:
    a, ck = tmp_path / "a", tmp_path / "ck"
    a.mkdir()
    owned_by(ck, a)
    with open(a / LOCK_NAME, "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # job a's launcher runs
        with pytest.raises(SpecError) as e:
            check_checkpoint_dir(paths(tmp_path / "b", str(ck)))
        check_checkpoint_dir(paths(a, str(ck)))  # job a itself (continued): its own
    msg = str(e.value)
    assert f"--checkpoint-dir / 'checkpoint_dir': {ck} is the checkpoint dir of the running "\
           f"job 'job-a' (job dir {a})" in msg
    assert "Fix: give each job its own --checkpoint-dir" in msg
    check_checkpoint_dir(paths(tmp_path / "b", str(ck)))  # a ended: b continues from it


def test_another_jobs_default_checkpoint_dir_is_its_while_it_runs(tmp_path: Path) -> None:
    """JOB_DIR/checkpoints (the default: no owner file is written there) of a running job."""
    from trainguard.controller.store import JobStore

    a = tmp_path / "a"
    a.mkdir()
    with JobStore.create(a, "job-a"):
        pass
    claim_checkpoint_dir(JobPaths(a, a / "logs", str(a / "checkpoints")), "job-a")
    assert not (a / "checkpoints" / OWNER_NAME).exists()
    with open(a / LOCK_NAME, "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        with pytest.raises(SpecError, match=r"of the running job 'job-a' \(job dir "):
            check_checkpoint_dir(paths(tmp_path / "b", str(a / "checkpoints")))
    check_checkpoint_dir(paths(tmp_path / "b", str(a / "checkpoints")))  # a ended


def test_a_launcher_that_has_not_taken_its_lock_yet_counts_as_running(tmp_path: Path) -> None:
    """Two jobs launched at once: the first claimed the dir, its lock is not taken yet."""
    launcher = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)",
                                 "trainguard"])
    try:
        owned_by(tmp_path / "ck", tmp_path / "a", socket.gethostname(), launcher.pid)
        with pytest.raises(SpecError):
            check_checkpoint_dir(paths(tmp_path / "b", str(tmp_path / "ck")))
    finally:
        launcher.kill()
        launcher.wait()
    check_checkpoint_dir(paths(tmp_path / "b", str(tmp_path / "ck")))  # gone: taken over


def test_an_object_store_dir_is_claimed_and_checked_too(tmp_path: Path) -> None:
    ck = f"memory://walk31-{os.getpid()}/run"
    a = tmp_path / "a"
    a.mkdir()
    claim_checkpoint_dir(paths(a, ck), "job-a")
    import fsspec

    owner = json.loads(fsspec.filesystem("memory").cat_file(f"{ck}/{OWNER_NAME}"))
    assert owner["run_id"] == "job-a" and owner["job_dir"] == str(a)
    with open(a / LOCK_NAME, "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        with pytest.raises(SpecError, match="of the running job 'job-a'"):
            check_checkpoint_dir(paths(tmp_path / "b", ck))


SCRIPT = """import os, time
from pathlib import Path
Path('started').touch()
for _ in range(300):
    if Path('go').exists():
        break
    time.sleep(0.05)
"""


def test_a_second_job_on_a_running_jobs_checkpoint_dir_is_refused(tmp_path: Path) -> None:
    """Real launchers: b is refused while a runs (run and --dry-run), and runs after."""
    (tmp_path / "t.py").write_text(SCRIPT)
    a = subprocess.Popen([*TG, "run", "--nproc-per-node", "1", "--job-dir", "a",
                          "--checkpoint-dir", "ck", "t.py"], cwd=tmp_path,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "started").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        for dry in (["--dry-run"], []):
            r = tg("run", "--nproc-per-node", "1", "--job-dir", "b", "--checkpoint-dir", "ck",
                   *dry, "t.py", cwd=tmp_path)
            assert r.returncode == 2, r.stderr
            assert "is the checkpoint dir of the running job" in r.stderr, r.stderr
            assert f"(job dir {tmp_path / 'a'})" in r.stderr
            assert "Fix: give each job its own --checkpoint-dir" in r.stderr
        assert not (tmp_path / "b").exists()
    finally:
        (tmp_path / "go").touch()
        _, err = a.communicate(timeout=60)
    assert a.returncode == 0, err
    r = tg("run", "--nproc-per-node", "1", "--job-dir", "b", "--checkpoint-dir", "ck", "t.py",
           cwd=tmp_path)
    assert r.returncode == 0, r.stderr  # a ended: b continues from its checkpoints
    owner = json.loads((tmp_path / "ck" / OWNER_NAME).read_text())
    assert owner["job_dir"] == str(tmp_path / "b")
