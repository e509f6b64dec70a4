"""Rung 1a, in-process restart: only the dead or hung rank starts again; the others re-enter
their training function in their own processes (examples/train_ddp.py --resilient runs it
in trainguard.run_resilient).

Real `trainguard run`, real worker processes, real torch DDP over gloo, real faults: a rank
SIGKILLed, a rank SIGSTOPped (hung: a gloo peer cannot be aborted, it must be killed), a
rank that breaks every connection of its group (every process lives).
"""

from __future__ import annotations

import json
import re
import shutil
from datetime import datetime
from pathlib import Path

import pytest

from tests.integration.conftest import EXAMPLE, read_json, reasons, run_tg
from trainguard.controller.store import JobStore
from trainguard.goodput.read import job_goodput

pytestmark = pytest.mark.integration

STEPS = 14


def job(job_dir: Path, *flags: str, resilient: bool = True) -> list[str]:
    return ["run", "--nproc-per-node", "2", "--job-dir", str(job_dir), "--max-restarts", "3",
            "--restart-backoff", "0.1", "--grace-period", "5", *flags, str(EXAMPLE),
            "--steps", str(STEPS), "--ckpt-every", "4", "--digest",
            *(["--resilient"] if resilient else [])]


def job4(where: Path, *flags: str) -> list[str]:
    """`job` with 4 ranks and 8 steps."""
    args = job(where, *flags)
    args[args.index("--nproc-per-node") + 1] = "4"
    args[args.index("--steps") + 1] = "8"
    return args


def resumed_from_step_4(tmp_path: Path, job_dir: Path) -> str:
    """The digest of a 4-rank run resumed from `job_dir`'s checkpoint of step 4 (with 4 ranks
    a fresh DDP sums the gradients in another order than an uninterrupted run)."""
    ckpt = tmp_path / "from-step-4"  # the job's checkpoint of step 4, from before the fault
    shutil.copytree(job_dir / "checkpoints", ckpt, ignore=shutil.ignore_patterns("*08"))
    (ckpt / "latest").write_text("step-000000004")
    ref = run_tg([*job4(tmp_path / "ref", "--no-standby-workers"), "--ckpt-dir", str(ckpt)],
                 cwd=tmp_path)
    assert ref.returncode == 0 and "resumed from the checkpoint of step 4" in ref.stderr, \
        ref.stderr[-3000:]
    return digest(ref.stdout)


def digest(stdout: str) -> str:
    found = re.findall(r"weights sha256 ([0-9a-f]{64})", stdout)
    assert len(found) == 1, stdout[-2000:]
    return found[0]


def first_pids(job_dir: Path) -> dict[int, int]:
    """rank -> the pid the first attempt started it with (its JobRunning event)."""
    running = next(e for e in read_json("events", job_dir) if e["reason"] == "JobRunning")
    return {int(r): int(p) for r, p in re.findall(r"rank (\d+): pid (\d+)", running["message"])}


def final_ranks(job_dir: Path) -> dict[int, tuple[int, int]]:
    """rank -> (pid, process start count) at the end."""
    return {int(r["rank"]): (int(r["pid"]), int(r["start_count"]))
            for r in read_json("status", job_dir)["ranks"]}


def only_rank_1_is_new(job_dir: Path) -> None:
    before, after = first_pids(job_dir), final_ranks(job_dir)
    assert after[0] == (before[0], 1)  # the survivor: the same process, started once
    assert after[1][0] != before[1] and after[1][1] == 2  # the replacement: a new process


def the_one_record(job_dir: Path) -> dict[str, object]:
    records = read_json("recovery", job_dir)["running_records"]
    assert len(records) == 1  # one attempt: the job was never restarted as processes
    (rr,) = records[0]["recover_records"]
    return dict(rr)


