"""Hang detection latency and false alarms of `trainguard run`, on the example DDP job.

Detection latency: examples/train_ddp.py, 2 ranks (gloo, CPU), a steady step (a fixed
--step-time, no jitter), the default hang settings (threshold max(3 x p99 step, 8 s)), and a
hang injected with TRAINGUARD_FAULT after the cadence is learned (step 20 for steps up to
0.1 s, else step 10):

* `hang`: rank 1 sleeps forever; rank 0 waits in the next allreduce;
* `spin`: rank 1 loops in Python at 100% of a CPU; rank 0 waits likewise;
* `loaderhang`: rank 0's DataLoader worker (--loader-workers 1) sleeps making a batch;
* `lock`: every rank blocks on an flock this benchmark holds.

The latency is the detector's own: last progress -> HangConfirmed (`last_progress_at` and
`confirmed_at` of the event's data; the same two times are the job_hanged recover record's
`fault_at` and `detected_at`, whose difference is its `detect`), in seconds and in units of
the job's p99 step interval as the detector learned it (`p99_step_s`). "written" is the
HangConfirmed event's own time: after every rank's stack was dumped. The target is the
docs': confirmed within 3 x p99 + 10 s (checked on "written", the later of the two). The
jobs run without --restart-on-hang and are stopped with SIGTERM once the hang is confirmed
(the restart is not measured here; tests/integration/test_hang.py checks it).

False alarms: one long healthy job, default hang settings, quiet (--quiet --progress: no line
printed between steps, progress through trainguard.progress), a checkpoint every 10 steps
that pauses 20 steps (--ckpt-pause 20, inside trainguard.phase("checkpoint")), and a step
time that varies 10x at random: after every step both ranks sleep a random extra in
[0, 9 x base) (`slow:` faults, seeded). Not the example's --step-jitter, unless
--use-step-jitter-flag: under DDP that flag scales each extra by the step's measured time,
which includes the wait in the allreduce for the peer's previous extra, so the extras feed on
each other and grow without bound (steps of 3 s, 24 s, 61 s by step 4 with --step-time 0.01
--step-jitter 9). The base step (--fa-step-time, 0.3 s) is chosen so
that 3 x p99 (about 3 x 10 x base) is above the 8 s floor: the learned threshold, not the
floor, is what must hold. Every HangSuspected and HangConfirmed is counted. At the end one
rank is made to hang (a probe), so the run also shows the threshold in force after the whole
run and a detection under jitter; events from the probe on are not counted as false alarms.

    .venv/bin/python benchmarks/hang_detection.py [--repeats 3] [--fa-seconds 300] [--quick]
"""

from __future__ import annotations

import argparse
import fcntl
import json
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from _common import (
    EXAMPLE,
    REPO,
    STAMPED_LINE,
    BenchError,
    bench_env,
    load_note,
    machine_line,
    markdown_table,
    parse_iso,
    stop_process,
    tail,
    trainguard_exe,
    wait_exit,
)

NPROC = 2
KINDS = ("hang", "spin", "loaderhang", "lock")
CULPRIT = {"hang": 1, "spin": 1, "loaderhang": 0, "lock": None}
COMPUTE_S = 0.02  # the example's own step (forward, backward, allreduce) on this machine
FA_CKPT_EVERY = 10
FA_JITTER = 9.0  # extra sleep in [0, 9 x base): the step time varies 10x
FA_CKPT_PAUSE = 20.0
STARTUP_S = 5.0  # launch -> first step, roughly (imports, gloo rendezvous)


@dataclass(frozen=True)
class HangRun:
    kind: str
    step_s: float
    p99_s: float
    threshold_s: float
    suspected_s: float  # last progress -> HangSuspected event
    confirmed_s: float  # last progress -> confirmed_at (the recover record's `detect`)
    written_s: float  # last progress -> HangConfirmed event written (stacks dumped)
    culprit: int | None
    notes: str

    @property
    def target_s(self) -> float:
        return 3 * self.p99_s + 10

    @property
    def culprit_ok(self) -> bool:
        return self.culprit == CULPRIT[self.kind]


