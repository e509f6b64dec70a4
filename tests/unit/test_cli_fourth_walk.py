"""What the fourth new-user walk-through found, each through the real command (`python -m
trainguard`, a real job store and files): refusals that name the right flag, a dry run that
refuses what `run` refuses, and `events`/`prune` filters that say so rather than match
nothing."""

from __future__ import annotations

import json
import subprocess
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from tests.unit.helpers import tg
from trainguard.controller.store import JobStore
from trainguard.records import Event, Involved, Level, RunningRecord, StartType

T0 = datetime(2025, 3, 1, 12, 0, 0, tzinfo=timezone.utc)


@pytest.fixture
def here(tmp_path: Path) -> Path:
    """A cwd with a script and a plain file where a directory is asked for."""
    (tmp_path / "train.py").write_text("")
    (tmp_path / "afile").write_text("hi\n")
    return tmp_path


@pytest.mark.parametrize(("flag", "key"), [("--checkpoint-dir", "checkpoint_dir"),
                                           ("--log-dir", "log_dir")])
def test_a_dir_that_cannot_be_made_names_its_flag_and_dry_run_refuses_it_too(
        here: Path, flag: str, key: str) -> None:
    argv = ("run", "--nproc-per-node", "1", "--job-dir", "runs/ckf", flag, "afile")
    dry, real = tg(*argv, "--dry-run", "train.py", cwd=here), tg(*argv, "train.py", cwd=here)
    want = (f"trainguard run: error: {flag} / '{key}': {here / 'afile'} is a file, not a directory."
            " Fix: give a directory (a new name is made), or move the file away")
    assert (dry.returncode, real.returncode) == (2, 2)
    assert dry.stderr.strip() == real.stderr.strip() == want
    assert not (here / "runs").exists()  # every dir is checked before one is made


def test_a_dir_from_the_job_file_that_cannot_be_made_is_refused_by_dry_run(here: Path) -> None:
    (here / "job.yaml").write_text("entrypoint: train.py\ncheckpoint_dir: afile/ck\n")
    r = tg("run", "--config", "job.yaml", "--dry-run", cwd=here)
    assert r.returncode == 2
    assert f"'checkpoint_dir': cannot create {here / 'afile' / 'ck'} (Not a directory)" in r.stderr


def a_job(job: Path, attempts: int = 2) -> Path:
    """An ended job of `attempts` attempts: JobCreated, a WorkerFailed in each, JobSucceeded."""
    with JobStore.create(job, "tg-held") as s:
        s.add_event(Event(T0, Level.INFO, "JobCreated", "created", Involved("tg-held")))
        for a in range(attempts):
            at = T0 + timedelta(seconds=10 * (a + 1))
            s.put_running(RunningRecord(a, at, StartType.FIRST_START if a == 0
                                        else StartType.AUTO_RESTART))
            s.add_event(Event(at, Level.ERROR, "WorkerFailed", f"rank 1 died in {a}",
                              Involved("tg-held", None, 1, a)))
        s.add_event(Event(T0 + timedelta(minutes=1), Level.INFO, "JobSucceeded", "done",
                          Involved("tg-held", None, None, attempts - 1)))
        s.set_meta(state="succeeded", attempt=attempts - 1, log_dir=str(job / "logs"))
    return job


def test_dry_run_refuses_another_run_id_with_the_words_run_uses(here: Path) -> None:
    held = a_job(here / "runs" / "j3")
    argv = ("run", "--run-id", "other", "--job-dir", str(held))
    dry, real = tg(*argv, "--dry-run", "train.py", cwd=here), tg(*argv, "train.py", cwd=here)
    assert (dry.returncode, real.returncode) == (2, 2)
    assert dry.stderr == real.stderr
    assert f"{held} holds the job 'tg-held', not 'other': drop --run-id" in dry.stderr
    same = tg("run", "--run-id", "tg-held", "--job-dir", str(held), "--dry-run", "train.py",
              cwd=here)
    assert same.returncode == 0 and json.loads(same.stdout)["run_id"] == "tg-held"


def reasons(r: subprocess.CompletedProcess[str]) -> list[str]:
    assert r.returncode == 0, r.stderr
    return [e["reason"] for e in json.loads(r.stdout)]


