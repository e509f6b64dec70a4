"""Every reader of a lost Slurm job when squeue does not answer (slurmctld down or slow):
`ls`, `prune`, `diagnose JOB_DIR` and a launch's checkpoint-dir check read it as `status`
and the dashboard do, as recorded, its ranks perhaps training on (review 53 #6: a failing
squeue read as every agent gone). squeue is a fake on PATH that fails (the I/O layer;
tests/multinode runs the real one)."""

from __future__ import annotations

import json
import os
import socket
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from tests.unit.helpers import tg
from trainguard.backends.orphans import ALIVE_KEY, GONE_AFTER_S
from trainguard.cli.diagnose_job import read_job_dir
from trainguard.controller.dir_owner import OWNER_NAME
from trainguard.controller.store import JobStore, NodeRow, WorkerRow
from trainguard.errors import SpecError
from trainguard.launch_ckpt_dir import check_checkpoint_dir
from trainguard.paths import JobPaths
from trainguard.records import RunningRecord, StartType
from trainguard.states import NodeState

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)  # long ago: prune's cutoff is passed
TIMED_OUT = "slurm_load_jobs error: Socket timed out on send/recv operation"


@pytest.fixture
def failing_squeue(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "squeue").write_text(f"#!/bin/sh\necho '{TIMED_OUT}' >&2\nexit 1\n")
    (bin_dir / "squeue").chmod(0o755)
    path = f"{bin_dir}{os.pathsep}{os.environ['PATH']}"
    monkeypatch.setenv("PATH", path)
    from trainguard.backends import orphans
    monkeypatch.setattr(orphans, "_steps_seen", {})
    return {**os.environ, "PATH": path}


def lost_slurm_job(job: Path, state: str = "running", alive_at: datetime | None = None
                   ) -> Path:
    """Attempt 0 of a two-node job in Slurm allocation 6, its launcher gone (no such pid):
    lost while `state` is an active one; its controller last alive at `alive_at` (the
    recorder's heartbeat: now when None)."""
    with JobStore.create(job, "run-1") as s:
        s.set_meta(state=state, attempt=0, launcher_pid=2 ** 22 + 12345,
                   launcher_host=socket.gethostname(), log_dir=str(job / "logs"),
                   slurm_job_id="6", created_at=T0.isoformat(), **{
                       ALIVE_KEY: (alive_at or datetime.now(timezone.utc)).isoformat()})
        s.put_running(RunningRecord(0, T0, StartType.FIRST_START))
        s.put_workers(0, [WorkerRow(0, r, 0, f"n{r}", 100 + r, "running") for r in (0, 1)])
        s.put_nodes([NodeRow(f"n{r}", f"h{r}", NodeState.HEALTHY, 500 + r, r, None,
                             T0 + timedelta(seconds=r), "slurm") for r in (0, 1)])
    logs = job / "logs" / "attempt-0"
    logs.mkdir(parents=True)
    for r in (0, 1):
        (logs / f"rank-{r}.log").write_text("step 1\nstep 2\n")
    return job


def test_prune_keeps_a_lost_job_whose_agents_slurm_cannot_say(
        tmp_path: Path, failing_squeue: dict[str, str]) -> None:
    """The job's last progress is long past the cutoff: prune deleted its logs and
    checkpoints although its ranks may still train and write there."""
    job = lost_slurm_job(tmp_path / "runs" / "job")
    (job / "checkpoints" / "step-000000010").mkdir(parents=True)
    ls = tg("ls", str(tmp_path / "runs"), "--json", env=failing_squeue)
    (row,) = json.loads(ls.stdout)
    assert row["state"] == "lost" and row["agents_without_controller"] == [], row
    assert TIMED_OUT in row["agents_unknown"], row
    r = tg("prune", str(tmp_path / "runs"), "--older-than", "1", "--yes", env=failing_squeue)
    assert r.returncode == 0, r.stderr
    assert (job / "checkpoints" / "step-000000010").is_dir() and (job / "logs").is_dir()
    said = " ".join(r.stderr.split())
    assert f"{job} is lost, and of its node agents Slurm could not be asked" in said, said
    assert "not deleted (their workers may train on). Fix: run prune again once Slurm " \
        "answers" in said, said


def test_diagnose_reads_a_lost_job_whose_agents_slurm_cannot_say_as_recorded(
        tmp_path: Path, failing_squeue: dict[str, str]) -> None:
    """Read as no agent running, the attempt was closed as lost with its launcher (its ranks
    with it): 'no failure', nothing read. Now its logs are read and the problem is said."""
    job = lost_slurm_job(tmp_path / "job")
    problems: list[str] = []
    got = read_job_dir(job, problems)
    assert got is not None and got.note is None, got
    assert sorted(name for _, name in got.files) == ["logs/attempt-0/rank-0.log",
                                                     "logs/attempt-0/rank-1.log"]
    assert len(problems) == 1 and problems[0].startswith(
        "the launcher is gone, and of its node agents Slurm could not be asked"), problems
    assert problems[0].endswith("the job is read as recorded (its ranks may train on)")


