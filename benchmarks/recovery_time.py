"""Recovery time vs. cold start of the example DDP job under `trainguard run`.

Runs, interleaved and repeated --repeats times, on this machine side by side:

* cold start: a fresh job (no checkpoint); wall time from launching `trainguard run` to
  the first `step N` line in the rank logs (the time stamp trainguard wrote when it read
  the line), split at the attempt's start (`start_at` of running record 0);
* recovery: the same job with TRAINGUARD_FAULT='signal:KILL@rank=1,step=25'; time from
  the crash (`fault_at`) to the first step after the restart (`first_progress_at`), and
  its split, all from `trainguard recovery DIR --json`. As a cross-check of `fault_at`
  (the time trainguard saw the worker exit), the table also shows the gap from the killed
  rank's last step line (it dies right after printing it) to `fault_at`.

Measured runs use `--restart-backoff 0`, so the recovery time is what trainguard itself
costs (detect, stop, decide, start workers, and the workers' own start up to the first
step); the default backoff adds a deliberate wait and is run once, reported apart.

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
FAULT_RANK, FAULT_STEP = 1, 25
FAULT = f"signal:KILL@rank={FAULT_RANK},step={FAULT_STEP}"
SPLIT = ("detect", "stop", "decide", "start", "resume")


@dataclass(frozen=True)
class ColdStart:
    total_s: float  # launch -> first step line
    launcher_s: float  # launch -> attempt 0 start_at
    workers_s: float  # attempt 0 start_at -> first step line


@dataclass(frozen=True)
class Recovery:
    total_s: float  # fault_at -> first_progress_at
    durations: dict[str, float]  # detect, stop, decide, start, resume (s)
    backoff_s: float
    steps_lost: int | None
    line_to_fault_s: float  # killed rank's last step line (stamp) -> fault_at: a cross-check


def launch(
    job_dir: Path, steps: int, backoff: float | None, fault: str | None, timeout_s: float
) -> float:
    """Run one `trainguard run` job to the end; returns the launch time (Unix time)."""
    argv = [trainguard_exe(), "run", "--nproc-per-node", str(NPROC), "--max-restarts", "3",
            "--job-dir", str(job_dir)]
    if backoff is not None:
        argv += ["--restart-backoff", f"{backoff:g}"]
    argv += [str(EXAMPLE), "--steps", str(steps)]
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
    launched = launch(job_dir, steps, backoff=0, fault=None, timeout_s=timeout_s)
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


def recovery(job_dir: Path, steps: int, backoff: float | None, timeout_s: float) -> Recovery:
    launch(job_dir, steps, backoff=backoff, fault=FAULT, timeout_s=timeout_s)
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
    if rec.get("backoff_s") is None:
        missing.append("backoff_s")
    if missing:
        raise BenchError(f"{job_dir}: recover record lacks {', '.join(missing)}")
    fault_at = parse_iso(rec["fault_at"])
    total = parse_iso(rec["first_progress_at"]) - fault_at
    # the fault fires right after the killed rank prints its step line: that line's stamp is
    # an estimate of the crash time independent of trainguard's exit detection
    killed_log = rank_logs(job_dir, 0, NPROC)[FAULT_RANK]
    last = [ln.stamp for ln in read_step_lines(killed_log, FAULT_RANK, stamped=True)
            if ln.step == FAULT_STEP and ln.stamp is not None]
    if not last:
        raise BenchError(f"{killed_log}: no step {FAULT_STEP} line before the fault")
    return Recovery(total, {k: float(dur[k]) for k in SPLIT}, float(rec["backoff_s"]),
                    rec.get("steps_lost"), fault_at - last[0])


def fmt(s: Spread, digits: int = 3) -> list[str]:
    return [f"{s.median:.{digits}f}", f"{s.lo:.{digits}f}", f"{s.hi:.{digits}f}"]


def report(colds: list[ColdStart], recs: list[Recovery], default: Recovery | None) -> str:
    ratios = [r.total_s / c.total_s for c, r in zip(colds, recs, strict=True)]
    rows = [
        ["cold start: launch -> first step", *fmt(Spread.of([c.total_s for c in colds]))],
        ["  launch -> attempt started", *fmt(Spread.of([c.launcher_s for c in colds]))],
        ["  attempt started -> first step", *fmt(Spread.of([c.workers_s for c in colds]))],
        ["recovery: fault -> first step after restart",
         *fmt(Spread.of([r.total_s for r in recs]))],
    ]
    labels = {
        "detect": "  detect (fault -> detected)",
        "stop": "  stop (other workers stopped)",
        "decide": "  decide",
        "start": "  start (backoff included)",
        "resume": "  resume (workers started -> first step)",
    }
    for key in SPLIT:
        rows.append([labels[key], *fmt(Spread.of([r.durations[key] for r in recs]))])
        if key == "start":
            rows.append(["    of which backoff (backoff_s)",
                         *fmt(Spread.of([r.backoff_s for r in recs]))])
    rows.append(["check: killed rank's last line -> fault_at",
                 *fmt(Spread.of([r.line_to_fault_s for r in recs]))])
    rows.append(["ratio recovery / cold start (per pair)", *fmt(Spread.of(ratios), 2)])
    table = markdown_table(["metric (s)", "median", "min", "max"], rows)
    lines = [table, ""]
    lost = sorted({r.steps_lost for r in recs if r.steps_lost is not None})
    if lost:
        lines.append(f"steps lost per recovery: {', '.join(map(str, lost))}")
    if default is not None:
        lines.append(
            f"default backoff (once, no --restart-backoff): recovery "
            f"{default.total_s:.3f} s, of which backoff {default.backoff_s:.3f} s "
            f"(start {default.durations['start']:.3f} s)"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Recovery time (crash -> first step after restart) vs. cold start "
        "(launch -> first step) of examples/train_ddp.py under `trainguard run`, "
        "2 ranks, interleaved repeats; prints a markdown table.",
    )
    parser.add_argument("--repeats", type=int, default=3, help="measured pairs (default 3)")
    parser.add_argument("--steps", type=int, default=30,
                        help="--steps for the fault runs; the fault fires after step 25 "
                        "(default 30)")
    parser.add_argument("--cold-steps", type=int, default=10,
                        help="--steps for the cold-start runs (default 10)")
    parser.add_argument("--no-default-backoff", action="store_true",
                        help="skip the one extra run with the default restart backoff")
    parser.add_argument("--no-warmup", action="store_true",
                        help="skip the unmeasured warm-up run (fills the file cache)")
    parser.add_argument("--timeout", type=float, default=120.0,
                        help="seconds allowed per job (default 120)")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    if args.steps <= 25:
        parser.error("--steps must be > 25: the fault fires after step 25")
    if args.cold_steps < 1:
        parser.error("--cold-steps must be >= 1")

    try:
        print(machine_line())
        print(f"repeats: {args.repeats} (interleaved); workers: {NPROC} (gloo, CPU); "
              f"measured runs with --restart-backoff 0; fault: {FAULT}; "
              f"fault runs --steps {args.steps}, cold runs --steps {args.cold_steps}",
              flush=True)
        colds: list[ColdStart] = []
        recs: list[Recovery] = []
        default: Recovery | None = None
        with tempfile.TemporaryDirectory(prefix="tg-bench-recovery-") as tmp:
            root = Path(tmp)
            if not args.no_warmup:
                cold_start(root / "warmup", args.cold_steps, args.timeout)
            for i in range(args.repeats):
                order = ("cold", "recovery") if i % 2 == 0 else ("recovery", "cold")
                for kind in order:
                    if kind == "cold":
                        c = cold_start(root / f"cold-{i}", args.cold_steps, args.timeout)
                        colds.append(c)
                        print(f"  [{i + 1}/{args.repeats}] cold start {c.total_s:.3f} s "
                              f"({load_note()})",
                              flush=True)
                    else:
                        r = recovery(root / f"recovery-{i}", args.steps, 0, args.timeout)
                        recs.append(r)
                        print(f"  [{i + 1}/{args.repeats}] recovery {r.total_s:.3f} s "
                              f"({load_note()})",
                              flush=True)
            if not args.no_default_backoff:
                default = recovery(root / "recovery-default", args.steps, None, args.timeout)
        print()
        print(report(colds, recs, default))
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
