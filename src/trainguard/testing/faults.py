"""Fault injection for examples, demos and tests, driven by the TRAINGUARD_FAULT variable.

A training script calls `inject(step)` once per finished step; a data-loader worker calls
`inject_loader(step)` when it makes the batch of `step`. The variable holds faults
separated by `;`, each `KIND[:ARG]@step=S[,rank=R][,attempt=A|*]`, for example
`exit:3@rank=1,step=5` or `log:NCCL error@step=5;signal:KILL@step=5`. A fault fires on the
global rank R (env RANK; every rank when absent or `*`) in attempt A (env
TORCHELASTIC_RESTART_COUNT; the first attempt, 0, when absent; every attempt for `*`), in
the rank's first process of that attempt (an in-process restart's replacement, a later
start of the rank in the same attempt, does not fire it again), and once per process (a
training function re-entered by trainguard.run_resilient passes step S again without it).

Kinds, each fired after step S (`loaderhang`: while making the batch of step S):

- `crash`: raise RuntimeError (a Python traceback, exit code 1).
- `exit:CODE`: os._exit(CODE) at once, no cleanup.
- `signal:SIG`: send itself SIG (a name such as KILL, SEGV, TERM, or a number).
- `hang`: sleep forever (idle: 0% CPU, the main thread in time.sleep).
- `spin`: a busy Python loop forever (100% of one CPU, the main thread running Python).
- `lock:PATH`: take an exclusive flock on PATH (opened for appending, created if missing),
  blocking until it is free, then release it and go on: hangs for as long as another
  process holds the lock (a test, or `flock PATH sleep 600`).
- `loaderhang`: the data-loader worker making the batch of step S sleeps forever, so the
  training loop finishes step S-1 and then waits for that batch forever. Fires only
  through `inject_loader` (examples/train_ddp.py --loader-workers N); `inject` skips it.
- `slow:SECONDS`: sleep SECONDS, then go on (a slow step).
- `log:TEXT`: print TEXT to stderr and go on (to test log scanning).
- `collective[:N]`: a transient collective failure inside step S: the rank shuts down its
  TCP connections (its process group's links to its peers and to the rendezvous store), so
  every rank's next collective fails with a real gloo error ("Connection closed by peer")
  while every process lives on. Fires through `inject_step` (called inside the step, e.g.
  by the step function a StepGuard runs), on the first N runs of step S in the process
  (default 1: a re-executed step S runs clean; 2: the re-execution fails too).

Stdlib only.
"""

from __future__ import annotations

import fcntl
import os
import socket
import stat
import sys
import time

from trainguard.testing import fault_spec
from trainguard.testing.fault_spec import KINDS as KINDS  # the spec's reading, re-exported
from trainguard.testing.fault_spec import Fault as Fault
from trainguard.testing.fault_spec import FaultSpecError as FaultSpecError
from trainguard.testing.fault_spec import parse as parse
from trainguard.worker import channel  # stdlib only; a message is dropped without a launcher
from trainguard.worker.contract import (
    ENV_FAULT,
    ENV_PROCESS_START_COUNT,
    ENV_RANK,
    ENV_RESTART_COUNT,
    MessageKind,
)

_runs: dict[tuple[str, int], int] = {}  # (spec, fault index) -> runs of its step so far
_called: set[str] = set()  # where this process called from (reported once each)


def inject(step: int) -> None:
    """Fire the faults of TRAINGUARD_FAULT that match this step, rank and attempt
    (all kinds but `loaderhang` and `collective`); call it once per finished step."""
    _inject(step, "step")


def inject_loader(step: int) -> None:
    """Fire the `loaderhang` faults that match; call it in a data-loader worker (a
    Dataset's __getitem__) while it makes the batch of `step`."""
    _inject(step, "loader")


def inject_step(step: int) -> None:
    """Fire the `collective` faults that match; call it inside the step (before its
    collectives), each time the step runs."""
    _inject(step, "in_step")


def _inject(step: int, where: str) -> None:
    spec = os.environ.get(ENV_FAULT)
    if not spec:
        return
    faults = fault_spec.parse_cached(spec)
    if where not in _called:  # once per process: the launcher learns the script calls it
        _called.add(where)
        _report(fault_spec.CALLS[where])
    if not any(fault_spec.where(f.kind) == where for f in faults):
        return
    rank = _env_int(ENV_RANK)
    attempt = _env_int(ENV_RESTART_COUNT)
    start = _env_int(ENV_PROCESS_START_COUNT) if os.environ.get(ENV_PROCESS_START_COUNT) \
        else None
    for i, fault in enumerate(faults):
        if fault_spec.where(fault.kind) == where and fault.matches(step, rank, attempt, start):
            runs = _runs[(spec, i)] = _runs.get((spec, i), 0) + 1
            # in-step kinds: the first N runs of the step; the rest: once per process
            # (every time with attempt=*)
            limit = int(fault.arg or 1) if fault.kind in fault_spec.IN_STEP_KINDS else (
                1 if fault.attempt is not None else None)
            if limit is not None and runs > limit:
                continue
            _report(fault_spec.CALLS[where], i)  # before it fires: a kill leaves no time after
            _fire(fault, step, rank, attempt)


def _report(call: str, fired: int | None = None) -> None:
    channel.send(MessageKind.FAULTS, call=call, fired=fired)


def _fire(fault: Fault, step: int, rank: int, attempt: int) -> None:
    where = f"rank {rank}, attempt {attempt}"
    sys.stdout.flush()  # the last step's log line must not die with the process
    _say(f"[trainguard.faults] injecting {fault.kind} at step {step} ({where})")
    if fault.kind == "crash":
        raise RuntimeError(f"injected crash at step {step}")
    elif fault.kind == "exit":
        os._exit(int(fault.arg or 0))
    elif fault.kind == "signal":
        os.kill(os.getpid(), fault_spec.signal_number(fault.arg or ""))
    elif fault.kind in ("hang", "loaderhang"):
        while True:
            time.sleep(3600)
    elif fault.kind == "spin":
        _spin()
    elif fault.kind == "lock":
        _wait_for_lock(fault.arg or "")
    elif fault.kind == "slow":
        time.sleep(float(fault.arg or 0))
    elif fault.kind == "log":
        _say(fault.arg or "")
    elif fault.kind == "collective":
        _say(f"[trainguard.faults] shut down {_break_connections()} TCP connection(s)")


def _break_connections() -> int:
    """Shut down every connected TCP socket of this process: its process group's links and
    its rendezvous store connection. The peers' next collective fails at once."""
    n = 0
    for name in os.listdir("/proc/self/fd"):
        try:
            fd = int(name)
            if not stat.S_ISSOCK(os.fstat(fd).st_mode):
                continue
            s = socket.socket(fileno=os.dup(fd))
        except (OSError, ValueError):
            continue
        with s:
            if s.family not in (socket.AF_INET, socket.AF_INET6) or \
                    s.type != socket.SOCK_STREAM:
                continue
            try:
                s.getpeername()
                s.shutdown(socket.SHUT_RDWR)
                n += 1
            except OSError:  # a listening or unconnected socket
                continue
    return n


def _spin() -> None:
    n = 0
    while True:  # pure Python: holds the GIL between switches, never sleeps
        n = (n + 1) & 0xFFFF


def _wait_for_lock(path: str) -> None:
    with open(path, "a") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)  # blocks while another process holds it
        fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def _env_int(name: str) -> int:
    value = os.environ.get(name, "0")
    if not value.strip().isdecimal():
        raise ValueError(f"{ENV_FAULT} needs {name} to be an integer >= 0, got {value!r}")
    return int(value)


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
