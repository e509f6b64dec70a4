"""Response times of `trainguard ui` over a big synthetic job, and the server's memory while
it tails big logs.

The job: 10 attempts (9 incidents with every recovery phase), 4 ranks, 100,000 events
(30% CheckpointSaved with data, one FailureDiagnosed per failed attempt, one HangConfirmed,
the rest hang suspicions and step retries), 50,000 progress samples, and 1 GiB of rank logs:
4 x 200 MiB for the last attempt, 36 x ~5.7 MiB for the others, each sparse (a hole) but
for its last 512 KiB of real stamped lines, written in a few seconds.

The server is the real command (`trainguard ui JOB_DIR --port 0`, a subprocess); requests
are sequential httpx GETs on one connection, --repeats each (after one warm-up request).
The first request of each kind is shown apart (it fills the goodput cache: the ledger is
computed once per job state), then the median and p95 of the others. The stream row is the
time from the request to its first event frame. Peak RSS is the server's VmHWM
(/proc/PID/status): after start-up, after the log tails (the first requests made), after
the `?line=` scans, at the end.

    .venv/bin/python benchmarks/ui_latency.py [--repeats 30] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import httpx
from _common import BenchError, load_note, machine_line, markdown_table, trainguard_exe

from trainguard.controller.store import JobStore, WorkerRow
from trainguard.records import (
    FaultScenario,
    RecoverRecord,
    RecoverResult,
    RunningRecord,
    StartType,
)
from trainguard.states import WorkerState
from trainguard.ui.catalog import job_id

T0 = datetime(2026, 12, 1, 0, 0, tzinfo=timezone.utc)
ATTEMPTS, RANKS, EVENTS, SAMPLES = 10, 4, 100_000, 50_000
BIG_LOG, SMALL_LOG, REAL_TAIL = 200 * 2**20, 5_965_000, 512 * 1024
TARGET_MS = 300.0
RUN = "tg-bench-ui"


def at(s: float) -> datetime:
    return T0 + timedelta(seconds=s)


def build_job(job_dir: Path) -> None:
    """The synthetic job (see the module docstring)."""
    logs = job_dir / "logs"
    store = JobStore.create(job_dir, RUN)
    span = 3600.0  # each attempt an hour
    store.set_meta(state="failed", log_dir=str(logs), created_at=at(0).isoformat(),
                   ended_at=at(ATTEMPTS * span).isoformat(), last_step=SAMPLES // ATTEMPTS,
                   last_progress_at=at(ATTEMPTS * span - 10).isoformat(), exit_code=1,
                   nproc_per_node=RANKS, command=["python", "train.py"])
    for a in range(ATTEMPTS):
        start = a * span
        rr = [] if a == ATTEMPTS - 1 else [RecoverRecord(
            attempt=a, recover_start_at=at(start + span - 30),
            fault_scenario=FaultScenario.JOB_HANGED if a == 3 else FaultScenario.NODE_FAULT,
            reason=f"rank {a % RANKS} failed", related_task=f"worker-{a % RANKS}",
            recover_result=RecoverResult.SUCCESS, fault_at=at(start + span - 30),
            detected_at=at(start + span - 29), workers_stopped_at=at(start + span - 27),
            decided_at=at(start + span - 27), workers_started_at=at(start + span + 1),
            first_progress_at=at(start + span + 20), resumed_step=a * 4000,
            last_step_before=a * 5000 + 4990)]
        store.put_running(RunningRecord(
            a, at(start), StartType.FIRST_START if a == 0 else StartType.AUTO_RESTART,
            end_at=at(start + span), end_reason="bench", first_step=a * 4000 + 1,
            last_step=a * 5000 + 4990, recover_records=rr))
        store.put_workers(a, [WorkerRow(a, r, r, "node-0", 1000 + r, WorkerState.STOPPED)
                              for r in range(RANKS)])
    store.add_progress([(i * ATTEMPTS // SAMPLES, i, i * ATTEMPTS * span / SAMPLES + 5)
                        for i in range(SAMPLES)])
    store.close()
    _bulk_events(job_dir / "trainguard.db", span)
    _write_logs(logs)


def _bulk_events(db: Path, span: float) -> None:
    """100k events in one transaction (the store's add_event is one transaction each)."""
    rnd = random.Random(1)
    rows = []
    per = EVENTS // ATTEMPTS
    for i in range(EVENTS):
        a = i // per
        t = at(a * span + (i % per) * span / per).isoformat()
        rank = i % RANKS
        if i % per == per - 1 and a < ATTEMPTS - 1:
            data = {"category": "nccl_communication_error", "summary": f"rank {rank}: NCCL",
                    "culprit": {"rank": rank}, "symptoms": [],
                    "evidence": {"file": f"logs/attempt-{a}/rank-{rank}.log", "line": 0,
                                 "text": f"RuntimeError: NCCL error in attempt {a}",
                                 "rank": rank}}
            rows.append((t, "Warning", "FailureDiagnosed", "nccl_communication_error", rank,
                         a, json.dumps(data)))
        elif i == 3 * per + per // 2:
            data = {"culprit": {"rank": 1, "reason": "rank 1 sleeps",
                                "by_rank": {str(r): "collective" for r in range(RANKS)}},
                    "stuck_ranks": list(range(RANKS)), "idle_s": 30.0, "threshold_s": 30.0,
                    "stacks": {str(r): ["all_reduce (c10d:0)"] for r in range(RANKS)}}
            rows.append((t, "Warning", "HangConfirmed", "hang confirmed", 1, a,
                         json.dumps(data)))
        elif i % 10 < 3:
            data = {"step": i, "blocked_s": round(rnd.uniform(0.01, 0.2), 3),
                    "write_s": 0.5, "bytes": 2**30}
            rows.append((t, "Info", "CheckpointSaved", f"checkpoint of step {i} committed at "
                         "/ckpt (loop blocked 0.1s, written in 0.5s, 1024.0 MiB)", 0, a,
                         json.dumps(data)))
        else:
            reason = ("HangSuspected", "HangCleared", "StepRetrying", "StepReexecuted")[i % 4]
            rows.append((t, "Info", reason, f"{reason}: bench event {i}", rank, a, None))
    with sqlite3.connect(db) as conn:
        conn.executemany("INSERT INTO events (time, level, reason, message, job, node, rank, "
                         f"attempt, data) VALUES (?, ?, ?, ?, '{RUN}', 'node-0', ?, ?, ?)", rows)


def _write_logs(logs: Path) -> None:
    for a in range(ATTEMPTS):
        for r in range(RANKS):
            size = BIG_LOG if a == ATTEMPTS - 1 else SMALL_LOG
            path = logs / f"attempt-{a}" / f"rank-{r}.log"
            path.parent.mkdir(parents=True, exist_ok=True)
            lines, n, total = [], 0, 0
            while total < REAL_TAIL:
                lines.append(f"{at(a * 3600 + n * 0.1).isoformat()} out step {n} loss 2.5 "
                             f"lr 3.0e-04 dt 101.2ms\n".encode())
                total, n = total + len(lines[-1]), n + 1
            lines.append(f"{at(a * 3600 + n).isoformat()} err RuntimeError: NCCL error in "
                         f"attempt {a}\n".encode())
            body = b"".join(lines)
            with open(path, "wb") as f:
                f.truncate(size - len(body))  # the hole: read back as zeros, no disk used
                f.seek(0, 2)
                f.write(body)


class Server:
    def __init__(self, job_dir: Path) -> None:
        self.job_dir = job_dir
        self.proc = subprocess.Popen([trainguard_exe(), "ui", str(job_dir), "--port", "0"],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True)
        stdout = self.proc.stdout
        if stdout is None:
            raise BenchError("no pipe from trainguard ui")
        got: list[str] = []
        reader = threading.Thread(target=lambda: got.append(stdout.readline()), daemon=True)
        reader.start()
        reader.join(60)
        m = re.search(r"(http://\S+)", got[0] if got else "")
        if m is None:
            self.stop()
            raise BenchError(f"trainguard ui printed no URL: {got}")
        self.url = m.group(1).rstrip("/")

    def hwm_mib(self) -> tuple[float, float]:
        """(VmRSS, VmHWM) of the server in MiB."""
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        vals = {k: int(v.split()[0]) / 1024 for k, v in
                (line.split(":", 1) for line in status.splitlines() if ":" in line)
                if k in ("VmRSS", "VmHWM")}
        return vals["VmRSS"], vals["VmHWM"]

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


def timed(client: httpx.Client, path: str, repeats: int) -> list[float]:
    """The first request's time, then `repeats` more."""
    out = []
    for _ in range(repeats + 1):
        t = time.perf_counter()
        r = client.get(path)
        out.append((time.perf_counter() - t) * 1000)
        if r.status_code != 200:
            raise BenchError(f"GET {path}: {r.status_code} {r.text[:300]}")
    return out


def first_event_ms(client: httpx.Client, path: str, repeats: int) -> list[float]:
    out = []
    for _ in range(repeats + 1):
        t = time.perf_counter()
        with client.stream("GET", path) as r:
            for chunk in r.iter_text():
                if "event: event" in chunk:
                    break
        out.append((time.perf_counter() - t) * 1000)
    return out


def row(name: str, times: list[float]) -> list[str]:
    """first request, then the median and p95 of the others (the target is on p95)."""
    first, ms = times[0], sorted(times[1:])
    p95 = ms[min(len(ms) - 1, round(0.95 * (len(ms) - 1)))]
    ok = "yes" if p95 < TARGET_MS else "NO"
    return [name, f"{first:.1f}", str(len(ms)), f"{statistics.median(ms):.1f}", f"{p95:.1f}", ok]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--keep", type=Path, help="build the job here and keep it")
    ns = ap.parse_args()
    base = ns.keep or Path(tempfile.mkdtemp(prefix="tg-ui-bench-"))
    job_dir = base / "job"
    t = time.perf_counter()
    if not (job_dir / "trainguard.db").exists():
        build_job(job_dir)
    print(f"job built in {time.perf_counter() - t:.1f}s at {job_dir}")
    server = Server(job_dir)
    try:
        return _measure(server, ns.repeats)
    finally:
        server.stop()


def _measure(server: Server, repeats: int) -> int:
    with httpx.Client(base_url=server.url, timeout=60) as c:
        jid = job_id(server.job_dir.resolve())  # no request before the log tails
        rss0, hwm0 = server.hwm_mib()
        j, last = f"/api/jobs/{jid}", ATTEMPTS - 1
        rows = [row(f"GET {j}/logs/{last}/0?tail=200 (200 MiB file)",
                    timed(c, f"{j}/logs/{last}/0?tail=200", repeats)),
                row(f"GET {j}/logs/{last}/1?tail=5000 (200 MiB file)",
                    timed(c, f"{j}/logs/{last}/1?tail=5000", repeats)),
                row(f"GET {j}/logs/0/2?tail=200 (5.7 MiB file, numbered)",
                    timed(c, f"{j}/logs/0/2?tail=200", repeats))]
        rss1, hwm1 = server.hwm_mib()
        around = row(f"GET {j}/logs/{last}/2?line=1000&context=20 (scans 200 MiB)",
                     timed(c, f"{j}/logs/{last}/2?line=1000&context=20", max(3, repeats // 10)))
        rss2, hwm2 = server.hwm_mib()
        for name, path in (("GET / (page)", "/"), ("GET /jobs/{id} (page)", f"/jobs/{jid}"),
                           ("GET /static/job.js", "/static/job.js"),
                           ("GET /api/jobs", "/api/jobs"), (f"GET {j}", j),
                           (f"GET {j}/events?limit=500", f"{j}/events?limit=500"),
                           (f"GET {j}/events?after=50000&limit=500",
                            f"{j}/events?after=50000&limit=500"),
                           (f"GET {j}/logs", f"{j}/logs"), (f"GET {j}/hangs", f"{j}/hangs"),
                           (f"GET {j}/goodput", f"{j}/goodput")):
            rows.append(row(name, timed(c, path, repeats)))
        rows.append(row(f"GET {j}/stream, to the first event", first_event_ms(
            c, f"{j}/stream", repeats)))
        rows.append(around)
        rss3, hwm3 = server.hwm_mib()
    print(machine_line() + "; " + load_note())
    print(markdown_table(["request", "first ms", "n", "median ms", "p95 ms",
                          f"p95 < {TARGET_MS:.0f} ms"], rows))
    print(f"\nserver memory (MiB): after start-up RSS {rss0:.0f} / peak "
          f"{hwm0:.0f}; after the tail requests RSS {rss1:.0f} / peak {hwm1:.0f}; after the "
          f"?line= scans RSS {rss2:.0f} / peak {hwm2:.0f}; at the end RSS {rss3:.0f} / peak "
          f"{hwm3:.0f}. Log files: 4 x 200 MiB + 36 x 5.7 MiB = 1.0 GiB.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
