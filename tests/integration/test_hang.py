"""Hung jobs, for real: detected, dumped, named and restarted in place; healthy jobs are left alone.

Real `trainguard run`, real worker processes, real torch DDP over gloo (examples/train_ddp.py,
2 ranks), real py-spy. The faults come from TRAINGUARD_FAULT (trainguard.testing.faults):

- `hang`: a rank sleeps forever after step S; the other waits for it in the next allreduce;
- `spin`: a rank loops in Python at 100% of a CPU after step S; the other waits likewise;
- `loaderhang`: rank 0's DataLoader worker sleeps while making the batch of step S;
- `lock:PATH`: every rank blocks on a file lock this test holds.

Each fires only in attempt 0, so the restarted attempt runs through. One test keeps the default
thresholds (floor 8 s); the others pass a lower `--hang-floor` to run faster.
"""

from __future__ import annotations

import fcntl
import json
import os
import random
import re
import signal
import subprocess
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.integration.conftest import EXAMPLE, TG, read_json, run_tg
from trainguard.node.stacks import find_pyspy

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(find_pyspy() is None, reason="py-spy is not installed")]

FAST = ["--restart-backoff", "0.1", "--grace-period", "3"]
STEP_TIME = "0.02"  # a real step (forward, backward, allreduce) plus 20 ms: quick but steady


def at_the_floor(data: dict[str, Any], floor: float) -> None:
    """The threshold is the floor, or on a loaded machine 3 x the p99 of the cadence the
    ranks kept (a CI rehearsal at a load of 5: snapshots 0.77 s apart, 2.32 s), never more:
    max(3 x p99, floor) as its basis says, with the p99 under the floor (a cadence, not a
    pause such as an evaluation's)."""
    m = re.fullmatch(r"max\(3 x p99 ([\d.]+)s, floor ([\d.]+)s\).*", data["basis"])
    assert m and float(m[2]) == floor, data["basis"]
    p99 = float(m[1])
    assert p99 < floor and abs(data["threshold_s"] - max(floor, 3 * p99)) < 0.005, data


def ddp(job_dir: Path, *flags: str, steps: int, ckpt_every: int = 10,
        script: tuple[str, ...] = ()) -> list[str]:
    return ["run", "--nproc-per-node", "2", "--job-dir", str(job_dir), *FAST, *flags,
            str(EXAMPLE), "--steps", str(steps), "--ckpt-every", str(ckpt_every),
            "--step-time", STEP_TIME, *script]


