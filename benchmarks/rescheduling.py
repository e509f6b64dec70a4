"""Node loss and rescheduling vs. cold start of a 2-node job under `trainguard run`.

The job: examples/train_ddp.py on the local backend, 2 virtual nodes x 2 ranks (gloo, CPU),
one spare node (`--nnodes 2 --nproc-per-node 2 --spare-nodes 1`), `--step-time 0.1
--ckpt-every 10 --progress --quiet`. Runs, `--repeats` times, the order rotated each repeat,
on this machine side by side:

* (a) pod-level rescheduling as before issue 13 (`--no-standby-workers`, no memory
  snapshots): once the job reports step >= 15 (`trainguard status --json`, so the step-10
  checkpoint is behind it) and has run LATE_KILL_S since its launch, node-1's agent
  process group is SIGKILLed
  (`os.killpg(agent_pid, SIGKILL)`); the wall clock (UTC) is read just before the kill.
  Measured: kill -> `first_progress_at` of the recover record (`trainguard recovery --json`),
  with the record's split (detect, stop, decide, start, resume) and kill -> `fault_at`
  (for a lost node `fault_at` is when the controller saw the loss). Checked: NodeLost and
  PodRescheduled events, one recover record (pod_reschedule, success, node_fault,
  node/node-1), attempt 1 started as pod_reschedule and resumed from a checkpoint.
* (a2) the same pod-level move today: standby workers (the default; the spare keeps them
  too) and `--memory-every 1`, so node-1's ranks start warm on the spare with the copy of
  their memory snapshots node-0 kept, and the others resume from their own memory, unless
  storage holds a newer step than the last whole peer copy (then every rank loads from
  storage; the record's `resumed_from` says which). Same measurement; checked as (a). The
  kill waits, besides, until every node's standbys have done their imports (`node_usage`
  of the same status: a long job's fault finds them so), at most WARM_WAIT_S after launch;
  the standbys ready (and, after a `+`, still importing) on node-0, node-1 and the spare at
  the kill are printed under the table: a restart is only as warm as they were.
* (a3) as (a2), but node-1 dies right after its ranks' snapshot of step 20 (issue 13's "a
  rank killed at step N resumes at N, 0 steps lost" for a pod-level move): TRAINGUARD_FAULT
  `lock:GATE@rank=2,step=20,attempt=0` blocks rank 2 on a file lock the benchmark holds, right
  after step 20's `maybe_save` (so node-1's other rank and node-0's wait in step 21's
  allreduce), `--no-hang-detection` (the wait is no hang), and node-1 is killed once the
  status shows step 20 and the standbys are warm. Checked as (a); the steps lost printed under
  the table must be 0.
* (b) isolated job-level rescheduling after the same node loss: the same job and kill with
  `--max-pod-reschedules 0`, so the pod-level rung is out of budget (quotaExceeded) and the
  job is placed again with node-1 kept out. Same measurement; checked: RescheduleDowngraded
  and JobRescheduled events, the records (pod_reschedule, quotaExceeded) then
  (job_reschedule_with_taint, success), attempt 1 started as job_reschedule.
* (c) job-level rescheduling on a hardware fault: TRAINGUARD_FAULT writes a GPU Xid 79 line
  into rank 2's log after step 15 and exits it with code 1; trainguard isolates node-1 and
  places every rank again. Measured: the record's `fault_at` -> `first_progress_at`, and its
  split. For a node-level recovery `fault_at` is the controller's detection time, so, as in
  recovery_time.py, a cross-check row shows the gap from the Xid line (its trainguard time
  stamp in logs/attempt-0/rank-2.log; the rank exits right after writing it) to `fault_at`.
  Checked: FailureDiagnosed, NodeIsolated (node-1, Xid) and JobRescheduled events, one
  recover record (job_reschedule_with_taint, success, chip_fault, gpu_hardware).
* (d) cold start of the same 2x2 job: launch of `trainguard run` -> the first training step
  of attempt 0. trainguard keeps no time of attempt 0's first step (the running record has
  `first_step`, a step number, only), so, as recovery_time.py does, this run leaves out
  `--quiet`: the example then prints `step N ...` right before each trainguard.progress(N),
  and the earliest trainguard time stamp of such a line in logs/attempt-0/rank-*.log is the
  first step. Checked: one running record (first_start, first_step 1), no recover record.

Every variant is also split with the job's own times: pre-check (PrecheckStarted -> the last
PrecheckCompleted of the attempt, events), workers started -> the last rank's first log line
(`rank R/4: process start ...`, printed after `import torch`, the gloo rendezvous, DDP and
the checkpoint load), that line -> first step. A reference row times 4 concurrent
`python -c "import torch, torch.distributed"` processes (launch -> the last one exited) on
the same machine in the same repeat: what the interpreter and the torch import alone cost
when 4 workers start at once.

    .venv/bin/python benchmarks/rescheduling.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from _common import (
    EXAMPLE,
    REPO,
    STAMPED_LINE,
    BenchError,
    Spread,
    bench_env,
    load_note,
    machine_line,
    markdown_table,
    parse_iso,
    rank_logs,
    read_step_lines,
    stop_process,
    tail,
    trainguard_exe,
    wait_exit,
)

NNODES, NPROC, WORLD = 2, 2, 4
KILL_NODE, SPARE_NODE = "node-1", "node-2"
KILL_AT_STEP = 15  # node loss once status reports a step >= this (the step-10 ckpt is done)
FAULT_RANK, FAULT_STEP = 2, 15  # rank 2 lives on node-1
XID = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus."
FAULT = f"log:{XID}@rank={FAULT_RANK},step={FAULT_STEP};exit:1@rank={FAULT_RANK},step={FAULT_STEP}"
SPLIT = ("detect", "stop", "decide", "start", "resume")
FIRST_LINE = re.compile(r"^rank (\d+)/(\d+): process start \d+, scheduled \d+$")
KINDS = ("cold", "pod", "pod-warm", "pod-snap", "job", "xid")
LATE_KILL_S = 25.0  # (a), (a2): after launch; the standbys fill 10 s after their trigger
WARM_WAIT_S = 90.0  # (a2): the kill waits for warm standbys at most this long after launch
LATE = {"pod": ["--no-standby-workers"], "pod-warm": ["--memory-every", "1"],
        "pod-snap": ["--memory-every", "1", "--no-hang-detection"]}  # (a3) waits blocked
SNAP_STEP = 20  # (a3): rank 2 (node-1) stops right after its snapshot of this step
WARM = ("pod-warm", "pod-snap")
IMPORT_REF = "import torch, torch.distributed"


def job_flags(steps: int, quiet: bool = True) -> list[str]:
    """The example's flags, the same for every variant (the cold start leaves out --quiet)."""
    return [str(EXAMPLE), "--steps", str(steps), "--step-time", "0.1", "--ckpt-every", "10",
            "--progress", *(["--quiet"] if quiet else [])]


