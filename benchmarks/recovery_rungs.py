"""The recovery ladder's lowest rungs side by side: step re-execution, in-process restart and
a process restart, each with and without pre-warmed standby workers, on the same job and the
same fault, interleaved in one run.

The example DDP job (2 ranks, gloo, a checkpoint every 10 steps, 0.3 s per step so that the
fault comes after the node's standby workers are ready: they fill 10 s after the first step)
gets one of two faults after step S (75, some 20 s in: the standbys are warm):

* `group`: TRAINGUARD_FAULT='collective@rank=1,step=S': inside step S rank 1 shuts down its
  TCP connections, so every rank's collective fails with a real gloo error while every
  process lives. Rungs: step re-execution (`--operator-reexecution`: step S re-run on a
  re-formed group); in-process restart (the script in trainguard.run_resilient,
  `--resilient`: every rank re-enters its training function in place and resumes from the
  checkpoint of step 70; no process is started); the process restart, from standbys (today's
  default) and cold (`--no-standby-workers`: every rank a new interpreter).
* `kill`: TRAINGUARD_FAULT='signal:KILL@rank=1,step=S': rank 1 is SIGKILLed. Rungs: the
  in-process restart (only rank 1 starts again, rank 0 re-enters in place) from a standby
  and cold, and the process restart from standbys and cold.

With `--nproc 4` (the `group` fault only): a broken group of 4 ranks, where gloo leaves a rank
blocked in its collective (it waits on a live peer that waits itself: review 35 #7); the
in-process restart replaces only that rank, the others re-enter in place; against the
process restart, from standbys and cold. With more than 2 ranks a fresh DDP sums in another
order than an uninterrupted run, so the check is that every run ends with the same weights
(each resumes from the same checkpoint) instead of an uninterrupted run's.

Every run uses `--restart-backoff 0` (no deliberate wait). Measured from the rank logs' stamps
(the time trainguard read each line): the fault (rank 1's "injecting" line) -> the first
step line a rank prints after its recovery (the first good step), and -> step S done again
(the work a restart re-does counts here). Every run also checks that the final weights are
bit-identical to an uninterrupted run, and that each rung kept or replaced the processes it
should.

    .venv/bin/python benchmarks/recovery_rungs.py [--repeats 3] [--faults group,kill]
    .venv/bin/python benchmarks/recovery_rungs.py --nproc 4 --faults group [--fault-rank 1]
"""

from __future__ import annotations

import argparse
import json
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
    STAMPED_LINE,
    STEP_LINE,
    BenchError,
    Spread,
    bench_env,
    machine_line,
    markdown_table,
    parse_iso,
    tail,
    trainguard_exe,
    wait_exit,
)

FAULT_STEP = 75
STEP_TIME = "0.3"
FAULTS = {"group": "collective@rank={rank},step=" + str(FAULT_STEP),
          "kill": "signal:KILL@rank={rank},step=" + str(FAULT_STEP)}
COLD = ["--no-standby-workers"]
# rung -> (launcher flags, script flags)
FLAGS = {"step re-execution": (["--operator-reexecution"], []),
         "in-process restart": ([], ["--resilient"]),
         "in-process restart, cold": (COLD, ["--resilient"]),
         "process restart": ([], []),
         "process restart, cold": (COLD, [])}
RUNGS = {"group": ("step re-execution", "in-process restart", "process restart",
                   "process restart, cold"),
         "kill": ("in-process restart", "in-process restart, cold", "process restart",
                  "process restart, cold")}
# more than 2 ranks: the broken group (a blocked rank), without step re-execution
RUNGS_MANY = {"group": ("in-process restart", "process restart", "process restart, cold")}
BASELINE = "process restart, cold"  # a new interpreter for every rank: the restart of old
INJECTED = re.compile(r"\[trainguard\.faults\] injecting ")
# a rank's own recovery: its group re-formed (rung 0), it re-enters its function (rung 1a)
RECOVERED = re.compile(r"\[trainguard\.(step|resilient)\] rank \d+: (process group re-formed|"
                       r"restarting in place)")
DIGEST = re.compile(r"weights sha256 ([0-9a-f]{64})")


@dataclass(frozen=True)
class Run:
    first_good_s: float  # fault -> the first step line after a rank's recovery
    back_at_s: float  # fault -> step FAULT_STEP done again (or for the first time)
    attempts: int
    new_processes: int  # ranks whose final process is not the one they started with
    from_standby: int  # new processes that came from a pre-warmed standby
    digest: str