def test_events_reason_and_level_match_in_any_case_and_unknown_ones_are_refused(
        tmp_path: Path) -> None:
    job = str(a_job(tmp_path / "j"))
    assert reasons(tg("events", job, "--json", "--reason", "workerfailed")) == ["WorkerFailed"] * 2
    assert reasons(tg("events", job, "--json", "--reason", "jobcreated,JOBSUCCEEDED")) == [
        "JobCreated", "JobSucceeded"]
    assert reasons(tg("events", job, "--json", "--level", "ERROR")) == ["WorkerFailed"] * 2
    bogus = tg("events", job, "--reason", "WorkerFailed,Bogus")
    assert bogus.returncode == 2 and bogus.stdout == ""
    assert "--reason: 'Bogus' is not a valid choice. Fix: pass one of JobCreated," in bogus.stderr
    assert "WorkerFailed" in bogus.stderr
    level = tg("events", job, "--level", "bogus")
    assert level.returncode == 2
    assert "--level: 'bogus' is not a valid choice. Fix: pass one of Info, Warning, Error" in \
        level.stderr


def test_events_of_an_attempt_the_job_does_not_have_names_the_ones_it_has(
        tmp_path: Path) -> None:
    job = str(a_job(tmp_path / "j"))
    assert reasons(tg("events", job, "--json", "--attempt", "1")) == ["WorkerFailed",
                                                                       "JobSucceeded"]
    for follow in ((), ("--follow",)):  # an ended job has no attempt still to come
        r = tg("events", job, "--attempt", "9", *follow)
        assert r.returncode == 2 and r.stdout == ""
        assert "the job has no attempt 9: its attempts are 0, 1 (pick one with --attempt)" in \
            r.stderr


@pytest.mark.parametrize(("argv", "said"), [
    (("events", "JOB", "--tail", "-1"), "-1 is negative. Fix: give a whole number, 0 or more"),
    (("logs", "JOB", "--tail", "-2"), "-2 is negative. Fix: give a whole number, 0 or more"),
    (("logs", "JOB", "--tail", "1.5"),
     "1.5 is not a whole number. Fix: give a whole number, 0 or more"),
    (("prune", "ROOT", "--older-than", "-1"),
     "-1 is negative. Fix: give a number of days, 0 or more"),
    (("prune", "ROOT", "--older-than", "nan"),
     "nan is not a number. Fix: give a number of days, 0 or more"),
    (("prune", "ROOT", "--older-than", "week"),
     "week is not a number. Fix: give a number of days, 0 or more"),
    # walk-through 35 F3: it signalled the launcher, then exited 1 "still running after -1s"
    (("stop", "JOB", "--timeout", "-1"),
     "-1 is negative. Fix: give a number of seconds, 0 or more"),
    (("stop", "JOB", "--timeout", "nan"),
     "nan is not a number. Fix: give a number of seconds, 0 or more")])
def test_a_negative_count_or_age_is_refused_not_taken_for_nothing_or_everything(
        tmp_path: Path, argv: tuple[str, ...], said: str) -> None:
    """In plain words: a negative value is called negative (not "not a number")."""
    job = a_job(tmp_path / "runs" / "j")
    paths = {"JOB": str(job), "ROOT": str(tmp_path / "runs")}
    r = tg(*(paths.get(a, a) for a in argv))
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr == f"trainguard {argv[0]}: error: {argv[2]}: {said}\n"
    assert job.is_dir()


def test_a_job_dir_in_use_advises_stop_or_another_job_dir_not_another_run_id(
        here: Path) -> None:
    from trainguard.launch_checks import job_lock

    job = here / "busy"
    job.mkdir()
    with job_lock(job):  # as a running launcher holds it
        r = tg("run", "--job-dir", str(job), "train.py", cwd=here)
    assert r.returncode == 2
    assert f"{job} is in use by a running launcher" in r.stderr
    assert f"stop it (`trainguard stop {job}`), or use another --job-dir" in r.stderr
    assert "--run-id" not in r.stderr


def test_an_age_past_what_a_date_can_go_back_to_is_refused_not_a_traceback(
        tmp_path: Path) -> None:
    job = a_job(tmp_path / "runs" / "j")
    r = tg("prune", str(tmp_path / "runs"), "--older-than", "1e9")
    assert r.returncode == 2 and r.stdout == "" and "Traceback" not in r.stderr
    assert "--older-than: 1e9 days is more than 100,000 days" in r.stderr
    assert job.is_dir()


def test_a_misspelled_command_or_choice_suggests_the_closest(tmp_path: Path) -> None:
    r = tg("stauts", cwd=tmp_path)
    assert r.returncode == 2
    assert "'stauts' is not a valid choice. Fix: did you mean status? Or pass one of run," \
        in r.stderr, r.stderr
    r = tg("run", "--scenario", "sngle-node", "x.py", cwd=tmp_path)
    assert "did you mean single-node? Or pass one of llm, multi-node, single-node" in r.stderr
