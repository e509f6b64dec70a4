"""What the fifth new-user walk-through found, each through the real command (`python -m
trainguard`, real files): a dry run that refuses what `run` refuses (a dir no mkdir can make,
a job dir in use, a checkpoint URL no filesystem serves), empty paths, settings that do not go
together, a misspelled flag, and job files that are missing, empty or give a key twice."""

from __future__ import annotations

import fcntl
import importlib.util
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.unit.helpers import tg


@pytest.fixture
def here(tmp_path: Path) -> Path:
    (tmp_path / "train.py").write_text("")
    return tmp_path


def both(here: Path, *argv: str) -> tuple[subprocess.CompletedProcess[str], ...]:
    """`run --dry-run ARGV train.py` and `run ARGV train.py`."""
    return (tg("run", *argv, "--dry-run", "train.py", cwd=here),
            tg("run", *argv, "train.py", cwd=here))


@pytest.mark.parametrize(("flag", "key", "where", "made"), [
    ("--checkpoint-dir", "checkpoint_dir", "/proc/ck", "/proc/ck"),
    ("--log-dir", "log_dir", "/proc/x/y", "/proc/x")])
def test_a_dir_under_proc_is_refused_by_dry_run_as_by_run(
        here: Path, flag: str, key: str, where: str, made: str) -> None:
    dry, real = both(here, "--job-dir", "runs/p", flag, where)
    assert (dry.returncode, real.returncode) == (2, 2), dry.stdout
    assert dry.stderr == real.stderr
    assert f"{flag} / '{key}': cannot create {made} (" in dry.stderr
    assert sorted(p.name for p in here.iterdir()) == ["train.py"]  # no dir, no probe left


@pytest.fixture
def held(here: Path) -> Iterator[Path]:
    """A job dir whose lock a running launcher (pid 4242) holds."""
    job = here / "runs" / "busy"
    job.mkdir(parents=True)
    with open(job / ".lock", "a+", encoding="utf-8") as f:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        f.write("4242")
        f.flush()
        yield job


def test_a_job_dir_in_use_is_refused_by_dry_run_as_by_run(here: Path, held: Path) -> None:
    dry, real = both(here, "--job-dir", str(held))
    assert (dry.returncode, real.returncode) == (2, 2), dry.stdout
    assert dry.stderr == real.stderr
    assert f"--job-dir: {held} is in use by a running launcher (pid 4242)" in dry.stderr


def test_a_free_job_dir_passes_the_dry_run_and_its_lock_is_let_go(here: Path) -> None:
    job = here / "runs" / "free"
    job.mkdir(parents=True)
    (job / ".lock").write_text("1")
    assert tg("run", "--job-dir", str(job), "--dry-run", "train.py", cwd=here).returncode == 0
    with open(job / ".lock", encoding="utf-8") as f:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)  # not held any longer


@pytest.mark.parametrize(("flag", "key"), [("--checkpoint-dir", "checkpoint_dir"),
                                           ("--job-dir", "job_dir"), ("--log-dir", "log_dir")])
def test_an_empty_dir_is_refused_naming_the_flag_and_the_default(
        here: Path, flag: str, key: str) -> None:
    r = tg("run", flag, "", "--dry-run", "train.py", cwd=here)
    assert r.returncode == 2
    assert f"{flag} / '{key}' (from the command line): is empty ('')" in r.stderr
    assert f"Fix: omit {flag} / '{key}' (default" in r.stderr


def test_an_empty_dir_in_the_job_file_is_refused(here: Path) -> None:
    (here / "job.yaml").write_text("entrypoint: train.py\nlog_dir: ''\n")
    r = tg("run", "--config", "job.yaml", "--dry-run", cwd=here)
    assert r.returncode == 2
    assert "--log-dir / 'log_dir' (from the job file job.yaml): is empty" in r.stderr


def test_restart_on_hang_without_hang_detection_is_refused(here: Path) -> None:
    r = tg("run", "--restart-on-hang", "--no-hang-detection", "--dry-run", "train.py", cwd=here)
    assert r.returncode == 2
    assert ("--restart-on-hang / 'restart_on_hang' (from the command line) and "
            "--no-hang-detection / 'hang_detection' (from the command line): a hang is never "
            "confirmed") in r.stderr
    assert "Fix: drop --restart-on-hang" in r.stderr


def test_unconditional_restart_without_a_restart_budget_is_refused(here: Path) -> None:
    r = tg("run", "--unconditional-restart", "--dry-run", "train.py", cwd=here)
    assert r.returncode == 2
    assert ("--unconditional-restart / 'unconditional_restart' (from the command line) and "
            "--max-restarts / 'max_restarts' (the default)") in r.stderr
    assert "Fix: set --max-restarts / 'max_restarts' to 1 or more" in r.stderr
    (here / "job.yaml").write_text("entrypoint: train.py\nmax_restarts: 0\n")
    r = tg("run", "--config", "job.yaml", "--unconditional-restart", "--dry-run", cwd=here)
    assert r.returncode == 2
    assert "'max_restarts' (from the job file job.yaml)" in r.stderr


@pytest.mark.parametrize("scenario", ["single-node", "multi-node", "llm"])
def test_presets_go_together_and_give_way_to_what_is_turned_off(
        here: Path, scenario: str) -> None:
    assert tg("run", "--scenario", scenario, "--dry-run", "train.py", cwd=here).returncode == 0
    r = tg("run", "--scenario", scenario, "--no-hang-detection", "--max-restarts", "0",
           "--dry-run", "train.py", cwd=here)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert (doc["restart_on_hang"], doc["unconditional_restart"]) == (False, False)


