"""Memory snapshots end to end: real launcher, real workers, real faults, a real tmpfs.

Each test gives the agent its own shared-memory root (TRAINGUARD_SHM_ROOT) so that "no
region is left behind" is checked exactly.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.integration.conftest import EXAMPLE, TG, read_json, run_tg
from tests.tmpfs import mount_tmpfs
from tests.torture.memory_kills import torture

tmpfs = contextlib.contextmanager(mount_tmpfs)  # a real tmpfs of a given size, or a skip


def ddp(job: Path, *extra: str) -> list[str]:
    return ["run", "--nproc-per-node", "2", "--memory-every", "1", "--restart-backoff", "0",
            "--job-dir", str(job), *extra, str(EXAMPLE), "--steps", "14", "--ckpt-every", "4",
            "--digest"]


def digest(text: str) -> str:
    found = re.findall(r"weights sha256 ([0-9a-f]{64})", text)
    assert len(found) == 1, text[-2000:]
    return str(found[0])


def messages(job: Path, reason: str) -> list[str]:
    return [str(e["message"]) for e in read_json("events", job) if e["reason"] == reason]


def steps_in_storage(ckpt_dir: Path) -> list[int]:
    out = subprocess.run([*TG, "ckpt", "ls", str(ckpt_dir), "--json"], capture_output=True,
                         text=True, check=True, timeout=60)
    rows = json.loads(out.stdout)
    assert all(r["status"] == "valid" for r in rows), rows
    return [int(r["step"]) for r in rows]


def test_a_rank_killed_after_step_n_resumes_at_n_from_memory_with_the_exact_weights(
        tmp_path: Path, clean_digest: str) -> None:
    job, shm = tmp_path / "job", tmp_path / "shm"
    shm.mkdir()
    r = run_tg(ddp(job, "--max-restarts", "2"), cwd=tmp_path,
               fault="signal:KILL@rank=1,step=9", env={"TRAINGUARD_SHM_ROOT": str(shm)})
    assert r.returncode == 0, r.stderr[-3000:]
    assert digest(r.stdout) == clean_digest  # bit for bit the uninterrupted run's weights
    assert messages(job, "Resumed") == ["resumed from the node's memory snapshot of step 9"]
    (inc,) = read_json("recovery", job)["running_records"][0]["recover_records"]
    assert (inc["resumed_step"], inc["steps_lost"], inc["resumed_from"]) == (9, 0, "memory")
    assert inc["workers_from"] in ("standby", "cold", "mixed")
    assert list(shm.iterdir()) == []  # the region went with the job


def test_when_a_worker_dies_the_agent_persists_its_snapshot_and_a_relaunch_resumes_there(
        tmp_path: Path, clean_digest: str) -> None:
    job, shm = tmp_path / "job", tmp_path / "shm"
    shm.mkdir()
    ckpt = tmp_path / "ckpt"
    r = run_tg(ddp(job, "--checkpoint-dir", str(ckpt)), cwd=tmp_path,
               fault="signal:KILL@rank=1,step=10", env={"TRAINGUARD_SHM_ROOT": str(shm)})
    assert r.returncode != 0  # no restart budget: the job fails...
    assert steps_in_storage(ckpt) == [10, 8, 4]  # ...but step 10 reached storage from memory
    log = (job / "logs" / "attempt-0" / "persist.log").read_text()
    assert "persisted the memory snapshot of step 10" in log
    # ...and the job's record says so before its end (walk-through 27: a job that gave up
    # ended first, and the save's outcome reached no event)
    events = read_json("events", job)
    reasons = [e["reason"] for e in events]
    saved = [i for i, e in enumerate(events) if e["reason"] == "CheckpointSaved"
             and e["data"].get("step") == 10]
    assert saved and "memory" in events[saved[0]]["message"], events[-5:]
    assert saved[0] < reasons.index("JobFailed") == len(events) - 1, reasons
    assert list(shm.iterdir()) == []
    again = run_tg(ddp(tmp_path / "job2", "--checkpoint-dir", str(ckpt)), cwd=tmp_path,
                   env={"TRAINGUARD_SHM_ROOT": str(shm)})
    assert again.returncode == 0, again.stderr[-3000:]
    assert messages(tmp_path / "job2", "Resumed")[0] == (
        f"resumed from the checkpoint of step 10 at {ckpt}")
    assert digest(again.stdout) == clean_digest


def test_a_launcher_killed_while_persisting_leaves_no_region_and_no_broken_checkpoint(
        tmp_path: Path) -> None:
    job, shm, ckpt = tmp_path / "job", tmp_path / "shm", tmp_path / "ckpt"
    shm.mkdir()
    env = {**os.environ, "TRAINGUARD_SHM_ROOT": str(shm),
           "TRAINGUARD_FAULT": "signal:KILL@rank=1,step=10"}
    launcher = subprocess.Popen([*TG, *ddp(job, "--checkpoint-dir", str(ckpt))],
                                cwd=tmp_path, env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
    persist_log = job / "logs" / "attempt-0" / "persist.log"
    deadline = time.monotonic() + 120
    while not persist_log.exists():  # the agent started persisting: kill it now
        assert launcher.poll() is None and time.monotonic() < deadline
        time.sleep(0.01)
    launcher.send_signal(signal.SIGKILL)
    launcher.wait(timeout=30)
    deadline = time.monotonic() + 30
    while list(shm.iterdir()) and time.monotonic() < deadline:
        time.sleep(0.05)  # the guardian frees the region once the workers are gone
    assert list(shm.iterdir()) == []
    assert set(steps_in_storage(ckpt)) <= {10, 8, 4}  # what is committed is whole


def test_a_shared_memory_too_small_for_two_snapshots_is_a_clear_error(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "shm", "size=1m") as shm:  # the example's state is 1.3 MiB
        r = run_tg(ddp(tmp_path / "job"), cwd=tmp_path, env={"TRAINGUARD_SHM_ROOT": str(shm)})
        assert r.returncode != 0
        assert "2 slots" in r.stderr and "--shm-size" in r.stderr, r.stderr[-3000:]
        assert list(shm.iterdir()) == []


def test_a_shared_memory_that_fills_up_after_the_first_snapshot_changes_nothing(
        tmp_path: Path, clean_digest: str) -> None:
    """Docker's 64 MB /dev/shm crashed DLRover's workers with SIGBUS when it filled up: the
    slots here are allocated up front, so whoever fills it later cannot hurt a copy."""
    with tmpfs(tmp_path / "shm", "size=16m") as shm:
        slots = " ".join(f"[ -s {shm}/trainguard-*/rank-{r}/slot-1.bin ]" for r in (0, 1))
        fill = subprocess.Popen(  # once both ranks allocated both slots: fill it up
            ["sh", "-c", f"until {slots.replace('] [', '] && [')}; do sleep 0.01; done; "
             f"dd if=/dev/zero of={shm}/filler bs=64k 2>/dev/null; true"])
        r = run_tg(ddp(tmp_path / "job", "--max-restarts", "2"), cwd=tmp_path,
                   fault="signal:KILL@rank=0,step=9", env={"TRAINGUARD_SHM_ROOT": str(shm)})
        fill.wait(timeout=60)
        assert (shm / "filler").stat().st_size > 0  # it did fill up
        assert r.returncode == 0, r.stderr[-3000:]
        assert digest(r.stdout) == clean_digest
        assert messages(tmp_path / "job", "Resumed") == [
            "resumed from the node's memory snapshot of step 9"]


def test_random_kills_during_snapshot_copies_never_resume_wrong_state(tmp_path: Path) -> None:
    result = torture(tmp_path, kills=2, seed=7, mib=16)  # `make torture`: 200 kills
    assert result["problems"] == [], result
    # every restart resumed and was checked, or (a kill before step 2) rightly started over
    restarts = result["resumes_checked"] + 2 * result["started_over_before_a_whole_snapshot"]
    assert restarts == 4 and (result["max_steps_lost"] or 0) <= 1


@pytest.mark.long  # tests/multinode/test_slurm_jobs.py runs the same scenario in make test
def test_a_lost_node_s_ranks_resume_from_their_peer_copy_on_the_spare(
        tmp_path: Path, clean_digest: str) -> None:
    """Pod-level move with memory snapshots: node-1 dies; its rank starts on the spare with
    the copy node-0 kept of its snapshot, rank 0 from its own memory: both resume at the
    step last copied (no durable checkpoint yet), and the job ends with the weights of the
    uninterrupted job (the same 2 ranks and 14 steps on one node), bit for bit. That step
    is saved to storage at once (save at breakpoint, node-1's part from node-0's copy), the
    spare's standby takes the rank, and `status` shows the standbys and shared memory."""
    from tests.integration.multinode import Background, kill_node, wait_for

    job, shm = tmp_path / "job", tmp_path / "shm"
    shm.mkdir()
    args = ["run", "--nnodes", "2", "--nproc-per-node", "1", "--spare-nodes", "1",
            "--memory-every", "1", "--restart-backoff", "0", "--job-dir", str(job),
            "--max-restarts", "3", "--grace-period", "5", str(EXAMPLE), "--steps", "14",
            "--step-time", "1.0", "--ckpt-every", "100", "--progress", "--digest"]
    os.environ["TRAINGUARD_SHM_ROOT"] = str(shm)  # the agents inherit the launcher's
    try:
        bg = Background(args, tmp_path)
    finally:
        del os.environ["TRAINGUARD_SHM_ROOT"]
    status = wait_for(job, lambda s: (s["last_progress"]["step"] or 0) >= 5 and any(
        u["node"] == "node-2" and u["standby_ready"] for u in s["node_usage"]))
    usage = {u["node"]: u for u in status["node_usage"]}
    assert set(usage) == {"node-0", "node-1", "node-2"}, usage
    assert usage["node-2"]["standby_rss_bytes"] > 20 << 20, usage  # torch imported
    for n in ("node-0", "node-1"):  # two to four slots of its rank, and its buddy's copy
        assert usage[n]["shm_bytes"] > usage[n]["shm_peer_bytes"] > 0, usage
    assert usage["node-2"]["shm_bytes"] == 0, usage
    kill_node(status, "node-1")
    code, out = bg.finish()
    assert code == 0, out
    assert digest(out) == clean_digest
    resumed = messages(job, "Resumed")
    assert len(resumed) == 2 and any("peer node's copy" in m for m in resumed), resumed
    (inc,) = read_json("recovery", job)["running_records"][0]["recover_records"]
    assert inc["recover"] == "pod_reschedule" and inc["resumed_from"] == "memory+peer", inc
    assert 0 < inc["resumed_step"] <= inc["last_step_before"], inc
    saved = [e["data"] for e in read_json("events", job) if e["reason"] == "CheckpointSaved"]
    assert {"step": inc["resumed_step"], "source": "peer"}.items() <= saved[0].items(), saved
    assert inc["resumed_step"] in steps_in_storage(job / "checkpoints")  # and the last
    restarted = messages(job, "WorkersRestarted")
    assert len(restarted) == 1 and "(standby)" in restarted[0], restarted
    assert read_json("status", job)["node_usage"] == []  # freed with the job
    assert list(shm.iterdir()) == []
    # `diagnose JOB_DIR` picks the attempt the loss ended (not the one that succeeded) and
    # blames the lost node, not a rank of a healthy node
    for args in ([], ["--attempt", "0"]):
        out = subprocess.run([*TG, "diagnose", str(job), "--json", *args], capture_output=True,
                             text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        report = json.loads(out.stdout)
        d = report["diagnosis"]
        assert report["attempt"] == 0 and d["confidence"] >= 0.9, d
        assert (d["subcategory"], d["culprit"]["node"], d["culprit"]["rank"]) == (
            "node_lost", "node-1", 1), d


@pytest.mark.long  # tests/unit/test_memory_region_owner.py checks the region in make test
def test_a_lost_node_s_rank_resumes_from_its_peer_copy_on_a_spare_without_standbys(
        tmp_path: Path) -> None:
    """Review of walk-through 32 #5: with `--no-standby-workers` nothing made the spare's
    region before the restore wrote into it; the agent refused the region the restore had
    made, the moved rank ran without memory snapshots, the job failed after 120 s
    (checkpoint_load_error) and the restored copy stayed in shared memory."""
    from tests.integration.multinode import Background, kill_node, wait_for

    job, shm = tmp_path / "job", tmp_path / "shm"
    shm.mkdir()
    args = ["run", "--nnodes", "2", "--nproc-per-node", "1", "--spare-nodes", "1",
            "--no-standby-workers", "--memory-every", "1", "--restart-backoff", "0",
            "--job-dir", str(job), "--max-restarts", "3", "--grace-period", "5",
            str(EXAMPLE), "--steps", "14", "--step-time", "1.0", "--ckpt-every", "100",
            "--progress"]
    os.environ["TRAINGUARD_SHM_ROOT"] = str(shm)  # the agents inherit the launcher's
    try:
        bg = Background(args, tmp_path)
    finally:
        del os.environ["TRAINGUARD_SHM_ROOT"]
    status = wait_for(job, lambda s: (s["last_progress"]["step"] or 0) >= 5)
    kill_node(status, "node-1")
    code, out = bg.finish()
    assert code == 0, out[-3000:]
    assert "exists already" not in out, out[-3000:]
    resumed = messages(job, "Resumed")
    assert any("peer node's copy" in m for m in resumed), resumed
    assert list(shm.iterdir()) == []


def test_the_save_at_breakpoint_runs_below_the_agents_priority(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The restart does not wait for the persisting process: the restarted workers, at the
    agent's priority, go before it (a real `python -m trainguard.checkpoint.persist`)."""
    import psutil

    from trainguard.node import procs
    from trainguard.node.memory import PERSIST_NICE, MemoryRegion
    from trainguard.protocol import StartWorkers
    from trainguard.worker.contract import ENV_MEMORY_EVERY, ENV_SHM_ROOT

    monkeypatch.setenv(ENV_SHM_ROOT, str(tmp_path))
    guardian = procs.Guardian("")
    region = MemoryRegion("tg-test", "n0", guardian)
    try:
        assert region.env({ENV_MEMORY_EVERY: "1"})
        cmd = StartWorkers(run_id="r", attempt=0, argv=["x"], env={}, workers=[], world_size=1,
                           group_rank=0, group_world_size=1, master_addr="127.0.0.1",
                           master_port=1, max_restarts=0, grace_s=1, log_dir=str(tmp_path),
                           job_dir=str(tmp_path), checkpoint_dir=str(tmp_path / "ckpt"),
                           standby=False)
        assert region.persist(dict(os.environ), cmd, None, tmp_path / "persist.log")
        pid = region._persisting.pid  # type: ignore[union-attr]
        assert psutil.Process(pid).nice() == min(os.nice(0) + PERSIST_NICE, 19)
    finally:
        region.close()
        guardian.close()
    assert not region.path.exists()


@pytest.mark.long  # a 2-node job with a spare (about a minute); make test-long
def test_a_node_lost_after_its_ranks_snapshot_of_step_n_costs_no_step(
        tmp_path: Path, clean_digest: str) -> None:
    """0 steps lost on a pod-level move: node-1's rank snapshots step 9 and then blocks (a
    lock the test holds); node-1 is killed while node-0's rank waits in step 10's
    allreduce. Both resume at 9, whatever the last whole copy round reached: node-1's rank
    from node-0's snapshot of step 9 with its own small tensors (its tail) laid over it,
    checked against its CRC-32, and the job ends bit for bit as the uninterrupted one."""
    import fcntl

    from tests.integration.multinode import kill_node, wait_for

    job, shm, gate = tmp_path / "job", tmp_path / "shm", tmp_path / "gate.lock"
    shm.mkdir()
    held = open(gate, "a")  # noqa: SIM115
    fcntl.flock(held, fcntl.LOCK_EX)
    env = {**os.environ, "TRAINGUARD_SHM_ROOT": str(shm),
           "TRAINGUARD_FAULT": f"lock:{gate}@rank=1,step=9,attempt=0"}
    console = tmp_path / "console.log"
    with open(console, "w") as out:
        proc = subprocess.Popen(
            [*TG, "-v", "run", "--nnodes", "2", "--nproc-per-node", "1", "--spare-nodes", "1",
             "--memory-every", "1", "--restart-backoff", "0", "--job-dir", str(job),
             "--max-restarts", "3", "--grace-period", "5", str(EXAMPLE), "--steps", "14",
             "--step-time", "0.1", "--ckpt-every", "100", "--progress", "--digest"],
            cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        status = wait_for(job, lambda s: (s["last_progress"]["step"] or 0) >= 9)
        kill_node(status, "node-1")
        code = proc.wait(timeout=180)
    finally:
        held.close()
        if proc.poll() is None:
            proc.kill()
    text = console.read_text()
    assert code == 0, text[-3000:]
    assert digest(text) == clean_digest
    (inc,) = read_json("recovery", job)["running_records"][0]["recover_records"]
    assert (inc["recover"], inc["resumed_from"]) == ("pod_reschedule", "memory+peer"), inc
    assert (inc["resumed_step"], inc["last_step_before"], inc["steps_lost"]) == (9, 9, 0), inc
    assert list(shm.iterdir()) == []


SNAPSHOT_JOB = """
import os, sys, time
import torch, torch.distributed as dist
import trainguard
from trainguard.checkpoint import Checkpointer

dist.init_process_group("gloo")
rank = dist.get_rank()
state = {"weights": {"w": torch.zeros(6 * 1024 * 1024)}}  # 24 MiB a rank
ckpt = Checkpointer(every_steps=1000)  # memory_every: --memory-every 1
timed, count = 0.0, 0
for step in range(1, 13):
    state["weights"]["w"].add_(1.0)
    dist.all_reduce(torch.ones(1))
    trainguard.progress(step)
    t0 = time.monotonic()
    ckpt.maybe_save(step, state)  # a snapshot only: what the loop waits for
    timed, count = timed + time.monotonic() - t0, count + 1
if rank == 0:
    print(f"snapshots {count} timed {timed:.6f}", flush=True)
dist.destroy_process_group()
"""  # no ckpt.close(): the last report goes at the interpreter's exit


def test_the_loop_s_wait_on_memory_snapshots_is_booked_as_checkpoint_blocking(
        tmp_path: Path) -> None:
    """Walk-through 34 #3: each snapshot made a step slower and goodput went up, the wait
    booked productive. Rank 0's own timing of its maybe_save calls (a snapshot each) bounds
    what the ledger books: at most that, plus the report's rounding to the millisecond; at
    least 80% of it. The library times from maybe_snapshot's entry to the manifest's commit,
    so only maybe_save's own check and the call itself (microseconds, against a 24 MiB copy
    of several ms, 12 of them) fall outside, and a thread switch to the CRC-32 thread that
    lands after the commit (Python's switch interval, 5 ms, at most once a snapshot) on a
    loaded machine: measured equal to within 1 ms on 2 loaded CPUs, 20% is the margin."""
    job, shm = tmp_path / "job", tmp_path / "shm"
    shm.mkdir()
    script = tmp_path / "snap.py"
    script.write_text(SNAPSHOT_JOB)
    r = run_tg(["run", "--nproc-per-node", "2", "--memory-every", "1", "--job-dir", str(job),
                str(script)], cwd=tmp_path, env={"TRAINGUARD_SHM_ROOT": str(shm)})
    assert r.returncode == 0, r.stderr[-3000:]
    found = re.findall(r"snapshots (\d+) timed ([0-9.]+)", r.stdout)
    assert found and int(found[0][0]) == 12, r.stdout[-2000:]
    timed = float(found[0][1])
    blocking = read_json("report", job)["goodput"]["badput_s"]["checkpoint_blocking"]
    assert blocking > 0 and 0.8 * timed <= blocking <= timed + 0.002, (blocking, timed)
    assert messages(job, "CheckpointSaved") == []  # no save: the snapshots' wait alone