def run_flags(job_dir: Path, *extra: str) -> list[str]:
    return ["run", "--nnodes", str(NNODES), "--nproc-per-node", str(NPROC), "--spare-nodes",
            "1", "--max-restarts", "3", "--grace-period", "5", "--job-dir", str(job_dir),
            *extra]


# -- running jobs ---------------------------------------------------------------------------


def cli_json(cmd: str, job_dir: Path, timeout_s: float = 60) -> Any:
    """`trainguard CMD DIR --json`, parsed; raises BenchError on failure."""
    argv = [trainguard_exe(), cmd, str(job_dir), "--json"]
    try:
        res = subprocess.run(argv, cwd=REPO, capture_output=True, text=True,
                             timeout=timeout_s, env=bench_env())
    except subprocess.TimeoutExpired:
        raise BenchError(f"`trainguard {cmd} {job_dir} --json` took over {timeout_s:g} s") \
            from None
    if res.returncode != 0:
        raise BenchError(f"`trainguard {cmd} {job_dir} --json` exited {res.returncode}:\n"
                         f"{res.stderr.strip()}")
    try:
        return json.loads(res.stdout)
    except json.JSONDecodeError as e:
        raise BenchError(f"`trainguard {cmd} --json` printed no JSON ({e})") from None


@dataclass
class Job:
    """One `trainguard run` in the background, its console in a file next to the job dir."""

    job_dir: Path
    argv: list[str]
    fault: str | None = None
    extra_env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None
    launched: float = 0.0  # Unix time, read just before Popen
    agent_pids: set[int] = field(default_factory=set)

    @property
    def console(self) -> Path:
        return self.job_dir.with_name(self.job_dir.name + ".console.txt")

    @property
    def what(self) -> str:
        return f"`trainguard run` for {self.job_dir.name}"

    def start(self) -> None:
        env = bench_env(**({"TRAINGUARD_FAULT": self.fault} if self.fault else {}),
                        **self.extra_env)
        with open(self.console, "wb") as out:
            self.launched = time.time()
            self.proc = subprocess.Popen([trainguard_exe(), *self.argv], cwd=REPO, env=env,
                                         stdin=subprocess.DEVNULL, stdout=out,
                                         stderr=subprocess.STDOUT)

    def status_when(self, pred: Callable[[dict[str, Any]], bool], timeout_s: float,
                    what: str) -> dict[str, Any]:
        """Poll `trainguard status --json` (every 0.5 s) until `pred` holds."""
        assert self.proc is not None
        deadline = time.monotonic() + timeout_s
        last_error = "no status read yet"
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise BenchError(f"{self.what} exited {self.proc.returncode} while waiting for "
                                 f"{what}; its last console lines:\n{tail(self.console)}")
            if (self.job_dir / "trainguard.db").exists():
                try:
                    status: dict[str, Any] = cli_json("status", self.job_dir)
                except BenchError as e:  # e.g. the store being created: try again
                    last_error = str(e)
                else:
                    self.agent_pids |= {n["agent_pid"] for n in status.get("nodes") or []
                                        if isinstance(n.get("agent_pid"), int)}
                    if pred(status):
                        return status
            time.sleep(0.5)
        raise BenchError(f"{self.job_dir.name}: no {what} within {timeout_s:g} s "
                         f"(last status error: {last_error}); console:\n{tail(self.console)}")

    def finish(self, timeout_s: float) -> None:
        assert self.proc is not None
        rc = wait_exit(self.proc, timeout_s, self.what)
        if rc != 0:
            raise BenchError(f"{self.what} exited {rc}; its last console lines:\n"
                             f"{tail(self.console)}")

    def cleanup(self) -> None:
        """After an error: stop the controller (it stops its agents), then any agent of
        this job still alive (a killed controller leaves them running), by pid."""
        if self.proc is not None:
            stop_process(self.proc)
        for pid in sorted(self.agent_pids):
            try:  # still this job's agent (not a reused pid)?
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
            except OSError:
                continue
            if "trainguard.node.main" in cmdline and str(self.job_dir) in cmdline:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGKILL)


