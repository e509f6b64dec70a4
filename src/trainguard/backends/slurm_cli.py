"""Slurm's commands, typed: read an allocation, list and isolate nodes, allocate, build srun lines.

A thin I/O layer: each function runs one Slurm command (``sinfo``, ``scontrol``, ``salloc``,
``scancel``) with a timeout and the caller's environment (``env``: None means this process's;
pass one with ``SLURM_CONF`` to reach a cluster that is not the system's). A failure raises
``SlurmError`` naming the command, Slurm's own message and the fix. The parsing functions and
``srun_argv`` are pure.

Facts this relies on (slurm-wlm 22.05):

- ``srun --overlap`` lets a step share every resource (CPUs, memory, GRES) with the job's other
  steps; without it a second long-running step on a node waits ("Step creation temporarily
  disabled") until the first ends. ``--exact`` and ``--mem=0`` are then not needed.
- ``salloc --no-shell`` prints "Granted job allocation N" on stderr and returns; the
  allocation lasts until ``scancel``. ``--immediate=S`` makes salloc give up (and withdraw
  the pending job) after S seconds instead of queueing for ever.
- Without ``--no-kill``, a node that stops answering ends the whole allocation; with it the
  job shrinks to the nodes left and carries on.
- ``scontrol update ... State=RESUME`` on a node that is neither drained nor down fails with
  "Invalid node state specified"; ``resume`` treats that as already done. A resumed node
  reads "idle*" (not responding) until slurmctld's next ping, within about a second.
- Inside a step started with ``srun --jobid J`` from outside the job, SLURM_JOB_NAME is the
  step's name and SLURM_JOB_NODELIST the step's nodes (in a batch script they are the job's).
"""

from __future__ import annotations

import math
import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from trainguard.errors import TrainguardError
from trainguard.states import NOT_THE_NODE

DEFAULT_TIMEOUT_S = 30.0
_GRANTED = re.compile(r"Granted job allocation (\d+(?:[_+]\d+)?)")
# slurmstepd's `*** STEP 1.2 ON n3 CANCELLED AT <time> [DUE TO JOB REQUEUE|TIME LIMIT|...] ***`
_CANCELLED = re.compile(r"\bCANCELLED AT\b")
_FIX_UP = ("check that slurmctld is up (`scontrol ping`) and that SLURM_CONF points at the "
           "cluster's slurm.conf")


class SlurmError(TrainguardError):
    """A Slurm command failed: the message names the command, Slurm's stderr and the fix."""

    def __init__(self, command: Sequence[str], problem: str, fix: str, stderr: str = "",
                 returncode: int | None = None) -> None:
        self.command = list(command)
        self.problem = problem
        self.fix = fix
        self.stderr = stderr.strip()
        self.returncode = returncode
        said = f": {self.stderr}" if self.stderr else ""
        super().__init__(f"`{' '.join(self.command)}` {problem}{said}. Fix: {fix}")


@dataclass(frozen=True)
class Allocation:
    """The Slurm job this process runs in, read from the environment Slurm sets."""

    job_id: str
    nodelist: str  # Slurm's compressed form, e.g. "n[1-3]"; expand_nodelist lists it
    nnodes: int | None
    restart_count: int
    name: str | None


def available() -> bool:
    """Whether Slurm's client commands (srun, scontrol) are on PATH."""
    return shutil.which("srun") is not None and shutil.which("scontrol") is not None


# --- pure ---------------------------------------------------------------------------------------
def _first(env: Mapping[str, str], *keys: str) -> str | None:
    for k in keys:
        v = env.get(k, "").strip()
        if v:
            return v
    return None


