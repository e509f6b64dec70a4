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
import functools
import os
import re
import signal
import socket
import stat
import sys
import time
from dataclasses import dataclass

from trainguard.worker import channel  # stdlib only; a message is dropped without a launcher
from trainguard.worker.contract import (
    ENV_FAULT,
    ENV_PROCESS_START_COUNT,
    ENV_RANK,
    ENV_RESTART_COUNT,
    MessageKind,
)

KINDS = (
    "crash",       # raise RuntimeError
    "exit",        # exit:CODE, os._exit(CODE)
    "signal",      # signal:SIG, kill itself with SIG
    "hang",        # sleep forever
    "spin",        # busy loop forever, 100% CPU
    "lock",        # lock:PATH, block on an exclusive flock of PATH until it is free
    "loaderhang",  # the data-loader worker making step S's batch sleeps forever
    "slow",        # slow:SECONDS, sleep, then go on
    "log",         # log:TEXT, print TEXT to stderr
    "collective",  # collective[:N], break this rank's connections in step S (N runs of it)
)
_NO_ARG = ("crash", "hang", "spin", "loaderhang")
_LOADER_KINDS = ("loaderhang",)  # fired by inject_loader, in a data-loader worker
_IN_STEP_KINDS = ("collective",)  # fired by inject_step, inside the step
_OPTIONAL_ARG = ("collective",)
_runs: dict[tuple[str, int], int] = {}  # (spec, fault index) -> runs of its step so far
_called: set[str] = set()  # where this process called from (reported once each)
_CALLS = {"step": "inject", "loader": "inject_loader", "in_step": "inject_step"}
_ESCAPABLE = ";@\\"
_UNESCAPE = re.compile(r"\\([;@\\])")


class FaultSpecError(ValueError):
    """A TRAINGUARD_FAULT spec that cannot be parsed; the message names the part and the fix,
    the fix last, after `; ` (a value quoted in the part may hold `; ` itself)."""

    @property
    def problem(self) -> str:
        head, sep, _ = str(self).rpartition("; ")
        return head if sep else str(self)

    @property
    def fix(self) -> str:
        _, sep, tail = str(self).rpartition("; ")
        return tail if sep else ""


@dataclass(frozen=True, slots=True)
class Fault:
    """One fault: what to do (`kind`, `arg`) and when (`step`, `rank`, `attempt`)."""

    kind: str
    arg: str | None
    step: int
    rank: int | None = None
    """Global rank (env RANK) it fires on; None fires on every rank."""
    attempt: int | None = 0
    """Restart count (env TORCHELASTIC_RESTART_COUNT) it fires on; None fires on every one."""

    def matches(self, step: int, rank: int, attempt: int, start: int | None = None) -> bool:
        """`start`: the rank's process start count (TRAINGUARD_PROCESS_START_COUNT), which
        is attempt + 1 for its first process of the attempt; None when unknown."""
        return (
            step == self.step
            and (self.rank is None or rank == self.rank)
            and (self.attempt is None or (attempt == self.attempt
                                          and (start is None or start <= attempt + 1)))
        )


def parse(spec: str) -> list[Fault]:
    """Parse a TRAINGUARD_FAULT value into faults, in the order given."""
    faults = []
    for part in _split(spec, ";"):
        if part.strip():
            faults.append(_parse_one(part))
    return faults


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


def _where(kind: str) -> str:
    return ("loader" if kind in _LOADER_KINDS else "in_step" if kind in _IN_STEP_KINDS
            else "step")


def _inject(step: int, where: str) -> None:
    spec = os.environ.get(ENV_FAULT)
    if not spec:
        return
    faults = _parse_cached(spec)
    if where not in _called:  # once per process: the launcher learns the script calls it
        _called.add(where)
        _report(_CALLS[where])
    if not any(_where(f.kind) == where for f in faults):
        return
    rank = _env_int(ENV_RANK)
    attempt = _env_int(ENV_RESTART_COUNT)
    start = _env_int(ENV_PROCESS_START_COUNT) if os.environ.get(ENV_PROCESS_START_COUNT) \
        else None
    for i, fault in enumerate(faults):
        if _where(fault.kind) == where and fault.matches(step, rank, attempt, start):
            runs = _runs[(spec, i)] = _runs.get((spec, i), 0) + 1
            # in-step kinds: the first N runs of the step; the rest: once per process
            # (every time with attempt=*)
            limit = int(fault.arg or 1) if fault.kind in _IN_STEP_KINDS else (
                1 if fault.attempt is not None else None)
            if limit is not None and runs > limit:
                continue
            _report(_CALLS[where], i)  # before it fires: a kill leaves no time after
            _fire(fault, step, rank, attempt)


def never_fired(spec: str, calls: set[str], fired: set[int]) -> tuple[list[str], int]:
    """The faults of `spec` that no rank fired, each with why (`calls`: the functions the
    ranks called, `fired`: the indexes of the faults that fired): a script that never
    calls the function its kind fires through, or a step, rank or attempt that never came;
    and how many faults `spec` holds."""
    lines = []
    faults = _parse_cached(spec)
    for i, fault in enumerate(faults):
        if i in fired:
            continue
        call = _CALLS[_where(fault.kind)]
        when = f"step {fault.step}" + (f", rank {fault.rank}" if fault.rank is not None else "") \
            + (f", attempt {fault.attempt}" if fault.attempt is not None else "")
        lines.append(f"{fault.kind}@{when}: " + (
            f"no rank called trainguard.testing.faults.{call}()" if call not in calls
            else f"the ranks called {call}(), but never at {when}"))
    return lines, len(faults)


def _report(call: str, fired: int | None = None) -> None:
    channel.send(MessageKind.FAULTS, call=call, fired=fired)