def run_to_end(job: Job, timeout_s: float) -> None:
    job.start()
    try:
        job.finish(timeout_s)
    except BaseException:
        job.cleanup()
        raise


# -- reading a finished job -----------------------------------------------------------------


def events(job_dir: Path) -> list[dict[str, Any]]:
    data: list[dict[str, Any]] = cli_json("events", job_dir)
    return data


def reasons(evs: list[dict[str, Any]]) -> list[str]:
    return [e["reason"] for e in evs]


def event_attempt(e: dict[str, Any]) -> int | None:
    a = (e.get("involved") or {}).get("attempt")
    return a if isinstance(a, int) else None


def precheck_span(job_dir: Path, evs: list[dict[str, Any]], attempt: int) -> tuple[float, float]:
    """(PrecheckStarted, the last PrecheckCompleted) of `attempt`, Unix times."""
    started = [parse_iso(e["time"]) for e in evs
               if e["reason"] == "PrecheckStarted" and event_attempt(e) == attempt]
    done = [parse_iso(e["time"]) for e in evs
            if e["reason"] == "PrecheckCompleted" and event_attempt(e) == attempt]
    failed = [e["message"] for e in evs
              if e["reason"] == "PrecheckFailed" and event_attempt(e) == attempt]
    if failed:
        raise BenchError(f"{job_dir}: pre-check failed in attempt {attempt}: {failed}")
    if len(started) != 1 or len(done) < NNODES:
        raise BenchError(f"{job_dir}: attempt {attempt}: expected 1 PrecheckStarted and >= "
                         f"{NNODES} PrecheckCompleted events, got {len(started)} and "
                         f"{len(done)}")
    return started[0], max(done)


def ranks_ready(job_dir: Path, attempt: int) -> float:
    """The last rank's first log line (`rank R/4: process start ...`), Unix time: every rank
    has imported torch, joined the gloo group, built DDP and loaded the checkpoint."""
    stamps: dict[int, float] = {}
    for rank, path in rank_logs(job_dir, attempt, WORLD).items():
        for raw in path.read_text(encoding="utf-8", errors="replace").splitlines():
            m = STAMPED_LINE.match(raw)
            if m is None or m.group(2) != "out":
                continue
            f = FIRST_LINE.match(m.group(3).strip())
            if f is not None and int(f.group(1)) == rank and int(f.group(2)) == WORLD:
                stamps[rank] = parse_iso(m.group(1))
                break
    missing = sorted(set(range(WORLD)) - set(stamps))
    if missing:
        raise BenchError(f"{job_dir}/logs/attempt-{attempt}: no `rank R/{WORLD}: process "
                         f"start` line for rank(s) {missing}")
    return max(stamps.values())


def stamp_of(path: Path, text: str) -> float:
    """The trainguard time stamp of the first line of `path` that contains `text`."""
    for raw in path.read_text(encoding="utf-8", errors="replace").splitlines():
        m = STAMPED_LINE.match(raw)
        if m is not None and text in m.group(3):
            return parse_iso(m.group(1))
    raise BenchError(f"{path}: no line with {text!r}")


# -- the four variants ----------------------------------------------------------------------


@dataclass(frozen=True)
class ColdStart:
    total_s: float  # launch -> first step line of attempt 0
    to_precheck_s: float  # launch -> PrecheckStarted (launcher and node agents up)
    precheck_s: float  # PrecheckStarted -> last PrecheckCompleted
    to_workers_s: float  # pre-check done -> JobRunning (workers started)
    ready_s: float  # JobRunning -> the last rank's first line
    first_step_s: float  # that line -> first step line


