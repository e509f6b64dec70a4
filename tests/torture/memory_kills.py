"""Torture the memory snapshots: SIGKILL workers at random moments, check every resume.

    python -m tests.torture.memory_kills --kills 200      # make torture
    (tests/integration/test_memory_snapshots.py runs a short variant)

Runs tests/torture/counting.py (2 ranks, a 32 MiB tensor per rank copied into shared memory
every step, about half of each step spent copying) under `trainguard run --memory-every 1`,
and SIGKILLs a random rank at a random moment of its run, `--kills` times. Every restart
must resume both ranks at the same step, from memory, with every element of their state
right (the worker checks it bit for bit and prints `RESUMED <step> OK`), losing at most the
step in flight; the job must then stop cleanly and leave no shared-memory region behind.
Prints one JSON line with the figures; exits 1 on any failure.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
WORKER = ROOT / "tests" / "torture" / "counting.py"
RESUMED = re.compile(r"out RESUMED (\d+) (OK|BAD)")
STEP = re.compile(r"out step (\d+)$")
ROUND = 100  # kills per job (its --max-restarts is ROUND + 5; the launcher allows 128)


def _pid(job: Path, rank: int) -> int | None:
    try:
        return int((job / "pids" / f"rank-{rank}").read_text())
    except (OSError, ValueError):
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _last_step(log: Path) -> int:
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return 0
    for line in reversed(lines):
        m = STEP.search(line)
        if m:
            return int(m.group(1))
    return 0


def torture(workdir: Path, kills: int, seed: int = 0, mib: int = 32) -> dict[str, Any]:
    rng = random.Random(seed)
    job, shm = workdir / "job", workdir / "shm"
    shm.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "TRAINGUARD_SHM_ROOT": str(shm)}
    env.pop("TRAINGUARD_FAULT", None)
    cmd = [sys.executable, "-m", "trainguard", "run", "--nproc-per-node", "2",
           "--memory-every", "1", "--max-restarts", str(kills + 5), "--restart-backoff", "0",
           "--no-progress-limit", "128", "--no-hang-detection", "--job-dir", str(job),
           str(WORKER), "--steps", "100000000", "--mib", str(mib)]
    # the launcher's lines go to a file: a pipe nobody reads fills up (64 KiB, about 70
    # restarts of event lines) and then blocks the launcher's writes, and its loop
    err_path = workdir / "launcher.err"
    err = open(err_path, "w")  # noqa: SIM115 (closed with the launcher, below)
    launcher = subprocess.Popen(cmd, cwd=workdir, env=env, stdout=subprocess.DEVNULL,
                                stderr=err, text=True)
    problems: list[str] = []
    killed_at: list[int] = []
    t0 = time.monotonic()
    try:
        dead: set[int] = set()
        for i in range(kills):
            deadline = time.monotonic() + 60
            while True:  # both ranks of the new attempt running and stepping
                pids = [_pid(job, r) for r in (0, 1)]
                attempt_logs = sorted((job / "logs").glob("attempt-*"),
                                      key=lambda p: int(p.name.split("-")[1]))
                if (all(p is not None and p not in dead and _alive(p) for p in pids)
                        and attempt_logs and len(attempt_logs) == i + 1
                        and _last_step(attempt_logs[-1] / "rank-0.log") > 0):
                    break
                if launcher.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"kill {i}: no running attempt (launcher exit "
                                       f"{launcher.poll()}): "
                                       f"{err_path.read_text(errors='replace')[-2000:]}")
                time.sleep(0.02)
            time.sleep(rng.uniform(0.0, 0.4))
            rank = rng.randrange(2)
            pid = pids[rank]
            assert pid is not None
            killed_at.append(_last_step(attempt_logs[-1] / f"rank-{rank}.log"))
            os.kill(pid, signal.SIGKILL)
            dead.update(p for p in pids if p is not None)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # the last restart resumed
            logs = sorted((job / "logs").glob("attempt-*"), key=lambda p: int(p.name[8:]))
            if len(logs) == kills + 1 and all(
                    RESUMED.search(p.read_text(errors="replace") if p.exists() else "")
                    for p in (logs[-1] / "rank-0.log", logs[-1] / "rank-1.log")):
                break
            time.sleep(0.05)
    finally:
        launcher.send_signal(signal.SIGTERM)
        try:
            launcher.wait(timeout=60)
        except subprocess.TimeoutExpired:
            launcher.kill()
            problems.append("the launcher did not stop within 60 s of SIGTERM")
        err.close()
    lost: list[int] = []
    started_over: set[int] = set()
    for i in range(1, kills + 1):
        steps = []
        for rank in (0, 1):
            log = job / "logs" / f"attempt-{i}" / f"rank-{rank}.log"
            found = RESUMED.findall(log.read_text(errors="replace")) if log.exists() else []
            if not found:
                # a start from step 1 is right only when every kill so far came before step
                # 2: before that no step's snapshot is whole on both ranks (rank 0 prints
                # step 2 only once both ranks finished snapshotting step 1)
                if max(killed_at[:i]) >= 2:
                    problems.append(f"attempt {i} rank {rank}: no resume (killed after step "
                                    f"{killed_at[i - 1]})")
                else:
                    started_over.add(i)
                continue
            step, verdict = int(found[0][0]), found[0][1]
            if verdict != "OK":
                problems.append(f"attempt {i} rank {rank}: WRONG state after resuming {step}")
            steps.append(step)
        if len(set(steps)) > 1:
            problems.append(f"attempt {i}: the ranks resumed different steps {steps}")
        if steps:
            lost.append(max(0, killed_at[i - 1] - min(steps)))
    leaked = sorted(p.name for p in shm.iterdir())
    if leaked:
        problems.append(f"shared-memory regions left after the job: {leaked}")
    return {"kills": kills, "resumes_checked": 2 * len(lost), "wrong_resumes": sum(
        "WRONG" in p for p in problems), "max_steps_lost": max(lost, default=None),
        "steps_lost_total": sum(lost), "leaked_regions": len(leaked),
        "started_over_before_a_whole_snapshot": len(started_over),
        "seconds": round(time.monotonic() - t0, 1), "problems": problems}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kills", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--mib", type=int, default=32)
    ap.add_argument("--workdir", type=Path, default=None)
    args = ap.parse_args(argv)
    import tempfile

    results = []
    with tempfile.TemporaryDirectory(prefix="tg-torture-") as tmp:
        left, n = args.kills, 0
        while left > 0:  # one job per ROUND kills: --max-restarts is at most 128
            kills = min(left, ROUND)
            work = (args.workdir or Path(tmp)) / f"round-{n}"
            results.append(torture(work, kills, args.seed + n, args.mib))
            print(json.dumps(results[-1]), flush=True)
            left, n = left - kills, n + 1
    total = {"kills": sum(r["kills"] for r in results), "jobs": len(results)}
    for key in ("resumes_checked", "wrong_resumes", "steps_lost_total", "leaked_regions",
                "started_over_before_a_whole_snapshot", "seconds"):
        total[key] = round(sum(r[key] for r in results), 1)
    total["max_steps_lost"] = max((r["max_steps_lost"] or 0) for r in results)
    total["problems"] = [p for r in results for p in r["problems"]]
    print(json.dumps(total))
    return 1 if total["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