def parse_allocation(env: Mapping[str, str]) -> Allocation | None:
    """The allocation described by Slurm's variables in env; None outside a Slurm job."""
    job_id = _first(env, "SLURM_JOB_ID", "SLURM_JOBID")
    if job_id is None:
        return None
    nnodes_s = _first(env, "SLURM_JOB_NUM_NODES", "SLURM_NNODES")
    nnodes = int(nnodes_s) if nnodes_s is not None and nnodes_s.isdigit() else None
    restarts_s = _first(env, "SLURM_RESTART_COUNT") or "0"
    if not restarts_s.isdigit():
        raise SlurmError(["environment"], f"has SLURM_RESTART_COUNT={restarts_s!r}",
                         "unset it or set a count (Slurm sets it on a requeued job)")
    return Allocation(job_id=job_id,
                      nodelist=_first(env, "SLURM_JOB_NODELIST", "SLURM_NODELIST") or "",
                      nnodes=nnodes, restart_count=int(restarts_s),
                      name=_first(env, "SLURM_JOB_NAME"))


def parse_sinfo(text: str) -> dict[str, str]:
    """Node -> lower-case state from `sinfo -h -N -o "%N %T"` (a node listed once per
    partition appears once; the state keeps Slurm's suffix: "down*", "idle~", "drained")."""
    states: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2:
            states.setdefault(parts[0], parts[1].lower())
    return states


def parse_state_reason(text: str) -> tuple[str, str] | None:
    """(state, reason) of one node from `sinfo -h -N -n NODE -o "%T|%E"` (a node in several
    partitions is listed once for each: the first line); Slurm's "none" is no reason ("")."""
    for line in text.splitlines():
        state, sep, reason = line.partition("|")
        if sep and state.strip():
            reason = reason.strip()
            return state.strip().lower(), "" if reason == "none" else reason
    return None


_TAKEN_DOWN = ("down", "drain", "fail")  # down*, drained, draining, fail, failing...
# reasons Slurm gives a node it set DOWN itself; with ReturnToService (1, its default) such a
# node comes back to service on its own (its slurmd registers again): trainguard drains it
_SLURMS_OWN = ("not responding", "node unexpectedly rebooted", "kill task failed",
               "batch job complete failure", "epilog error", "prolog error")


def held_down(state: str, reason: str) -> str | None:
    """What isolating a node an admin already has down or drained comes to: it is left as
    it is, its reason kept (walk-through 36 #3); None when the node is in service or down by
    Slurm's own doing (it is to be drained: review 40 #9)."""
    if not any(t in state for t in _TAKEN_DOWN) or \
            reason.lower().startswith(_SLURMS_OWN):
        return None
    return (f"not drained: Slurm has it {state} (reason: {reason or 'none given'}); left as "
            "it is")


def cancelled_note(stderr: str) -> str | None:
    """Slurm's own cancellation of a step, from what its srun wrote (slurmstepd's `*** STEP
    J.S ON NODE CANCELLED AT <time> [DUE TO <why>] ***`), said for a stop it caused: a
    requeue, a time limit, a preemption, scancel, or a node failure elsewhere in a job
    submitted without --no-kill (walk-through 42 #5: that read as a plain `stopped by
    SIGTERM`); None when there is none."""
    said = [ln.split(": error: ", 1)[-1].strip() for ln in stderr.splitlines()
            if "***" in ln and _CANCELLED.search(ln)]
    if not said:
        return None
    note = f"Slurm cancelled the job's steps ({said[-1]})"
    if "NODE FAIL" in said[-1]:
        note += (": Slurm ends a job whose node failed unless it was submitted with "
                 "--no-kill; submit it with `sbatch --no-kill` so that trainguard replaces the "
                 "node instead")
    return note