@functools.lru_cache(maxsize=8)
def _parse_cached(spec: str) -> tuple[Fault, ...]:
    try:
        return tuple(parse(spec))
    except FaultSpecError as e:
        raise FaultSpecError(f"{ENV_FAULT}={spec!r}: {e}") from None


def _fire(fault: Fault, step: int, rank: int, attempt: int) -> None:
    where = f"rank {rank}, attempt {attempt}"
    sys.stdout.flush()  # the last step's log line must not die with the process
    _say(f"[trainguard.faults] injecting {fault.kind} at step {step} ({where})")
    if fault.kind == "crash":
        raise RuntimeError(f"injected crash at step {step}")
    elif fault.kind == "exit":
        os._exit(int(fault.arg or 0))
    elif fault.kind == "signal":
        os.kill(os.getpid(), _signal_number(fault.arg or ""))
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


def _parse_one(part: str) -> Fault:
    pieces = _split(part, "@")
    if len(pieces) == 1:
        raise FaultSpecError(f"fault {part.strip()!r} has no trigger; add one, e.g. '@step=5'")
    if len(pieces) > 2:
        raise FaultSpecError(
            f"fault {part.strip()!r} has more than one '@'; write a literal '@' as '\\@'"
        )
    head, conditions = pieces[0].strip(), pieces[1]
    kind, sep, raw_arg = head.partition(":")
    kind = _unescape(kind).strip().lower()
    arg = _unescape(raw_arg) if sep else None
    _check_kind(kind, arg, head)
    step, rank, attempt = _parse_conditions(_unescape(conditions), part.strip())
    return Fault(kind=kind, arg=arg, step=step, rank=rank, attempt=attempt)


def _check_kind(kind: str, arg: str | None, head: str) -> None:
    if kind not in KINDS:
        kinds = ", ".join(KINDS)
        raise FaultSpecError(f"unknown fault kind {kind!r} in {head!r}; use one of: {kinds}")
    if kind in _OPTIONAL_ARG:
        if arg is not None and not (arg.strip().isdecimal() and 1 <= int(arg) <= 100):
            raise FaultSpecError(f"{kind} takes a run count 1..100, got {arg!r}; "
                                 f"e.g. '{kind}:2@step=5'")
        return
    if kind in _NO_ARG:
        if arg is not None:
            raise FaultSpecError(f"{kind!r} takes no argument; write '{kind}@step=S'")
        return
    if not arg:
        example = {"exit": "exit:1", "signal": "signal:KILL", "slow": "slow:2.5",
                   "lock": "lock:/tmp/trainguard.lock"}
        raise FaultSpecError(f"{kind!r} needs an argument, e.g. {example.get(kind, 'log:TEXT')!r}")
    if kind == "exit" and not (arg.strip().isdecimal() and 0 <= int(arg) <= 255):
        raise FaultSpecError(f"exit code {arg!r} is not an integer in 0..255; e.g. 'exit:1'")
    if kind == "signal":
        _signal_number(arg)
    if kind == "slow":
        try:
            seconds = float(arg)
        except ValueError:
            seconds = -1.0
        if not 0 <= seconds < float("inf"):
            raise FaultSpecError(f"slow needs seconds >= 0, got {arg!r}; e.g. 'slow:2.5'")


def _parse_conditions(text: str, part: str) -> tuple[int, int | None, int | None]:
    values: dict[str, str] = {}
    for cond in text.split(","):
        key, sep, value = (s.strip() for s in cond.partition("="))
        if not sep or not value or key not in ("step", "rank", "attempt"):
            raise FaultSpecError(
                f"bad condition {cond.strip()!r} in {part!r}; use step=S, rank=R or attempt=A|*"
            )
        if key in values:
            raise FaultSpecError(f"condition {key!r} given twice in {part!r}; keep one")
        values[key] = value
    if "step" not in values:
        raise FaultSpecError(f"fault {part!r} has no step; add 'step=S' after the '@'")
    step = _cond_int("step", values["step"], part)
    rank = values.get("rank", "*")
    attempt = values.get("attempt", "0")
    return (
        step,
        None if rank == "*" else _cond_int("rank", rank, part),
        None if attempt == "*" else _cond_int("attempt", attempt, part),
    )


def _cond_int(key: str, value: str, part: str) -> int:
    if not value.isdecimal():
        any_ok = "" if key == "step" else " or '*'"
        raise FaultSpecError(f"{key}={value!r} in {part!r} is not an integer >= 0{any_ok}")
    return int(value)


def _signal_number(arg: str) -> int:
    name = arg.strip().upper()
    try:
        if name.isdecimal():
            return int(signal.Signals(int(name)))
        return int(signal.Signals[name if name.startswith("SIG") else "SIG" + name])
    except (KeyError, ValueError):
        raise FaultSpecError(
            f"unknown signal {arg!r}; use a name such as KILL, TERM, SEGV or a number such as 9"
        ) from None


def _split(text: str, sep: str) -> list[str]:
    """Split at `sep` unless escaped with a backslash; escapes are kept for `_unescape`."""
    parts, current, i = [], [], 0
    while i < len(text):
        if text[i] == "\\" and i + 1 < len(text) and text[i + 1] in _ESCAPABLE:
            current.append(text[i : i + 2])
            i += 2
            continue
        if text[i] == sep:
            parts.append("".join(current))
            current = []
        else:
            current.append(text[i])
        i += 1
    parts.append("".join(current))
    return parts


def _unescape(text: str) -> str:
    return _UNESCAPE.sub(r"\1", text)


def _env_int(name: str) -> int:
    value = os.environ.get(name, "0")
    if not value.strip().isdecimal():
        raise ValueError(f"{ENV_FAULT} needs {name} to be an integer >= 0, got {value!r}")
    return int(value)


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
