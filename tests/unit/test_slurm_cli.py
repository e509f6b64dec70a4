"""slurm_cli's parsing and command lines (pure), and its error paths with stand-in commands."""

from __future__ import annotations

import os
import stat
import subprocess
import time
from pathlib import Path

import pytest

from trainguard.backends import slurm_cli
from trainguard.backends.slurm import SrunAgent
from trainguard.backends.slurm_cli import Allocation, SlurmError
from trainguard.errors import SpecError, TrainguardError
from trainguard.launch_checks import check_backend
from trainguard.spec import JobSpec

BATCH_ENV = {
    "SLURM_JOB_ID": "41", "SLURM_JOBID": "41", "SLURM_JOB_NODELIST": "n[1-2]",
    "SLURM_NODELIST": "n[1-2]", "SLURM_NNODES": "2", "SLURM_JOB_NUM_NODES": "2",
    "SLURM_JOB_NAME": "train", "SLURM_RESTART_COUNT": "3", "PATH": "/usr/bin",
}


def test_parse_allocation_reads_a_batch_jobs_environment() -> None:
    assert slurm_cli.parse_allocation(BATCH_ENV) == Allocation(
        job_id="41", nodelist="n[1-2]", nnodes=2, restart_count=3, name="train")


def test_parse_allocation_outside_slurm_is_none() -> None:
    assert slurm_cli.parse_allocation({"PATH": "/usr/bin"}) is None
    assert slurm_cli.parse_allocation({"SLURM_JOB_ID": " "}) is None


def test_parse_allocation_falls_back_to_the_old_names_and_defaults() -> None:
    alloc = slurm_cli.parse_allocation({"SLURM_JOBID": "7", "SLURM_NODELIST": "gpu[01-04]"})
    assert alloc == Allocation(job_id="7", nodelist="gpu[01-04]", nnodes=None,
                               restart_count=0, name=None)


def test_parse_allocation_prefers_the_jobs_node_count_over_the_steps() -> None:
    # inside `srun -N1` in a 2-node batch job: SLURM_NNODES is the step's, the job's is apart
    env = {"SLURM_JOB_ID": "5", "SLURM_NNODES": "1", "SLURM_JOB_NUM_NODES": "2"}
    alloc = slurm_cli.parse_allocation(env)
    assert alloc is not None and alloc.nnodes == 2
    assert slurm_cli.parse_allocation({"SLURM_JOB_ID": "5", "SLURM_NNODES": "x"}) == Allocation(
        "5", "", None, 0, None)


def test_parse_allocation_rejects_a_bad_restart_count() -> None:
    with pytest.raises(SlurmError, match=r"SLURM_RESTART_COUNT='two'.*Fix:"):
        slurm_cli.parse_allocation({"SLURM_JOB_ID": "5", "SLURM_RESTART_COUNT": "two"})


def test_allocation_is_frozen() -> None:
    alloc = slurm_cli.parse_allocation(BATCH_ENV)
    assert alloc is not None
    with pytest.raises(AttributeError):
        alloc.job_id = "1"  # type: ignore[misc]


def test_parse_sinfo_lowercases_keeps_suffixes_and_dedupes_partitions() -> None:
    text = "n1 IDLE\nn2 down*\nn3 drained\nn1 idle\n\ngarbage line here\nn4 mixed-\n"
    assert slurm_cli.parse_sinfo(text) == {"n1": "idle", "n2": "down*", "n3": "drained",
                                           "n4": "mixed-"}
    assert slurm_cli.parse_sinfo("") == {}


@pytest.mark.parametrize(("text", "job"), [
    ("salloc: Granted job allocation 12\n", "12"),
    ("salloc: Required node not available (down, drained or reserved)\n"
     "salloc: Pending job allocation 2\nsalloc: job 2 queued and waiting for resources\n"
     "salloc: job 2 has been allocated resources\nsalloc: Granted job allocation 2\n", "2"),
    ("salloc: Granted job allocation 77_3", "77_3"),
    ("salloc: Pending job allocation 9\nsalloc: error: Unable to allocate resources: "
     "Connection timed out\n", None),
    ("", None),
])
def test_parse_granted(text: str, job: str | None) -> None:
    assert slurm_cli.parse_granted(text) == job