def test_an_unknown_checkpoint_url_scheme_is_refused_before_the_start(here: Path) -> None:
    dry, real = both(here, "--job-dir", "runs/u", "--checkpoint-dir", "bogus://x/y")
    assert (dry.returncode, real.returncode) == (2, 2), dry.stdout
    assert dry.stderr == real.stderr
    assert ("--checkpoint-dir / 'checkpoint_dir': bogus://x/y: unknown URL scheme 'bogus'"
            in dry.stderr)
    assert not (here / "runs").exists()


@pytest.mark.skipif(importlib.util.find_spec("gcsfs") is not None, reason="gcsfs installed")
def test_a_known_scheme_whose_package_is_missing_names_the_package(here: Path) -> None:
    r = tg("run", "--checkpoint-dir", "gcs://b/ck", "--dry-run", "train.py", cwd=here)
    assert r.returncode == 2
    assert "gcs://b/ck: the gcs:// filesystem needs the package gcsfs" in r.stderr
    assert "Fix: pip install gcsfs" in r.stderr
    ok = tg("run", "--checkpoint-dir", "memory://b/ck", "--dry-run", "train.py", cwd=here)
    assert ok.returncode == 0, ok.stderr


@pytest.mark.parametrize(("argv", "want"), [
    (["run", "--dry-run", "--max-restart", "3", "train.py"],
     "trainguard run: error: unrecognized arguments: --max-restart. Fix: did you mean "
     "--max-restarts? See `trainguard run --help`"),
    (["ckpt", "ls", "--jsn", "x"],
     "trainguard ckpt ls: error: unrecognized arguments: --jsn. Fix: did you mean --json? "
     "See `trainguard ckpt ls --help`"),
    (["run", "--dry-run", "--zzz", "train.py"],
     "trainguard run: error: unrecognized arguments: --zzz. Fix: see `trainguard run --help`"),
])
def test_a_misspelled_flag_suggests_the_subcommands_closest_flag(
        here: Path, argv: list[str], want: str) -> None:
    r = tg(*argv, cwd=here)
    assert r.returncode == 2
    assert r.stderr.strip() == want


def test_a_job_files_missing_entrypoint_names_the_key_and_the_file(here: Path) -> None:
    (here / "cfg").mkdir()
    (here / "cfg" / "job.yaml").write_text("entrypoint: nothere.py\n")
    r = tg("run", "--config", "cfg/job.yaml", "--dry-run", cwd=here)
    assert r.returncode == 2
    assert ("job file cfg/job.yaml: entrypoint: 'cfg/nothere.py' is not a file (a relative "
            "entrypoint is read from the job file's directory)") in r.stderr


def test_an_empty_job_file_says_it_is_empty(here: Path) -> None:
    (here / "job.yaml").write_text("# nothing yet\n")
    r = tg("run", "--config", "job.yaml", "--dry-run", cwd=here)
    assert r.returncode == 2
    assert "--config: job.yaml is empty" in r.stderr
    assert "`entrypoint: train.py`" in r.stderr
    r = tg("run", "--config", "job.yaml", "--dry-run", "train.py", cwd=here)
    assert r.returncode == 0  # (walk-through 22) it runs on the flags, and says so
    assert "note: job file job.yaml is empty (no keys): nothing is taken from it" in r.stderr


def test_a_key_given_twice_in_the_job_file_is_refused_with_its_lines(here: Path) -> None:
    (here / "job.yaml").write_text("entrypoint: train.py\nnproc_per_node: 2\n"
                                   "nproc_per_node: 3\n")
    r = tg("run", "--config", "job.yaml", "--dry-run", cwd=here)
    assert r.returncode == 2
    assert ("job file job.yaml: nproc_per_node: given twice (lines 2 and 3). Fix: keep one"
            in r.stderr)


def test_no_probe_dir_is_left_where_the_job_dir_would_be(here: Path) -> None:
    r = tg("run", "--job-dir", "runs/new/j", "--dry-run", "train.py", cwd=here)
    assert r.returncode == 0, r.stderr
    assert not [n for n in os.listdir(here) if n.startswith(".trainguard-probe")]
    assert not (here / "runs").exists()


def test_the_settings_job_created_records_are_the_dry_runs_with_absolute_dirs(
        here: Path) -> None:
    """Walk-through 9: JobCreated held `job_dir: 'j1'`, `log_dir: None`, `checkpoint_dir:
    None`; it records the dirs the job uses, as `run --dry-run` prints them."""
    argv = ("--job-dir", "j1", "--run-id", "walk9")
    dry = json.loads(tg("run", *argv, "--dry-run", "train.py", cwd=here).stdout)
    assert tg("run", *argv, "train.py", cwd=here).returncode == 0
    events = json.loads(tg("events", "j1", "--json", cwd=here).stdout)
    settings = next(e for e in events if e["reason"] == "JobCreated")["data"]["settings"]
    for key in ("job_dir", "log_dir", "checkpoint_dir"):
        assert settings[key] == dry[key] == str(here / "j1" / {"job_dir": "", "log_dir": "logs",
                                                                "checkpoint_dir": "checkpoints"
                                                                }[key]).rstrip("/"), key


def test_restart_args_given_a_flag_like_value_says_how_to_write_it(here: Path) -> None:
    """(walk-through 22) argparse's 'expected one argument' for `--restart-args
    --init_from=resume`: the fix is to join it with '=' and quote it."""
    r = tg("run", "--restart-args", "--init_from=resume", "--dry-run", "train.py", cwd=here)
    assert r.returncode == 2
    assert "Fix: join it with '=' and quote it: --restart-args='--init_from=resume'" in r.stderr
    ok = tg("run", "--restart-args=--init_from=resume", "--dry-run", "train.py", cwd=here)
    assert ok.returncode == 0, ok.stderr
