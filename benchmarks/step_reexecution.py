"""Step re-execution (rung 0) vs. a process restart (rung 1) on the same job and fault.

The example DDP job (2 ranks, gloo) gets TRAINGUARD_FAULT='collective@rank=1,step=S': inside
step S rank 1 shuts down its TCP connections, so every rank's collective fails with a real
gloo error. Interleaved and repeated --repeats times, side by side in one run:

* step re-execution: `--operator-reexecution`; the ranks discard the step, re-form the
  process group in the same processes and run step S again;
* process restart: the same job without it (today's behaviour): the ranks raise, exit, and
  are restarted from the last checkpoint (`--restart-backoff 0`, so no deliberate wait).

Measured from the rank logs' stamps (the time trainguard read each line): the fault (rank 1's
"injecting collective" line) -> the first step line after it (the first good step after
recovery), and -> the job back at step S done (what a restart re-does counts here). Every
run also checks that the final weights are bit-identical to an uninterrupted run.

    .venv/bin/python benchmarks/step_reexecution.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from _common import (
    EXAMPLE,
    REPO,
    BenchError,
    Spread,
    bench_env,
    machine_line,
    markdown_table,
    parse_iso,
    read_step_lines,
    tail,
    trainguard_exe,
    wait_exit,
)

NPROC = 2
FAULT_STEP = 12
FAULT = f"collective@rank=1,step={FAULT_STEP}"
INJECTED = re.compile(r"^(\S+) err \[trainguard\.faults\] injecting collective at step")
DIGEST = re.compile(r"weights sha256 ([0-9a-f]{64})")


@dataclass(frozen=True)
class Run:
    first_good_s: float  # fault -> first step line after it
    back_at_s: float  # fault -> step FAULT_STEP done again (or for the first time)
    attempts: int
    digest: str


def run_job(job_dir: Path, steps: int, reexecute: bool, fault: bool, timeout_s: float) -> str:
    """One `trainguard run` to the end; returns its console output."""
    argv = [trainguard_exe(), "run", "--nproc-per-node", str(NPROC), "--max-restarts", "3",
            "--restart-backoff", "0", "--job-dir", str(job_dir)]
    if reexecute:
        argv.append("--operator-reexecution")
    argv += [str(EXAMPLE), "--steps", str(steps), "--ckpt-every", "10", "--digest"]
    env = bench_env(**({"TRAINGUARD_FAULT": FAULT} if fault else {}))
    console = job_dir.with_name(job_dir.name + ".console.txt")
    what = f"`trainguard run` for {job_dir.name}"
    with open(console, "wb") as out:
        proc = subprocess.Popen(argv, cwd=REPO, env=env, stdin=subprocess.DEVNULL,
                                stdout=out, stderr=subprocess.STDOUT)
        rc = wait_exit(proc, timeout_s, what)
    if rc != 0:
        raise BenchError(f"{what} exited {rc}; its last console lines:\n{tail(console)}")
    return console.read_text(encoding="utf-8", errors="replace")


def digest_of(console: str, what: str) -> str:
    found = DIGEST.findall(console)
    if len(found) != 1:
        raise BenchError(f"{what}: expected one 'weights sha256' line, found {len(found)}")
    return str(found[0])


def measure(job_dir: Path, steps: int, reexecute: bool, timeout_s: float) -> Run:
    console = run_job(job_dir, steps, reexecute, True, timeout_s)
    logs = job_dir / "logs"
    attempts = sorted(int(p.name.split("-")[1]) for p in logs.glob("attempt-*"))
    fault_at = None
    for line in (logs / "attempt-0" / "rank-1.log").read_text(errors="replace").splitlines():
        m = INJECTED.match(line)
        if m:
            fault_at = parse_iso(m.group(1))
            break
    if fault_at is None:
        raise BenchError(f"{job_dir}: no 'injecting collective' line in rank 1's log")
    # after the fault: in attempt 0 only step S or later (a peer's line of step S-1 may be
    # read a moment after the fault line), in a restarted attempt any step
    lines = [ln for a in attempts for r in range(NPROC)
             for ln in read_step_lines(logs / f"attempt-{a}" / f"rank-{r}.log", r, stamped=True)
             if ln.stamp is not None and ln.stamp > fault_at and (a > 0 or ln.step >= FAULT_STEP)]
    if not lines:
        raise BenchError(f"{job_dir}: no step line after the fault")
    first_good = min(ln.stamp for ln in lines if ln.stamp is not None)
    back = [ln.stamp for ln in lines if ln.step == FAULT_STEP and ln.stamp is not None]
    if not back:
        raise BenchError(f"{job_dir}: step {FAULT_STEP} was never done after the fault")
    return Run(first_good - fault_at, max(back) - fault_at, len(attempts),
               digest_of(console, str(job_dir)))


def fmt(s: Spread, digits: int = 3) -> list[str]:
    return [f"{s.median:.{digits}f}", f"{s.lo:.{digits}f}", f"{s.hi:.{digits}f}"]


def report(rungs: list[Run], restarts: list[Run]) -> str:
    ratio = [a.first_good_s / b.first_good_s for a, b in zip(rungs, restarts, strict=True)]
    back_ratio = [a.back_at_s / b.back_at_s for a, b in zip(rungs, restarts, strict=True)]
    rows = [
        ["step re-execution: fault -> first good step", *fmt(Spread.of(
            [r.first_good_s for r in rungs]))],
        ["process restart: fault -> first good step", *fmt(Spread.of(
            [r.first_good_s for r in restarts]))],
        ["ratio re-execution / restart (per pair)", *fmt(Spread.of(ratio), 3)],
        ["step re-execution: fault -> step S done", *fmt(Spread.of(
            [r.back_at_s for r in rungs]))],
        ["process restart: fault -> step S done again", *fmt(Spread.of(
            [r.back_at_s for r in restarts]))],
        ["ratio (back at step S, per pair)", *fmt(Spread.of(back_ratio), 3)],
    ]
    return markdown_table(["metric (s)", "median", "min", "max"], rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Step re-execution vs. process restart on the example DDP job: 2 ranks, "
        "a transient collective failure, interleaved repeats; prints a markdown table.")
    parser.add_argument("--repeats", type=int, default=3, help="measured pairs (default 3)")
    parser.add_argument("--steps", type=int, default=20, help="steps per job (default 20)")
    parser.add_argument("--timeout", type=float, default=180.0, help="per job (s)")
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.steps <= FAULT_STEP:
        parser.error(f"--repeats must be >= 1 and --steps > {FAULT_STEP}")
    print(machine_line())
    print(f"fault: TRAINGUARD_FAULT={FAULT!r}, {args.repeats} interleaved pairs\n", flush=True)
    rungs: list[Run] = []
    restarts: list[Run] = []
    with tempfile.TemporaryDirectory(prefix="tg-bench-step-") as tmp:
        base = Path(tmp)
        clean = digest_of(run_job(base / "clean", args.steps, False, False, args.timeout),
                          "the uninterrupted run")
        for i in range(args.repeats):
            t0 = time.monotonic()
            rungs.append(measure(base / f"rung0-{i}", args.steps, True, args.timeout))
            restarts.append(measure(base / f"restart-{i}", args.steps, False, args.timeout))
            print(f"pair {i + 1}/{args.repeats}: re-execution {rungs[-1].first_good_s:.3f} s, "
                  f"restart {restarts[-1].first_good_s:.3f} s "
                  f"({time.monotonic() - t0:.0f} s)", file=sys.stderr, flush=True)
        bad = [r for r in rungs + restarts if r.digest != clean]
        if bad:
            raise BenchError(f"{len(bad)} run(s) ended with weights that differ from the "
                             "uninterrupted run")
        if any(r.attempts != 1 for r in rungs) or any(r.attempts != 2 for r in restarts):
            raise BenchError("a re-executed run restarted a process, or a restart run did not")
    print(report(rungs, restarts))
    print("\nevery run's final weights: bit-identical to the uninterrupted run; re-execution "
          "runs: one attempt (no process restarted), restart runs: two")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BenchError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