@dataclass(frozen=True)
class FalseAlarmRun:
    wall_s: float
    steps: int
    checkpoints: int
    suspected: int
    confirmed: int
    cleared: int
    probe_threshold_s: float | None
    probe_p99_s: float | None
    probe_basis: str | None
    probe_confirmed_s: float | None
    notes: str


def fault_step(step_s: float) -> int:
    return 20 if step_s <= 0.1 else 10


def tg_json(command: str, job_dir: Path) -> Any:
    argv = [trainguard_exe(), command, str(job_dir), "--json"]
    res = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=60)
    if res.returncode != 0:
        raise BenchError(f"`trainguard {command} {job_dir} --json` exited {res.returncode}:\n"
                         f"{res.stderr.strip()}")
    return json.loads(res.stdout)


def stamped(path: Path, needle: str) -> float | None:
    """The time stamp of the first line of a rank log that contains `needle`."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    for raw in text.splitlines():
        m = STAMPED_LINE.match(raw)
        if m is not None and needle in m.group(3):
            return parse_iso(m.group(1))
    return None


def launch(job_dir: Path, run_flags: list[str], script_flags: list[str], fault: str
           ) -> tuple[subprocess.Popen[bytes], Path]:
    argv = [trainguard_exe(), "run", "--nproc-per-node", str(NPROC), "--job-dir", str(job_dir),
            "--grace-period", "3", *run_flags, str(EXAMPLE), *script_flags]
    console = job_dir.with_name(job_dir.name + ".console.txt")
    with open(console, "wb") as out:
        proc = subprocess.Popen(argv, cwd=REPO, env=bench_env(TRAINGUARD_FAULT=fault),
                                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
    return proc, console


def wait_confirmed(proc: subprocess.Popen[bytes], job_dir: Path, console: Path, after: float,
                   timeout_s: float, fault_log: Path | None = None,
                   fault_line: str = "") -> None:
    """Until hang.json of attempt 0 holds a confirmation at or after `after` (Unix time), and,
    with `fault_log`, after the line `fault_line` appeared in it; then stop the job."""
    hang = job_dir / "logs" / "attempt-0" / "stacks" / "hang.json"
    deadline = time.monotonic() + timeout_s
    since = after
    while True:
        if proc.poll() is not None:
            raise BenchError(f"{job_dir.name}: `trainguard run` exited {proc.returncode} "
                             f"before the hang was confirmed:\n{tail(console)}")
        if time.monotonic() > deadline:
            stop_process(proc)
            raise BenchError(f"{job_dir.name}: no hang confirmed within {timeout_s:g} s:\n"
                             f"{tail(console)}")
        if fault_log is not None:
            fired = stamped(fault_log, fault_line)
            since = max(after, fired) if fired is not None else float("inf")
        try:
            data = json.loads(hang.read_text(encoding="utf-8"))
            if parse_iso(data["confirmed_at"]) >= since:
                break
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.2)
    time.sleep(0.5)  # the HangConfirmed event is written right after hang.json
    proc.send_signal(signal.SIGTERM)
    rc = wait_exit(proc, 60, f"`trainguard run` for {job_dir.name}")
    if rc != 128 + signal.SIGTERM:
        raise BenchError(f"{job_dir.name}: exited {rc} after SIGTERM, expected 143:\n"
                         f"{tail(console)}")


def of_reason(events: list[dict[str, Any]], reason: str) -> list[dict[str, Any]]:
    return [e for e in events if e["reason"] == reason]


def hang_run(root: Path, kind: str, step_s: float, i: int, timeout_s: float) -> HangRun:
    job = root / f"{kind}-{step_s:g}-{i}"
    s = fault_step(step_s)
    lock_path = root / f"{job.name}.lock"
    fault = {"hang": f"hang@rank=1,step={s}", "spin": f"spin@rank=1,step={s}",
             "loaderhang": f"loaderhang@rank=0,step={s}",
             "lock": f"lock:{lock_path}@step={s}"}[kind]
    script = ["--steps", str(s + 20), "--ckpt-every", "10", "--step-time", f"{step_s:g}"]
    if kind == "loaderhang":
        script += ["--loader-workers", "1"]
    fault_rank = 0 if kind in ("loaderhang", "lock") else 1
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # only `lock` jobs take it: they block on it
        started = time.time()
        proc, console = launch(job, [], script, fault)
        try:
            wait_confirmed(proc, job, console, started, timeout_s,
                           job / "logs" / "attempt-0" / f"rank-{fault_rank}.log",
                           f"injecting {kind} at step {s}")
        finally:
            stop_process(proc)
    events = tg_json("events", job)
    sus, conf = of_reason(events, "HangSuspected"), of_reason(events, "HangConfirmed")
    if not sus or not conf:
        raise BenchError(f"{job.name}: HangSuspected {len(sus)}, HangConfirmed {len(conf)}")
    notes = []
    if len(sus) > 1 or len(conf) > 1:
        notes.append(f"{len(sus)} suspected, {len(conf)} confirmed")
    d = conf[-1]["data"]
    last = parse_iso(d["last_progress_at"])
    if d["p99_step_s"] is None:
        raise BenchError(f"{job.name}: confirmed before the cadence was learned: {d['basis']}")
    return HangRun(kind, step_s, float(d["p99_step_s"]), float(d["threshold_s"]),
                   parse_iso(sus[-1]["time"]) - last, parse_iso(d["confirmed_at"]) - last,
                   parse_iso(conf[-1]["time"]) - last, d["culprit"]["rank"], "; ".join(notes))


def jitter_plan(base_s: float, seconds: float, seed: int) -> tuple[int, list[float]]:
    """Steps and the extra sleep after each, so the healthy run lasts about `seconds`."""
    rng = random.Random(seed)
    extras: list[float] = []
    total = STARTUP_S
    while True:
        extra = rng.random() * FA_JITTER * base_s
        n = len(extras) + 1
        cost = base_s + extra + (FA_CKPT_PAUSE * base_s if n % FA_CKPT_EVERY == 0 else 0.0)
        if total + cost > seconds and n > 2 * FA_CKPT_EVERY:
            return len(extras), extras
        extras.append(extra)
        total += cost


def false_alarm_run(root: Path, step_time: float, seconds: float, seed: int, use_flag: bool
                    ) -> FalseAlarmRun:
    job = root / "false-alarm"
    base = step_time + COMPUTE_S
    steps, extras = jitter_plan(base, seconds, seed)
    probe = steps - 1  # rank 1 hangs after this step: the job never ends by itself
    faults = [f"hang@rank=1,step={probe}"]
    script = ["--steps", str(steps), "--ckpt-every", str(FA_CKPT_EVERY), "--step-time",
              f"{step_time:g}", "--ckpt-pause", f"{FA_CKPT_PAUSE:g}", "--quiet", "--progress"]
    if use_flag:
        script += ["--step-jitter", f"{FA_JITTER:g}"]
    else:
        faults += [f"slow:{x:.3f}@step={n}" for n, x in enumerate(extras, 1)]
    started = time.time()
    proc, console = launch(job, [], script, ";".join(faults))
    rank1 = job / "logs" / "attempt-0" / "rank-1.log"
    try:
        wait_confirmed(proc, job, console, started, seconds * 3 + 120, rank1,
                       f"injecting hang at step {probe}")
    finally:
        stop_process(proc)
    fired = stamped(rank1, f"injecting hang at step {probe}")
    if fired is None:
        raise BenchError(f"{job.name}: the probe hang never fired")
    events = tg_json("events", job)
    before = [e for e in events if parse_iso(e["time"]) < fired]
    after = [e for e in events if parse_iso(e["time"]) >= fired]
    probe_conf = of_reason(after, "HangConfirmed")
    notes = []
    if of_reason(before, "WorkerFailed"):
        notes.append("a worker failed")
    pd = probe_conf[0]["data"] if probe_conf else None
    return FalseAlarmRun(
        wall_s=fired - started, steps=probe, checkpoints=len(of_reason(before, "CheckpointSaved")),
        suspected=len(of_reason(before, "HangSuspected")),
        confirmed=len(of_reason(before, "HangConfirmed")),
        cleared=len(of_reason(before, "HangCleared")),
        probe_threshold_s=pd["threshold_s"] if pd else None,
        probe_p99_s=pd["p99_step_s"] if pd else None, probe_basis=pd["basis"] if pd else None,
        probe_confirmed_s=(parse_iso(pd["confirmed_at"]) - parse_iso(pd["last_progress_at"])
                           if pd else None),
        notes="; ".join(notes))


def f2(x: float) -> str:
    return f"{x:.2f}"


def rng_of(xs: list[float], digits: int = 2) -> str:
    return f"{statistics.median(xs):.{digits}f} ({min(xs):.{digits}f}-{max(xs):.{digits}f})"


def latency_tables(runs: list[HangRun]) -> str:
    rows = []
    for step_s in sorted({r.step_s for r in runs}):
        for kind in KINDS:
            rs = [r for r in runs if r.kind == kind and r.step_s == step_s]
            if not rs:
                continue
            met = sum(r.written_s <= r.target_s for r in rs)
            rows.append([
                kind, f"{step_s:g}", str(len(rs)), rng_of([r.p99_s for r in rs], 3),
                f2(statistics.median([r.threshold_s for r in rs])),
                rng_of([r.suspected_s for r in rs]), rng_of([r.confirmed_s for r in rs]),
                rng_of([r.confirmed_s / r.p99_s for r in rs], 0),
                rng_of([r.written_s for r in rs]), f2(max(r.target_s for r in rs)),
                f"{met}/{len(rs)}", f"{sum(r.culprit_ok for r in rs)}/{len(rs)}"])
    summary = markdown_table(
        ["kind", "step (s)", "runs", "p99 step (s)", "threshold (s)", "suspected (s)",
         "confirmed (s)", "confirmed (x p99)", "written (s)", "target 3xp99+10 (s)",
         "target met", "culprit right"], rows)
    detail = markdown_table(
        ["kind", "step (s)", "p99 (s)", "confirmed (s)", "x p99", "written (s)", "culprit",
         "notes"],
        [[r.kind, f"{r.step_s:g}", f"{r.p99_s:.3f}", f"{r.confirmed_s:.3f}",
          f"{r.confirmed_s / r.p99_s:.0f}", f"{r.written_s:.3f}",
          "none" if r.culprit is None else f"rank {r.culprit}", r.notes] for r in runs])
    return ("Median (min-max) over the runs; seconds from the last progress.\n\n" + summary
            + "\n\nEvery run:\n\n" + detail)


def false_alarm_table(fa: FalseAlarmRun, step_time: float, use_flag: bool) -> str:
    base = step_time + COMPUTE_S
    how = ("--step-jitter 9" if use_flag else
           f"slow faults, extra in [0, {FA_JITTER:g} x {base:g} s)")
    rows = [
        ["healthy run (launch -> probe)", f"{fa.wall_s:.0f} s, {fa.steps} steps, "
         f"{fa.checkpoints} checkpoints"],
        ["step time", f"--step-time {step_time:g} + {how}"],
        ["checkpoint pause", f"--ckpt-pause {FA_CKPT_PAUSE:g} (every {FA_CKPT_EVERY} steps)"],
        ["HangSuspected (false alarms)", str(fa.suspected)],
        ["HangConfirmed (false alarms)", str(fa.confirmed)],
        ["HangCleared", str(fa.cleared)],
        ["probe: threshold in force",
         "-" if fa.probe_threshold_s is None else
         f"{fa.probe_threshold_s:.2f} s ({fa.probe_basis})"],
        ["probe: confirmed after (s)",
         "-" if fa.probe_confirmed_s is None else f"{fa.probe_confirmed_s:.2f}"],
    ]
    if fa.notes:
        rows.append(["notes", fa.notes])
    return markdown_table(["false alarms, default hang settings", "value"], rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Hang detection latency (per hang kind and step time) and false alarms "
        "(a long jittery healthy job) of `trainguard run` with examples/train_ddp.py, 2 ranks; "
        "prints markdown tables.")
    parser.add_argument("--repeats", type=int, default=3, help="runs per kind and step time")
    parser.add_argument("--step-times", default="0.05,0.5",
                        help="steady --step-time values, comma-separated (default 0.05,0.5)")
    parser.add_argument("--kinds", default=",".join(KINDS),
                        help=f"hang kinds, comma-separated (default {','.join(KINDS)})")
    parser.add_argument("--fa-seconds", type=float, default=300.0,
                        help="length of the healthy false-alarm run (default 300)")
    parser.add_argument("--fa-step-time", type=float, default=0.3,
                        help="--step-time of the false-alarm run (default 0.3: 3 x p99 above "
                        "the 8 s floor)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the false-alarm jitter")
    parser.add_argument("--use-step-jitter-flag", action="store_true",
                        help="jitter with train_ddp.py --step-jitter 9 instead of slow faults")
    parser.add_argument("--no-false-alarms", action="store_true", help="skip that run")
    parser.add_argument("--timeout", type=float, default=120.0,
                        help="seconds allowed for a hang to be confirmed (default 120)")
    parser.add_argument("--quick", action="store_true",
                        help="1 repeat, step time 0.05 only, a 60 s false-alarm run")
    args = parser.parse_args(argv)
    step_times = [float(x) for x in args.step_times.split(",") if x.strip()]
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    if args.quick:
        args.repeats, step_times, args.fa_seconds = 1, [0.05], min(args.fa_seconds, 60.0)
    bad = [k for k in kinds if k not in KINDS]
    if bad:
        parser.error(f"unknown kinds {bad}; use {', '.join(KINDS)}")
    if args.repeats < 1 or not step_times or any(s <= 0 for s in step_times):
        parser.error("--repeats must be >= 1 and the step times > 0")

    t_start = time.monotonic()
    try:
        print(f"{datetime.now():%Y-%m-%d %H:%M} · .venv/bin/python benchmarks/hang_detection.py "
              f"{' '.join(sys.argv[1:] if argv is None else argv)}".rstrip())
        print(machine_line())
        print(f"workers: {NPROC} (gloo, CPU); default hang settings; repeats {args.repeats}; "
              f"step times {', '.join(f'{s:g}' for s in step_times)} s; kinds "
              f"{', '.join(kinds)}; false-alarm run {args.fa_seconds:g} s", flush=True)
        runs: list[HangRun] = []
        fa: FalseAlarmRun | None = None
        with tempfile.TemporaryDirectory(prefix="tg-bench-hang-") as tmp:
            root = Path(tmp)
            for i in range(args.repeats):
                for step_s in step_times:
                    for kind in (kinds if i % 2 == 0 else kinds[::-1]):
                        r = hang_run(root, kind, step_s, i, args.timeout)
                        runs.append(r)
                        print(f"  [{i + 1}/{args.repeats}] {kind} step {step_s:g}s: confirmed "
                              f"{r.confirmed_s:.2f}s ({r.confirmed_s / r.p99_s:.0f} x p99 "
                              f"{r.p99_s:.3f}s), written {r.written_s:.2f}s, culprit "
                              f"{r.culprit} ({load_note()})", flush=True)
            if not args.no_false_alarms:
                fa = false_alarm_run(root, args.fa_step_time, args.fa_seconds, args.seed,
                                     args.use_step_jitter_flag)
                print(f"  false alarms: {fa.suspected} suspected, {fa.confirmed} confirmed "
                      f"in {fa.wall_s:.0f}s ({load_note()})", flush=True)
        print()
        print(latency_tables(runs))
        if fa is not None:
            print()
            print(false_alarm_table(fa, args.fa_step_time, args.use_step_jitter_flag))
        print(f"\ntotal wall time {time.monotonic() - t_start:.0f} s")
    except BenchError as e:
        print(f"hang_detection: error: {e}", file=sys.stderr)
        return 1
    except (OSError, KeyError, TypeError, ValueError, subprocess.SubprocessError) as e:
        print(f"hang_detection: error: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("hang_detection: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
