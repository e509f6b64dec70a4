"""slurm_cli against a real Slurm cluster of three virtual nodes on this machine (no mocks)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.multinode.slurm_cluster import SlurmCluster
from trainguard.backends import slurm_cli
from trainguard.backends.slurm import SlurmBackend
from trainguard.backends.slurm_cli import SlurmError

NODES = ["n1", "n2", "n3"]


@pytest.fixture
def cluster(slurm_cluster: SlurmCluster) -> Iterator[SlurmCluster]:
    """The session's cluster, with every job cancelled and every node idle after each test."""
    yield slurm_cluster
    env = slurm_cluster.env()
    subprocess.run(["scancel", "--user", "root"], env=env, capture_output=True, timeout=20,
                   check=False)
    for node in NODES:
        if slurm_cluster.node_state(node).startswith(("drain", "down")):
            slurm_cluster.resume(node)
    slurm_cluster.wait_idle(timeout_s=20)


def env_of(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def job_nodes(job_id: str, env: dict[str, str]) -> list[str]:
    out = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%N"], env=env,
                         capture_output=True, text=True, timeout=20, check=True).stdout
    return slurm_cli.expand_nodelist(out.strip(), env)


def start_step(job_id: str, node: str, env: dict[str, str], name: str,
               script: str = "sleep 120") -> tuple[subprocess.Popen[str], int]:
    """A long-running one-task step on node; returns srun and the task's pid once it runs."""
    argv = slurm_cli.srun_argv(job_id, node, ["bash", "-c", f"echo $SLURMD_NODENAME $$; {script}"],
                               step_name=name)
    p = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True)
    assert p.stdout is not None
    first = p.stdout.readline().split()
    assert first[:1] == [node], f"step on {node} printed {first}"
    return p, int(first[1])


def test_every_node_comes_up_idle(cluster: SlurmCluster) -> None:
    assert slurm_cli.available()
    assert slurm_cli.node_states(cluster.env()) == dict.fromkeys(NODES, "idle")
    assert cluster.node_state("n2") == "idle"
    assert cluster.start_s < 30


def test_expand_nodelist(cluster: SlurmCluster) -> None:
    env = cluster.env()
    assert slurm_cli.expand_nodelist("n[1-3]", env) == NODES
    assert slurm_cli.expand_nodelist("n[1,3],gpu[07-08]", env) == ["n1", "n3", "gpu07", "gpu08"]
    assert slurm_cli.expand_nodelist("", env) == []


def test_parse_allocation_of_a_real_batch_job(cluster: SlurmCluster, tmp_path: Path) -> None:
    env = cluster.env()
    out = tmp_path / "env.txt"
    job_id = subprocess.run(
        ["sbatch", "--parsable", "-N", "2", "-J", "tg-batch", "-o", str(out), "--wrap", "env"],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=20,
        check=True).stdout.strip()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and "SLURM_JOB_ID=" not in (
            out.read_text() if out.exists() else ""):
        time.sleep(0.2)
    alloc = slurm_cli.parse_allocation(env_of(out.read_text()))
    assert alloc is not None
    assert (alloc.job_id, alloc.nnodes, alloc.restart_count, alloc.name) == (
        job_id, 2, 0, "tg-batch")
    assert len(slurm_cli.expand_nodelist(alloc.nodelist, env)) == 2
    assert slurm_cli.parse_allocation(env) is None  # the test process is in no job


def test_parse_allocation_inside_a_step_of_an_salloc_job(cluster: SlurmCluster) -> None:
    env = cluster.env()
    job_id = slurm_cli.allocate(3, name="tg-alloc", env=env, timeout_s=20)
    r = subprocess.run(slurm_cli.srun_argv(job_id, "n2", ["env"], step_name="tg-env"), env=env,
                       capture_output=True, text=True, timeout=30, check=True)
    alloc = slurm_cli.parse_allocation(env_of(r.stdout))
    assert alloc is not None
    assert alloc.job_id == job_id and alloc.restart_count == 0
    # srun --jobid from outside the job: Slurm sets the step's values (name, node list)
    assert alloc.name == "tg-env"
    assert "n2" in slurm_cli.expand_nodelist(alloc.nodelist, env)


