"""Step time of the example DDP job under `trainguard run` vs. started by hand.

A/B runs, interleaved (A B, B A, A B, ...), --repeats of each, 2 ranks (gloo, CPU):

* A, trainguard: `trainguard run --nproc-per-node 2 --job-dir DIR examples/train_ddp.py
  --steps N --ckpt-dir DIR/ckpt`; the step lines are read from DIR/logs/attempt-0/;
* B, by hand: two plain `python examples/train_ddp.py --steps N --ckpt-dir DIR/ckpt`
  processes with RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT set, stdout and
  stderr to files, each in a new session as trainguard starts its workers (Linux autogroup
  scheduling gives each session its own CPU share; --same-session turns this off).

Both get OMP_NUM_THREADS=1 and a fresh checkpoint dir. The per-step time is the example's
own `dt` (forward, backward, optimizer step; not the checkpoint writes), both ranks, the
first --warmup steps dropped. For A, the launcher process's own CPU time (psutil, children
excluded) is sampled while it runs and read once more from its zombie at exit.

    .venv/bin/python benchmarks/launcher_overhead.py [--repeats 3] [--steps 300]
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
from _common import (
    EXAMPLE,
    REPO,
    BenchError,
    Spread,
    StepLine,
    bench_env,
    free_port,
    load_note,
    machine_line,
    markdown_table,
    rank_logs,
    read_step_lines,
    stop_process,
    tail,
    trainguard_exe,
    wait_exit,
)

NPROC = 2


@dataclass(frozen=True)
class Run:
    median_ms: float  # median dt over both ranks, warm-up dropped
    mean_ms: float
    wall_s: float  # launch -> every process exited
    launcher_cpu_s: float | None = None  # trainguard process, user + system, whole run
    launcher_steady_cpu_s: float | None = None  # same, between the first and last kept step
    steady_steps: int | None = None  # steps in that window


def kept_dts(lines: list[StepLine], steps: int, warmup: int, what: str) -> list[float]:
    """The dt values of steps > warmup, checking every rank logged every step once."""
    kept = [ln for ln in lines if ln.step > warmup]
    seen = {(ln.rank, ln.step) for ln in kept}
    expected = NPROC * (steps - warmup)
    if len(kept) != expected or len(seen) != expected:
        raise BenchError(f"{what}: {len(kept)} step lines after warm-up, expected {expected}")
    return [ln.dt_ms for ln in kept]


def summarize(dts: list[float], wall_s: float) -> Run:
    return Run(statistics.median(dts), statistics.fmean(dts), wall_s)


class CpuSampler:
    """Samples a process's own CPU time (user + system, children excluded) over time."""

    def __init__(self, pid: int) -> None:
        self._proc = psutil.Process(pid)
        self.samples: list[tuple[float, float]] = []  # (Unix time, CPU seconds)

    def __call__(self) -> None:
        try:
            t = self._proc.cpu_times()
        except psutil.Error:
            return
        self.samples.append((time.time(), t.user + t.system))

    def at(self, when: float) -> float:
        """CPU seconds at `when`, interpolated linearly between samples."""
        s = self.samples
        if when <= s[0][0]:
            return s[0][1]
        for (t0, c0), (t1, c1) in itertools.pairwise(s):
            if t0 <= when <= t1:
                return c0 if t1 == t0 else c0 + (c1 - c0) * (when - t0) / (t1 - t0)
        return s[-1][1]


