"""The Slurm backend: one agent per node as a step of the job's allocation (srun).

Inside an allocation (sbatch or salloc: SLURM_JOB_ID and its node list are set) the job
uses its nodes; elsewhere it makes one with `salloc --no-shell --no-kill` (a lost node then
shrinks the allocation instead of ending it) and cancels it at the end. A node is lost when
its agent's srun ends, when its agent is disconnected or silent (the fleet's watch, faster
than Slurm's SlurmdTimeout), or when Slurm itself reports it down or failing. Isolation
drains the node (`scontrol update NodeName=.. State=DRAIN Reason=..`) where this user may
and Slurm has it in service (a node down or drained keeps its state and reason), and always
keeps it out of the job's placement.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import threading
from pathlib import Path

from trainguard.backends import slurm_cli
from trainguard.backends.slurm_cli import SlurmError
from trainguard.errors import LaunchError

log = logging.getLogger(__name__)

STATES_EVERY_S = 2.0  # sinfo at most this often
STATES_TIMEOUT_S = 10.0  # one sinfo call at most this long
_BAD = ("down", "fail", "not_responding")  # a bare "*" (e.g. mixed*) is a passing blip


SRUN_SAID_BYTES = 16384  # how much of srun's last output why_ended reads


class SrunAgent:
    """An agent started here as `srun ... python -m trainguard.node.main` (pid = srun's);
    `log`: the file srun writes to, from byte `since` on for this start."""

    def __init__(self, node: str, proc: subprocess.Popen[bytes] | None,
                 log: Path | None = None, since: int = 0) -> None:
        self.node, self._proc = node, proc
        self._log, self._since = log, since
        self._why: str | None = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def ended(self) -> bool:
        # an adopted agent (a restarted controller) has no srun here: the hub watches it
        return self._proc is not None and self._proc.poll() is not None

    def why_ended(self) -> str:
        """The step's end in srun's words: on a node failure srun ends here while the agent
        may run on (walk-through 36 #11: "its agent process ended" for one that ran)."""
        if self._why is None and self.ended():  # srun's last words are written
            self._why = slurm_cli.srun_ended_why(self._said())
        return self._why or slurm_cli.srun_ended_why("")

    def cancelled(self) -> str | None:
        """Slurm's words when it cancelled this agent's step (the agent may run on, for its
        workers' grace: node/term.py), for the stop's record; None when it did not."""
        return slurm_cli.cancelled_note(self._said())

    def _said(self) -> str:
        if self._log is None:
            return ""
        try:
            with open(self._log, "rb") as f:
                f.seek(max(self._since, f.seek(0, os.SEEK_END) - SRUN_SAID_BYTES))
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def kill(self, wait: bool = True) -> None:
        """SIGTERM to srun, which passes it to the agent (whose guardian ends the workers),
        SIGKILL after 10 s; `wait` False: the wait goes on in a thread (a lost node's srun
        waits out KillWait, 4 s, for its step: walk-through 42 #4, that was most of every
        node-loss recovery's `stop`)."""
        if self._proc is None or self._proc.poll() is not None:
            return
        self._proc.terminate()
        if wait:
            self._reap()
        else:
            threading.Thread(target=self._reap, name=f"srun-{self.node}", daemon=True).start()

    def _reap(self) -> None:
        assert self._proc is not None
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


def agent_step(run_id: str, node: str) -> str:
    """The name of `node`'s agent step in the job's allocation (squeue -s, scancel): with
    the run id, as two jobs may share an allocation (review 52 #5)."""
    return f"trainguard-{run_id}-agent-{node}"


def _still_runs(job_id: str) -> bool:
    try:
        return bool(slurm_cli.job_nodelist(job_id))
    except SlurmError:
        return False


class SlurmBackend:
    name = "slurm"

    def __init__(self, nodes: int, run_id: str, log_dir: Path,
                 own_job: str | None = None, wait_s: float = 300.0) -> None:
        """`own_job`: the allocation an earlier controller of this job made (a restarted
        controller takes it over instead of making a second one); `wait_s`: how long an
        allocation made here waits for its nodes (--queue-timeout)."""
        if not slurm_cli.available():
            raise LaunchError("--backend slurm: srun/scontrol are not on PATH. Fix: run on a "
                              "Slurm login or compute node, or use --backend local")
        self._log_dir, self._run_id = log_dir, run_id
        self._own = False
        self._closed = threading.Event()
        self._reader: threading.Thread | None = None  # reads Slurm's node states until close
        alloc = slurm_cli.parse_allocation(os.environ)
        adopted = False
        try:
            if alloc is not None:
                self.job_id = alloc.job_id
                names = slurm_cli.expand_nodelist(alloc.nodelist)
                self.restart_count = alloc.restart_count
            elif own_job is not None and _still_runs(own_job):
                # taken over from a dead controller of this job: it may have shrunk (a lost
                # node leaves a --no-kill allocation); the job store knows which nodes
                self.job_id, self._own, adopted = own_job, True, True
                names = slurm_cli.expand_nodelist(slurm_cli.job_nodelist(own_job))
                self.restart_count = 0
            else:
                self.job_id = slurm_cli.allocate(nodes, name=f"trainguard-{run_id}",
                                                 no_kill=True, timeout_s=wait_s)
                self._own = True
                names = slurm_cli.expand_nodelist(slurm_cli.job_nodelist(self.job_id))
                self.restart_count = 0
        except SlurmError as e:
            raise LaunchError(str(e)) from None
        if len(names) < nodes and not adopted:
            self.close()
            raise LaunchError(f"Slurm job {self.job_id} has {len(names)} node(s) "
                              f"({', '.join(names)}); this job needs {nodes} (--nnodes plus "
                              "--spare-nodes). Fix: allocate more nodes (sbatch -N / salloc -N)")
        self._names = names[:nodes]
        if adopted and len(names) < nodes:  # the nodes it lost are in the store, not in Slurm
            self._names = names
        self._states: dict[str, str] = {}
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read_states, name="trainguard-sinfo",
                                        daemon=True)
        self._reader.start()

    def node_names(self) -> list[str]:
        return list(self._names)

    def start_agent(self, node: str, argv: list[str]) -> SrunAgent:
        self._log_dir.mkdir(parents=True, exist_ok=True)
        cmd = slurm_cli.srun_argv(self.job_id, node, [*argv, "--node", node],
                                  step_name=agent_step(self._run_id, node))
        log_file = self._log_dir / f"{node}.agent.log"
        with open(log_file, "ab") as err:
            since = err.tell()  # the file holds earlier launches' agents too
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stderr=err,
                                    start_new_session=True, close_fds=True)
        return SrunAgent(node, proc, log_file, since)

    def adopt_agent(self, node: str, pid: int | None) -> SrunAgent:
        return SrunAgent(node, None)

    def bad_nodes(self) -> dict[str, str]:
        """Nodes of the job that Slurm reports down, failing or not responding (as last
        read by the background reader: a slow slurmctld never stalls the controller)."""
        with self._lock:
            states = dict(self._states)
        return {n: s for n, s in states.items()
                if n in self._names and any(b in s for b in _BAD)}

    def _read_states(self) -> None:
        while not self._closed.wait(STATES_EVERY_S):
            try:
                states = slurm_cli.node_states(timeout_s=STATES_TIMEOUT_S)
            except SlurmError as e:
                log.warning("cannot read Slurm's node states: %s", e)
                continue
            with self._lock:
                self._states = states

    def isolate(self, node: str, reason: str) -> str:
        """Drain the node, unless Slurm already has it down or drained: an admin's (or
        Slurm's own) state and reason are kept, and said (walk-through 36 #3: an admin's
        DOWN and its reason were replaced by trainguard's DRAIN)."""
        try:
            found = slurm_cli.state_reason(node, timeout_s=STATES_TIMEOUT_S)
        except SlurmError as e:  # the drain below says whether Slurm answers at all
            log.warning("cannot read Slurm's state of %s before draining it: %s", node, e)
            found = None
        held = slurm_cli.held_down(*found) if found is not None else None
        if held is not None:
            return held
        try:
            slurm_cli.drain(node, reason)
        except SlurmError as e:
            return (f"not drained in Slurm ({e.problem}; {e.stderr or 'no detail'}); kept out "
                    "of the job's placement")
        return f"drained in Slurm (scontrol update NodeName={node} State=DRAIN)"

    @property
    def owned_job(self) -> str | None:
        """The allocation this backend made (cancelled at the end), if any."""
        return self.job_id if self._own else None

    def close(self) -> None:
        self._closed.set()
        if self._reader is not None and self._reader is not threading.current_thread():
            self._reader.join(STATES_TIMEOUT_S + 1)  # at most one sinfo call to wait for
        if self._own:
            self._own = False
            with contextlib.suppress(SlurmError):
                slurm_cli.cancel(self.job_id)
