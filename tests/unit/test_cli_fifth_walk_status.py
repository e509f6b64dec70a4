"""What the fifth new-user walk-through found, each through the real command (`python -m
trainguard`, a real job store and files): a Slurm launch that fails before anything runs says
why in salloc's own terms and leaves an ended job, `status` of a copied job dir shows the dir
given, `recovery` names both counts of steps, `prune` and `logs --tail` say what they did."""

from __future__ import annotations

import json
import os
import shutil
import stat
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from tests.unit.helpers import tg
from trainguard.backends.slurm_cli import allocate_fix
from trainguard.controller.store import JobStore
from trainguard.records import Event, Involved, Level, RunningRecord, StartType, iso

NO_CONFIG = ("salloc: error: resolve_ctls_from_dns_srv: res_nsearch error: Unknown host\n"
             "salloc: error: fetch_config: DNS SRV lookup failed\n"
             "salloc: fatal: Could not establish a configuration source\n")


# --- 1. salloc's message decides the fix; a launch that fails before start ends the job ---
BAD_CONF = ("salloc: error: s_p_parse_file: cannot stat file /tmp/nonexist.conf: No such file "
            "or directory, retrying in 1sec up to 60sec\n"
            "salloc: fatal: Unable to process configuration file\n")  # (walk-through 42 #3)


@pytest.mark.parametrize("said", [NO_CONFIG, BAD_CONF,
                                  "salloc: error: Unable to contact slurm controller "
                                  "(connect failure)\n"])
def test_a_cluster_that_cannot_be_reached_is_blamed_not_the_nodes(said: str) -> None:
    fix = allocate_fix(said, 2, (), 300)
    assert "slurm.conf" in fix and "`scontrol ping`" in fix
    assert "sinfo" not in fix and "free or resume" not in fix


def test_nodes_not_free_in_time_name_the_flag_that_waits_longer() -> None:
    said = ("salloc: error: Unable to allocate resources: Immediate execution impossible, "
            "insufficient priority\n")
    fix = allocate_fix(said, 2, ("n3",), 300)
    assert fix.startswith("free or resume nodes (`sinfo -N -R`): 2 node(s) outside n3 ")
    assert "within 300 s, or wait longer with --queue-timeout S" in fix