def run_trainguard(root: Path, steps: int, warmup: int, timeout_s: float) -> Run:
    job_dir = root / "job"
    argv = [trainguard_exe(), "run", "--nproc-per-node", str(NPROC), "--job-dir", str(job_dir),
            str(EXAMPLE), "--steps", str(steps), "--ckpt-dir", str(root / "ckpt")]
    console = root / "console.txt"
    what = f"`trainguard run` ({root.name})"
    with open(console, "wb") as out:
        started = time.monotonic()
        proc = subprocess.Popen(argv, cwd=REPO, env=bench_env(), stdin=subprocess.DEVNULL,
                                stdout=out, stderr=subprocess.STDOUT)
        try:
            cpu = CpuSampler(proc.pid)
        except psutil.Error as e:
            stop_process(proc)
            raise BenchError(f"{what}: cannot watch the launcher process: {e}") from None
        rc = wait_exit(proc, timeout_s, what, on_poll=cpu)
        wall = time.monotonic() - started
    if rc != 0:
        raise BenchError(f"{what} exited {rc}; its last console lines:\n{tail(console)}")
    lines = [ln for r, p in rank_logs(job_dir, 0, NPROC).items()
             for ln in read_step_lines(p, r, stamped=True)]
    run = summarize(kept_dts(lines, steps, warmup, what), wall)
    if not cpu.samples:
        raise BenchError(f"{what}: no CPU time sample of the launcher process")
    # steady state: from the first kept step line to the last step line (trainguard's stamps)
    first = min(ln.stamp for ln in lines if ln.step == warmup + 1 and ln.stamp is not None)
    last = max(ln.stamp for ln in lines if ln.step == steps and ln.stamp is not None)
    return Run(run.median_ms, run.mean_ms, wall, launcher_cpu_s=cpu.samples[-1][1],
               launcher_steady_cpu_s=cpu.at(last) - cpu.at(first),
               steady_steps=steps - warmup - 1)


