"""Recovery time vs. cold start of the example DDP job under `trainguard run`.

Runs, interleaved and repeated --repeats times, on this machine side by side:

* cold start: a fresh job (no checkpoint); wall time from launching `trainguard run` to
  the first `step N` line in the rank logs (the time stamp trainguard wrote when it read
  the line), split at the attempt's start (`start_at` of running record 0);
* a process restart after TRAINGUARD_FAULT='signal:KILL@rank=1,step=75' (some 20 s in, when
  the node's standby workers are warm), three ways, all with a durable checkpoint every 10
  steps:
  - `cold, storage`: as before issue 13 (`--no-standby-workers`, no memory snapshots): new
    interpreters, state from the checkpoint of step 70;
  - `standby, storage`: pre-warmed standby workers (the default), state from storage;
  - `standby, memory`: standby workers and `--memory-every 1`: state from the node's
    shared memory, the step the rank died after.
  Each: fault (`fault_at`) -> first step after the restart (`first_progress_at`), its
  split and the steps lost, from `trainguard recovery DIR --json`; and fault -> step 76 done
  by every rank (the lost steps redone on top), from the rank logs.

Measured runs use `--restart-backoff 0`, so the recovery time is what trainguard itself
costs (detect, stop, decide, start workers, and the workers' own start up to the first
step). Targets (issue 13): the process restart <= 0.35x the job's cold start; 0 steps lost
with `--memory-every 1`.

    .venv/bin/python benchmarks/recovery_time.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _common import (
    EXAMPLE,
    REPO,
    BenchError,
    Spread,
    bench_env,
    load_note,
    machine_line,
    markdown_table,
    parse_iso,
    rank_logs,
    read_step_lines,
    tail,
    trainguard_exe,
    wait_exit,
)

NPROC = 2
FAULT_RANK, FAULT_STEP = 1, 75
FAULT = f"signal:KILL@rank={FAULT_RANK},step={FAULT_STEP}"
STEP_TIME = "0.3"  # the standbys fill 10 s after the first step: the fault comes after
SPLIT = ("detect", "stop", "decide", "start", "resume")
VARIANTS: dict[str, list[str]] = {
    "cold, storage": ["--no-standby-workers"],
    "standby, storage": [],
    "standby, memory": ["--memory-every", "1"],
}


@dataclass(frozen=True)
class ColdStart:
    total_s: float  # launch -> first step line
    launcher_s: float  # launch -> attempt 0 start_at
    workers_s: float  # attempt 0 start_at -> first step line


@dataclass(frozen=True)
class Recovery:
    total_s: float  # fault_at -> first_progress_at
    back_s: float  # fault_at -> the first new step (FAULT_STEP + 1) done by every rank
    durations: dict[str, float]  # detect, stop, decide, start, resume (s)
    steps_lost: int | None
    workers_from: str | None
    resumed_from: str | None


def launch(job_dir: Path, steps: int, flags: list[str], fault: str | None,
           timeout_s: float) -> float:
    """Run one `trainguard run` job to the end; returns the launch time (Unix time)."""
    argv = [trainguard_exe(), "run", "--nproc-per-node", str(NPROC), "--max-restarts", "3",
            "--restart-backoff", "0", "--job-dir", str(job_dir), *flags, str(EXAMPLE),
            "--steps", str(steps), "--ckpt-every", "10", "--step-time", STEP_TIME]
    env = bench_env(**({"TRAINGUARD_FAULT": fault} if fault else {}))
    console = job_dir.with_name(job_dir.name + ".console.txt")
    what = f"`trainguard run` for {job_dir.name}"
    with open(console, "wb") as out:
        launched = time.time()
        proc = subprocess.Popen(argv, cwd=REPO, env=env, stdin=subprocess.DEVNULL,
                                stdout=out, stderr=subprocess.STDOUT)
        rc = wait_exit(proc, timeout_s, what)
    if rc != 0:
        raise BenchError(f"{what} exited {rc}; its last console lines:\n{tail(console)}")
    return launched


def recovery_json(job_dir: Path) -> dict[str, Any]:
    argv = [trainguard_exe(), "recovery", str(job_dir), "--json"]
    res = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=60)
    if res.returncode != 0:
        raise BenchError(f"`trainguard recovery {job_dir} --json` exited {res.returncode}:\n"
                         f"{res.stderr.strip()}")
    try:
        data: dict[str, Any] = json.loads(res.stdout)
    except json.JSONDecodeError as e:
        raise BenchError(f"`trainguard recovery --json` printed no JSON ({e})") from None
    return data


def cold_start(job_dir: Path, steps: int, timeout_s: float) -> ColdStart:
    launched = launch(job_dir, steps, [], fault=None, timeout_s=timeout_s)
    stamps = [
        line.stamp
        for rank, path in rank_logs(job_dir, 0, NPROC).items()
        for line in read_step_lines(path, rank, stamped=True)
        if line.stamp is not None
    ]
    if not stamps:
        raise BenchError(f"no step line in the rank logs of {job_dir}/logs/attempt-0")
    first_step = min(stamps)
    records = recovery_json(job_dir)["running_records"]
    if len(records) != 1:
        raise BenchError(f"cold-start job {job_dir} ran {len(records)} attempts, expected 1")
    started = parse_iso(records[0]["start_at"])
    return ColdStart(first_step - launched, started - launched, first_step - started)


def recovery(job_dir: Path, steps: int, flags: list[str], timeout_s: float) -> Recovery:
    launch(job_dir, steps, flags, fault=FAULT, timeout_s=timeout_s)
    data = recovery_json(job_dir)
    recs = [r for rr in data["running_records"] for r in rr["recover_records"]]
    if len(recs) != 1:
        raise BenchError(f"{job_dir}: expected 1 recover record, got {len(recs)} "
                         f"(did TRAINGUARD_FAULT={FAULT!r} fire?)")
    rec = recs[0]
    if rec.get("recover_result") != "success":
        raise BenchError(f"{job_dir}: recovery did not succeed: {rec.get('recover_result')}")
    missing = [k for k in ("fault_at", "first_progress_at") if not rec.get(k)]
    dur = rec.get("durations_s") or {}
    missing += [f"durations_s.{k}" for k in SPLIT if dur.get(k) is None]
    if missing:
        raise BenchError(f"{job_dir}: recover record lacks {', '.join(missing)}")
    fault_at = parse_iso(rec["fault_at"])
    new = [ln.stamp for rank, path in rank_logs(job_dir, 1, NPROC).items()
           for ln in read_step_lines(path, rank, stamped=True)
           if ln.step == FAULT_STEP + 1 and ln.stamp is not None]
    if len(new) < NPROC:
        raise BenchError(f"{job_dir}: step {FAULT_STEP + 1} not done by every rank")
    return Recovery(parse_iso(rec["first_progress_at"]) - fault_at, max(new) - fault_at,
                    {k: float(dur[k]) for k in SPLIT}, rec.get("steps_lost"),
                    rec.get("workers_from"), rec.get("resumed_from"))


def fmt(s: Spread, digits: int = 3) -> list[str]:
    return [f"{s.median:.{digits}f}", f"{s.lo:.{digits}f}", f"{s.hi:.{digits}f}"]


def report(colds: list[ColdStart], runs: dict[str, list[Recovery]]) -> str:
    rows = [
        ["cold start: launch -> first step", *fmt(Spread.of([c.total_s for c in colds]))],
        ["  launch -> attempt started", *fmt(Spread.of([c.launcher_s for c in colds]))],
        ["  attempt started -> first step", *fmt(Spread.of([c.workers_s for c in colds]))],
    ]
    for name, recs in runs.items():
        rows.append([f"restart ({name}): fault -> first step",
                     *fmt(Spread.of([r.total_s for r in recs]))])
        for key in SPLIT:
            rows.append([f"  {key}", *fmt(Spread.of([r.durations[key] for r in recs]))])
        rows.append(["  ratio to the cold start (per pair)", *fmt(Spread.of(
            [r.total_s / c.total_s for c, r in zip(colds, recs, strict=True)]), 2)])
        rows.append([f"restart ({name}): fault -> step {FAULT_STEP + 1} done (lost steps "
                     "redone)",
                     *fmt(Spread.of([r.back_s for r in recs]))])
    table = markdown_table(["metric (s)", "median", "min", "max"], rows)
    facts = markdown_table(
        ["restart", "steps lost", "workers from", "state from"],
        [[name, ", ".join(str(r.steps_lost) for r in recs),
          ", ".join(str(r.workers_from) for r in recs),
          ", ".join(str(r.resumed_from) for r in recs)] for name, recs in runs.items()])
    return f"{table}\n\n{facts}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Recovery time (crash -> first step after restart) vs. cold start "
        "(launch -> first step) of examples/train_ddp.py under `trainguard run`, "
        "2 ranks, interleaved repeats; prints a markdown table.",
    )
    parser.add_argument("--repeats", type=int, default=3, help="measured pairs (default 3)")
    parser.add_argument("--steps", type=int, default=80,
                        help=f"--steps for the fault runs; the fault fires after step "
                        f"{FAULT_STEP} (default 80)")
    parser.add_argument("--cold-steps", type=int, default=10,
                        help="--steps for the cold-start runs (default 10)")
    parser.add_argument("--no-warmup", action="store_true",
                        help="skip the unmeasured warm-up run (fills the file cache)")
    parser.add_argument("--timeout", type=float, default=120.0,
                        help="seconds allowed per job (default 120)")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    if args.steps <= FAULT_STEP:
        parser.error(f"--steps must be > {FAULT_STEP}: the fault fires after it")
    if args.cold_steps < 1:
        parser.error("--cold-steps must be >= 1")

    try:
        print(machine_line())
        print(f"repeats: {args.repeats} (interleaved); workers: {NPROC} (gloo, CPU); "
              f"--restart-backoff 0; fault: {FAULT}; --step-time {STEP_TIME}; fault runs "
              f"--steps {args.steps}, cold runs --steps {args.cold_steps}", flush=True)
        colds: list[ColdStart] = []
        runs: dict[str, list[Recovery]] = {name: [] for name in VARIANTS}
        with tempfile.TemporaryDirectory(prefix="tg-bench-recovery-") as tmp:
            root = Path(tmp)
            if not args.no_warmup:
                cold_start(root / "warmup", args.cold_steps, args.timeout)
            for i in range(args.repeats):
                order = ["cold", *VARIANTS]
                order = order[i % len(order):] + order[:i % len(order)]  # rotate
                for kind in order:
                    if kind == "cold":
                        c = cold_start(root / f"cold-{i}", args.cold_steps, args.timeout)
                        colds.append(c)
                        print(f"  [{i + 1}/{args.repeats}] cold start {c.total_s:.3f} s "
                              f"({load_note()})", flush=True)
                    else:
                        slug = kind.replace(", ", "-")
                        r = recovery(root / f"{slug}-{i}", args.steps, VARIANTS[kind],
                                     args.timeout)
                        runs[kind].append(r)
                        print(f"  [{i + 1}/{args.repeats}] restart ({kind}) {r.total_s:.3f} s, "
                              f"{r.steps_lost} step(s) lost, workers {r.workers_from}, "
                              f"state from {r.resumed_from} ({load_note()})", flush=True)
        print()
        print(report(colds, runs))
    except BenchError as e:
        print(f"recovery_time: error: {e}", file=sys.stderr)
        return 1
    except (OSError, KeyError, TypeError, ValueError, subprocess.SubprocessError) as e:
        print(f"recovery_time: error: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("recovery_time: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
