"""A job dir another user made (walk-through 32 #8): `run` wrote the token and controller
address of a 2-node job into a dir another user owned and could write, who then pointed the
agents at a listener of theirs. Now such a job dir is refused (run and --dry-run), the
cluster dir is the job's user's alone, and an agent follows no controller address and takes
no token that another user could have changed."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.unit.helpers import tg
from trainguard.node.main import controller_address
from trainguard.wire import WireError, new_token, read_token, write_token

ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
NOBODY = 65534


def dry_run(cwd: Path, job: Path) -> str:
    (cwd / "t.py").write_text("print('step 1')\n")
    r = tg("run", "--nnodes", "2", "--nproc-per-node", "1", "--job-dir", str(job), "--dry-run",
           "t.py", cwd=cwd)
    assert r.returncode == 2, r.stdout + r.stderr
    return r.stderr


@ROOT_ONLY
def test_a_job_dir_another_user_owns_is_refused(tmp_path: Path) -> None:
    job = tmp_path / "theirs"
    (job / "cluster").mkdir(parents=True)
    os.chown(job, NOBODY, NOBODY)
    err = dry_run(tmp_path, job)
    assert f"--job-dir: {job} belongs to uid {NOBODY}, not to you (uid 0): its " \
        "owner could point the job's agents at a controller of theirs" in err, err
    assert "Fix: use a job dir of your own" in err
    r = tg("run", "--nnodes", "2", "--nproc-per-node", "1", "--job-dir", str(job), "t.py",
           cwd=tmp_path)
    assert r.returncode == 2 and "belongs to uid" in r.stderr, r.stderr
    assert sorted(p.name for p in (job / "cluster").iterdir()) == []  # nothing written there


def test_a_job_dir_every_user_may_write_is_refused(tmp_path: Path) -> None:
    job = tmp_path / "open"
    job.mkdir()
    job.chmod(0o777)
    err = dry_run(tmp_path, job)
    assert "may be written by every user (mode 777)" in err and f"Fix: chmod o-w {job}" in err


def write_address(d: Path) -> Path:
    d.mkdir(mode=0o700, exist_ok=True)
    path = d / "controller.json"
    path.write_text(json.dumps({"host": "127.0.0.1", "port": 4242}))
    path.chmod(0o600)
    return path


def test_an_agent_follows_only_an_address_nobody_else_may_change(tmp_path: Path) -> None:
    path = write_address(tmp_path / "cluster")
    assert controller_address(path) == ("127.0.0.1", 4242)
    path.chmod(0o666)
    why = controller_address(path)
    assert isinstance(why, str) and "is not this agent's user's alone" in why, why
    path.chmod(0o600)
    path.parent.chmod(0o777)
    assert isinstance(controller_address(path), str)


@ROOT_ONLY
def test_an_agent_takes_no_address_or_token_of_another_user(tmp_path: Path) -> None:
    path = write_address(tmp_path / "cluster")
    os.chown(path, NOBODY, NOBODY)
    why = controller_address(path)
    assert isinstance(why, str) and f"owner uid {NOBODY}" in why, why
    token = tmp_path / "token"
    write_token(token, new_token())
    os.chown(token, NOBODY, NOBODY)
    with pytest.raises(WireError, match=f"belongs to uid {NOBODY}, not to this process's user"):
        read_token(token)


@ROOT_ONLY
def test_a_checkpoint_dir_or_log_dir_another_user_owns_is_refused(tmp_path: Path) -> None:
    """(review of walk-through 32 #10) The rule stopped at the job dir: a --checkpoint-dir of
    another user's, which the job resumes from, was taken as it was."""
    (tmp_path / "t.py").write_text("print('step 1')\n")
    for flag in ("--checkpoint-dir", "--log-dir"):
        theirs = tmp_path / f"theirs{flag}"
        theirs.mkdir()
        os.chown(theirs, NOBODY, NOBODY)
        r = tg("run", "--nproc-per-node", "1", "--job-dir", str(tmp_path / "job"), flag,
               str(theirs), "--dry-run", "t.py", cwd=tmp_path)
        assert r.returncode == 2, r.stdout + r.stderr
        assert f"{flag}: {theirs} belongs to uid {NOBODY}, not to you" in r.stderr, r.stderr
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    r = tg("run", "--nproc-per-node", "1", "--job-dir", str(tmp_path / "job"),
           "--checkpoint-dir", str(open_dir), "--dry-run", "t.py", cwd=tmp_path)
    assert r.returncode == 2 and "may be written by every user (mode 777)" in r.stderr


@ROOT_ONLY
def test_a_job_dir_another_user_makes_while_the_launch_checks_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """(review of walk-through 32 #3) The owner was checked before the job dir existed and
    never after it was made: a dir another user made in between (a shared parent, the path
    readable in the launcher's argv) was taken as the job's."""
    import trainguard.launch_checks as lc
    from trainguard.errors import SpecError
    from trainguard.spec import JobSpec

    job = tmp_path / "job"
    real = lc.check_unlocked

    def stranger_makes_it(job_dir: Path) -> None:
        job.mkdir()
        os.chown(job, NOBODY, NOBODY)
        job.chmod(0o777)
        real(job_dir)

    monkeypatch.setattr(lc, "check_unlocked", stranger_makes_it)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SpecError, match=f"belongs to uid {NOBODY}"):
        lc.prepare(JobSpec(entrypoint="t.py", nproc_per_node=1, job_dir=str(job)), create=True)


def test_a_job_dir_on_a_read_only_mount_says_so_not_chmod(tmp_path: Path) -> None:
    """Walk-through 40 #9: a read-only tmpfs (mode 1777) as --job-dir was told to `chmod
    o-w`, which cannot work there; the mount's real problem was not named."""
    from tests.tmpfs import mount_tmpfs

    job = tmp_path / "ro"
    for _ in mount_tmpfs(job, "ro,mode=1777"):
        err = dry_run(tmp_path, job)
    assert f"{job} is on a read-only file system" in err and "chmod" not in err, err
    assert "Fix: use another --job-dir on a writable disk, or remount it read-write" in err