def ts(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def events(job_dir: Path) -> list[dict[str, Any]]:
    evs: list[dict[str, Any]] = read_json("events", job_dir)
    return evs


def reasons_of(evs: list[dict[str, Any]]) -> list[str]:
    return [e["reason"] for e in evs]


def check_confirmed(job_dir: Path, culprit: int | None, by_rank: dict[str, str],
                    attempt: int = 0) -> dict[str, Any]:
    """HangSuspected, then HangConfirmed with the verdict and the stacks: its data."""
    evs = [e for e in events(job_dir) if e["involved"].get("attempt") == attempt]
    got = reasons_of(evs)
    assert got.count("HangSuspected") == 1 and got.count("HangConfirmed") == 1, got
    assert got.index("HangSuspected") < got.index("HangConfirmed"), got
    suspected = evs[got.index("HangSuspected")]
    confirmed = evs[got.index("HangConfirmed")]
    assert suspected["level"] == confirmed["level"] == "Warning"
    assert suspected["message"].startswith(
        "The system detects that your training job may be suspended")
    assert suspected["data"]["state"] == "suspected"
    sd = suspected["data"]
    data: dict[str, Any] = confirmed["data"]
    assert sd["idle_s"] >= sd["threshold_s"] * 2 / 3 - 0.01  # idle_s is rounded to ms
    assert ts(suspected["time"]) <= ts(data["confirmed_at"])
    assert data["state"] == "confirmed"
    assert data["idle_s"] >= data["threshold_s"]
    assert data["p99_step_s"] is not None and data["p99_step_s"] < 1.0  # cadence learned
    assert data["last_progress_at"] is not None
    c = data["culprit"]
    assert c["rank"] == culprit, c
    assert c["by_rank"] == by_rank, c
    assert confirmed["involved"].get("rank") == culprit
    assert data["stack_errors"] == {}, data["stack_errors"]
    # every rank dumped, readable and as py-spy JSON, and the verdict next to them
    stacks = job_dir / "logs" / f"attempt-{attempt}" / "stacks"
    for r in (0, 1):
        txt, js = stacks / f"rank-{r}.txt", stacks / f"rank-{r}.json"
        assert str(txt) in data["stack_files"] and str(js) in data["stack_files"]
        assert txt.read_text().startswith("# py-spy dump --pid")
        threads = json.loads(js.read_text())
        assert threads and threads[0]["frames"]
    hang = json.loads((stacks / "hang.json").read_text())
    assert hang["attempt"] == attempt and hang["culprit"] == c
    assert hang["confirmed_at"] == data["confirmed_at"]
    # the target: confirmed within 3 x p99 step + 10 s of the last progress
    latency = ts(data["confirmed_at"]) - ts(data["last_progress_at"])
    assert data["threshold_s"] <= latency <= 3 * data["p99_step_s"] + 10, latency
    return data


def check_restarted(job_dir: Path, data: dict[str, Any], culprit: int | None,
                    resumed: int) -> None:
    """One restart upon suspension, its job_hanged record, a resume from `resumed`."""
    evs = events(job_dir)
    got = reasons_of(evs)
    hc = got.index("HangConfirmed")
    assert got[hc + 1:hc + 4] == ["WorkersStopped", "RestartScheduled", "WorkersRestarted"]
    assert got[-1] == "JobSucceeded" and "WorkerFailed" not in got
    assert got.count("HangConfirmed") == 1  # the restarted attempt ran through
    res = [e for e in evs if e["reason"] == "Resumed"]
    assert res and all(e["involved"]["attempt"] == 1 for e in res)
    assert f"resumed from the checkpoint of step {resumed} " in res[0]["message"]
    rec = read_json("recovery", job_dir)
    assert rec["state"] == "succeeded"
    first, second = rec["running_records"]
    assert second["start_type"] == "suspension_restart"
    assert second["first_step"] == resumed + 1
    [inc] = first["recover_records"]
    assert inc["fault_scenario"] == "job_hanged"
    assert inc["related_task"] == ("job" if culprit is None else f"worker-{culprit}")
    assert inc["recover"] == "process_restart" and inc["recover_result"] == "success"
    assert inc["category"] == "nccl_timeout_or_hang"
    assert inc["resumed_step"] == resumed
    # fault_at = the last progress, detected_at = the confirmation: detect is the latency
    assert abs(ts(inc["fault_at"]) - ts(data["last_progress_at"])) < 0.002
    assert abs(ts(inc["detected_at"]) - ts(data["confirmed_at"])) < 0.002
    assert abs(inc["durations_s"]["detect"] - data["idle_s"]) < 0.01
    assert all(v is not None for v in inc["durations_s"].values())
    status = read_json("status", job_dir)
    assert status["restarts_used"] == 0  # restarts upon suspension use no restart budget
    assert [w["start_count"] for w in status["ranks"]] == [2, 2]


def test_a_rank_sleeping_before_an_allreduce_is_confirmed_named_and_restarted_by_default(
        tmp_path: Path, job_dir: Path) -> None:
    """The default thresholds (floor 8 s): rank 1 sleeps after step 20, rank 0 waits in the
    allreduce of step 21."""
    r = run_tg(ddp(job_dir, "--restart-on-hang", steps=30), cwd=tmp_path,
               fault="hang@rank=1,step=20", timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    data = check_confirmed(job_dir, 1, {"0": "collective", "1": "sleep"})
    assert data["threshold_s"] == 8.0 and "floor 8s" in data["basis"]
    assert data["culprit"]["reason"].startswith("Rank 1 is sleeping (time.sleep")
    assert "rank 0 waits in a collective" in data["culprit"]["reason"]
    # the script's call into the fault injection, not a frame inside it
    assert data["culprit"]["frame"].startswith(f"{EXAMPLE}:"), data["culprit"]
    check_restarted(job_dir, data, 1, resumed=20)
    log = (job_dir / "logs" / "attempt-1" / "rank-1.log").read_text()
    assert " out resumed from step 20" in log
    diag = read_json("diagnose", job_dir)  # the hung attempt, though the job succeeded
    assert diag["attempt"] == 0
    d = diag["diagnosis"]
    assert (d["category"], d["subcategory"], d["culprit"]["rank"]) == (
        "nccl_timeout_or_hang", "hang", 1)


def test_a_rank_spinning_in_a_python_loop_is_hung_though_it_burns_a_cpu(
        tmp_path: Path, job_dir: Path) -> None:
    r = run_tg(ddp(job_dir, "--restart-on-hang", "--hang-floor", "4", steps=20),
               cwd=tmp_path, fault="spin@rank=1,step=10", timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    data = check_confirmed(job_dir, 1, {"0": "collective", "1": "compute"})
    assert data["threshold_s"] == 4.0
    assert data["culprit"]["frame"].startswith(f"{EXAMPLE}:"), data["culprit"]  # not _spin
    check_restarted(job_dir, data, 1, resumed=10)


def test_a_blocked_data_loader_worker_is_named_through_its_rank(
        tmp_path: Path, job_dir: Path) -> None:
    """Rank 0's loader worker sleeps making the batch of step 15: rank 0 waits for its data
    after step 14, rank 1 in the allreduce of step 15; the last checkpoint is step 10."""
    r = run_tg(ddp(job_dir, "--restart-on-hang", "--hang-floor", "4", steps=20,
                   script=("--loader-workers", "1")),
               cwd=tmp_path, fault="loaderhang@rank=0,step=15", timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    data = check_confirmed(job_dir, 0, {"0": "dataloader", "1": "collective"})
    assert data["culprit"]["reason"].startswith("Rank 0 is in the data loader")
    check_restarted(job_dir, data, 0, resumed=10)
    rec = read_json("recovery", job_dir)["running_records"][0]["recover_records"][0]
    assert rec["last_step_before"] == 14 and rec["steps_lost"] == 4


@pytest.mark.long  # make test: tests/unit/test_hang_stacks.py's every-rank-in-one-file-lock
# verdict, and the other real hangs here (a sleep, a spin, a data loader worker)
def test_every_rank_blocked_on_one_file_lock_has_no_single_culprit(
        tmp_path: Path, job_dir: Path) -> None:
    held = tmp_path / "held.lock"
    with open(held, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # held for the whole run: attempt 0 blocks on it
        r = run_tg(ddp(job_dir, "--restart-on-hang", "--hang-floor", "4", steps=20),
                   cwd=tmp_path, fault=f"lock:{held}@step=10,attempt=0", timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    data = check_confirmed(job_dir, None, {"0": "lock", "1": "lock"})
    reason = data["culprit"]["reason"]
    assert "lock" in reason and "fcntl.flock" in reason and "no single culprit" in reason
    assert data["stuck_ranks"] == [0, 1]
    check_restarted(job_dir, data, None, resumed=10)


def _wait_file(path: Path, proc: subprocess.Popen[str], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, f"launcher exited {proc.returncode} before {path.name}"
        assert time.monotonic() < deadline, f"no {path} after {timeout:g}s"
        time.sleep(0.2)


def test_without_restart_on_hang_a_confirmed_hang_is_reported_and_the_job_left_running(
        tmp_path: Path, job_dir: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRAINGUARD_FAULT"}
    env["TRAINGUARD_FAULT"] = "hang@rank=1,step=10"
    proc = subprocess.Popen([*TG, *ddp(job_dir, "--hang-floor", "3", steps=30)], cwd=tmp_path,
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    try:
        stacks = job_dir / "logs" / "attempt-0" / "stacks"
        _wait_file(stacks / "hang.json", proc, timeout=45)
        pids = {p.pid for p in psutil.Process(proc.pid).children(recursive=True)}
        deadline = time.monotonic() + 10
        while "HangConfirmed" not in reasons_of(events(job_dir)):
            assert time.monotonic() < deadline, "hang.json but no HangConfirmed event"
            time.sleep(0.2)
        data = check_confirmed(job_dir, 1, {"0": "collective", "1": "sleep"})
        # the hang is only reported: a threshold later nothing was stopped
        time.sleep(data["threshold_s"] + 1)
        assert proc.poll() is None
        status = read_json("status", job_dir)
        assert status["state"] == "running" and status["attempt"] == 0
        assert [w["state"] for w in status["ranks"]] == ["running", "running"]
        assert all(psutil.pid_exists(w["pid"]) for w in status["ranks"])
        got = reasons_of(events(job_dir))
        assert got.count("HangConfirmed") == 1
        assert not {"WorkersStopped", "RestartScheduled", "WorkersRestarted"} & set(got)
        assert not (job_dir / "logs" / "attempt-1").exists()
        diag = read_json("diagnose", job_dir)  # the hung attempt, while it still hangs
        d = diag["diagnosis"]
        assert diag["attempt"] == 0
        assert (d["category"], d["subcategory"], d["culprit"]["rank"]) == (
            "nccl_timeout_or_hang", "hang", 1)
        assert d["evidence"]["file"].endswith("attempt-0/stacks/rank-1.txt")
        assert d["evidence"]["rank"] == 1 and "train_ddp.py" in d["evidence"]["text"]
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    assert proc.returncode == 143, err[-2000:]
    deadline = time.monotonic() + 10
    left = pids
    while left and time.monotonic() < deadline:
        left = {p for p in left if psutil.pid_exists(p)
                and psutil.Process(p).status() != psutil.STATUS_ZOMBIE}
        time.sleep(0.2)
    assert left == set(), "processes left behind"
    assert reasons_of(events(job_dir))[-1] == "JobStopped"
    assert read_json("status", job_dir)["state"] == "stopped"
    # walk-through 34 #9: both say the grace the hung ranks got (JobStopped said the job's 15 s)
    said = {e["reason"]: e["message"] for e in events(job_dir)}
    assert "the ranks have 3s (hung) to exit" in said["StopRequested"], said
    assert "workers got SIGTERM and 3s to exit" in said["JobStopped"], said


def jitter(steps: int, base_s: float, extra: float = 9.0, seed: int = 7) -> str:
    """TRAINGUARD_FAULT for a job whose step time varies 10x at random: after each step, every
    rank sleeps the same random extra in [0, extra x base_s).

    Not `train_ddp.py --step-jitter`: that flag scales each rank's extra by the step's own
    measured time, which under DDP includes the wait for the peer's previous extra, so the
    extras feed on each other and grow without bound (about 4.5x a step with --step-jitter 9).
    """
    rng = random.Random(seed)
    return ";".join(f"slow:{rng.random() * extra * base_s:.3f}@step={s},attempt=*"
                    for s in range(1, steps + 1))


# make test-long (about 40 s, alone): make test runs the detector on the same cadence
# (tests/unit/test_liveness.py, no false alarm when step time varies tenfold and saves pause)
@pytest.mark.long
@pytest.mark.serial  # a second job's load would make its learned cadence a lie
def test_a_healthy_jittery_quiet_job_with_slow_checkpoints_raises_no_false_alarm(
        tmp_path: Path, job_dir: Path) -> None:
    """Steps of 0.1-1 s at random, a checkpoint every 5 steps that pauses 20 steps, no line
    printed between steps (progress through trainguard.progress), about 40 s. With
    `--hang-floor 2` the learned 3 x p99 (about 3 s) is the threshold, not the floor."""
    steps, base = 40, 0.1  # 0.08 s sleep + about 0.02 s of real step
    t0 = time.monotonic()
    r = run_tg(["run", "--nproc-per-node", "2", "--job-dir", str(job_dir), *FAST,
                "--restart-on-hang", "--hang-floor", "2", str(EXAMPLE), "--steps", str(steps),
                "--ckpt-every", "5", "--step-time", "0.08", "--ckpt-pause", "20", "--quiet",
                "--progress"], cwd=tmp_path, fault=jitter(steps, base), timeout=120)
    took = time.monotonic() - t0
    assert r.returncode == 0, r.stderr[-3000:]
    got = reasons_of(events(job_dir))
    assert not [x for x in got if x.startswith("Hang")], got
    assert "WorkersRestarted" not in got and got[-1] == "JobSucceeded"
    assert got.count("CheckpointSaved") >= steps // 5
    assert took > 30  # long enough to learn the cadence and see many checkpoints
    log = (job_dir / "logs" / "attempt-0" / "rank-0.log").read_text()
    assert " out step " not in log  # --quiet: progress came from trainguard.progress


def test_a_job_that_reports_no_steps_is_judged_by_its_memory_snapshots(
        tmp_path: Path, job_dir: Path) -> None:
    """Walk-through 40 #2: a job that prints no steps and calls no trainguard.progress but
    takes a memory snapshot every 5 steps hung after step 30: with no progress at all it
    waited out the 30-minute start-up allowance. The snapshots are its ranks' progress and
    cadence: confirmed at the floor, named, restarted, resumed from the snapshot of step 30."""
    r = run_tg(ddp(job_dir, "--restart-on-hang", "--hang-floor", "2", "--memory-every", "5",
                   steps=45, ckpt_every=100_000, script=("--quiet",)),
               cwd=tmp_path, fault="hang@rank=1,step=30", timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    data = check_confirmed(job_dir, 1, {"0": "collective", "1": "sleep"})
    at_the_floor(data, 2.0)
    assert "memory snapshots" in data["basis"], data["basis"]
    got = reasons_of(events(job_dir))
    assert got[got.index("HangConfirmed") + 1:][:3] == [
        "WorkersStopped", "RestartScheduled", "WorkersRestarted"], got
    assert got[-1] == "JobSucceeded", got
    res = [e["message"] for e in events(job_dir) if e["reason"] == "Resumed"]
    assert res and "memory snapshot of step 30" in res[0], res
    log = (job_dir / "logs" / "attempt-0" / "rank-0.log").read_text()
    assert " out step " not in log  # --quiet, and no trainguard.progress (no --progress)


def test_a_silent_job_s_marked_evaluation_is_not_its_snapshot_cadence(
        tmp_path: Path, job_dir: Path) -> None:
    """Review 51 #1: a 6 s evaluation (marked) between two snapshots made that interval the
    job's cadence: a later hang waited 3 x 6.5 s, not the 2 s floor (a 10-minute evaluation:
    30 minutes). The phase's time is taken off the interval."""
    r = run_tg(ddp(job_dir, "--restart-on-hang", "--hang-floor", "2", "--memory-every", "5",
                   steps=19, ckpt_every=100_000,  # one evaluation, after step 10
                   script=("--quiet", "--eval-every", "10", "--eval-s", "6")),
               cwd=tmp_path, fault="hang@rank=1,step=15", timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    data = check_confirmed(job_dir, 1, {"0": "collective", "1": "sleep"})
    at_the_floor(data, 2.0)  # not 3 x the 6 s evaluation's interval
    assert "memory snapshots" in data["basis"], data["basis"]


@pytest.mark.parametrize("prints", ["nothing", "rank 0 only"])
def test_a_healthy_job_is_not_judged_hung_by_its_memory_snapshots(
        tmp_path: Path, job_dir: Path, prints: str) -> None:
    """Review 50 #1 #2: snapshots every 10 steps of 0.3 s, further apart than the 2 s floor.
    A job that prints nothing learns its cadence from one snapshot to the next (it learned
    1 ms, from the snapshot's own phase end, and was confirmed hung between two healthy
    snapshots); where rank 0 prints its steps, the silent rank 1 is judged by the job's
    progress, not by its snapshots (it was suspected at every snapshot interval)."""
    flags = ("--quiet",) if prints == "nothing" else ("--rank0-only",)
    r = run_tg(["run", "--nproc-per-node", "2", "--job-dir", str(job_dir), *FAST,
                "--restart-on-hang", "--hang-floor", "2", "--memory-every", "10", str(EXAMPLE),
                "--steps", "40", "--ckpt-every", "100000", "--step-time", "0.3", *flags],
               cwd=tmp_path, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    got = reasons_of(events(job_dir))
    assert not [x for x in got if x.startswith("Hang")], got
    assert "WorkersRestarted" not in got and got[-1] == "JobSucceeded", got
    assert ((job_dir / "logs" / "attempt-0" / "rank-1.log").read_text().count(" out step ")
            == 0)


def test_a_rank_finishing_after_its_peer_exited_is_not_confirmed_hung(
        tmp_path: Path, job_dir: Path) -> None:
    """Rank 1 ends at once; rank 0 works on silently for 6 s after its last step (a final
    evaluation, an upload) with a 1 s hang timeout: the job is ending, nothing is hung."""
    script = tmp_path / "ends.py"
    script.write_text("import os, time\nfor s in range(1, 6):\n    print(f'step {s}', "
                      "flush=True)\n    time.sleep(0.1)\nif os.environ['RANK'] == '0':\n"
                      "    time.sleep(6)\n")
    r = run_tg(["run", "--nproc-per-node", "2", "--job-dir", str(job_dir), "--hang-timeout",
                "1", "--restart-on-hang", "--max-restarts", "1", str(script)], cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "HangConfirmed" not in reasons_of(events(job_dir))


def test_hung_ranks_with_a_save_on_the_way_out_are_stopped_within_seconds(
        tmp_path: Path, job_dir: Path) -> None:
    """Walk-through 33 #4: with --save-on-exit (the llm preset) SIGTERM waits for the next
    step end, which hung ranks never reach: every restart upon suspension waited the whole
    grace period, then SIGKILL. A confirmed hang's ranks get at most HUNG_GRACE_S."""
    r = run_tg(ddp(job_dir, "--restart-on-hang", "--save-on-exit", "--grace-period", "30",
                   "--hang-floor", "4", steps=20), cwd=tmp_path, fault="hang@rank=1,step=10",
               timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    stopped = [e for e in events(job_dir) if e["reason"] == "WorkersStopped"]
    assert len(stopped) == 1 and "stopped 2 hung worker(s): rank(s) 0, 1 (grace 3s" in \
        stopped[0]["message"], stopped
    [inc] = read_json("recovery", job_dir)["running_records"][0]["recover_records"]
    # was the whole 30 s; about 4 s now (10.7 s in a make-test run with the machine loaded)
    assert inc["durations_s"]["stop"] < 20, inc["durations_s"]
