"""A TRAINGUARD_FAULT spec read (its syntax: trainguard/testing/faults.py): pure and stdlib
only, for both sides, the rank that fires the faults (testing/faults.py) and the launcher
that checks the spec before a run (cli/run_checks.py) and says which faults never fired
(controller/worker_messages.py).
"""

from __future__ import annotations

import functools
import re
import signal
from dataclasses import dataclass

from trainguard.worker.contract import ENV_FAULT

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
IN_STEP_KINDS = ("collective",)  # fired by inject_step, inside the step
_OPTIONAL_ARG = ("collective",)
CALLS = {"step": "inject", "loader": "inject_loader", "in_step": "inject_step"}
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


def where(kind: str) -> str:
    return ("loader" if kind in _LOADER_KINDS else "in_step" if kind in IN_STEP_KINDS
            else "step")


def never_fired(spec: str, calls: set[str], fired: set[int]) -> tuple[list[str], int]:
    """The faults of `spec` that no rank fired, each with why (`calls`: the functions the
    ranks called, `fired`: the indexes of the faults that fired): a script that never
    calls the function its kind fires through, or a step, rank or attempt that never came;
    and how many faults `spec` holds."""
    lines = []
    faults = parse_cached(spec)
    for i, fault in enumerate(faults):
        if i in fired:
            continue
        call = CALLS[where(fault.kind)]
        when = f"step {fault.step}" + (f", rank {fault.rank}" if fault.rank is not None else "") \
            + (f", attempt {fault.attempt}" if fault.attempt is not None else "")
        lines.append(f"{fault.kind}@{when}: " + (
            f"no rank called trainguard.testing.faults.{call}()" if call not in calls
            else f"the ranks called {call}(), but never at {when}"))
    return lines, len(faults)


@functools.lru_cache(maxsize=8)
def parse_cached(spec: str) -> tuple[Fault, ...]:
    try:
        return tuple(parse(spec))
    except FaultSpecError as e:
        raise FaultSpecError(f"{ENV_FAULT}={spec!r}: {e}") from None


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
        signal_number(arg)
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


def signal_number(arg: str) -> int:
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