def test_srun_argv_is_one_overlapping_task_on_one_node() -> None:
    assert slurm_cli.srun_argv("12", "n2", ["python", "-m", "agent", "--x"],
                               step_name="tg-agent-n2") == [
        "srun", "--jobid", "12", "-N1", "-n1", "-w", "n2", "--overlap",
        "--kill-on-bad-exit=0", "-J", "tg-agent-n2", "--export=ALL", "python", "-m", "agent",
        "--x"]
    no_job = slurm_cli.srun_argv(None, "n1", ["true"], step_name="s")
    assert no_job[:2] == ["srun", "-N1"] and "--jobid" not in no_job
    with pytest.raises(ValueError):
        slurm_cli.srun_argv("1", "n1", [], step_name="s")


def test_slurm_error_names_command_stderr_and_fix() -> None:
    e = SlurmError(["scontrol", "update", "NodeName=x"], "failed (exit 1)", "check the name",
                   "slurm_update error: Invalid node name specified\n", 1)
    assert str(e) == ("`scontrol update NodeName=x` failed (exit 1): slurm_update error: "
                      "Invalid node name specified. Fix: check the name")
    assert isinstance(e, TrainguardError) and e.returncode == 1


def fake_bin(tmp_path: Path, name: str, script: str) -> dict[str, str]:
    """An environment whose PATH finds only a stand-in `name` (a shell script)."""
    exe = tmp_path / name
    exe.write_text(f"#!/bin/sh\n{script}\n")
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    return {**os.environ, "PATH": f"{tmp_path}:/bin:/usr/bin"}


def test_a_missing_command_says_to_install_slurm(tmp_path: Path) -> None:
    with pytest.raises(SlurmError, match=r"`sinfo -h -N -o %N %T` could not be started.*Fix: "
                                         r"install Slurm's client commands"):
        slurm_cli.node_states({"PATH": str(tmp_path)})


def test_a_hung_command_times_out_with_the_fix(tmp_path: Path) -> None:
    env = fake_bin(tmp_path, "sinfo", "exec sleep 30")
    t0 = time.monotonic()
    with pytest.raises(SlurmError, match=r"did not finish within 1 s.*scontrol ping"):
        slurm_cli.node_states(env, timeout_s=1)
    assert time.monotonic() - t0 < 10


def test_allocate_reads_the_job_id_from_stderr_and_reports_failures(tmp_path: Path) -> None:
    env = fake_bin(tmp_path, "salloc",
                   'echo "$@" > "$(dirname "$0")/args"; '
                   'echo "salloc: Granted job allocation 321" >&2')
    assert slurm_cli.allocate(2, exclude=["n1", "n4"], name="tg", env=env, timeout_s=5) == "321"
    assert (tmp_path / "args").read_text().split() == [
        "--no-shell", "--immediate=5", "-N", "2", "-J", "tg", "--exclude", "n1,n4"]
    env = fake_bin(tmp_path, "salloc", 'echo "salloc: error: Invalid partition" >&2; exit 1')
    with pytest.raises(SlurmError, match=r"salloc .*exit 1\): salloc: error: Invalid partition"):
        slurm_cli.allocate(1, env=env, timeout_s=5)
    with pytest.raises(ValueError):
        slurm_cli.allocate(0, env=env)


def test_resume_of_a_node_in_service_is_a_no_op(tmp_path: Path) -> None:
    env = fake_bin(tmp_path, "scontrol",
                   'echo "slurm_update error: Invalid node state specified" >&2; exit 1')
    slurm_cli.resume("n1", env)
    env = fake_bin(tmp_path, "scontrol",
                   'echo "slurm_update error: Invalid node name specified" >&2; exit 1')
    with pytest.raises(SlurmError, match="Invalid node name specified"):
        slurm_cli.resume("nx", env)


