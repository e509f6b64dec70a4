"""Multi-node jobs on the local backend: virtual nodes (an agent process each, in its own
process group) on this machine, real DDP over gloo, real faults.

- a node killed (its agent's process group, and with it its workers) -> pod-level
  rescheduling onto the spare, resumed from the checkpoint, the same world size;
- a GPU hardware line (Xid 79) in one node's rank log -> that node isolated, every rank
  placed again on healthy + spare nodes (isolated job-level rescheduling);
- no spare left -> pod-level downgrades, job-level queues, then a clear failure;
- the controller SIGKILLed mid-run and started again -> it takes the job over, the workers
  never stop, nothing is lost;
- ... and when it cannot take over (a rank ended while none watched) -> the checkpoints
  committed meanwhile are still recorded (the agents kept them), the job launched again;
- every node failing the same pre-check -> the job fails at once, naming the check and the
  setting, before any start.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import pytest

from tests.integration.conftest import EXAMPLE, TG, read_json, reasons, run_tg
from tests.integration.multinode import (
    XID,
    Background,
    events_of,
    job_args,
    kill_node,
    log_of,
    node,
    wait_for,
)
from trainguard.controller.store import JobStore
from trainguard.handshake import connect
from trainguard.wire import WireError, new_token


# make test runs the same scenario on Slurm (tests/multinode/test_slurm_jobs.py) and on the
# local backend with memory snapshots, diagnose included (test_memory_snapshots.py)
@pytest.mark.long
def test_a_killed_node_is_replaced_by_the_spare_and_training_resumes(tmp_path: Path) -> None:
    job = tmp_path / "job"
    bg = Background(job_args(job, "--spare-nodes", "1"), tmp_path)
    status = wait_for(job, lambda s: (s["last_progress"]["step"] or 0) >= 25)
    assert [(n["name"], n["state"], n["slot"]) for n in status["nodes"]] == [
        ("node-0", "healthy", 0), ("node-1", "healthy", 1), ("node-2", "spare", None)]
    assert all(isinstance(n["agent_pid"], int) and n["host"] for n in status["nodes"])
    with JobStore.open(job) as store:  # a stranger without the job token knocks
        port = int(store.meta()["controller_port"])
    with pytest.raises(WireError):
        connect("127.0.0.1", port, new_token(), "node-9", {}, timeout=5)
    kill_node(status, "node-1")
    code, out = bg.finish()
    assert code == 0, out
    assert "NodeLost" in reasons(job) and "PodRescheduled" in reasons(job)
    lost = events_of(job, "NodeLost")[0]
    assert lost["involved"]["node"] == "node-1" and "agent process ended" in lost["message"]
    resumed = events_of(job, "Resumed")
    assert resumed and int(resumed[0]["message"].split("step ")[1].split()[0]) >= 20
    final = read_json("status", job)
    assert {n["name"]: n["state"] for n in final["nodes"]} == {
        "node-0": "healthy", "node-2": "healthy", "node-1": "lost"}
    # the stranger is counted where an operator looks (walk-through 32: logs only)
    assert final["connections_refused"]["handshake"] >= 1, final["connections_refused"]
    metrics = subprocess.run([*TG, "metrics", str(job)], capture_output=True, text=True,
                             check=True, timeout=60).stdout
    assert re.search(r'^trainguard_connections_refused_total\{reason="handshake"\} [1-9]',
                     metrics, re.M), metrics
    ranks = {r["rank"]: r for r in final["ranks"]}
    assert len(ranks) == 4
    assert {r: ranks[r]["node"] for r in ranks} == {0: "node-0", 1: "node-0", 2: "node-2",
                                                     3: "node-2"}
    # same world size; the moved ranks were scheduled twice, every process started twice
    assert "rank 2/4: process start 2, scheduled 2" in log_of(job, 1, 2)
    assert "rank 0/4: process start 2, scheduled 1" in log_of(job, 1, 0)
    recovery = read_json("recovery", job)
    first, second = recovery["running_records"]
    assert second["start_type"] == "pod_reschedule"
    (rr,) = first["recover_records"]
    assert (rr["recover"], rr["recover_result"], rr["fault_scenario"], rr["related_task"]) == (
        "pod_reschedule", "success", "node_fault", "node/node-1")
    assert rr["resumed_step"] >= 20 and rr["durations_s"]["detect"] < 2
    # `diagnose JOB_DIR` picks the attempt the loss ended (not the one that succeeded) and
    # blames the lost node, not a rank of a healthy node
    for args in ([], ["--attempt", "0"]):
        out = subprocess.run([*TG, "diagnose", str(job), "--json", *args], capture_output=True,
                             text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        report = json.loads(out.stdout)
        assert report["attempt"] == 0
        d = report["diagnosis"]
        assert (d["subcategory"], d["culprit"]["node"], d["culprit"]["rank"]) == (
            "node_lost", "node-1", 2)
        assert d["confidence"] >= 0.9


@pytest.mark.long  # tests/multinode/test_slurm_jobs.py runs the same scenario in make test
def test_a_gpu_fault_isolates_its_node_and_reschedules_the_whole_job(tmp_path: Path) -> None:
    job = tmp_path / "job"
    fault = f"log:{XID}@rank=2,step=15;exit:1@rank=2,step=15"
    r = run_tg(job_args(job, "--spare-nodes", "1", steps=40), cwd=tmp_path, fault=fault)
    assert r.returncode == 0, r.stderr
    key = ("FailureDiagnosed", "NodeIsolated", "JobRescheduled")
    assert [x for x in reasons(job) if x in key] == list(key)
    isolated = events_of(job, "NodeIsolated")[0]
    assert isolated["involved"]["node"] == "node-1" and "Xid" in isolated["message"]
    status = read_json("status", job)
    bad = node(status, "node-1")
    assert bad["state"] == "isolated" and "gpu_hardware" in bad["reason"]
    assert bad["times_implicated"] == 1
    assert {r["node"] for r in status["ranks"]} == {"node-0", "node-2"}
    for rank in range(4):  # every rank placed again
        assert f"rank {rank}/4: process start 2, scheduled 2" in log_of(job, 1, rank)
    first = read_json("recovery", job)["running_records"][0]
    (rr,) = first["recover_records"]
    assert (rr["recover"], rr["recover_result"], rr["fault_scenario"], rr["category"]) == (
        "job_reschedule_with_taint", "success", "chip_fault", "gpu_hardware")


@pytest.mark.long  # tests/multinode/test_slurm_jobs.py runs the same scenario in make test
def test_without_a_spare_a_lost_node_downgrades_queues_and_fails_clearly(tmp_path: Path) -> None:
    job = tmp_path / "job"
    bg = Background(job_args(job, "--queue-timeout", "3"), tmp_path)
    status = wait_for(job, lambda s: (s["last_progress"]["step"] or 0) >= 5)
    kill_node(status, "node-1")
    wait_for(job, lambda s: s["state"] == "queuing")
    waiting = read_json("recovery", job)["running_records"][0]["recover_records"]
    assert [(x["recover"], x["recover_result"]) for x in waiting] == [
        ("pod_reschedule", "downgrade"), ("job_reschedule_with_taint", "recovering")]
    code, out = bg.finish()
    assert code == 1, out
    # a checkpoint the surviving node committed may be reported with the stop, after NodeLost
    got = [r for r in reasons(job) if r != "CheckpointSaved"]
    assert got[-5:] == ["NodeLost", "FailureDiagnosed", "RescheduleDowngraded", "Queuing",
                     "JobFailed"], got
    failed = events_of(job, "JobFailed")[0]["message"]
    assert "not enough healthy nodes" in failed and "waited 3s" in failed
    assert "no spare node" in events_of(job, "RescheduleDowngraded")[0]["message"]
    records = read_json("recovery", job)["running_records"][0]["recover_records"]
    assert [(x["recover"], x["recover_result"]) for x in records] == [
        ("pod_reschedule", "downgrade"), ("job_reschedule_with_taint", "failed")]
    final = read_json("status", job)
    assert final["state"] == "failed" and node(final, "node-1")["state"] == "lost"
    # nothing was rescheduled: no budget spent (walk-through 21 saw job_reschedules 1/3), and
    # the lost node's rank reads lost (its end unseen: walk-through 42 #12), not running
    assert final["budgets"]["job_reschedules"]["used"] == 0, final["budgets"]
    assert {r["rank"]: r["state"] for r in final["ranks"] if r["node"] == "node-1"} == {
        2: "lost", 3: "lost"}, final["ranks"]


@pytest.mark.long  # tests/multinode/test_slurm_jobs.py runs the same scenario in make test
def test_a_restarted_controller_takes_the_job_over_without_stopping_workers(
        tmp_path: Path) -> None:
    job = tmp_path / "job"
    args = job_args(job, "--spare-nodes", "1", steps=80)
    fault = "log:hello@step=2"  # fired before the takeover: the new controller never hears it
    first = Background(args, tmp_path, fault=fault)
    before = wait_for(job, lambda s: (s["last_progress"]["step"] or 0) >= 10)
    first.proc.kill()  # the controller only: the agents and workers live on
    first.finish(timeout=30)
    # lost, but training on: the nightly prune leaves it (walk-through 30 saw it deleted)
    pruned = subprocess.run([*TG, "prune", str(tmp_path), "--older-than", "0", "--yes"],
                            capture_output=True, text=True, timeout=60, check=True)
    assert f"{job} is lost, but the node agents of node-0, node-1, node-2 still run" in \
        pruned.stderr, pruned.stderr
    assert (job / "trainguard.db").is_file()
    r = run_tg(args, cwd=tmp_path, fault=fault)
    assert r.returncode == 0, r.stderr
    assert "ControllerRestarted" in reasons(job) and "took over attempt 0" in r.stderr
    assert "FaultsNotFired" not in reasons(job)  # (review 39 #2: it said it never fired)
    # the adopted agents echo the ranks to the first console; the new one echoes their logs
    assert "[rank 0] done: 80 steps" in r.stdout, r.stdout[-3000:]
    after = read_json("status", job)
    assert after["state"] == "succeeded" and after["attempt"] == 0
    # every step trained once, in the first attempt, by the first workers
    saved = " ".join(e["message"] for e in events_of(job, "CheckpointSaved"))
    assert all(f"checkpoint of step {s} committed" in saved for s in range(10, 81, 10))
    assert "[rank 0] done: 80 steps" in first.console.read_text()
    assert {w["rank"]: w["pid"] for w in before["ranks"]} == \
        {w["rank"]: w["pid"] for w in after["ranks"]}
    assert "WorkersRestarted" not in reasons(job)
    (rec,) = read_json("recovery", job)["running_records"]
    assert rec["recover_records"] == [] and rec["end_reason"] == "succeeded"


def test_a_controller_that_cannot_take_over_records_what_the_agents_kept_for_it(
        tmp_path: Path) -> None:
    """The controller dies; while none watches, the workers commit the checkpoints of steps
    20 and 30 (the agents keep those messages: nobody acknowledged them) and rank 3 exits.
    The next controller cannot take the attempt over (its workers ended): it ended the agents
    with their kept messages unread, so those checkpoints were never in the job's events."""
    job = tmp_path / "job"
    args = job_args(job, steps=60)
    first = Background(args, tmp_path, fault="exit:1@rank=3,step=35")
    wait_for(job, lambda s: (s["last_progress"]["step"] or 0) >= 10)
    first.proc.kill()  # the controller only: the agents and workers live on
    first.finish(timeout=30)
    deadline = time.monotonic() + 60
    while not any("30" in p.name for p in (job / "checkpoints").glob("*")):
        assert time.monotonic() < deadline, list((job / "checkpoints").glob("*"))
        time.sleep(0.2)
    time.sleep(3)  # rank 3 exits after step 35
    r = run_tg(args, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "cannot take the running attempt over" in r.stderr
    saved = {(e["data"]["step"], e["involved"].get("attempt")) for e in
             events_of(job, "CheckpointSaved")}
    assert {(20, 0), (30, 0)} <= saved, sorted(saved)


def test_a_pre_check_failing_the_same_way_on_every_node_fails_the_job_at_once(
        tmp_path: Path) -> None:
    job = tmp_path / "job"
    r = run_tg(job_args(job, "--spare-nodes", "1", "--queue-timeout", "60",
                        "--min-free-disk-mb", "1e12"), cwd=tmp_path)
    assert r.returncode == 2  # the job's setting, nothing ran (walk-through 36 #6: it
    got = reasons(job)  # queued the whole --queue-timeout, then failed naming neither)
    assert got.count("PrecheckFailed") == 3 and "JobRunning" not in got
    assert "Queuing" not in got and "NodeIsolated" not in got  # no node is to blame
    failed = events_of(job, "JobFailed")[0]["message"]
    assert "every node checked" in failed and "same pre-check, disk:" in failed
    assert "--min-free-disk-mb" in failed
    fails = events_of(job, "PrecheckFailed")[0]
    assert "disk" in fails["message"] and fails["data"]["checks"]


# make test-long: make test runs the decision (tests/unit/test_ladder.py) and an isolated
# node's job-level reschedule with real nodes (test_slurm_jobs.py, the GPU fault)
@pytest.mark.long
def test_a_node_implicated_again_and_again_is_isolated_as_a_repeat_offender(
        tmp_path: Path) -> None:
    job = tmp_path / "job"
    nccl = "log:RuntimeError: NCCL error: unhandled system error (run with NCCL_DEBUG=INFO)"
    fault = (f"{nccl}@rank=2,step=3,attempt=0;exit:1@rank=2,step=3,attempt=0;"
             f"{nccl}@rank=3,step=3,attempt=1;exit:1@rank=3,step=3,attempt=1")
    r = run_tg(job_args(job, "--spare-nodes", "1", "--repeat-offender", "2",
                        "--unconditional-restart", "--restart-backoff", "0", steps=20),
               cwd=tmp_path, fault=fault)
    assert r.returncode == 0, r.stderr
    got = [x for x in reasons(job) if x in ("WorkersRestarted", "NodeIsolated",
                                             "JobRescheduled")]
    assert got == ["WorkersRestarted", "NodeIsolated", "JobRescheduled", "WorkersRestarted"]
    isolated = events_of(job, "NodeIsolated")[0]
    assert isolated["involved"]["node"] == "node-1"
    assert "repeat offender: implicated 2 times" in isolated["message"]
    records = [rr for rec in read_json("recovery", job)["running_records"]
               for rr in rec["recover_records"]]
    assert [rr["recover"] for rr in records] == ["process_restart", "job_reschedule_with_taint"]
    assert node(read_json("status", job), "node-1")["times_implicated"] == 2


def test_under_the_llm_preset_a_lost_node_costs_no_grace_period(tmp_path: Path) -> None:
    """Walk-through 19: with `--scenario llm` (step re-execution and the save on the way
    out) a pod-level move took the whole grace period: the survivor, its step failed, waited
    for a verdict that never comes to a rank being stopped, and its save on the way out waited
    for the lost node's rank. Now it stops waiting and its save does not wait for the dead."""
    job = tmp_path / "job"
    bg = Background(["run", "--scenario", "llm", "--nnodes", "2", "--nproc-per-node", "1",
                     "--spare-nodes", "1", "--grace-period", "30", "--job-dir", str(job),
                     str(EXAMPLE), "--steps", "100", "--step-time", "0.1", "--ckpt-every",
                     "1000"], tmp_path)
    status = wait_for(job, lambda s: (s["last_progress"]["step"] or 0) >= 40)
    kill_node(status, "node-1")
    code, out = bg.finish()
    assert code == 0, out
    (rr,) = [rr for r in read_json("recovery", job)["running_records"]
             for rr in r["recover_records"]]
    assert rr["recover"] == "pod_reschedule" and rr["recover_result"] == "success"
    assert rr["durations_s"]["stop"] < 15, rr["durations_s"]  # was the 30 s grace period
    saved = [e for e in events_of(job, "CheckpointSaved") if e["involved"].get("attempt") == 0]
    assert saved and "without the part of rank(s) 1" in saved[-1]["message"]
    log = log_of(job, 0, 0)  # (a SIGTERM between two steps stops it at the boundary instead)
    if "failed on process group generation" in log:
        assert "the launcher is stopping this rank: step" in log, log[-2000:]
