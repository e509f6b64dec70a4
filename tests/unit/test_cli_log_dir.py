"""Jobs given one --log-dir (walk-through 28, finding 8: torchrun makes a folder per run, so a
team passes one fixed --log-dir): the second job's ranks appended to the first's
attempt-0/rank-R.log, and `logs` and `diagnose` of each read the other's lines. Now a
--log-dir that holds another job's logs is refused, naming that job and the fix."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from tests.unit.helpers import tg
from trainguard.checkpoint.manifest import OWNER_NAME

SCRIPT = "import os\nprint('job', os.environ.get('J'), 'step 1', flush=True)\n"


def run(cwd: Path, *args: str, job: str = "1") -> subprocess.CompletedProcess[str]:
    return tg("run", "--nproc-per-node", "1", *args, "t.py", cwd=cwd,
              env={**os.environ, "J": job})


def test_a_second_job_in_a_log_dir_with_another_jobs_logs_is_refused(tmp_path: Path) -> None:
    (tmp_path / "t.py").write_text(SCRIPT)
    r = run(tmp_path, "--job-dir", "runs/a", "--log-dir", "logs")
    assert r.returncode == 0, r.stderr
    owner = json.loads((tmp_path / "logs" / OWNER_NAME).read_text())
    assert owner["job_dir"] == str(tmp_path / "runs" / "a")
    for dry in ([], ["--dry-run"]):
        r = run(tmp_path, "--job-dir", "runs/b", "--log-dir", "logs", *dry, job="2")
        assert r.returncode == 2, r.stderr
        assert (f"--log-dir / 'log_dir': {tmp_path / 'logs'} holds the logs of the job "
                f"'{owner['run_id']}' (job dir {tmp_path / 'runs' / 'a'}) (attempt-0)") \
            in r.stderr, r.stderr
        assert "Fix: give each job its own --log-dir" in r.stderr
    assert not (tmp_path / "runs" / "b").exists()  # refused before anything was made
    log = (tmp_path / "logs" / "attempt-0" / "rank-0.log").read_text()
    assert "job 1 step 1" in log and "job 2" not in log
    # its own folder under the same parent: fine
    r = run(tmp_path, "--job-dir", "runs/b", "--log-dir", "logs/b", job="2")
    assert r.returncode == 0, r.stderr


def test_the_same_job_continued_keeps_its_log_dir(tmp_path: Path) -> None:
    """A requeue (the same job dir again) writes its next attempt beside the first; so does
    a job whose log dir was written before the owner file (its store names it)."""
    (tmp_path / "t.py").write_text(SCRIPT)
    assert run(tmp_path, "--job-dir", "jd", "--log-dir", "logs").returncode == 0
    r = run(tmp_path, "--job-dir", "jd", "--log-dir", "logs")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "logs" / "attempt-1" / "rank-0.log").is_file()
    (tmp_path / "logs" / OWNER_NAME).unlink()
    r = run(tmp_path, "--job-dir", "jd", "--log-dir", "logs")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "logs" / OWNER_NAME).is_file()  # written again


def test_logs_of_an_unknown_earlier_job_are_refused_too(tmp_path: Path) -> None:
    (tmp_path / "t.py").write_text(SCRIPT)
    (tmp_path / "logs" / "attempt-0").mkdir(parents=True)
    (tmp_path / "logs" / "attempt-0" / "rank-0.log").write_text("someone's\n")
    r = run(tmp_path, "--job-dir", "jd", "--log-dir", "logs")
    assert r.returncode == 2, r.stderr
    assert "holds the logs of an earlier job (attempt-0)" in r.stderr, r.stderr
    # a log dir with other things but no attempt-N dirs (tensorboard's) is not another job's
    (tmp_path / "tb").mkdir()
    (tmp_path / "tb" / "events.tfevents").write_text("tb\n")
    assert run(tmp_path, "--job-dir", "jd2", "--log-dir", "tb").returncode == 0
