"""Walk-through 19's findings on the command line: another tool's flags and the docs' word
`preset` get what to use instead, not the nearest spelling (`--shutdown-timeout` suggested
--hang-timeout, `--start-method` --hang-startup-timeout, `--preset` --redirects)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.unit.helpers import a_job, tg
from trainguard.suggest import INSTEAD, instead


@pytest.mark.parametrize(("flag", "says"), [
    ("--preset", "the presets are scenarios: --scenario single-node | multi-node | llm"),
    ("--shutdown-timeout", "torchrun's --shutdown-timeout is trainguard's --grace-period"),
    ("--shutdown_timeout", "torchrun's --shutdown-timeout is trainguard's --grace-period"),
    ("--start-method", "every rank is a process of its own"),
    ("--numa-binding", "not supported: bind in the script"),
])
def test_another_tools_flag_says_what_to_use_instead(tmp_path: Path, flag: str,
                                                     says: str) -> None:
    (tmp_path / "t.py").write_text("print('hi')\n")
    r = tg("run", flag, "1", "--dry-run", "t.py", cwd=tmp_path)
    assert r.returncode == 2
    assert f"Fix: {flag}: " in r.stderr and says in r.stderr, r.stderr
    assert "did you mean --hang" not in r.stderr


def test_a_near_miss_still_gets_the_nearest_flag_beside_another_tools_flag(
        tmp_path: Path) -> None:
    (tmp_path / "t.py").write_text("print('hi')\n")
    r = tg("run", "--max-restart=3", "--role=x", "--dry-run", "t.py", cwd=tmp_path)
    assert r.returncode == 2
    assert "--role: leave it out" in r.stderr and "did you mean --max-restarts?" in r.stderr


def test_a_job_files_preset_key_points_at_scenario(tmp_path: Path) -> None:
    (tmp_path / "t.py").write_text("print('hi')\n")
    (tmp_path / "job.yaml").write_text("preset: llm\nentrypoint: t.py\n")
    r = tg("run", "--config", "job.yaml", "--dry-run", cwd=tmp_path)
    assert r.returncode == 2
    assert "preset: unknown key. Fix: the presets are scenarios" in r.stderr, r.stderr


def test_every_torchrun_flag_is_taken_or_says_what_instead() -> None:
    """torchrun's own parser, of the torch installed: each of its flags is one `run` takes
    or one INSTEAD answers (a new torchrun flag fails here until it is placed)."""
    import torch.distributed.run as torchrun

    from trainguard.cli import _subcommand, parser

    p = parser()
    run = _subcommand(p, p.parse_args(["run", "t.py"]))
    ours = {s.replace("_", "-") for a in run._actions for s in a.option_strings}
    theirs = {s.replace("_", "-") for a in torchrun.get_args_parser()._actions
              for s in a.option_strings if s.startswith("--") and s != "--help"}
    assert not {f for f in theirs - ours if instead(f) is None}
    assert not {k for k in INSTEAD if f"--{k}" in ours}  # none that run takes after all


def test_torchruns_first_node_command_is_refused_not_run_on_this_machine(
        tmp_path: Path) -> None:
    """`--nnodes 2 --node_rank 0` (torchrun's command for the first node) ran both nodes
    here as virtual nodes, and the job 'succeeded'; a single-node job may still say 0."""
    (tmp_path / "t.py").write_text("print('hi')\n")
    r = tg("run", "--nnodes=2", "--node_rank=0", "--nproc-per-node=1", "--dry-run", "t.py",
           cwd=tmp_path)
    assert r.returncode == 2
    assert ("--node-rank / 'node_rank': 0 in a multi-node job: trainguard is not started once "
            "per node as torchrun is. Fix: drop it: run trainguard once") in r.stderr, r.stderr
    assert "its 2 nodes are virtual nodes on this machine" in r.stderr
    (tmp_path / "job.yaml").write_text("entrypoint: t.py\nnnodes: 2\nnode_rank: 0\n")
    f = tg("run", "--config", "job.yaml", "--dry-run", cwd=tmp_path)  # a job file's the same
    assert f.returncode == 2 and "0 in a multi-node job" in f.stderr, f.stderr
    assert tg("run", "--node_rank=0", "--dry-run", "t.py", cwd=tmp_path).returncode == 0
    assert tg("run", "--nnodes=2", "--dry-run", "t.py", cwd=tmp_path).returncode == 0


def test_dry_run_says_where_each_value_came_from(tmp_path: Path) -> None:
    """Walk-through 19: `--dry-run` printed the merged values only; which layer gave each
    (a preset, the job file, a flag) had to be worked out from the precedence rule."""
    (tmp_path / "t.py").write_text("print('hi')\n")
    (tmp_path / "job.yaml").write_text("scenario: llm\nmax_restarts: 4\nentrypoint: t.py\n")
    r = tg("run", "--config", "job.yaml", "--no-hang-detection", "--grace-period", "12",
           "--dry-run", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    came = doc["from"]
    assert set(came) == set(doc) - {"from", "run_id_note"}  # every key, nothing else
    assert (doc["max_restarts"], came["max_restarts"]) == (4, "the job file job.yaml")
    assert (doc["grace_period_s"], came["grace_period_s"]) == (12.0, "the command line")
    assert came["save_on_exit"] == "the llm preset" and doc["save_on_exit"] is True
    assert came["step_retries"] == "the default"
    assert doc["restart_on_hang"] is False  # the preset's true gave way to the flag
    assert came["restart_on_hang"] == ("the llm preset, turned off by hang_detection from "
                                       "the command line")
    assert came["run_id"] == "assigned at launch"
    assert came["checkpoint_dir"] == "the job dir (JOB_DIR/checkpoints)"
    held = a_job(tmp_path / "held", 1)
    again = json.loads(tg("run", "--dry-run", "--job-dir", str(held), "t.py",
                          cwd=tmp_path).stdout)
    assert (again["run_id"], again["from"]["run_id"]) == (
        "run-w", "the job the job dir holds (a relaunch continues it)")
    assert again["from"]["job_dir"] == "the command line"


@pytest.mark.parametrize("dry", [True, False])
def test_a_taken_metrics_port_is_refused_before_a_job_is_recorded(tmp_path: Path,
                                                                   dry: bool) -> None:
    """Walk-through 19: a launch refused for a metrics port in use left a `failed` job in its
    job dir (status, ls and prune saw a job that never ran); the port is now checked with the
    other settings, by `run` and `--dry-run` alike, before the job dir is made."""
    import socket

    (tmp_path / "t.py").write_text("print('hi')\n")
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        r = tg("run", "--metrics-port", str(port), "--job-dir", "j",
               *(["--dry-run"] if dry else []), "t.py", cwd=tmp_path)
    assert r.returncode == 2
    assert (f"--metrics-port: cannot serve metrics on 127.0.0.1:{port} (Address already in "
            "use). Fix: pick a free port, or 0 for any") in r.stderr, r.stderr
    assert not (tmp_path / "j").exists()


def test_a_job_still_running_is_said_to_be_before_its_metrics_port(tmp_path: Path) -> None:
    """Running a running job's command again (or its --dry-run) says the job dir is in use,
    not that its metrics port is (whose fix, another port, only led to the next refusal)."""
    import fcntl
    import socket

    (tmp_path / "t.py").write_text("print('hi')\n")
    job = tmp_path / "busy"
    job.mkdir()
    with socket.create_server(("127.0.0.1", 0)) as taken, \
            open(job / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # as a running launcher holds it
        lock.write("4242")
        lock.flush()
        port = str(taken.getsockname()[1])
        for dry in ([], ["--dry-run"]):
            r = tg("run", "--metrics-port", port, "--job-dir", str(job), *dry, "t.py",
                   cwd=tmp_path)
            assert r.returncode == 2
            assert f"--job-dir: {job} is in use by a running launcher (pid 4242)" in r.stderr, \
                r.stderr


def test_a_metrics_host_that_is_not_this_nodes_is_named_not_the_port(tmp_path: Path) -> None:
    (tmp_path / "t.py").write_text("print('hi')\n")
    r = tg("run", "--metrics-host", "no-such-host.invalid", "--metrics-port", "0",
           "--dry-run", "t.py", cwd=tmp_path)
    assert r.returncode == 2
    assert "--metrics-host: cannot serve metrics on no-such-host.invalid:0" in r.stderr, r.stderr
    assert "Fix: use 127.0.0.1 or one of this node's addresses" in r.stderr


def test_the_master_address_is_checked_for_a_single_node_job_only(tmp_path: Path) -> None:
    """A multi-node job meets at its first node's address (the flag is a fallback there):
    `--master-addr node001` from a login node must not refuse it."""
    (tmp_path / "t.py").write_text("print('hi')\n")
    one = tg("run", "--master-addr", "192.0.2.1", "--dry-run", "t.py", cwd=tmp_path)
    assert one.returncode == 2
    assert "--master-addr / --rdzv-endpoint: cannot listen on '192.0.2.1' on this node" in \
        one.stderr, one.stderr
    fake = tmp_path / "bin"  # Slurm's commands, for the dry run's check that they are here
    fake.mkdir()  # (and a cluster's partition: a real sinfo finding none refuses the launch)
    for cmd, body in (("srun", "exit 0"), ("scontrol", "exit 0"), ("sinfo", "echo 'debug* 4'")):
        (fake / cmd).write_text(f"#!/bin/sh\n{body}\n")
        (fake / cmd).chmod(0o755)
    two = tg("run", "--nnodes", "2", "--backend", "slurm", "--master-addr", "192.0.2.1",
             "--dry-run", "t.py", cwd=tmp_path,
             env={**os.environ, "PATH": f"{fake}:{os.environ['PATH']}"})
    assert two.returncode == 0, two.stderr


def test_a_preset_switch_that_was_off_is_not_said_to_be_turned_off(tmp_path: Path) -> None:
    (tmp_path / "t.py").write_text("print('hi')\n")
    r = tg("run", "--scenario", "single-node", "--max-restarts", "0", "--dry-run", "t.py",
           cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["unconditional_restart"] is False
    assert doc["from"]["unconditional_restart"] == "the single-node preset"


def test_another_jobs_run_id_is_refused_before_any_dir_is_made(tmp_path: Path) -> None:
    (tmp_path / "t.py").write_text("print('hi')\n")
    held = a_job(tmp_path / "held", 1)
    r = tg("run", "--job-dir", str(held), "--run-id", "other", "--log-dir", "newlogs",
           "--checkpoint-dir", "newck", "t.py", cwd=tmp_path)
    assert r.returncode == 2 and "run-w" in r.stderr, r.stderr
    assert not (tmp_path / "newlogs").exists() and not (tmp_path / "newck").exists()


@pytest.mark.parametrize("key", ["dry_run", "dry-run", "config", "verbose"])
def test_a_command_line_only_flag_in_a_job_file_says_so(tmp_path: Path, key: str) -> None:
    """Walk-through 33 #7: `dry_run: true` in a job file was told "did you mean 'run_id'?"."""
    (tmp_path / "t.py").write_text("print('hi')\n")
    (tmp_path / "job.yaml").write_text(f"{key}: true\nentrypoint: t.py\n")
    r = tg("run", "--config", "job.yaml", "--dry-run", cwd=tmp_path)
    assert r.returncode == 2
    flag, shown = "--" + key.replace("_", "-"), key.replace("-", "_")  # as the file is read
    assert f"{shown}: unknown key. Fix: `{shown}` is not a job-file setting: pass {flag} on " \
        "the command line" in r.stderr, r.stderr


def test_the_command_line_only_flags_are_the_run_flags_with_no_job_file_key() -> None:
    from trainguard.cli.run import NOT_SPEC
    from trainguard.spec_build import COMMAND_LINE_ONLY

    assert {k.replace("_", "-") for k in NOT_SPEC} - {"func", "command"} == set(COMMAND_LINE_ONLY)