def test_parse_partitions_finds_the_default_and_sums_a_split_partition() -> None:
    text = "debug* 3\ngpu 8\ngpu 2\nCLUSTER: c1\n\n"
    assert slurm_cli.parse_partitions(text) == ("debug", {"debug": 3, "gpu": 10})
    assert slurm_cli.parse_partitions("") == (None, {})


@pytest.mark.parametrize(("env", "found"), [
    ({}, ("debug", 3)),
    ({"SALLOC_PARTITION": "gpu"}, ("gpu", 10)),
    ({"SALLOC_PARTITION": "debug, gpu"}, ("gpu", 10)),  # the first that can run it
    ({"SALLOC_PARTITION": "nope"}, None),  # salloc says what is wrong with it
])
def test_salloc_partition_is_the_named_one_or_the_default(
        env: dict[str, str], found: tuple[str, int] | None) -> None:
    assert slurm_cli.salloc_partition(env, "debug", {"debug": 3, "gpu": 10}) == found
    assert slurm_cli.salloc_partition({}, None, {"gpu": 10}) is None


def test_a_job_larger_than_its_partition_is_refused_before_anything_is_made(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # walk-through 36 #7: salloc queued --queue-timeout for 4 nodes of a 3-node partition,
    # then said to free nodes or wait longer
    for cmd in ("srun", "scontrol"):
        fake_bin(tmp_path, cmd, "exit 0")
    monkeypatch.setenv("PATH", fake_bin(tmp_path, "sinfo", 'echo "debug* 3"')["PATH"])
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.delenv("SLURM_JOBID", raising=False)
    monkeypatch.delenv("SALLOC_PARTITION", raising=False)
    spec = JobSpec(entrypoint="train.py", backend="slurm", nnodes=2, spare_nodes=2)
    with pytest.raises(SpecError) as e:
        check_backend(spec)
    assert str(e.value) == (
        "--nnodes / --spare-nodes: the job asks Slurm for 4 nodes (--nnodes 2 + --spare-nodes "
        "2) and the partition debug has 3: no wait gives more. Fix: ask for at most 3 nodes in "
        "all (lower --spare-nodes or --nnodes), or name a larger partition "
        "(SALLOC_PARTITION=NAME)")
    check_backend(spec.model_copy(update={"spare_nodes": 1}))  # 3 of 3: salloc may wait
    monkeypatch.setenv("SLURM_JOB_ID", "41")  # inside an allocation: its own nodes count
    check_backend(spec)
    monkeypatch.delenv("SLURM_JOB_ID")
    fake_bin(tmp_path, "sinfo", "exit 1")  # no answer: salloc says what is wrong
    check_backend(spec)
    # no cluster at all (a SLURM_CONF that names no file): said at once, by --dry-run too
    # (walk-through 42 #3: salloc retried for 70 s, then the fix said to free nodes)
    fake_bin(tmp_path, "sinfo", "echo 'sinfo: error: s_p_parse_file: cannot stat file /x.conf' "
             ">&2; echo 'sinfo: fatal: Unable to process configuration file' >&2; exit 1")
    with pytest.raises(SpecError) as e:
        check_backend(spec)
    assert str(e.value).startswith("--backend slurm: `sinfo` finds no Slurm cluster here: "
                                   "sinfo: fatal: Unable to process configuration file. "
                                   "Fix: this host cannot reach a Slurm cluster"), str(e.value)


def test_parse_state_reason_reads_the_first_partitions_line() -> None:
    assert slurm_cli.parse_state_reason("DOWN|admin: bad fan | see ticket\ndown|x\n") == (
        "down", "admin: bad fan | see ticket")
    assert slurm_cli.parse_state_reason("idle|none\n") == ("idle", "")
    assert slurm_cli.parse_state_reason("") is None


@pytest.mark.parametrize(("state", "reason", "held"), [
    ("down", "w36test", "not drained: Slurm has it down (reason: w36test); left as it is"),
    ("down*", "Not responding", None),  # Slurm's own: it returns to service by itself (#9)
    ("down", "Node unexpectedly rebooted", None),
    ("drained", "", "not drained: Slurm has it drained (reason: none given); left as it is"),
    ("draining", "maintenance", "not drained: Slurm has it draining (reason: maintenance); "
                                "left as it is"),
    ("fail", "psu", "not drained: Slurm has it fail (reason: psu); left as it is"),
    ("allocated", "", None),
    ("mixed*", "", None),  # not responding for a moment: trainguard drains it
    ("idle", "", None),
])
def test_a_node_slurm_has_down_or_drained_is_left_with_its_reason(
        state: str, reason: str, held: str | None) -> None:
    # walk-through 36 #3: an admin's DOWN and its reason were replaced by trainguard's DRAIN
    assert slurm_cli.held_down(state, reason) == held


@pytest.mark.parametrize(("said", "why"), [
    ("[trainguard-agent] INFO connected\nsrun: error: Node failure on n2\n",
     "its agent's Slurm step ended (srun: Node failure on n2)"),
    ("slurmstepd-n1: error: *** STEP 4.0 ON n1 CANCELLED AT 2026-12-06T16:30:42 ***\n"
     "srun: Job step aborted: Waiting up to 4 seconds for job step to finish.\n"
     "srun: error: n1: task 0: Killed\n",
     "its agent's Slurm step was cancelled (*** STEP 4.0 ON n1 CANCELLED AT 2026-12-06T16:30:42 "
     "***): the cluster ended it, not a fault of the node"),
    # walk-through 42 #12: a requeue's cancelled step is Slurm's doing, a node failure is not
    ("slurmstepd-n3: error: *** STEP 1.2 ON n3 CANCELLED AT 2026-12-07T11:41:24 DUE TO JOB "
     "REQUEUE ***\n",
     "its agent's Slurm step was cancelled (*** STEP 1.2 ON n3 CANCELLED AT 2026-12-07T11:41:24 "
     "DUE TO JOB REQUEUE ***): the cluster ended it, not a fault of the node"),
    # a job without --no-kill: Slurm cancels every node's step for one that failed (that one's
    # srun says `Node failure on NODE`)
    ("slurmstepd-n1: error: *** STEP 14.0 ON n1 CANCELLED AT 2026-12-07T09:03:22 DUE TO NODE "
     "FAILURE ***\n",
     "its agent's Slurm step was cancelled (*** STEP 14.0 ON n1 CANCELLED AT 2026-12-07T09:03:22 "
     "DUE TO NODE FAILURE ***): the cluster ended it, not a fault of the node"),
    ("Traceback ...\nsrun: error: n3: task 0: Exited with exit code 1\n",
     "its agent's Slurm step ended (srun: n3: task 0: Exited with exit code 1)"),
    ("", "its agent's Slurm step ended"),
])
def test_an_agents_step_end_is_said_in_sruns_words(said: str, why: str) -> None:
    # walk-through 36 #11: a node failure ends srun here while the agent runs on there
    assert slurm_cli.srun_ended_why(said) == why


def test_an_srun_agent_reads_only_what_its_own_srun_wrote(tmp_path: Path) -> None:
    log = tmp_path / "n2.agent.log"
    log.write_text("srun: error: Node failure on n2\n")  # an earlier launch's agent
    with open(log, "ab") as err:
        since = err.tell()
        proc = subprocess.Popen(["sh", "-c", "echo 'srun: error: n2: task 0: Exited with "
                                 "exit code 3' >&2"], stderr=err)
    agent = SrunAgent("n2", proc, log, since)
    proc.wait(10)
    assert agent.ended()
    assert agent.why_ended() == "its agent's Slurm step ended (srun: n2: task 0: Exited " \
                                "with exit code 3)"
    assert SrunAgent("n2", None).why_ended() == "its agent's Slurm step ended"


def test_a_lost_node_s_srun_is_ended_without_the_recovery_waiting_on_it() -> None:
    """Walk-through 42 #4: srun waits out Slurm's KillWait (4 s) for a step on a dead node
    after its SIGTERM; the recovery's `stop` waited with it. kill(wait=False) returns at
    once; the srun is still reaped (a thread waits, SIGKILL after 10 s)."""
    import sys

    slow = ("import signal, sys, time\n"
            "signal.signal(signal.SIGTERM, lambda *a: (time.sleep(1.5), sys.exit(0)))\n"
            "print('ready', flush=True)\ntime.sleep(30)\n")
    proc = subprocess.Popen([sys.executable, "-c", slow], stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
    agent = SrunAgent("n2", proc)  # type: ignore[arg-type]
    t0 = time.monotonic()
    agent.kill(wait=False)
    assert time.monotonic() - t0 < 0.5 and not agent.ended()
    deadline = time.monotonic() + 10
    while proc.returncode is None and time.monotonic() < deadline:
        time.sleep(0.05)  # reaped by the thread (poll() here would reap it itself)
    assert proc.returncode == 0


def test_parse_steps_maps_each_running_step_s_name_to_its_id() -> None:
    text = ("7.0 trainguard-agent-n1\n7.1 trainguard-agent-n2\n\n7.2 trainguard-agent-n3\n"
            "7.extern extern\n7.3 a name with spaces\n")
    assert slurm_cli.parse_steps(text) == {
        "trainguard-agent-n1": "7.0", "trainguard-agent-n2": "7.1", "trainguard-agent-n3": "7.2",
        "extern": "7.extern", "a name with spaces": "7.3"}
    assert slurm_cli.parse_steps("") == {}


def test_a_node_whose_step_the_cluster_cancelled_is_not_drained() -> None:
    """Walk-through 42 #12: `scontrol requeue` cancelled the spare's agent step (`CANCELLED AT
    ... DUE TO JOB REQUEUE`) a moment before the launcher's SIGTERM, and the spare was
    drained in Slurm as a lost node: a healthy node out of service until an admin resumed it."""
    from trainguard.policy.nodes import lost_isolation

    requeued = slurm_cli.srun_ended_why(
        "slurmstepd-n3: error: *** STEP 1.2 ON n3 CANCELLED AT 2026-12-07T11:41:24 DUE TO JOB "
        "REQUEUE ***\n")
    assert not lost_isolation("n3", requeued).drain
    failed = slurm_cli.srun_ended_why("srun: error: Node failure on n2\n")
    assert lost_isolation("n2", failed).drain


def test_a_stop_slurm_caused_says_so_and_a_node_failure_without_no_kill_says_the_fix(
        tmp_path: Path) -> None:
    """Walk-through 42 #5: Slurm cancelled a job without --no-kill for a failed node, and
    trainguard's record read as a plain `stopped by SIGTERM`: the on-call looked for a person
    who stopped it."""
    log = tmp_path / "n1.agent.log"
    log.write_text("slurmstepd-n1: error: *** STEP 9.0 ON n1 CANCELLED AT 2026-12-07T09:00:00 "
                   "DUE TO JOB REQUEUE ***\n")  # an earlier launch's
    with open(log, "ab") as f:
        since = f.tell()
    agent = SrunAgent("n1", None, log, since)
    assert agent.cancelled() is None
    with open(log, "a") as f:
        f.write("[trainguard-agent] INFO connected\nslurmstepd-n1: error: *** STEP 14.0 ON n1 "
                "CANCELLED AT 2026-12-07T09:03:22 DUE TO NODE FAILURE ***\n")
    assert agent.cancelled() == (
        "Slurm cancelled the job's steps (*** STEP 14.0 ON n1 CANCELLED AT 2026-12-07T09:03:22 "
        "DUE TO NODE FAILURE ***): Slurm ends a job whose node failed unless it was submitted "
        "with --no-kill; submit it with `sbatch --no-kill` so that trainguard replaces the node "
        "instead")
    assert slurm_cli.cancelled_note(
        "*** STEP 1.2 ON n3 CANCELLED AT 2026-12-07T11:41:24 DUE TO JOB REQUEUE ***") == (
        "Slurm cancelled the job's steps (*** STEP 1.2 ON n3 CANCELLED AT 2026-12-07T11:41:24 "
        "DUE TO JOB REQUEUE ***)")
    assert slurm_cli.cancelled_note("srun: error: Node failure on n2\n") is None