def test_a_killed_rank_is_started_again_alone_and_its_peer_reenters_in_place(
        tmp_path: Path, job_dir: Path, clean_digest: str) -> None:
    r = run_tg(job(job_dir, "--save-on-exit"), cwd=tmp_path, fault="signal:KILL@rank=1,step=6")
    assert r.returncode == 0, r.stderr[-3000:]
    assert digest(r.stdout) == clean_digest  # resumed from step 4: the same weights
    # the job's last step is the newest checkpoint: the survivor's first entry saved its old
    # step 6 at interpreter exit after it, and `latest` pointed back at it (walk-through 27)
    assert (job_dir / "checkpoints" / "latest").read_text().strip() == f"step-{STEPS:09d}"
    saved = [e["message"] for e in read_json("events", job_dir)
             if e["reason"] == "CheckpointSaved"]
    assert not any("checkpoint of step 6 " in m for m in saved), saved
    got = reasons(job_dir)
    assert got.index("WorkerFailed") < got.index("InProcessRestarting") < got.index(
        "InProcessRestarted")
    assert "WorkersRestarted" not in got and "WorkersStopped" not in got[:-1]
    assert got[-1] == "JobSucceeded"
    # review 35 #1: the survivor's failed step, reported in the settle after the death, made
    # a step re-execution record and a StepRetryDowngraded
    assert "StepRetryDowngraded" not in got and "StepRetrying" not in got, got
    only_rank_1_is_new(job_dir)
    rr = the_one_record(job_dir)
    # from step 4's checkpoint; from 0 when a loaded machine had not committed step 4's
    # asynchronous save when rank 1 was killed at step 6 (a make-test run under load)
    assert (rr["recover"], rr["recover_result"], rr["related_task"]) == (
        "in_process_restart", "success", "worker-1") and rr["resumed_step"] in (0, 4), rr
    assert rr["durations_s"]["stop"] == 0, rr  # nothing stopped (review 35 #6: the settle)
    restarting = next(e for e in read_json("events", job_dir)
                      if e["reason"] == "InProcessRestarting")
    assert "only rank 1 starts again" in restarting["message"]
    assert "re-enter" in restarting["message"]
    restarted = next(e for e in read_json("events", job_dir)
                     if e["reason"] == "InProcessRestarted")  # (walk-through 22: it was null)
    assert rr["workers_from"] == ("standby" if "pre-warmed standby" in restarted["message"]
                                  else "cold")
    # every step counted once, the redone ones once more (tests/unit/test_goodput_ledger.py
    # has the sparse samples of walk-through 27 F10, which this run's dense ones do not show)
    with JobStore.open(job_dir) as store:
        g = job_goodput(store)
    assert g.steps_productive == STEPS
    assert g.steps_wasted == rr["steps_lost"]


def test_a_survivors_step_of_the_old_group_is_not_taken_for_recovery(
        tmp_path: Path, job_dir: Path) -> None:
    """(walk-through 22) Rank 1 is killed while both ranks sleep out step 7 after its
    all-reduce: rank 0 still prints step 7, after the agent began the restart. That step was
    taken for the first step after recovery (the record said 0.04-0.1 s, the recovery took
    about 1 s, and the steps done again went uncounted). The first step counted is the
    first one after the ranks re-entered: resumed at 4, it is 5."""
    import os
    import subprocess
    import sys
    import time

    from trainguard.controller.store import JobStore

    args = ["run", "--nproc-per-node", "2", "--job-dir", str(job_dir), "--max-restarts", "3",
            "--grace-period", "5", str(EXAMPLE), "--steps", "10", "--ckpt-every", "4",
            "--step-time", "0.8", "--resilient"]
    env = {k: v for k, v in os.environ.items() if k != "TRAINGUARD_FAULT"}
    with (tmp_path / "console.txt").open("w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "trainguard", *args], cwd=tmp_path,
                                env=env, stdout=out, stderr=subprocess.STDOUT, text=True)
    try:
        log = job_dir / "logs" / "attempt-0" / "rank-1.log"
        deadline = time.monotonic() + 120
        while not (log.exists() and "step 6 " in log.read_text(errors="replace")):
            assert time.monotonic() < deadline and proc.poll() is None, \
                (tmp_path / "console.txt").read_text()[-3000:]
            time.sleep(0.02)
        time.sleep(0.3)  # step 7's all-reduce is done: both ranks sleep
        os.kill(first_pids(job_dir)[1], 9)
        assert proc.wait(timeout=120) == 0, (tmp_path / "console.txt").read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    rr = the_one_record(job_dir)
    assert (rr["recover"], rr["resumed_step"]) == ("in_process_restart", 4)
    store = JobStore.open(job_dir)
    try:
        samples = [(step, at) for _, step, at in store.progress()]
    finally:
        store.close()
    steps = [step for step, _ in samples]
    # step 5 again after the old group's 6 (the survivor's old step 7 may come before it, or,
    # dropped as stale, never), and the recovery ends at that step 5, not at a stale step
    again = steps.index(6) + 1 + steps[steps.index(6) + 1:].index(5)
    first = datetime.fromisoformat(str(rr["first_progress_at"])).timestamp()
    assert abs(first - samples[again][1]) < 0.01, (rr, samples)


