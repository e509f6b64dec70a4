"""Helpers shared by the benchmark scripts: processes, log parsing, statistics, tables.

Standard library and psutil only (both benchmarks run with the project's .venv).
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "train_ddp.py"

# `<iso-time> <out|err> <text>`: the prefix trainguard writes on every rank-log line
STAMPED_LINE = re.compile(r"^(\S+) (out|err) (.*)$")
# the example's per-step line: `step N loss L lr LR dt X.Xms`
STEP_LINE = re.compile(r"^step (\d+) loss \S+ lr \S+ dt ([0-9.]+)ms$")


class BenchError(RuntimeError):
    """A benchmark run that failed; the message says which run and why."""


def trainguard_exe() -> str:
    """The `trainguard` console script next to this Python (the .venv), else on PATH."""
    beside = Path(sys.executable).parent / "trainguard"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("trainguard")
    if found is None:
        raise BenchError(
            f"no `trainguard` command next to {sys.executable} or on PATH; "
            "run with the project's venv: .venv/bin/python benchmarks/..."
        )
    return found


def bench_env(**extra: str) -> dict[str, str]:
    """The environment for every measured process: no injected fault unless asked."""
    env = {k: v for k, v in os.environ.items() if k != "TRAINGUARD_FAULT"}
    env["OMP_NUM_THREADS"] = "1"
    env.update(extra)
    return env


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def machine_line() -> str:
    """One line describing where the numbers came from."""
    try:
        import torch

        torch_version = str(torch.__version__)
    except ImportError:  # pragma: no cover - the .venv has torch
        torch_version = "not installed"
    return (
        f"machine: {os.cpu_count()} logical CPUs, {platform.machine()}, "
        f"Linux {platform.release()}; Python {platform.python_version()}, "
        f"torch {torch_version}"
    )


def load_note() -> str:
    """The 1-minute load average, to show how busy the machine was around a run."""
    return f"load {os.getloadavg()[0]:.2f}"


def stop_process(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL after 20 s, one process we started (by its pid)."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def wait_exit(
    proc: subprocess.Popen[bytes],
    timeout_s: float,
    what: str,
    on_poll: Callable[[], None] | None = None,
    poll_s: float = 0.1,
) -> int:
    """Wait for `proc` to exit; call `on_poll` while it runs and once more on its zombie.

    The exit is peeked with WNOWAIT, so `on_poll` can still read the dead process's
    /proc entry (its final CPU times) before it is reaped. Stops it and raises on timeout.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        if on_poll is not None:
            on_poll()
        if os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT | os.WNOHANG) is not None:
            if on_poll is not None:
                on_poll()  # the zombie: final CPU times
            return proc.wait()
        if time.monotonic() > deadline:
            stop_process(proc)
            raise BenchError(f"{what} did not finish within {timeout_s:g} s; stopped it")
        time.sleep(poll_s)


def tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return f"(no {path})"
    return "\n".join(text.splitlines()[-lines:])


def parse_iso(text: str) -> float:
    """An ISO-8601 time with offset (as trainguard writes it) as a Unix timestamp."""
    return datetime.fromisoformat(text).timestamp()


@dataclass(frozen=True)
class StepLine:
    rank: int
    step: int
    dt_ms: float
    stamp: float | None  # when trainguard read the line (Unix time); None without a stamp


def read_step_lines(path: Path, rank: int, stamped: bool) -> list[StepLine]:
    """The example's step lines in one rank log (trainguard-stamped or plain stdout)."""
    out: list[StepLine] = []
    for raw in path.read_text(encoding="utf-8", errors="replace").splitlines():
        stamp: float | None = None
        text = raw
        if stamped:
            m = STAMPED_LINE.match(raw)
            if m is None or m.group(2) != "out":
                continue
            stamp, text = parse_iso(m.group(1)), m.group(3)
        s = STEP_LINE.match(text.strip())
        if s is not None:
            out.append(StepLine(rank, int(s.group(1)), float(s.group(2)), stamp))
    return out


def rank_logs(job_dir: Path, attempt: int, nproc: int) -> dict[int, Path]:
    """DIR/logs/attempt-N/rank-R.log for every rank; raises if one is missing."""
    logs = {r: job_dir / "logs" / f"attempt-{attempt}" / f"rank-{r}.log" for r in range(nproc)}
    missing = [str(p) for p in logs.values() if not p.is_file()]
    if missing:
        raise BenchError(f"rank logs missing: {', '.join(missing)}")
    return logs


@dataclass(frozen=True)
class Spread:
    median: float
    lo: float
    hi: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread:
        if not values:
            raise BenchError("no values to summarize")
        return cls(statistics.median(values), min(values), max(values))


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A pipe table, columns padded so that it also reads well as plain text."""
    cells = [list(header), *[list(r) for r in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]

    def line(row: Sequence[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |"

    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(cells[0]), sep, *[line(r) for r in cells[1:]]])