@pytest.fixture
def no_cluster(tmp_path: Path) -> dict[str, str]:
    """Slurm's client commands that answer as an unconfigured client does: salloc fails."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in {"salloc": f"cat >&2 <<'EOF'\n{NO_CONFIG}EOF\nexit 1\n",
                       "srun": "exit 1\n", "scontrol": "exit 1\n", "scancel": "exit 0\n",
                       "sinfo": "exit 1\n", "squeue": "exit 1\n"}.items():
        f = bin_dir / name
        f.write_text("#!/bin/sh\n" + body)
        f.chmod(f.stat().st_mode | stat.S_IXUSR)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    (tmp_path / "tiny.py").write_text("print('hi')\n")
    return env


def test_a_slurm_launch_without_a_cluster_says_so_and_leaves_a_failed_job(
        tmp_path: Path, no_cluster: dict[str, str]) -> None:
    r = tg("run", "--backend", "slurm", "--nnodes", "2", "--nproc-per-node", "1",
           "--job-dir", "runs/slurm", "tiny.py", cwd=tmp_path, env=no_cluster)
    assert r.returncode == 2, r.stderr
    assert "Could not establish a configuration source. Fix: this host cannot reach a " \
           "Slurm cluster" in r.stderr
    assert "free or resume" not in r.stderr
    status = json.loads(tg("status", "runs/slurm", "--json", cwd=tmp_path).stdout)
    assert status["state"] == "failed"
    events = json.loads(tg("events", "runs/slurm", "--json", cwd=tmp_path).stdout)
    failed = [e for e in events if e["reason"] == "JobFailed"]
    assert len(failed) == 1
    assert "before any worker started" in failed[0]["message"]
    assert "configuration source" in failed[0]["message"]
    ls = json.loads(tg("ls", "runs", "--json", cwd=tmp_path).stdout)
    assert [row["state"] for row in ls] == ["failed"]
    prune = tg("prune", "runs", "--older-than", "0", cwd=tmp_path)
    assert "would delete" in prune.stdout and "runs/slurm (failed" in prune.stdout


# --- 4. status of a copied job dir shows the dir given ---
def test_status_of_a_copied_job_dir_shows_the_copy_and_where_it_was_recorded(
        tmp_path: Path) -> None:
    orig = tmp_path / "runs" / "j1"
    with JobStore.create(orig, "tg-copied") as s:
        s.set_meta(state="succeeded", attempt=0, job_dir=str(orig),
                   ended_at=datetime.now(timezone.utc).isoformat())
    copy = tmp_path / "archive" / "j1"
    shutil.copytree(orig, copy)
    shown = tg("status", str(copy)).stdout
    assert f"job dir: {copy} (recorded at {orig}: copied or moved since)" in shown
    doc = json.loads(tg("status", str(copy), "--json").stdout)
    assert (doc["job_dir"], doc["recorded_job_dir"]) == (str(copy), str(orig))
    assert json.loads(tg("status", str(orig), "--json").stdout)["recorded_job_dir"] is None
    assert f"job dir: {orig}\n" in tg("status", str(orig)).stdout


# --- 5. prune's sentence and the --tail cap ---
def _ended_job(job: Path, days_ago: float) -> None:
    ended = datetime.now(timezone.utc) - timedelta(days=days_ago)
    with JobStore.create(job, f"tg-{job.name}") as s:
        s.add_event(Event(ended, Level.INFO, "JobSucceeded", "done", Involved(f"tg-{job.name}")))
        s.set_meta(state="succeeded", attempt=0, ended_at=ended.isoformat())


def test_prune_says_one_day_and_a_plain_sentence(tmp_path: Path) -> None:
    _ended_job(tmp_path / "runs" / "old", 3)
    none = tg("prune", "runs", "--older-than", "5", cwd=tmp_path).stdout
    assert none.strip() == "no job ended more than 5 days ago: nothing to delete"
    one = tg("prune", "runs", "--older-than", "1", cwd=tmp_path).stdout.splitlines()[-1]
    assert one.startswith("1 job ended more than 1 day ago: ")
    assert one.endswith(" to free; add --yes to delete it")
    done = tg("prune", "runs", "--older-than", "1", "--yes", cwd=tmp_path).stdout
    assert done.splitlines()[-1].startswith("deleted 1 job that ended more than 1 day ago: ")
    assert not (tmp_path / "runs" / "old").exists()


def test_logs_tail_over_the_cap_says_so_on_stderr(tmp_path: Path) -> None:
    job = tmp_path / "j"
    with JobStore.create(job, "tg-logs") as s:
        s.set_meta(state="succeeded", attempt=0, log_dir=str(job / "logs"), job_dir=str(job))
    log = job / "logs" / "attempt-0" / "rank-0.log"
    log.parent.mkdir(parents=True)
    log.write_text("".join(f"line {i}\n" for i in range(6000)))
    capped = tg("logs", str(job), "--tail", "6000")
    assert capped.returncode == 0
    assert len(capped.stdout.splitlines()) == 5000
    assert "--tail shows at most 5000 lines" in capped.stderr
    whole = tg("logs", str(job), "--tail", "10")
    assert len(whole.stdout.splitlines()) == 10 and whole.stderr == ""


# --- 3. recovery and report count the same steps done again ---
def test_recovery_names_steps_done_again_after_a_relaunch_as_report_does(tmp_path: Path) -> None:
    t0 = datetime(2025, 3, 1, 12, 0, 0, tzinfo=timezone.utc)

    def at(s: float) -> datetime:
        return t0 + timedelta(seconds=s)

    job = tmp_path / "job"
    with JobStore.create(job, "run-1") as s:
        s.add_event(Event(at(0), Level.INFO, "JobCreated", "created", Involved("run-1")))
        # stopped at step 60; the relaunch resumes from the checkpoint of step 50
        s.put_running(RunningRecord(0, at(0), StartType.FIRST_START, at(40), "JobStopped"))
        s.put_running(RunningRecord(1, at(100), StartType.RELAUNCH, at(140), "JobSucceeded"))
        s.add_progress([(0, k, at(5 + k * 0.5).timestamp()) for k in range(1, 61)]
                       + [(1, k, at(105 + (k - 50) * 0.5).timestamp()) for k in range(51, 101)])
        s.set_meta(state="succeeded", attempt=1, created_at=iso(at(0)), ended_at=iso(at(140)),
                   last_step=100, last_progress_at=iso(at(130)))
    summary = tg("recovery", str(job)).stdout
    assert "0 incidents, steps lost in incidents 0, steps done again 10, goodput" in summary
    assert "steps done once 100, done again 10" in tg("report", str(job)).stdout
    doc = json.loads(tg("recovery", str(job), "--json").stdout)["summary"]
    assert (doc["steps_lost"], doc["steps_done_again"]) == (0, 10)