def test_a_hung_rank_is_dumped_killed_and_replaced_while_its_peer_goes_on_in_place(
        tmp_path: Path, job_dir: Path, clean_digest: str) -> None:
    r = run_tg(job(job_dir, "--restart-on-hang", "--hang-timeout", "4"), cwd=tmp_path,
               fault="signal:STOP@rank=1,step=6")
    assert r.returncode == 0, r.stderr[-3000:]
    assert digest(r.stdout) == clean_digest
    got = reasons(job_dir)
    assert got.index("HangConfirmed") < got.index("InProcessRestarting") < got.index(
        "InProcessRestarted")
    assert "WorkersRestarted" not in got
    hang = json.loads((job_dir / "logs" / "attempt-0" / "stacks" / "hang.json").read_text())
    assert hang["culprit"]["rank"] == 1 and hang["stack_files"]  # the stacks were dumped
    only_rank_1_is_new(job_dir)
    rr = the_one_record(job_dir)
    assert (rr["recover"], rr["recover_result"], rr["fault_scenario"]) == (
        "in_process_restart", "success", "job_hanged")


def test_a_group_broken_under_every_live_rank_reenters_without_a_new_process(
        tmp_path: Path, job_dir: Path, clean_digest: str) -> None:
    r = run_tg(job(job_dir), cwd=tmp_path, fault="collective@rank=1,step=6")
    assert r.returncode == 0, r.stderr[-3000:]
    assert digest(r.stdout) == clean_digest
    got = reasons(job_dir)
    assert "InProcessRestarted" in got and "WorkerFailed" not in got
    before, after = first_pids(job_dir), final_ranks(job_dir)
    assert after == {rank: (pid, 1) for rank, pid in before.items()}  # nobody new
    rr = the_one_record(job_dir)
    assert (rr["recover"], rr["recover_result"]) == ("in_process_restart", "success")
    # walk-through 34 #6: fault, detected and decided were all the moment after the decision
    # (detect/stop/decide 0.000 s, the total 28% short): the fault is the first rank's
    # failure (its `run_resilient` line comes just after), detected when the last one waited
    failed = sorted(datetime.fromisoformat(line.split()[0]) for rank in (0, 1)
                    for line in (job_dir / "logs" / "attempt-0" / f"rank-{rank}.log")
                    .read_text().splitlines() if "the process group failed under" in line)
    fault_at = datetime.fromisoformat(str(rr["fault_at"]))
    assert len(failed) == 2 and 0 <= (failed[0] - fault_at).total_seconds() < 1, (failed, rr)
    durations = rr["durations_s"]
    assert isinstance(durations, dict) and durations["detect"] > 0, rr