def test_a_second_step_on_the_same_node_is_not_blocked(cluster: SlurmCluster) -> None:
    env = cluster.env()
    job_id = slurm_cli.allocate(3, name="tg-steps", env=env, timeout_s=20)
    assert sorted(job_nodes(job_id, env)) == NODES
    first, _ = start_step(job_id, "n2", env, "agent-n2")
    try:
        t0 = time.monotonic()
        r = subprocess.run(
            slurm_cli.srun_argv(job_id, "n2", ["bash", "-c", "echo $SLURMD_NODENAME"],
                                step_name="second"),
            env=env, capture_output=True, text=True, timeout=20, check=False)
        assert (r.returncode, r.stdout.strip()) == (0, "n2"), r.stderr
        assert time.monotonic() - t0 < 10
        assert first.poll() is None  # the first step still runs beside it
    finally:
        slurm_cli.cancel(job_id, env)
        first.wait(20)


def test_allocate_excludes_nodes(cluster: SlurmCluster) -> None:
    env = cluster.env()
    job_id = slurm_cli.allocate(2, exclude=["n1"], name="tg-excl", env=env, timeout_s=20)
    assert sorted(job_nodes(job_id, env)) == ["n2", "n3"]
    slurm_cli.cancel(job_id, env)


def test_allocate_gives_up_and_leaves_nothing_queued(cluster: SlurmCluster) -> None:
    env = cluster.env()
    t0 = time.monotonic()
    with pytest.raises(SlurmError, match=r"salloc.*Fix: free or resume nodes"):
        slurm_cli.allocate(4, name="tg-toomany", env=env, timeout_s=1)
    assert time.monotonic() - t0 < 15
    queued = subprocess.run(["squeue", "-h", "-n", "tg-toomany"], env=env, capture_output=True,
                            text=True, timeout=20, check=True).stdout
    assert queued.strip() == ""


def test_drain_then_resume(cluster: SlurmCluster) -> None:
    env = cluster.env()
    slurm_cli.drain("n3", "trainguard: test isolation", env)
    assert slurm_cli.node_states(env)["n3"].startswith("drain")
    assert "drain" in cluster.sinfo_text() and "trainguard: test isolation" in cluster.sinfo_text()
    with pytest.raises(SlurmError, match="Fix: free or resume nodes"):
        slurm_cli.allocate(3, name="tg-drained", env=env, timeout_s=1)
    slurm_cli.resume("n3", env)
    # resumed, a node reads "idle*" (not responding) until slurmctld's next ping, < 1 s later
    assert slurm_cli.node_states(env)["n3"] in ("idle", "idle*")
    assert cluster.wait_state("n3", {"idle"}, timeout_s=10) == "idle"
    slurm_cli.resume("n3", env)  # already in service: nothing to do, no error


