"""The fault stream of a chaos run: what each kind breaks, and when it counts as recovered.

Every fault waits for the previous one to be recovered (or to time out): a fault is
recovered when, after it ended (the process killed, the disk freed, the server back), rank
0 finishes a step beyond the furthest one done before it, and, for the storage faults, the
storage works again (a new checkpoint committed on S3; the job store takes writes again).
"""

from __future__ import annotations

import os
import random
import re
import signal
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import psutil

from tests.chaos.parts import tagged

if TYPE_CHECKING:
    from tests.chaos.run import Harness, Run

KINDS = ("worker_kill", "worker_stop", "agent_kill", "controller_kill", "ckpt_disk_full",
         "s3_restart", "jobdir_full")


@dataclass
class Fault:
    kind: str
    at: float  # when it was injected (time.time())
    detail: str = ""
    ended_at: float | None = None  # when the broken part was whole again
    step_before: int = 0  # rank 0's furthest step when it ended
    recovered_at: float | None = None
    note: str = ""


class Chaos:
    """Injects the faults of one run, one at a time, and waits for each to be recovered."""

    def __init__(self, h: Harness, run: Run, rng: random.Random) -> None:
        self.h, self.run, self.rng = h, run, rng
        self.agent_kills = 0

    # -- the stream ------------------------------------------------------------------------

    def drive(self) -> list[Fault]:
        cfg, run = self.h.cfg, self.run
        faults: list[Fault] = []
        while not run.digests.lines(0):  # the job trains
            if self._ended():
                return faults
            time.sleep(0.5)
        start = time.time()
        stop_at = start + cfg.minutes * 60
        next_at = start + cfg.first_fault_after
        order = list(cfg.order)
        while time.time() < stop_at and not (cfg.max_faults and len(faults) >= cfg.max_faults):
            while time.time() < next_at:
                if self._ended():
                    return faults
                self.h.note_markers(run)
                time.sleep(0.2)
            if self._ended() or run.digests.max_step(0) >= cfg.steps - 10:
                return faults
            kind = order.pop(0) if order else self._pick()
            fault = self.inject(kind)
            faults.append(fault)
            self._wait_recovered(fault)
            gap = self.rng.expovariate(cfg.fault_rate / 60.0) if cfg.fault_rate > 0 else 1e9
            next_at = max(fault.at + gap, time.time() + 1.0)
        return faults

    def _pick(self) -> str:
        kinds = [k for k in self.h.cfg.kinds
                 if k != "agent_kill" or self.agent_kills < self.h.cfg.spares]
        return self.rng.choice(kinds)

    def _ended(self) -> bool:
        """The job ended by itself (not a launcher we killed)."""
        proc = self.run.proc
        return proc is not None and proc.poll() is not None and proc.returncode != -9

    def inject(self, kind: str) -> Fault:
        fault = Fault(kind, time.time())
        getattr(self, kind)(fault)
        if fault.ended_at is None:
            fault.ended_at = time.time()
        time.sleep(1.0)  # a step in flight when the fault struck may still finish
        fault.step_before = self.run.digests.max_step(0)
        return fault

    def _wait_recovered(self, fault: Fault) -> None:
        deadline = time.monotonic() + self.h.cfg.recover_timeout_s
        assert fault.ended_at is not None
        while time.monotonic() < deadline:
            self.h.note_markers(self.run)
            if self._progressed(fault) and self._storage_back(fault):
                fault.recovered_at = time.time()
                return
            if self._ended() and self.run.proc is not None and self.run.proc.returncode != 0:
                fault.note = f"the job ended with exit {self.run.proc.returncode}"
                return
            time.sleep(0.25)
        fault.note = fault.note or "no recovery within the timeout"

    def _progressed(self, fault: Fault) -> bool:
        """Rank 0 finished a step beyond the furthest before the fault; after a fault that
        ends processes, in a process started after the fault (a restarted one)."""
        assert fault.ended_at is not None
        if self._ended() and self.run.proc is not None and self.run.proc.returncode == 0:
            return True
        lines = self.run.digests.lines(0)
        new_pids = {ln.pid for ln in lines if ln.kind == "start" and ln.at >= fault.at}
        restarts = fault.kind in ("worker_kill", "worker_stop", "agent_kill")
        return any(ln.kind == "step" and ln.step > fault.step_before
                   and ln.at >= fault.ended_at and (not restarts or ln.pid in new_pids)
                   for ln in lines)

    def _storage_back(self, fault: Fault) -> bool:
        if fault.kind == "s3_restart":
            steps = self.h.s3.committed_steps(self.run.prefix)
            return bool(steps) and steps[-1] > fault.step_before
        if fault.kind == "controller_kill":  # the new launcher took the job over
            proc = self.run.proc
            status = self.h.status(self.run) or {}
            return proc is not None and (proc.poll() is None or proc.returncode == 0) and (
                status.get("state") in ("running", "succeeded"))
        if fault.kind == "jobdir_full":
            status = self.h.status(self.run)
            step = ((status or {}).get("last_progress") or {}).get("step") or 0
            return int(step) > fault.step_before
        return True

    # -- the kinds -------------------------------------------------------------------------

    def _worker(self) -> tuple[int, int]:
        """A random rank and the pid of its process (waits for one to run)."""
        rank = self.rng.randrange(4)
        for _ in range(600):
            pid = self.run.digests.current_pid(rank)
            if pid is not None:
                return rank, pid
            time.sleep(0.1)
        raise RuntimeError(f"rank {rank} has no live process")

    def worker_kill(self, fault: Fault) -> None:
        rank, pid = self._worker()
        os.kill(pid, signal.SIGKILL)
        fault.detail = f"SIGKILL rank {rank} (pid {pid})"

    def worker_stop(self, fault: Fault) -> None:
        rank, pid = self._worker()
        os.kill(pid, signal.SIGSTOP)  # a hang: the process lives and does nothing
        fault.detail = f"SIGSTOP rank {rank} (pid {pid})"

    def agent_kill(self, fault: Fault) -> None:
        self.agent_kills += 1
        status = self.h.status(self.run) or {}
        placed = {n["name"] for n in status.get("nodes", []) if n.get("state") == "healthy"}
        agents = []
        for p in tagged(self.run.tag):
            try:
                cmd = p.cmdline()
            except psutil.Error:
                continue
            if "trainguard.node.main" in cmd and "--node" in cmd:
                node = cmd[cmd.index("--node") + 1]
                if not placed or node in placed:
                    agents.append((node, p.pid))
        node, pid = self.rng.choice(sorted(agents))
        os.kill(pid, signal.SIGKILL)  # the agent only: its guardian ends its workers
        fault.detail = f"SIGKILL the agent of {node} (pid {pid})"

    def controller_kill(self, fault: Fault) -> None:
        proc = self.run.proc
        assert proc is not None
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        time.sleep(self.h.cfg.requeue_delay_s)
        fault.ended_at = time.time()
        self.h.launch(self.run)  # the same command, the same --job-dir
        fault.detail = (f"SIGKILL the launcher (pid {proc.pid}); started again after "
                        f"{self.h.cfg.requeue_delay_s:g}s")

    def _full(self, fault: Fault, fs: Any, what: str) -> None:
        written = fs.fill()
        time.sleep(self.h.cfg.outage_s)
        fs.free()
        fault.ended_at = time.time()
        fault.detail = f"{what} full for {self.h.cfg.outage_s:g}s ({written >> 20} MiB ballast)"

    def ckpt_disk_full(self, fault: Fault) -> None:
        self._full(fault, self.h.shmfs, "the memory checkpoint tier's tmpfs")

    def jobdir_full(self, fault: Fault) -> None:
        self._full(fault, self.h.jobfs, "the job dir's tmpfs")

    def s3_restart(self, fault: Fault) -> None:
        s3 = self.h.s3
        kept = s3.snapshot()
        key = s3.kill_mid_save(timeout_s=60)
        time.sleep(self.h.cfg.outage_s)
        s3.start()
        s3.restore(kept)
        fault.ended_at = time.time()
        where = f"while {key} was written" if key else "(no save began within 60s)"
        step = re.search(r"step-0*(\d+)", key or "")
        fault.detail = (f"SIGKILL the S3 server {where}; down {self.h.cfg.outage_s:g}s, "
                        f"restarted with the {len(kept)} objects it had"
                        + (f" (save of step {step.group(1)} lost)" if step else ""))