@pytest.mark.long  # make test: the step-rung test below blocks rank 3 of 4 in the broken
# collective the same way, and its in-process restart replaces only that rank
def test_a_group_broken_under_4_ranks_replaces_only_a_rank_blocked_in_its_collective(
        tmp_path: Path, job_dir: Path) -> None:
    """Review 35 #7: with 4 ranks the broken connections fail the collective at once only
    where a rank waits on rank 1; rank 3 waits on a live peer that itself waits, makes no step
    and never reports. The three waiting ranks were refused after 5 s ("the other ranks run
    on") and every process restarted. Rank 3, blocked, is killed and started again; the
    others re-enter in place. Exact: the weights are those of a run resumed from the same
    checkpoint (with 4 ranks a fresh DDP sums the gradients in another order than the
    uninterrupted run's, so its weights differ; a process restart's are these too)."""
    r = run_tg(job4(job_dir), cwd=tmp_path, fault="collective@rank=1,step=6")
    assert r.returncode == 0, r.stderr[-3000:]
    got = reasons(job_dir)
    assert "InProcessRestarted" in got and "WorkersRestarted" not in got, got
    assert "WorkerFailed" not in got, got
    restarting = next(e["message"] for e in read_json("events", job_dir)
                      if e["reason"] == "InProcessRestarting")
    named = re.search(r"only rank (\d+) starts again", restarting)
    assert named and f"rank(s) {named[1]} made no step since the group failed" in restarting
    before, after = first_pids(job_dir), final_ranks(job_dir)
    new = int(named[1])
    assert after[new][0] != before[new] and after[new][1] == 2, (before, after)
    assert {rank: after[rank] for rank in before if rank != new} == {
        rank: (pid, 1) for rank, pid in before.items() if rank != new}
    rr = the_one_record(job_dir)
    assert (rr["recover"], rr["recover_result"], rr["resumed_step"]) == (
        "in_process_restart", "success", 4)
    # review 37 #6: the record named every rank and the job, with the blocked rank killed
    assert str(rr["reason"]).startswith(
        f"the process group failed on rank(s) {', '.join(str(x) for x in range(4) if x != new)}"
        f"; rank(s) {new} blocked in the broken collective, killed: "), rr["reason"]
    assert rr["related_task"] == f"worker-{new}"
    assert digest(r.stdout) == resumed_from_step_4(tmp_path, job_dir)