def srun_ended_why(stderr: str) -> str:
    """Why a node's agent step ended, from what its srun wrote (the agent's stderr comes
    through it too): Slurm's node failure (the node went down: the agent may run on there,
    its srun ended here), a cancelled step, else srun's last error (the task's exit)."""
    lines = [ln.strip() for ln in stderr.splitlines()]
    said = ([ln for ln in lines if ln.startswith("srun: error: Node failure")]
            or [ln.split(": error: ", 1)[-1] for ln in lines
                if ln.startswith("slurmstepd") and "***" in ln]
            or [ln for ln in lines if ln.startswith("srun: error: ")])
    if not said:
        return "its agent's Slurm step ended"
    last = said[-1].replace('srun: error: ', 'srun: ')
    if _CANCELLED.search(last):  # Slurm's own doing (walk-through 42 #12: a requeue's
        # cancelled step drained a healthy spare); a node that failed is srun's `Node
        # failure on NODE` (preferred above): `DUE TO NODE FAILURE` is said on every node
        return f"its agent's Slurm step was cancelled ({last}): {NOT_THE_NODE}"
    return f"its agent's Slurm step ended ({last})"


def parse_partitions(text: str) -> tuple[str | None, dict[str, int]]:
    """(the default partition, partition -> its node count) from `sinfo -h -o "%P %D"`
    (one line per partition: sinfo groups by the fields shown; the default's name ends in
    "*"; a partition on several lines is summed)."""
    default: str | None = None
    sizes: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) != 2 or not parts[1].isdigit():
            continue
        name = parts[0].rstrip("*")
        if parts[0].endswith("*"):
            default = name
        sizes[name] = sizes.get(name, 0) + int(parts[1])
    return default, sizes


def salloc_partition(env: Mapping[str, str], default: str | None,
                     sizes: Mapping[str, int]) -> tuple[str, int] | None:
    """The partition a plain `salloc` asks (SALLOC_PARTITION, else the default) and its node
    count; of a list (`a,b`: the first that can run it), the largest. None when unknown."""
    asked = [p.strip() for p in env.get("SALLOC_PARTITION", "").split(",") if p.strip()]
    known = [(p, sizes[p]) for p in (asked or ([default] if default else [])) if p in sizes]
    return max(known, key=lambda ps: ps[1]) if known else None


def parse_granted(text: str) -> str | None:
    """The job id in salloc's "Granted job allocation N" (the last one), else None."""
    found = _GRANTED.findall(text)
    return found[-1] if found else None


# what salloc says when it cannot reach (or find) the cluster at all, as opposed to a
# cluster that has no nodes for the job (slurm-wlm 22.05's wording)
_NO_CLUSTER = ("could not establish a configuration source", "unable to contact slurm controller",
               "zero bytes were transmitted", "connection refused", "unable to load config",
               "could not open configuration file", "communication connection failure",
               # a SLURM_CONF that names no file (walk-through 42 #3: read as no free node)
               "unable to process configuration file", "s_p_parse_file: cannot stat file")
NO_CLUSTER_FIX = ("this host cannot reach a Slurm cluster: check that slurm.conf is found "
                  "(SLURM_CONF, or /etc/slurm/slurm.conf) and that slurmctld answers "
                  "(`scontrol ping`); or use --backend local")


def no_cluster(said: str) -> bool:
    """Whether a Slurm command's message says it found no cluster (no configuration, no
    controller), as opposed to a cluster with no nodes for the job."""
    return any(m in said.lower() for m in _NO_CLUSTER)


def allocate_fix(said: str, nnodes: int, exclude: Sequence[str], wait_s: int) -> str:
    """The fix for a failed `salloc`, from salloc's own message: no configuration or no
    controller is a cluster problem; anything else (no node free in time, nodes down) is
    the nodes'."""
    if no_cluster(said):
        return NO_CLUSTER_FIX
    outside = f"outside {','.join(exclude)} " if exclude else ""
    return (f"free or resume nodes (`sinfo -N -R`): {nnodes} node(s) {outside}must be "
            f"available to this partition within {wait_s} s, or wait longer with "
            "--queue-timeout S")