def test_a_new_job_is_refused_the_checkpoint_dir_of_a_lost_job_slurm_cannot_say_of(
        tmp_path: Path, failing_squeue: dict[str, str]) -> None:
    """The launch check read the failing squeue as no agent: the lost job counted as ended,
    and a second job took over the checkpoint dir its ranks may still save into."""
    job = lost_slurm_job(tmp_path / "a")
    ck = tmp_path / "ck"
    ck.mkdir()
    (ck / OWNER_NAME).write_text(json.dumps({"run_id": "run-1", "job_dir": str(job),
                                             "host": "elsewhere", "pid": 1}))
    with pytest.raises(SpecError) as e:
        check_checkpoint_dir(JobPaths(tmp_path / "b", tmp_path / "b" / "logs", str(ck),
                                      checkpoint_dir_key="checkpoint_dir"))
    msg = " ".join(str(e.value).split())
    assert f"{ck} is the checkpoint dir of the lost job 'run-1' (job dir {job}): its " \
        "launcher is gone, and of its node agents Slurm could not be asked" in msg, msg
    assert "so their workers may train on: both jobs would save the same steps" in msg, msg
    assert f"Fix: run this again once Slurm answers (`trainguard status {job}` says" in msg


def test_an_ended_job_s_checkpoint_dir_is_taken_over_whatever_slurm_says(
        tmp_path: Path, failing_squeue: dict[str, str]) -> None:
    """Review 55 #1: the launch asked Slurm of every owner whose launcher was not running,
    ended jobs too: a succeeded job's dir was refused as a lost job's whose workers may
    train on (the documented way to continue from an ended job's checkpoints, blocked)."""
    job = lost_slurm_job(tmp_path / "a", state="succeeded")
    ck = tmp_path / "ck"
    ck.mkdir()
    (ck / OWNER_NAME).write_text(json.dumps({"run_id": "run-1", "job_dir": str(job),
                                             "host": "elsewhere", "pid": 1}))
    check_checkpoint_dir(JobPaths(tmp_path / "b", tmp_path / "b" / "logs", str(ck),
                                  checkpoint_dir_key="checkpoint_dir"))  # no refusal


def test_stop_says_slurm_could_not_be_asked_and_fails(
        tmp_path: Path, failing_squeue: dict[str, str]) -> None:
    """Review 55 #2: stop read a failing squeue as no agent: "the job has already ended
    (lost)", exit 0, while status said its agents may run."""
    job = lost_slurm_job(tmp_path / "job")
    r = tg("stop", str(job), env=failing_squeue)
    assert r.returncode == 1, (r.stdout, r.stderr)
    said = " ".join(r.stderr.split())
    assert "the job's launcher is gone, and of its node agents Slurm could not be asked" \
        in said, said
    assert "nothing was ended, their workers may train on. Fix: run `trainguard stop " \
        f"{job}` again once Slurm answers, or `scancel 6` (the whole allocation)" in said, said
    assert "already ended" not in said, said


def test_a_lost_job_s_agents_have_ended_once_its_controller_was_gone_past_their_timeout(
        tmp_path: Path, failing_squeue: dict[str, str]) -> None:
    """Review 55 #3: an agent ends without a controller after its orphan timeout; a lost
    job whose controller was last alive longer ago than that (its heartbeat in meta) has no
    agent left, whatever Slurm says: prunable, its dir free, its logs diagnosed."""
    old = datetime.now(timezone.utc) - timedelta(seconds=GONE_AFTER_S + 5)
    job = lost_slurm_job(tmp_path / "runs" / "job", alive_at=old)
    ls = tg("ls", str(tmp_path / "runs"), "--json", env=failing_squeue)
    (row,) = json.loads(ls.stdout)
    assert row["state"] == "lost" and row["agents_unknown"] is None, row
    problems: list[str] = []
    got = read_job_dir(job, problems)
    assert got is not None and problems == [], problems
    r = tg("prune", str(tmp_path / "runs"), "--older-than", "1", "--yes", env=failing_squeue)
    assert r.returncode == 0 and not job.exists(), (r.stdout, r.stderr)


def test_a_long_slurm_error_is_cut_at_a_word_and_keeps_its_fix() -> None:
    """Review 55 #3: cut at 300 characters, squeue's error read `... Fix: c)`."""
    from trainguard.backends.orphans import _short

    said = _short("`squeue -h` failed (exit 1): " + "word " * 100 + "end. Fix: check "
                  "that slurmctld answers (`scontrol ping`)")
    assert said.endswith("word ... Fix: check that slurmctld answers (`scontrol ping`)"), said
    assert len(said) < 380
    assert _short("short. Fix: x") == "short. Fix: x"