def test_a_step_that_fails_under_4_ranks_with_one_blocked_goes_on_to_the_in_process_restart(
        tmp_path: Path, job_dir: Path) -> None:
    """Review 37 #2: with --operator-reexecution the step rung re-formed the group while rank
    3 was blocked in the broken collective; the rendezvous timed out (--step-retry-timeout),
    the failed init left torch's group counter at 1, and the in-process restart's fresh rank
    3 (group "0") and the survivors (group "1") waited in init_process_group for good. The
    step rung now gives the step up when a rank has not reported it 1 s after the first
    report, and the in-process restart replaces the blocked rank at once."""
    r = run_tg(job4(job_dir, "--operator-reexecution", "--step-retry-timeout", "10"),
               cwd=tmp_path, fault="collective@rank=1,step=6", timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    events = read_json("events", job_dir)
    got = [e["reason"] for e in events]
    assert "InProcessRestarted" in got and "WorkersRestarted" not in got, got
    assert "StepRetrying" not in got, got  # no rendezvous a blocked rank never joins
    down = next(e["message"] for e in events if e["reason"] == "StepRetryDowngraded")
    named = re.search(r"rank\(s\) (\d+) did not report step 6's failure within half of", down)
    assert named, down
    restarting = next(e["message"] for e in events if e["reason"] == "InProcessRestarting")
    assert f"only rank {named[1]} starts again" in restarting, restarting
    assert digest(r.stdout) == resumed_from_step_4(tmp_path, job_dir)


def test_an_in_process_restart_that_fails_again_downgrades_to_a_process_restart(
        tmp_path: Path, job_dir: Path) -> None:
    # every start of rank 1 dies at step 6: the in-process replacement too
    r = run_tg(job(job_dir, "--max-restarts", "2", "--unconditional-restart"), cwd=tmp_path,
               fault="signal:KILL@rank=1,step=6,attempt=*")
    assert r.returncode != 0
    first = read_json("recovery", job_dir)["running_records"][0]
    kinds = [(x["recover"], x["recover_result"]) for x in first["recover_records"]]
    # recovered (a step ran after it), then the same death, no step further than before
    assert kinds[:3] == [("in_process_restart", "success"), ("in_process_restart", "downgrade"),
                         ("process_restart", "success")], kinds
    assert "made no new progress" in first["recover_records"][1]["reason"]
    assert "WorkersRestarted" in reasons(job_dir)


def test_without_in_process_restart_every_rank_restarts_as_a_process(
        tmp_path: Path, job_dir: Path) -> None:
    r = run_tg(job(job_dir, "--no-in-process-restart"), cwd=tmp_path,
               fault="signal:KILL@rank=1,step=6")
    assert r.returncode == 0, r.stderr[-3000:]
    got = reasons(job_dir)
    assert "InProcessRestarting" not in got and "WorkersRestarted" in got
    assert {n for _, n in final_ranks(job_dir).values()} == {2}  # every process was new


def test_ranks_killed_together_restart_once_as_processes(
        tmp_path: Path, job_dir: Path, clean_digest: str) -> None:
    """Walk-through 34 #1: every rank SIGKILLed at once (an OOM killer, a `kill -9` of the
    job): the rung decided 2 ms after the first exit, around a survivor dying 25 ms later,
    spent the only restart on an in-process restart that restarted nothing, and the job failed
    ('restart budget spent'). It waits SETTLE_S for the survivors first: no rank survived, one
    process restart."""
    args = job(job_dir)
    args[args.index("--max-restarts") + 1] = "1"
    r = run_tg(args, cwd=tmp_path, fault="signal:KILL@step=6")
    assert r.returncode == 0, r.stderr[-3000:]
    assert digest(r.stdout) == clean_digest
    got = reasons(job_dir)
    assert "InProcessRestarting" not in got and got.count("WorkersRestarted") == 1, got
    scheduled = next(e["message"] for e in read_json("events", job_dir)
                     if e["reason"] == "RestartScheduled")
    assert "no rank survived to restart in place" in scheduled, scheduled


def test_a_peer_that_ends_its_script_early_fails_the_job_at_once(
        tmp_path: Path, job_dir: Path) -> None:
    """Walk-through 34 #11: rank 1 exits 0 at step 6 (its script ended); rank 0's group broke
    and it waited the whole --in-process-timeout (60 s) for a verdict that never came, hang
    detection off in the wait. It is told NO_RESTART at once: its error ends it, and the
    diagnosis names the early exit."""
    r = run_tg(job(job_dir), cwd=tmp_path, fault="exit:0@rank=1,step=6")
    assert r.returncode == 1, r.stderr[-3000:]
    ev = read_json("events", job_dir)
    failed = datetime.fromisoformat(next(e["time"] for e in ev if e["reason"] == "WorkerFailed"))
    log = (job_dir / "logs" / "attempt-0" / "rank-1.log").read_text()
    exited = datetime.fromisoformat(re.search(r"^(\S+) err \[trainguard\.faults\] injecting "
                                              r"exit", log, re.M).group(1))  # type: ignore[union-attr]
    # at once: not the 60 s timeout, nor the 5 s after which a waiting rank is refused while
    # others run on (review 35 #7)
    assert (failed - exited).total_seconds() < 4, (exited, failed)
    diagnosed = next(e["message"] for e in ev if e["reason"] == "FailureDiagnosed")
    assert "rank(s) 1 ended the script (exit 0) before rank(s) 0" in diagnosed, diagnosed