@dataclass(frozen=True)
class Reschedule:
    total_s: float  # kill (a, b) or fault_at (c) -> first_progress_at
    to_fault_s: float  # kill -> fault_at (a, b); Xid line stamp -> fault_at (c)
    durations: dict[str, float]  # the record's split
    precheck_s: float  # attempt 1's pre-check (inside `start`)
    ready_s: float  # workers_started_at -> the last rank's first line (inside `resume`)
    first_step_s: float  # that line -> first_progress_at (inside `resume`)
    resumed_step: int
    steps_lost: int | None
    origin: tuple[str, str] = ("?", "?")  # the record's workers_from, resumed_from
    standbys: str = "-"  # standbys ready(+importing) at the kill: node-0, node-1, the spare


def cold_start(job_dir: Path, steps: int, timeout_s: float) -> ColdStart:
    job = Job(job_dir, [*run_flags(job_dir), *job_flags(steps, quiet=False)])
    run_to_end(job, timeout_s)
    stamps = [ln.stamp for rank, path in rank_logs(job_dir, 0, WORLD).items()
              for ln in read_step_lines(path, rank, stamped=True) if ln.stamp is not None]
    if not stamps:
        raise BenchError(f"no step line in the rank logs of {job_dir}/logs/attempt-0")
    first_step = min(stamps)
    recs = cli_json("recovery", job_dir)["running_records"]
    if len(recs) != 1 or recs[0]["recover_records"] or recs[0]["first_step"] != 1 \
            or recs[0]["start_type"] != "first_start":
        raise BenchError(f"cold-start job {job_dir}: expected one first_start attempt from "
                         f"step 1 without incidents, got {json.dumps(recs)[:600]}")
    evs = events(job_dir)
    running = [parse_iso(e["time"]) for e in evs if e["reason"] == "JobRunning"]
    if len(running) != 1:
        raise BenchError(f"{job_dir}: expected 1 JobRunning event, got {len(running)}")
    pc_start, pc_end = precheck_span(job_dir, evs, 0)
    ready = ranks_ready(job_dir, 0)
    if not job.launched < pc_start <= pc_end <= running[0] <= ready <= first_step:
        raise BenchError(f"{job_dir}: times out of order: launch {job.launched}, pre-check "
                         f"{pc_start}-{pc_end}, running {running[0]}, ready {ready}, "
                         f"first step {first_step}")
    return ColdStart(first_step - job.launched, pc_start - job.launched, pc_end - pc_start,
                     running[0] - pc_end, ready - running[0], first_step - ready)


def warm_everywhere(status: dict[str, Any]) -> bool:
    """Every node (the spare too) has NPROC standbys with their imports done."""
    ready = {u["node"]: u.get("standby_ready", 0) for u in status.get("node_usage") or []}
    return all(ready.get(n, 0) >= NPROC for n in ("node-0", KILL_NODE, SPARE_NODE))


def step_of(status: dict[str, Any]) -> int:
    step = (status.get("last_progress") or {}).get("step")
    return step if isinstance(step, int) else 0


def reschedule(kind: str, job_dir: Path, steps: int, timeout_s: float,
               extra_env: dict[str, str] | None = None) -> Reschedule:
    extra = ["--max-pod-reschedules", "0"] if kind == "job" else LATE.get(kind, [])
    late = kind in LATE
    gate = job_dir.parent / f"{job_dir.name}.gate"  # (a3): held until the node is killed
    fault = FAULT if kind == "xid" else (
        f"lock:{gate}@rank={FAULT_RANK},step={SNAP_STEP},attempt=0" if kind == "pod-snap"
        else None)
    held = None
    if kind == "pod-snap":
        held = open(gate, "a")  # noqa: SIM115
        fcntl.flock(held, fcntl.LOCK_EX)
    job = Job(job_dir, [*run_flags(job_dir, *extra), *job_flags(steps)],
              fault=fault, extra_env=extra_env or {})
    job.start()
    killed_at: float | None = None
    at_step = SNAP_STEP if kind == "pod-snap" else KILL_AT_STEP
    try:
        if kind in ("pod", "pod-warm", "pod-snap", "job"):
            def due(s: dict[str, Any]) -> bool:
                since = time.time() - job.launched
                return step_of(s) >= at_step and (not late or since >= LATE_KILL_S) and (
                    kind not in WARM or since >= WARM_WAIT_S or warm_everywhere(s))

            status = job.status_when(due, timeout_s, f"step >= {at_step}" + (
                f", {LATE_KILL_S:g} s in" if late else "") + (
                ", standbys warm" if kind in WARM else ""))
            nodes = {n["name"]: n for n in status["nodes"]}
            placed = [(n, nodes.get(n, {}).get("state"), nodes.get(n, {}).get("slot"))
                      for n in ("node-0", KILL_NODE, SPARE_NODE)]
            if placed != [("node-0", "healthy", 0), (KILL_NODE, "healthy", 1),
                          (SPARE_NODE, "spare", None)]:
                raise BenchError(f"{job_dir}: unexpected nodes before the kill: {placed}")
            pid = nodes[KILL_NODE]["agent_pid"]
            if not isinstance(pid, int):
                raise BenchError(f"{job_dir}: no agent pid for {KILL_NODE}: {nodes[KILL_NODE]}")
            killed_at = time.time()
            os.killpg(pid, signal.SIGKILL)
            usage = {u["node"]: u for u in status.get("node_usage") or []}
            standbys = "/".join(
                str(usage.get(n, {}).get("standby_ready", 0)) + (
                    f"+{usage[n]['standby_warming']}"
                    if usage.get(n, {}).get("standby_warming") else "")
                for n in ("node-0", KILL_NODE, SPARE_NODE))
        if held is not None:
            held.close()  # attempt 0 is gone; the fault names attempt 0 only
        job.finish(timeout_s)
    except BaseException:
        job.cleanup()
        raise
    finally:
        if held is not None:
            held.close()
    result = read_reschedule(kind, job_dir, steps, killed_at)
    return replace(result, standbys=standbys) if killed_at is not None else result