def srun_argv(job_id: str | None, node: str, argv: Sequence[str], *,
              step_name: str) -> list[str]:
    """The srun line that runs argv as one task on node, as a step of job_id (None: the job
    in srun's environment). --overlap lets it run beside the job's other steps on that node
    (a second step is not blocked); --kill-on-bad-exit=0 keeps one task's failure from ending
    the job's other steps."""
    if not node or not argv:
        raise ValueError("srun_argv needs a node and a command")
    head = ["srun"] if job_id is None else ["srun", "--jobid", job_id]
    return [*head, "-N1", "-n1", "-w", node, "--overlap", "--kill-on-bad-exit=0",
            "-J", step_name, "--export=ALL", *argv]


# --- commands -----------------------------------------------------------------------------------
def _run(argv: list[str], env: Mapping[str, str] | None, timeout_s: float, fix: str,
         *, check: bool = True, answer: str = "") -> subprocess.CompletedProcess[str]:
    """`check`: a failure raises SlurmError, unless its stderr says `answer` (lower case)."""
    try:
        proc = subprocess.Popen(argv, env=None if env is None else dict(env),
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, errors="replace")
    except OSError as e:
        raise SlurmError(argv, f"could not be started ({e.strerror or e})",
                         f"install Slurm's client commands (slurm-client) or put "
                         f"{argv[0]} on PATH") from e
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired as e:
        # SIGTERM first: salloc withdraws its pending job on it, srun its step
        proc.terminate()
        try:
            out, err = proc.communicate(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        raise SlurmError(argv, f"did not finish within {timeout_s:.0f} s", _FIX_UP,
                         err or "") from e
    if check and proc.returncode != 0 and not (answer and answer in (err or "").lower()):
        raise SlurmError(argv, f"failed (exit {proc.returncode})", fix, err or out,
                         proc.returncode)
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def expand_nodelist(nodelist: str, env: Mapping[str, str] | None = None, *,
                    timeout_s: float = DEFAULT_TIMEOUT_S) -> list[str]:
    """Host names in a Slurm node list ("n[1-3],gpu07" -> n1 n2 n3 gpu07), in order."""
    if not nodelist.strip():
        return []
    r = _run(["scontrol", "show", "hostnames", nodelist], env, timeout_s,
             "pass a node list in Slurm's syntax, e.g. n[1-3],gpu07")
    return r.stdout.split()


def node_states(env: Mapping[str, str] | None = None, *,
                timeout_s: float = DEFAULT_TIMEOUT_S) -> dict[str, str]:
    """Every node's state, lower case: idle, mixed, allocated, drained, draining, down*..."""
    r = _run(["sinfo", "-h", "-N", "-o", "%N %T"], env, timeout_s, _FIX_UP)
    return parse_sinfo(r.stdout)


def partitions(env: Mapping[str, str] | None = None, *,
               timeout_s: float = DEFAULT_TIMEOUT_S) -> tuple[str | None, dict[str, int]]:
    """The default partition and every partition's node count (parse_partitions)."""
    r = _run(["sinfo", "-h", "-o", "%P %D"], env, timeout_s, _FIX_UP)
    return parse_partitions(r.stdout)


def state_reason(node: str, env: Mapping[str, str] | None = None, *,
                 timeout_s: float = DEFAULT_TIMEOUT_S) -> tuple[str, str] | None:
    """One node's state and the reason an admin or Slurm gave for it (parse_state_reason);
    None for a node sinfo does not list."""
    r = _run(["sinfo", "-h", "-N", "-n", node, "-o", "%T|%E"], env, timeout_s, _FIX_UP)
    return parse_state_reason(r.stdout)


def drain(node: str, reason: str, env: Mapping[str, str] | None = None, *,
          timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
    """Keep new work off node (its running steps go on); the reason shows in `sinfo -R`."""
    _run(["scontrol", "update", f"NodeName={node}", "State=DRAIN",
          f"Reason={reason.strip() or 'trainguard'}"], env, timeout_s,
         f"check that {node} is a node of this cluster (`sinfo -N`) and that this user may "
         "change node states (SlurmUser, root or an operator)")


def resume(node: str, env: Mapping[str, str] | None = None, *,
           timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
    """Undo drain (or a down state); a node already in service is left as it is."""
    argv = ["scontrol", "update", f"NodeName={node}", "State=RESUME"]
    r = _run(argv, env, timeout_s, "", check=False)
    if r.returncode == 0 or "Invalid node state specified" in r.stderr:
        return
    raise SlurmError(argv, f"failed (exit {r.returncode})",
                     f"check that {node} is a node of this cluster (`sinfo -N`) and that this "
                     "user may change node states", r.stderr or r.stdout, r.returncode)


def allocate(nnodes: int, *, exclude: Sequence[str] = (), name: str = "trainguard",
             env: Mapping[str, str] | None = None, timeout_s: float = 60.0,
             no_kill: bool = False) -> str:
    """Allocate nnodes nodes (none of exclude) and return the job id; steps go in with srun.

    Waits at most timeout_s for the nodes (salloc --immediate), then raises; nothing is
    left queued. no_kill: the allocation survives the loss of one of its nodes (it shrinks).
    """
    if nnodes < 1:
        raise ValueError(f"allocate needs at least one node, not {nnodes}")
    wait = max(1, math.ceil(timeout_s))
    argv = ["salloc", "--no-shell", f"--immediate={wait}", "-N", str(nnodes), "-J", name]
    if exclude:
        argv += ["--exclude", ",".join(exclude)]
    if no_kill:
        argv.append("--no-kill")
    r = _run(argv, env, wait + DEFAULT_TIMEOUT_S, "", check=False)
    if r.returncode != 0:
        said = r.stderr or r.stdout
        raise SlurmError(argv, f"failed (exit {r.returncode})",
                         allocate_fix(said, nnodes, exclude, wait), said, r.returncode)
    job_id = parse_granted(r.stderr + "\n" + r.stdout)
    if job_id is None:
        raise SlurmError(argv, "printed no 'Granted job allocation N'",
                         "check the salloc version's output (22.05 prints it on stderr)",
                         r.stderr or r.stdout)
    return job_id


def cancel(job_id: str, env: Mapping[str, str] | None = None, *,
           timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
    """End a job (allocation) and every step in it."""
    _run(["scancel", job_id], env, timeout_s,
         f"check the job id ({job_id}) with `squeue`, and that this user owns the job")


def parse_steps(text: str) -> dict[str, str]:
    """`squeue -h -s -o "%i %j"` lines ("6.3 trainguard-agent-n2") -> {step name: step id}."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(None, 1)
        if len(parts) == 2:
            out.setdefault(parts[1].strip(), parts[0])
    return out


def job_steps(job_id: str, env: Mapping[str, str] | None = None, *,
              timeout_s: float = DEFAULT_TIMEOUT_S) -> dict[str, str]:
    """The running steps of a job: {step name: step id ("JOBID.STEP")}; {} when the job
    has ended (squeue lists nothing, or no longer knows the id); SlurmError when squeue did
    not answer (slurmctld down or slow: review 53 #6 read that as every agent gone)."""
    r = _run(["squeue", "-h", "-s", "-j", job_id, "-o", "%i %j"], env, timeout_s,
             "check that slurmctld answers (`scontrol ping`)", answer="invalid job id")
    return parse_steps(r.stdout) if r.returncode == 0 else {}


def job_nodelist(job_id: str, env: Mapping[str, str] | None = None, *,
                 timeout_s: float = DEFAULT_TIMEOUT_S) -> str:
    """The node list of a running job (squeue's %N), e.g. "n[1-3]"."""
    r = _run(["squeue", "-h", "-j", job_id, "-o", "%N"], env, timeout_s,
             f"check that job {job_id} still runs (`squeue -j {job_id}`)")
    return r.stdout.strip()
