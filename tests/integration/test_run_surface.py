"""What a user types and sees: job files, console filtering, error files, bad input."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from tests.integration.conftest import read_json, reasons, run_tg

pytestmark = pytest.mark.integration


def test_a_job_file_holds_what_the_flags_hold_and_flags_override_it(tmp_path: Path) -> None:
    (tmp_path / "w.py").write_text("import os\nprint('step 1 on rank', os.environ['RANK'])\n")
    (tmp_path / "job.yaml").write_text(textwrap.dedent("""
        scenario: single-node
        entrypoint: w.py
        nproc_per_node: 3
        job_dir: from-file
        max_restarts: 7
    """))
    r = run_tg(["run", "--config", "job.yaml", "--nproc-per-node", "2"], cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    status = read_json("status", tmp_path / "from-file")
    assert len(status["ranks"]) == 2 and status["max_restarts"] == 7


def test_a_misspelt_job_file_key_is_an_error_that_names_the_key_and_the_fix(
        tmp_path: Path) -> None:
    (tmp_path / "job.yaml").write_text("entrypoint: w.py\nmax_restart: 3\n")
    r = run_tg(["run", "--config", "job.yaml"], cwd=tmp_path)
    assert r.returncode == 2
    assert "max_restart" in r.stderr and "did you mean 'max_restarts'" in r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize(("args", "expect"), [
    (["run", "missing.py"], "'missing.py' is not a file"),
    (["run", "--max-restarts", "500", "w.py"], "max_restarts"),
    (["run", "--nnodes", "2", "--node-rank", "1", "w.py"], "one controller"),
    (["run", "--nnodes", "2", "--backend", "pbs", "w.py"],
     "'pbs' is not a valid choice. Fix: pass one of local, slurm"),
    (["run", "--rdzv-backend", "etcd", "w.py"], "etcd"),
    (["run", "--nproc-per-node", "many", "w.py"], "use N, cpu, gpu or auto"),
    (["events", "no-such-dir"], "no trainguard job"),
])
def test_bad_input_gets_one_clear_error_line_and_exit_code_2(
        tmp_path: Path, args: list[str], expect: str) -> None:
    (tmp_path / "w.py").write_text("print('hi')\n")
    r = run_tg(args, cwd=tmp_path)
    assert r.returncode == 2
    assert expect in r.stderr
    assert "Traceback" not in r.stderr


def test_a_module_that_does_not_exist_is_diagnosed_from_pythons_line_and_exits_2(
        tmp_path: Path) -> None:
    # docs/cli.md: 2 for a program that could not start at all; restarts would not help
    r = run_tg(["run", "--job-dir", "j", "--max-restarts", "3", "--unconditional-restart",
                "-m", "nosuchmod"], cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert "WorkersRestarted" not in reasons(tmp_path / "j")
    out = run_tg(["diagnose", "j", "--json"], cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)["diagnosis"]
    assert (d["category"], d["subcategory"], d["rule"]) == (
        "dependency_or_import_error", "not_started", "program-not-started")
    assert "No module named nosuchmod" in d["evidence"]["text"]


def test_an_fsspec_url_as_checkpoint_dir_reaches_the_workers_as_given(tmp_path: Path) -> None:
    # README: `--checkpoint-dir` may be an fsspec URL such as s3://bucket/run1
    (tmp_path / "w.py").write_text(
        "import os\nprint('ckpt at', os.environ['TRAINGUARD_CHECKPOINT_DIR'])\n")
    r = run_tg(["run", "--job-dir", "j", "--checkpoint-dir", "s3://bucket/run1", "w.py"],
               cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "ckpt at s3://bucket/run1" in (tmp_path / "j/logs/attempt-0/rank-0.log").read_text()
    assert not (tmp_path / "s3:").exists()


def test_the_console_shows_only_the_filtered_ranks_but_every_rank_is_logged(
        tmp_path: Path) -> None:
    (tmp_path / "w.py").write_text("import os\nprint('hello from', os.environ['RANK'])\n")
    r = run_tg(["run", "--nproc-per-node", "3", "--local-ranks-filter", "1",
                "--job-dir", "j", "w.py"], cwd=tmp_path)
    assert r.returncode == 0
    assert "[rank 1] hello from 1" in r.stdout
    assert "hello from 0" not in r.stdout and "hello from 2" not in r.stdout
    for rank in range(3):
        line = (tmp_path / "j/logs/attempt-0" / f"rank-{rank}.log").read_text().splitlines()[0]
        stamp, stream, text = line.split(" ", 2)
        assert stamp.endswith("+00:00") and stream == "out" and text == f"hello from {rank}"


def test_torch_record_error_files_reach_the_diagnosis(tmp_path: Path) -> None:
    script = textwrap.dedent("""
        import os
        from torch.distributed.elastic.multiprocessing.errors import record

        @record
        def main():
            if os.environ["RANK"] == "1":
                raise ValueError("bad shard index 7")
            print("ok")

        main()
    """)
    (tmp_path / "w.py").write_text(script)
    r = run_tg(["run", "--nproc-per-node", "2", "--max-restarts", "2", "--job-dir", "j",
                "w.py"], cwd=tmp_path)
    assert r.returncode == 1
    assert (tmp_path / "j/logs/attempt-0/rank-1.error.json").is_file()
    diag = next(e for e in read_json("events", tmp_path / "j")
                if e["reason"] == "FailureDiagnosed")
    assert "user_code_error" in diag["message"] and "bad shard index 7" in diag["message"]
    assert "RestartScheduled" not in reasons(tmp_path / "j")


def test_a_module_runs_with_dash_m_and_a_program_with_no_python(tmp_path: Path) -> None:
    (tmp_path / "mymod.py").write_text("import sys\nprint('module args', sys.argv[1:])\n")
    r = run_tg(["run", "-m", "--job-dir", "a", "mymod", "--x", "1"], cwd=tmp_path)
    assert r.returncode == 0 and "module args ['--x', '1']" in r.stdout
    r = run_tg(["run", "--no-python", "--job-dir", "b", "echo", "step", "3"], cwd=tmp_path)
    assert r.returncode == 0 and "[rank 0] step 3" in r.stdout
    assert read_json("status", tmp_path / "b")["last_progress"]["step"] == 3


def test_the_same_job_launched_again_continues_its_attempts_and_counts_the_scheduling(
        tmp_path: Path) -> None:
    """The same command again, no --run-id (a retry, `sbatch --requeue`): the job goes on;
    a different explicit --run-id on that job dir is refused, naming the fix."""
    args = ["run", "--job-dir", "j", "--no-python", "sh", "-c",
            "echo step $TRAINGUARD_ATTEMPT start $TRAINGUARD_PROCESS_START_COUNT "
            "sched $TRAINGUARD_SCHEDULE_COUNT"]
    assert run_tg(args, cwd=tmp_path).returncode == 0
    run_id = read_json("status", tmp_path / "j")["run_id"]
    r = run_tg(args, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "[rank 0] step 1 start 2 sched 2" in r.stdout
    rec = read_json("recovery", tmp_path / "j")
    assert [x["start_type"] for x in rec["running_records"]] == ["first_start", "relaunch"]
    assert rec["summary"]["restarts"] == 0 and rec["summary"]["launches"] == 2
    assert "JobRelaunched" in reasons(tmp_path / "j")
    assert read_json("status", tmp_path / "j")["run_id"] == run_id
    other = run_tg(["run", "--run-id", "other", *args[1:]], cwd=tmp_path)
    assert other.returncode == 2
    assert f"holds the job {run_id!r}, not 'other': drop --run-id" in other.stderr


def test_a_program_that_cannot_start_fails_the_job_with_a_clear_event(tmp_path: Path) -> None:
    r = run_tg(["run", "--no-python", "--job-dir", "j", "no-such-program"], cwd=tmp_path)
    assert r.returncode == 2
    assert "cannot start 'no-such-program'" in r.stderr and "Traceback" not in r.stderr
    assert reasons(tmp_path / "j")[-1] == "JobFailed"
    assert read_json("status", tmp_path / "j")["state"] == "failed"