def read_reschedule(kind: str, job_dir: Path, steps: int,
                    killed_at: float | None) -> Reschedule:
    data = cli_json("recovery", job_dir)
    runs = data["running_records"]
    if len(runs) != 2:
        raise BenchError(f"{job_dir}: expected 2 attempts, got {len(runs)}: "
                         f"{json.dumps(runs)[:600]}")
    recs = runs[0]["recover_records"]
    got = [(r["recover"], r["recover_result"]) for r in recs]
    want = {"pod": [("pod_reschedule", "success")], "pod-warm": [("pod_reschedule", "success")],
            "pod-snap": [("pod_reschedule", "success")],
            "job": [("pod_reschedule", "quotaExceeded"),
                    ("job_reschedule_with_taint", "success")],
            "xid": [("job_reschedule_with_taint", "success")]}[kind]
    if got != want or runs[1]["recover_records"]:
        raise BenchError(f"{job_dir}: recover records {got} (then "
                         f"{len(runs[1]['recover_records'])}), expected {want} (then none)")
    rec = recs[-1]
    scenario, category = ("chip_fault", "gpu_hardware") if kind == "xid" else ("node_fault", None)
    if (rec["fault_scenario"], rec["category"], rec["related_task"]) != (
            scenario, category, f"node/{KILL_NODE}"):
        raise BenchError(f"{job_dir}: record says {rec['fault_scenario']}, {rec['category']}, "
                         f"{rec['related_task']}; expected {scenario}, {category}, "
                         f"node/{KILL_NODE}")
    start_type = "pod_reschedule" if kind.startswith("pod") else "job_reschedule"
    if runs[1]["start_type"] != start_type:
        raise BenchError(f"{job_dir}: attempt 1 started as {runs[1]['start_type']}, "
                         f"expected {start_type}")
    dur = rec.get("durations_s") or {}
    missing = [k for k in ("fault_at", "workers_started_at", "first_progress_at")
               if not rec.get(k)]
    missing += [f"durations_s.{k}" for k in SPLIT if dur.get(k) is None]
    if missing:
        raise BenchError(f"{job_dir}: recover record lacks {', '.join(missing)}")
    resumed = rec.get("resumed_step")
    if not isinstance(resumed, int) or resumed < 10 or resumed >= steps:
        raise BenchError(f"{job_dir}: resumed from step {resumed}, expected a checkpoint "
                         f">= 10 (the node loss/fault must come after one)")

    evs = events(job_dir)
    got_reasons = reasons(evs)
    need = {"pod": ("NodeLost", "PodRescheduled", "Resumed"),
            "pod-warm": ("NodeLost", "PodRescheduled", "Resumed"),
            "pod-snap": ("NodeLost", "PodRescheduled", "Resumed"),
            "job": ("NodeLost", "RescheduleDowngraded", "JobRescheduled", "Resumed"),
            "xid": ("FailureDiagnosed", "NodeIsolated", "JobRescheduled", "Resumed")}[kind]
    order = [r for r in got_reasons if r in need]
    order = order[:len(need)]  # one Resumed per source the ranks loaded from
    if order != list(need):
        raise BenchError(f"{job_dir}: events {order}, expected {list(need)} in that order")
    if "JobSucceeded" not in got_reasons:
        raise BenchError(f"{job_dir}: no JobSucceeded event")
    first_ev = next(e for e in evs if e["reason"] == need[0])
    if (first_ev.get("involved") or {}).get("node") != KILL_NODE and kind != "xid":
        raise BenchError(f"{job_dir}: {need[0]} names {first_ev.get('involved')}")
    if kind == "xid":
        iso = next(e for e in evs if e["reason"] == "NodeIsolated")
        if (iso.get("involved") or {}).get("node") != KILL_NODE or "Xid" not in iso["message"]:
            raise BenchError(f"{job_dir}: NodeIsolated: {iso}")

    fault_at = parse_iso(rec["fault_at"])
    started = parse_iso(rec["workers_started_at"])
    first = parse_iso(rec["first_progress_at"])
    if kind == "xid":
        origin = fault_at
        xid_log = rank_logs(job_dir, 0, WORLD)[FAULT_RANK]
        to_fault = fault_at - stamp_of(xid_log, "GPU has fallen off the bus")
    else:
        assert killed_at is not None
        origin = killed_at
        to_fault = fault_at - killed_at
        if to_fault < 0:
            raise BenchError(f"{job_dir}: fault_at is {-to_fault:.3f} s before the kill")
    pc_start, pc_end = precheck_span(job_dir, evs, 1)
    ready = ranks_ready(job_dir, 1)
    if not origin <= fault_at <= pc_start <= pc_end <= started <= ready <= first:
        raise BenchError(f"{job_dir}: times out of order: origin {origin}, fault_at "
                         f"{fault_at}, pre-check {pc_start}-{pc_end}, workers started "
                         f"{started}, ready {ready}, first progress {first}")
    return Reschedule(first - origin, to_fault, {k: float(dur[k]) for k in SPLIT},
                      pc_end - pc_start, ready - started, first - ready, resumed,
                      rec.get("steps_lost"),
                      (str(rec.get("workers_from")), str(rec.get("resumed_from"))))


