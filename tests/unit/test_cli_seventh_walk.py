"""Problems the seventh new-user walk-through met, with the real command."""

from __future__ import annotations

import json
from pathlib import Path

from tests.unit.helpers import tg
from trainguard.controller.store import JobStore


def test_a_file_given_as_a_job_dir_says_it_is_a_file_and_a_parent_of_jobs_points_to_ls(
        tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("print('hi')\n")
    for cmd in ("status", "logs", "report", "events"):
        r = tg(cmd, "train.py", cwd=tmp_path)
        assert r.returncode == 2, (cmd, r.stdout, r.stderr)
        assert "train.py is a file, not a job dir; pass the job dir printed by `trainguard " \
               "run` (`trainguard ls DIR` lists the jobs in DIR, ./trainguard-runs by default)" \
            in r.stderr, (cmd, r.stderr)
    r = tg("ckpt", "ls", "train.py", cwd=tmp_path)
    assert r.returncode == 2 and "train.py is a file, not a directory" in r.stderr, r.stderr
    JobStore.create(tmp_path / "jobs" / "a", "run-a").close()
    r = tg("status", "jobs", cwd=tmp_path)
    assert r.returncode == 2
    assert "it holds job dirs: `trainguard ls jobs` lists them" in r.stderr, r.stderr
    assert json.loads(tg("ls", "jobs", "--json", cwd=tmp_path).stdout)[0]["run_id"] == "run-a"


def test_a_job_that_ended_without_progress_is_not_offered_a_requeue(tmp_path: Path) -> None:
    with JobStore.create(tmp_path / "noprog", "run-n") as s:
        s.set_meta(state="failed", exit_code=86, attempt=3)
    with JobStore.create(tmp_path / "crashed", "run-c") as s:
        s.set_meta(state="failed", exit_code=1, attempt=0)
    out = tg("status", "noprog", cwd=tmp_path).stdout
    assert "ended: exit 86, attempts kept failing without progress: do not requeue it as it " \
           "is" in out and "continue it:" not in out, out
    assert json.loads(tg("status", "noprog", "--json", cwd=tmp_path).stdout)["exit_code"] == 86
    crashed = tg("status", "crashed", cwd=tmp_path).stdout
    assert "continue it: once its cause is fixed (`trainguard diagnose " in crashed, crashed
    assert "run the same `trainguard run` command with --job-dir" in crashed
    assert "or starts over if none was saved" in crashed


def test_a_switch_a_preset_turns_on_has_an_off_flag(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("")
    on = json.loads(tg("run", "--scenario", "llm", "--dry-run", "train.py", cwd=tmp_path).stdout)
    assert on["save_on_exit"] and on["restart_on_hang"]
    off = tg("run", "--scenario", "llm", "--no-save-on-exit", "--no-restart-on-hang",
             "--no-operator-reexecution", "--no-unconditional-restart", "--dry-run", "train.py",
             cwd=tmp_path)
    assert off.returncode == 0, off.stderr
    doc = json.loads(off.stdout)
    assert not (doc["save_on_exit"] or doc["restart_on_hang"] or doc["operator_reexecution"]
                or doc["unconditional_restart"])


def test_a_job_file_that_is_not_yaml_is_one_line_with_where_and_ls_of_nothing_says_so(
        tmp_path: Path) -> None:
    (tmp_path / "bad.yaml").write_text("entrypoint: x.py\nmax_restarts: [1\n")
    r = tg("run", "--config", "bad.yaml", "--dry-run", cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "is not valid YAML: expected ',' or ']'" in r.stderr and "at line 3, column 1" in \
        r.stderr and "Fix: fix the syntax there" in r.stderr, r.stderr
    r = tg("ls", "nothere", cwd=tmp_path)
    assert r.returncode == 2 and "nothere does not exist" in r.stderr, r.stderr


def test_diagnose_of_a_folder_of_jobs_asks_for_one_of_them(tmp_path: Path) -> None:
    JobStore.create(tmp_path / "jobs" / "a", "run-a").close()
    r = tg("diagnose", "jobs", cwd=tmp_path)
    assert r.returncode == 2
    assert "jobs holds job dirs, not one job's logs. Fix: diagnose one of them " \
           "(`trainguard ls jobs` lists them)" in r.stderr, r.stderr


def test_diagnose_of_a_script_says_it_is_no_log(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("start = ckpt.load_latest(state) or 0\n")
    r = tg("diagnose", "train.py", cwd=tmp_path)
    assert r.returncode == 2 and "train.py is a script, not a log. Fix: give the job dir" \
        in r.stderr, r.stdout + r.stderr