def run_job(job_dir: Path, steps: int, rung: str | None, fault: str | None,
            timeout_s: float, nproc: int = 2) -> str:
    """One `trainguard run` to the end; returns its console output."""
    launcher, script = FLAGS[rung] if rung else ([], [])
    argv = [trainguard_exe(), "run", "--nproc-per-node", str(nproc), "--max-restarts", "3",
            "--restart-backoff", "0", "--job-dir", str(job_dir), *launcher, str(EXAMPLE),
            "--steps", str(steps), "--ckpt-every", "10", "--step-time", STEP_TIME, "--digest",
            *script]
    env = bench_env(**({"TRAINGUARD_FAULT": fault} if fault else {}))
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


def steps_after_recovery(log: Path, whole: bool) -> tuple[list[tuple[float, int]], float | None]:
    """(stamp, step) of the step lines after the rank's recovery (all of them in a restarted
    attempt: `whole`), and the stamp of an 'injecting' line."""
    steps: list[tuple[float, int]] = []
    fault_at, recovered = None, whole
    for raw in log.read_text(encoding="utf-8", errors="replace").splitlines():
        m = STAMPED_LINE.match(raw)
        if m is None:
            continue
        at, text = parse_iso(m.group(1)), m.group(3).strip()
        if fault_at is None and INJECTED.search(text):
            fault_at = at
        elif RECOVERED.search(text):
            recovered = True
        elif (s := STEP_LINE.match(text)) is not None and m.group(2) == "out" and recovered:
            # only after the rank's own recovery: a peer's line of step S itself may be read
            # a moment after the fault's line (a kill comes after step S)
            steps.append((at, int(s.group(1))))
    return steps, fault_at


def measure(job_dir: Path, steps: int, rung: str, fault: str, timeout_s: float,
            nproc: int) -> Run:
    console = run_job(job_dir, steps, rung, fault, timeout_s, nproc)
    logs = job_dir / "logs"
    attempts = sorted(int(p.name.split("-")[1]) for p in logs.glob("attempt-*"))
    fault_at, after = None, []
    for a in attempts:
        for r in range(nproc):
            found, at = steps_after_recovery(logs / f"attempt-{a}" / f"rank-{r}.log", a > 0)
            after += found
            fault_at = at if fault_at is None else fault_at
    if fault_at is None:
        raise BenchError(f"{job_dir}: no 'injecting' line in the rank logs")
    after = [(at, step) for at, step in after if at > fault_at]
    back = [at for at, step in after if step == FAULT_STEP]
    if not after or not back:
        raise BenchError(f"{job_dir}: no step after the fault, or step {FAULT_STEP} never done")
    return Run(min(at for at, _ in after) - fault_at, max(back) - fault_at, len(attempts),
               new_processes(job_dir), from_standby(job_dir), digest_of(console, str(job_dir)))


def from_standby(job_dir: Path) -> int:
    """New processes that came from standbys, as the restart events say."""
    out = subprocess.run([trainguard_exe(), "events", str(job_dir), "--json"],
                         capture_output=True, text=True, check=True, timeout=60)
    n = 0
    for e in json.loads(out.stdout):
        if e["reason"] == "WorkersRestarted":
            n += str(e["message"]).count("(standby)")
        elif e["reason"] == "InProcessRestarted":
            m = re.search(r"rank\(s\) ([\d, ]+) from a pre-warmed standby", str(e["message"]))
            n += len(m.group(1).split(",")) if m else 0
    return n


def new_processes(job_dir: Path) -> int:
    """Ranks whose final process is not the first one (a later process start count)."""
    out = subprocess.run([trainguard_exe(), "status", str(job_dir), "--json"],
                         capture_output=True, text=True, check=True, timeout=60)
    return sum(int(r["start_count"]) > 1 for r in json.loads(out.stdout)["ranks"])


def fmt(s: Spread) -> list[str]:
    return [f"{s.median:.3f}", f"{s.lo:.3f}", f"{s.hi:.3f}"]


def report(fault: str, spelled: str, runs: dict[str, list[Run]]) -> str:
    base = runs[BASELINE]
    rows = []
    for rung, rs in runs.items():
        rows.append([f"{rung}: fault -> first good step", *fmt(Spread.of(
            [r.first_good_s for r in rs]))])
    for rung, rs in runs.items():
        if rung != BASELINE:
            rows.append([f"ratio {rung} / {BASELINE} (per repeat)", *fmt(Spread.of(
                [a.first_good_s / b.first_good_s for a, b in zip(rs, base, strict=True)]))])
    for rung, rs in runs.items():
        rows.append([f"{rung}: fault -> step {FAULT_STEP} done again", *fmt(Spread.of(
            [r.back_at_s for r in rs]))])
    return (f"fault `{fault}` (TRAINGUARD_FAULT='{spelled}')\n\n"
            + markdown_table(["metric (s)", "median", "min", "max"], rows))