# `python -X importtime` lines (stderr, so stamped `err` in the rank log): depth 0 = an
# import made by running code, not by another import
IMPORT_LINE = re.compile(r"^import time:\s+(\d+) \|\s+(\d+) \|( *)(\S+)$")


@dataclass(frozen=True)
class ImportSplit:
    """One rank of the profile run, seconds (time stamps trainguard wrote)."""

    torch_s: float  # workers started -> `import torch` done (interpreter + torch)
    script_imports_s: float  # -> the example's last import done (trainguard, Checkpointer...)
    setup_s: float  # -> the rank's first line (gloo rendezvous, model, DDP, ckpt load)
    lazy_imports_s: float  # of setup_s: imports made by running code (importtime's own sum)
    top_lazy: list[tuple[str, float]]  # the biggest of those: (module, s)
    script_top: list[tuple[str, float]]  # the biggest imports after torch, before setup


def import_split(log: Path, started: float) -> ImportSplit:
    t_torch = t_script = t_first = None
    script: list[tuple[str, float]] = []
    lazy: list[tuple[str, float]] = []
    for raw in log.read_text(encoding="utf-8", errors="replace").splitlines():
        m = STAMPED_LINE.match(raw)
        if m is None:
            continue
        at, text = parse_iso(m.group(1)), m.group(3).rstrip()
        if m.group(2) == "out" and FIRST_LINE.match(text.strip()):
            t_first = at
            break
        i = IMPORT_LINE.match(text)
        if i is None or i.group(3) != " ":  # only depth-0 imports
            continue
        name, cumulative = i.group(4), int(i.group(2)) / 1e6
        if t_torch is None:
            if name == "torch":
                t_torch = at
        elif t_script is None:
            script.append((name, cumulative))
            if name == "trainguard.testing.faults":
                t_script = at
        else:
            lazy.append((name, cumulative))
    if t_torch is None or t_script is None or t_first is None:
        raise BenchError(f"{log}: import profile incomplete (torch {t_torch}, example's "
                         f"imports {t_script}, first line {t_first}); is "
                         "PYTHONPROFILEIMPORTTIME passed to the workers?")

    def top(xs: list[tuple[str, float]]) -> list[tuple[str, float]]:
        return sorted(xs, key=lambda x: -x[1])[:3]

    return ImportSplit(t_torch - started, t_script - t_torch, t_first - t_script,
                       sum(c for _, c in lazy), top(lazy), top(script))


def import_profile(job_dir: Path, steps: int, timeout_s: float) -> tuple[Reschedule, str]:
    """One extra pod-level run with PYTHONPROFILEIMPORTTIME=1 (every process logs its imports
    to stderr, which slows it): where the new workers' start-up goes, per rank."""
    r = reschedule("pod", job_dir, steps, timeout_s, {"PYTHONPROFILEIMPORTTIME": "1"})
    rec = cli_json("recovery", job_dir)["running_records"][0]["recover_records"][-1]
    started = parse_iso(rec["workers_started_at"])
    splits = [import_split(path, started) for path in rank_logs(job_dir, 1, WORLD).values()]
    rows = [
        ["workers started -> `import torch` done",
         *fmt([s.torch_s for s in splits])],
        ["-> the example's imports done (trainguard, Checkpointer)",
         *fmt([s.script_imports_s for s in splits])],
        ["-> the rank's first line (rendezvous, model, DDP, ckpt load)",
         *fmt([s.setup_s for s in splits])],
        ["   of which imports made by that code (importtime's sum)",
         *fmt([s.lazy_imports_s for s in splits])],
    ]
    out = [markdown_table(["import profile, per rank (s)", "median", "min", "max"], rows), ""]
    for what, field_name in (("after torch, by the example's imports", "script_top"),
                             ("by running code (rendezvous to first line)", "top_lazy")):
        seen: dict[str, list[float]] = {}
        for s in splits:
            for name, c in getattr(s, field_name):
                seen.setdefault(name, []).append(c)
        cells = [f"{n} {Spread.of(cs).median:.2f} ({len(cs)} ranks)"
                 for n, cs in sorted(seen.items(), key=lambda x: -Spread.of(x[1]).median)]
        out.append(f"largest depth-0 imports {what} (importtime cumulative, median s): "
                   + "; ".join(cells))
    out.append(f"(this run: kill -> first step {r.total_s:.3f} s, resume "
               f"{r.durations['resume']:.3f} s; the profiling itself slows it)")
    return r, "\n".join(out)