def run_by_hand(
    root: Path, steps: int, warmup: int, timeout_s: float, new_session: bool
) -> Run:
    port = str(free_port())
    argv = [sys.executable, str(EXAMPLE), "--steps", str(steps), "--ckpt-dir", str(root / "ckpt")]
    procs: list[tuple[int, subprocess.Popen[bytes], Path]] = []
    files = []
    what = f"by-hand run ({root.name})"
    started = time.monotonic()
    try:
        for rank in range(NPROC):
            env = bench_env(RANK=str(rank), WORLD_SIZE=str(NPROC), LOCAL_RANK=str(rank),
                            MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
            out_path = root / f"rank-{rank}.log"
            out = open(out_path, "wb")  # noqa: SIM115 - closed below
            err = open(root / f"rank-{rank}.err", "wb")  # noqa: SIM115 - closed below
            files += [out, err]
            procs.append((rank, subprocess.Popen(argv, cwd=REPO, env=env,
                                                 stdin=subprocess.DEVNULL, stdout=out,
                                                 stderr=err, start_new_session=new_session),
                          out_path))
        deadline = time.monotonic() + timeout_s
        while any(proc.poll() is None for _, proc, _ in procs):
            for rank, proc, _ in procs:  # one rank failing would leave the other waiting
                rc = proc.poll()
                if rc is not None and rc != 0:
                    raise BenchError(f"{what}: rank {rank} exited {rc}; its stderr:\n"
                                     f"{tail(root / f'rank-{rank}.err')}")
            if time.monotonic() > deadline:
                raise BenchError(f"{what} did not finish within {timeout_s:g} s; stopped it")
            time.sleep(0.1)  # the same poll period as for the trainguard runs
        wall = time.monotonic() - started
        for rank, proc, _ in procs:
            if proc.returncode != 0:
                raise BenchError(f"{what}: rank {rank} exited {proc.returncode}; its stderr:\n"
                                 f"{tail(root / f'rank-{rank}.err')}")
    finally:
        for _, proc, _ in procs:
            stop_process(proc)
        for f in files:
            f.close()
    lines = [ln for rank, _, path in procs for ln in read_step_lines(path, rank, stamped=False)]
    return summarize(kept_dts(lines, steps, warmup, what), wall)


def fmt(s: Spread, digits: int) -> list[str]:
    return [f"{s.median:.{digits}f}", f"{s.lo:.{digits}f}", f"{s.hi:.{digits}f}"]


def report(tg: list[Run], hand: list[Run], steps: int) -> str:
    ratios = [a.median_ms / b.median_ms for a, b in zip(tg, hand, strict=True)]
    mean_ratios = [a.mean_ms / b.mean_ms for a, b in zip(tg, hand, strict=True)]
    cpu_total = [r.launcher_cpu_s for r in tg if r.launcher_cpu_s is not None]
    cpu_steady = [
        r.launcher_steady_cpu_s / r.steady_steps
        for r in tg
        if r.launcher_steady_cpu_s is not None and r.steady_steps
    ]
    share = [c * 1000 / r.median_ms * 100 for c, r in zip(cpu_steady, tg, strict=True)]
    rows = [
        ["step time, trainguard (ms, median dt)", *fmt(Spread.of([r.median_ms for r in tg]), 2)],
        ["step time, by hand (ms, median dt)", *fmt(Spread.of([r.median_ms for r in hand]), 2)],
        ["ratio trainguard / by hand (median dt, per pair)", *fmt(Spread.of(ratios), 3)],
        ["step time, trainguard (ms, mean dt)", *fmt(Spread.of([r.mean_ms for r in tg]), 2)],
        ["step time, by hand (ms, mean dt)", *fmt(Spread.of([r.mean_ms for r in hand]), 2)],
        ["ratio trainguard / by hand (mean dt, per pair)", *fmt(Spread.of(mean_ratios), 3)],
        ["wall time per run, trainguard (s)", *fmt(Spread.of([r.wall_s for r in tg]), 2)],
        ["wall time per run, by hand (s)", *fmt(Spread.of([r.wall_s for r in hand]), 2)],
        ["launcher CPU, whole run (s)", *fmt(Spread.of(cpu_total), 3)],
        [f"launcher CPU per step, whole run / {steps} (ms)",
         *fmt(Spread.of([c / steps * 1000 for c in cpu_total]), 3)],
        ["launcher CPU per step, while training (ms)",
         *fmt(Spread.of([c * 1000 for c in cpu_steady]), 3)],
        ["  as % of the median step time", *fmt(Spread.of(share), 1)],
    ]
    return markdown_table(["metric", "median", "min", "max"], rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Per-step time of examples/train_ddp.py (2 ranks, gloo, CPU) under "
        "`trainguard run` vs. two processes started by hand, interleaved A/B repeats, plus "
        "the launcher process's own CPU time per step; prints a markdown table.",
    )
    parser.add_argument("--repeats", type=int, default=3,
                        help="runs of each method (default 3)")
    parser.add_argument("--steps", type=int, default=300, help="steps per run (default 300)")
    parser.add_argument("--warmup", type=int, default=20,
                        help="first steps dropped from the step times (default 20)")
    parser.add_argument("--same-session", action="store_true",
                        help="start the by-hand ranks in this script's session instead of "
                        "one new session each (trainguard's placement); with Linux "
                        "autogroup scheduling that changes their CPU share under load")
    parser.add_argument("--timeout", type=float, default=180.0,
                        help="seconds allowed per run (default 180)")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    if not 0 <= args.warmup < args.steps - 1:
        parser.error("--warmup must be >= 0 and leave at least 2 steps")

    try:
        print(machine_line())
        print(f"repeats: {args.repeats} per method, interleaved A/B; workers: {NPROC} "
              f"(gloo, CPU), OMP_NUM_THREADS=1; --steps {args.steps}, "
              f"first {args.warmup} dropped", flush=True)
        tg: list[Run] = []
        hand: list[Run] = []
        with tempfile.TemporaryDirectory(prefix="tg-bench-overhead-") as tmp:
            root = Path(tmp)
            for i in range(args.repeats):
                order = ("trainguard", "by-hand") if i % 2 == 0 else ("by-hand", "trainguard")
                for method in order:
                    d = root / f"{method}-{i}"
                    d.mkdir()
                    if method == "trainguard":
                        r = run_trainguard(d, args.steps, args.warmup, args.timeout)
                        tg.append(r)
                    else:
                        r = run_by_hand(d, args.steps, args.warmup, args.timeout,
                                        new_session=not args.same_session)
                        hand.append(r)
                    print(f"  [{i + 1}/{args.repeats}] {method}: median dt "
                          f"{r.median_ms:.2f} ms, wall {r.wall_s:.2f} s ({load_note()})",
                          flush=True)
        print()
        print(report(tg, hand, args.steps))
    except BenchError as e:
        print(f"launcher_overhead: error: {e}", file=sys.stderr)
        return 1
    except (OSError, KeyError, TypeError, ValueError, subprocess.SubprocessError,
            psutil.Error) as e:
        print(f"launcher_overhead: error: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("launcher_overhead: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