# what each rung must have done: (attempts, ranks with a new process)
EXPECTED = {("group", "step re-execution"): (1, 0), ("group", "in-process restart"): (1, 0),
            ("group", "process restart"): (2, 2), ("group", "process restart, cold"): (2, 2),
            ("kill", "in-process restart"): (1, 1), ("kill", "in-process restart, cold"): (1, 1),
            ("kill", "process restart"): (2, 2), ("kill", "process restart, cold"): (2, 2)}


def expected(fault: str, rung: str, nproc: int) -> tuple[int, int]:
    """(attempts, ranks with a new process) for `rung` with `nproc` ranks: with more than 2,
    the in-process restart replaces the rank blocked in the broken group's collective."""
    attempts, new = EXPECTED[(fault, rung)]
    if nproc == 2:
        return attempts, new
    return (1, 1) if rung.startswith("in-process") else (attempts, nproc)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Step re-execution, in-process restart and process restart on the example "
        "DDP job: 2 ranks, the same fault, interleaved repeats; prints markdown tables.")
    parser.add_argument("--repeats", type=int, default=3, help="measured rounds (default 3)")
    parser.add_argument("--steps", type=int, default=80, help="steps per job (default 80)")
    parser.add_argument("--faults", default="group,kill", help="group, kill or both")
    parser.add_argument("--timeout", type=float, default=180.0, help="per job (s)")
    parser.add_argument("--nproc", type=int, default=2, help="ranks (default 2; more than 2: "
                        "the group fault only, a rank blocked in the broken collective)")
    parser.add_argument("--fault-rank", type=int, default=1, help="the rank the fault hits")
    args = parser.parse_args(argv)
    faults = [f.strip() for f in args.faults.split(",") if f.strip()]
    rungs = RUNGS if args.nproc == 2 else RUNGS_MANY
    if args.repeats < 1 or args.steps <= FAULT_STEP or not faults or \
            any(f not in rungs for f in faults) or args.nproc < 2 or \
            not 0 <= args.fault_rank < args.nproc:
        parser.error(f"--repeats >= 1, --steps > {FAULT_STEP}, --faults from {list(rungs)}, "
                     "--nproc >= 2, 0 <= --fault-rank < --nproc")
    print(machine_line())
    print(f"{args.nproc} ranks; {args.repeats} interleaved rounds per fault\n", flush=True)
    with tempfile.TemporaryDirectory(prefix="tg-bench-rungs-") as tmp:
        base = Path(tmp)
        # 2 ranks: the uninterrupted run's weights; more: the first faulted run's (a fresh
        # DDP after any restart sums 4 ranks' gradients in another order)
        clean = digest_of(run_job(base / "clean", args.steps, None, None, args.timeout),
                          "the uninterrupted run") if args.nproc == 2 else None
        for fault in faults:
            spelled = FAULTS[fault].format(rank=args.fault_rank)
            runs: dict[str, list[Run]] = {rung: [] for rung in rungs[fault]}
            for i in range(args.repeats):
                t0 = time.monotonic()
                for rung in rungs[fault]:
                    name = f"{fault}-{rung.replace(' ', '_').replace(',', '')}-{i}"
                    run = measure(base / name, args.steps, rung, spelled, args.timeout,
                                  args.nproc)
                    clean = clean or run.digest
                    if run.digest != clean:
                        raise BenchError(f"{name}: final weights differ from the "
                                         f"{'uninterrupted' if args.nproc == 2 else 'first'} "
                                         "run")
                    want = expected(fault, rung, args.nproc)
                    if (run.attempts, run.new_processes) != want:
                        raise BenchError(f"{name}: {run.attempts} attempt(s), "
                                         f"{run.new_processes} new process(es); expected "
                                         f"{want}")
                    warm = 0 if rung.endswith("cold") else run.new_processes
                    if run.from_standby != warm:
                        raise BenchError(f"{name}: {run.from_standby} of {run.new_processes} "
                                         f"new process(es) came from a standby, not {warm}")
                    runs[rung].append(run)
                print(f"{fault} round {i + 1}/{args.repeats}: " + ", ".join(
                    f"{rung} {rs[-1].first_good_s:.3f} s" for rung, rs in runs.items())
                    + f" ({time.monotonic() - t0:.0f} s)", file=sys.stderr, flush=True)
            print(report(fault, spelled, runs) + "\n", flush=True)
    if args.nproc > 2:
        print("every run's final weights: the same in every run (each resumed from the same "
              "checkpoint); the in-process restart: one attempt, one new process (the rank "
              "blocked in the broken collective); process restart: two attempts, every "
              "process new")
        return 0
    print("every run's final weights: bit-identical to the uninterrupted run; attempts and new "
          "processes as each rung promises (re-execution and in-process on a broken group: one "
          "attempt, no new process; in-process after a kill: one attempt, one new process; "
          "process restart: two attempts, every process new)")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BenchError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