def import_reference(timeout_s: float) -> float:
    """4 concurrent `python -c "import torch, torch.distributed"`: launch -> last exit (s)."""
    started = time.monotonic()
    procs = [subprocess.Popen([sys.executable, "-c", IMPORT_REF], cwd=REPO, env=bench_env(),
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE) for _ in range(WORLD)]
    try:
        for p in procs:
            if wait_exit(p, timeout_s, "import reference") != 0:
                err = p.stderr.read().decode(errors="replace") if p.stderr else ""
                raise BenchError(f"`python -c {IMPORT_REF!r}` failed:\n{err[-2000:]}")
    finally:
        for p in procs:
            stop_process(p)
            if p.stderr:
                p.stderr.close()
    return time.monotonic() - started


# -- report ---------------------------------------------------------------------------------


def fmt(values: list[float], digits: int = 3) -> list[str]:
    s = Spread.of(values)
    return [f"{s.median:.{digits}f}", f"{s.lo:.{digits}f}", f"{s.hi:.{digits}f}"]


TITLES = {
    "pod": "(a) pod-level, cold spare, storage: kill node-1 -> first step",
    "pod-warm": "(a2) pod-level, standbys + peer memory copy: kill -> first step",
    "pod-snap": "(a3) as (a2), node-1 lost right after step 20's snapshot",
    "job": "(b) isolated job-level rescheduling: kill node-1 -> first step",
    "xid": "(c) job-level rescheduling on Xid 79: fault_at -> first step",
}