def test_isolating_keeps_an_admins_down_and_reason_and_drains_a_node_in_service(
        cluster: SlurmCluster, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # walk-through 36 #3: a node an admin set DOWN was drained with trainguard's reason
    for k, v in {**cluster.env(), "SLURM_JOB_ID": "999", "SLURM_JOB_NODELIST": "n[2-3]"}.items():
        monkeypatch.setenv(k, v)  # the backend inside an allocation (no salloc of its own)
    backend = SlurmBackend(2, "tg-test", tmp_path)
    try:
        cluster.scontrol("update", "NodeName=n3", "State=DOWN", "Reason=admin-test")
        assert backend.isolate("n3", "trainguard: lost") == (
            "not drained: Slurm has it down (reason: admin-test); left as it is")
        assert slurm_cli.state_reason("n3") == ("down", "admin-test")
        assert backend.isolate("n2", "trainguard: lost") == (
            "drained in Slurm (scontrol update NodeName=n2 State=DRAIN)")
        assert slurm_cli.state_reason("n2") == ("drained", "trainguard: lost")
    finally:
        backend.close()


def test_errors_name_the_command_stderr_and_fix(cluster: SlurmCluster) -> None:
    env = cluster.env()
    with pytest.raises(SlurmError) as e:
        slurm_cli.drain("nosuch", "x", env)
    assert "scontrol update NodeName=nosuch" in str(e.value)
    assert "Invalid node name specified" in str(e.value) and "Fix:" in str(e.value)
    with pytest.raises(SlurmError, match="could not be started"):
        slurm_cli.node_states({**env, "PATH": "/nonexistent"})


def test_losing_a_node_kills_its_step_and_marks_it_down(cluster: SlurmCluster) -> None:
    env = cluster.env()
    job_id = slurm_cli.allocate(3, name="tg-loss", env=env, timeout_s=20, no_kill=True)
    lost, lost_pid = start_step(job_id, "n2", env, "agent-n2")
    kept, kept_pid = start_step(job_id, "n1", env, "agent-n1")
    try:
        cluster.kill_node("n2")
        assert not psutil.pid_exists(lost_pid) or psutil.Process(lost_pid).status() == "zombie"
        assert psutil.pid_exists(kept_pid)
        t0 = time.monotonic()
        assert cluster.wait_state("n2", {"down*", "down"}, timeout_s=30).startswith("down")
        # srun learns of the loss only from slurmctld (about SlurmdTimeout + a ping period);
        # it reports it on stderr but exits 0: exit codes alone do not show a lost node
        out, _ = lost.communicate(timeout=20)
        assert "Node failure on n2" in out
        assert time.monotonic() - t0 < 25
        # --no-kill: the job carries on without n2, and so does its step on n1
        assert sorted(job_nodes(job_id, env)) == ["n1", "n3"]
        assert kept.poll() is None and psutil.pid_exists(kept_pid)
        cluster.restart_node("n2")
        if cluster.node_state("n2").startswith("down"):
            cluster.resume("n2")
        assert cluster.wait_state("n2", {"idle"}, timeout_s=20) == "idle"
    finally:
        slurm_cli.cancel(job_id, env)
        for p in (lost, kept):
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def test_a_node_failure_ends_an_agents_srun_while_the_agent_runs_on(
        cluster: SlurmCluster, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # walk-through 36 #11: slurmd died, its steps lived; the NodeLost said "its agent process
    # ended" of an agent that ran on (the fleet now tells such an agent to end)
    env = cluster.env()
    job_id = slurm_cli.allocate(2, exclude=["n3"], name="tg-failure", env=env, timeout_s=20,
                                no_kill=True)
    for k, v in {**env, "SLURM_JOB_ID": job_id,
                 "SLURM_JOB_NODELIST": slurm_cli.job_nodelist(job_id, env)}.items():
        monkeypatch.setenv(k, v)
    backend = SlurmBackend(2, "tg-test", tmp_path)
    pid_file = tmp_path / "agent.pid"
    agent = backend.start_agent("n2", ["bash", "-c", f"echo $$ > {pid_file}; exec sleep 120"])
    try:
        deadline = time.monotonic() + 20
        while not pid_file.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        pid = int(pid_file.read_text())
        cluster.kill_node("n2", steps=False)
        while not agent.ended() and time.monotonic() < deadline + 25:
            time.sleep(0.2)
        assert agent.ended() and psutil.pid_exists(pid)  # srun ended here; the agent runs
        assert agent.why_ended() == "its agent's Slurm step ended (srun: Node failure on n2)"
    finally:
        if pid_file.exists():
            with contextlib.suppress(OSError):
                os.kill(int(pid_file.read_text()), signal.SIGKILL)
        backend.close()
        slurm_cli.cancel(job_id, env)
        cluster.restart_node("n2")
        if cluster.node_state("n2").startswith("down"):
            cluster.resume("n2")


def test_env_points_clients_at_this_cluster(cluster: SlurmCluster) -> None:
    env = cluster.env()
    assert env["SLURM_CONF"] == str(cluster.conf) and cluster.conf.is_file()
    assert not any(k.startswith("SLURM_JOB") for k in env)
    assert os.environ.get("SLURM_CONF") != str(cluster.conf)  # nothing leaks into this process