def report(colds: list[ColdStart], res: dict[str, list[Reschedule]],
           imports: list[float]) -> str:
    rows: list[list[str]] = [
        ["(d) cold start: launch -> first step", *fmt([c.total_s for c in colds])],
        ["  launch -> pre-check started", *fmt([c.to_precheck_s for c in colds])],
        ["  pre-check (3 nodes)", *fmt([c.precheck_s for c in colds])],
        ["  pre-check done -> workers started", *fmt([c.to_workers_s for c in colds])],
        ["  workers started -> last rank's first line", *fmt([c.ready_s for c in colds])],
        ["  last rank's first line -> first step", *fmt([c.first_step_s for c in colds])],
    ]
    for kind in ("pod", "pod-warm", "pod-snap", "job", "xid"):
        rs = res[kind]
        rows.append([TITLES[kind], *fmt([r.total_s for r in rs])])
        if kind == "xid":
            rows.append(["  check: Xid line (rank 2 log) -> fault_at",
                         *fmt([r.to_fault_s for r in rs])])
        else:
            rows.append(["  kill -> fault_at (loss seen)", *fmt([r.to_fault_s for r in rs])])
        for key in SPLIT:
            rows.append([f"  {key}", *fmt([r.durations[key] for r in rs])])
            if key == "start":
                rows.append(["    of which pre-check (2 nodes)",
                             *fmt([r.precheck_s for r in rs])])
            if key == "resume":
                rows.append(["    workers started -> last rank's first line",
                             *fmt([r.ready_s for r in rs])])
                rows.append(["    last rank's first line -> first step",
                             *fmt([r.first_step_s for r in rs])])
        ratios = [r.total_s / c.total_s for r, c in zip(rs, colds, strict=True)]
        rows.append(["  ratio to cold start (same repeat)", *fmt(ratios, 2)])
    rows.append([f"reference: 4 x `python -c \"{IMPORT_REF}\"`", *fmt(imports)])
    lines = [markdown_table(["metric (s)", "median", "min", "max"], rows), ""]
    for kind in ("pod", "pod-warm", "pod-snap", "job", "xid"):
        lost = sorted({r.steps_lost for r in res[kind] if r.steps_lost is not None})
        steps = sorted({r.resumed_step for r in res[kind]})
        lines.append(f"{kind}: resumed from step {', '.join(map(str, steps))}; steps lost "
                     f"{', '.join(map(str, lost)) or '?'}; workers from, state from: "
                     + "; ".join(f"{w}, {st}" for w, st in (r.origin for r in res[kind]))
                     + ("" if kind == "xid" else "; standbys ready(+importing) at the kill (node-0/"
                        f"{KILL_NODE}/spare): " + ", ".join(r.standbys for r in res[kind])))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Node loss and rescheduling (pod-level, isolated job-level, job-level on "
        "a GPU Xid) vs. cold start of examples/train_ddp.py, 2 nodes x 2 ranks on the local "
        "backend, repeated; prints a markdown table.",
    )
    parser.add_argument("--repeats", type=int, default=3, help="repeats (default 3)")
    parser.add_argument("--steps", type=int, default=40,
                        help=f"--steps for the rescheduling runs; the kill/fault comes at "
                        f"step >= {KILL_AT_STEP} (default 40)")
    parser.add_argument("--late-steps", type=int, default=400,
                        help=f"--steps for (a) and (a2), killed {LATE_KILL_S:g} s in "
                        "(default 200)")
    parser.add_argument("--cold-steps", type=int, default=10,
                        help="--steps for the cold-start runs (default 10)")
    parser.add_argument("--no-warmup", action="store_true",
                        help="skip the unmeasured warm-up cold start (fills the file cache)")
    parser.add_argument("--no-import-profile", action="store_true",
                        help="skip the extra pod-level run with PYTHONPROFILEIMPORTTIME=1")
    parser.add_argument("--timeout", type=float, default=300.0,
                        help="seconds allowed per job (default 300)")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    if args.steps < KILL_AT_STEP + 15:
        parser.error(f"--steps must be >= {KILL_AT_STEP + 15}: the kill comes at step >= "
                     f"{KILL_AT_STEP} and must not miss the job")
    if args.cold_steps < 1:
        parser.error("--cold-steps must be >= 1")

    try:
        print(machine_line())
        exe = Path(sys.executable)
        shown = exe.relative_to(REPO) if exe.is_relative_to(REPO) else exe
        print("command: " + " ".join([str(shown), *sys.argv]))
        print(f"date: {datetime.now(timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}")
        print(f"job: trainguard {' '.join(run_flags(Path('DIR')))} "
              f"{' '.join(job_flags(args.steps))}")
        print(f"  (a) adds --no-standby-workers, (a2) --memory-every 1, both --steps "
              f"{args.late_steps} and killed {LATE_KILL_S:g} s after launch at the earliest, "
              f"(a2) once every node's standbys are warm (at most {WARM_WAIT_S:g} s); (a3) as "
              f"(a2) with TRAINGUARD_FAULT='lock:GATE@rank={FAULT_RANK},step={SNAP_STEP},"
              "attempt=0' (rank 2 blocks on a lock the benchmark holds right after its step "
              f"{SNAP_STEP} snapshot) and node-1 killed at status step >= {SNAP_STEP}; (b) adds "
              f"--max-pod-reschedules 0; (c) TRAINGUARD_FAULT='{FAULT}'; (d) --steps "
              f"{args.cold_steps}, no --quiet")
        print(f"repeats: {args.repeats}, order rotated each repeat; kill {KILL_NODE} at "
              f"status step >= {KILL_AT_STEP}", flush=True)
        colds: list[ColdStart] = []
        res: dict[str, list[Reschedule]] = {k: [] for k in KINDS if k != "cold"}
        imports: list[float] = []
        with tempfile.TemporaryDirectory(prefix="tg-bench-resched-") as tmp:
            root = Path(tmp)
            if not args.no_warmup:
                cold_start(root / "warmup", args.cold_steps, args.timeout)
            for i in range(args.repeats):
                order = KINDS[i % len(KINDS):] + KINDS[:i % len(KINDS)]
                tag = f"  [{i + 1}/{args.repeats}]"
                for kind in order:
                    if kind == "cold":
                        c = cold_start(root / f"cold-{i}", args.cold_steps, args.timeout)
                        colds.append(c)
                        print(f"{tag} cold start {c.total_s:.3f} s ({load_note()})", flush=True)
                    else:
                        steps = args.late_steps if kind in LATE else args.steps
                        r = reschedule(kind, root / f"{kind}-{i}", steps, args.timeout)
                        res[kind].append(r)
                        print(f"{tag} {kind} {r.total_s:.3f} s (start {r.durations['start']:.3f},"
                              f" resume {r.durations['resume']:.3f}; {load_note()})",
                              flush=True)
                imports.append(import_reference(args.timeout))
                print(f"{tag} import reference {imports[-1]:.3f} s ({load_note()})",
                      flush=True)
            profile = None
            if not args.no_import_profile:
                _, profile = import_profile(root / "pod-importtime", args.late_steps,
                                            args.timeout)
                print(f"  import profile run done ({load_note()})", flush=True)
        print()
        print(report(colds, res, imports))
        if profile is not None:
            print()
            print(profile)
    except BenchError as e:
        print(f"rescheduling: error: {e}", file=sys.stderr)
        return 1
    except (OSError, KeyError, TypeError, ValueError, StopIteration,
            subprocess.SubprocessError) as e:
        print(f"rescheduling: error: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("rescheduling: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
