"""Typed, bounded fields: what every message of the launcher <-> worker contract
(worker/contract.py) is checked against. Pure, stdlib only.

A value outside its bounds is a broken or hostile sender, never a real value: the agent drops
the datagram (node/channel.py), a rank drops the verdict (worker/control.py).
"""

from __future__ import annotations

import math
from enum import Enum
from typing import Any, NamedTuple

# bounds: anything outside is a broken or hostile sender, never a real value
MAX_INT32, MAX_INT64 = 2**31 - 1, 2**63 - 1
MAX_RANK = MAX_INT32  # torch's ranks are int32
MAX_PID = 2**22  # Linux's PID_MAX_LIMIT
MAX_TIME = 32_503_680_000.0  # 3000-01-01 in Unix seconds: `at`, a sender's wall clock
MAX_SECONDS = 1e9  # any duration (about 31 years)
MAX_NAME, MAX_PATH = 1_024, 4_096  # a phase name or a status; a checkpoint location (a URL)
MAX_TEXT = 16_384  # an error message, a reason
MAX_LIST = 65_536  # ranks listed in one message
MAX_METRIC = 1e300  # a loss or learning rate (a non-finite one is sent as null)


class ContractError(ValueError):
    """A message that breaks the contract (unknown kind, missing or bad field)."""


class Field(NamedTuple):
    """One field of a message: its type, and its bounds (inclusive) or longest length."""

    of: type  # int, float (int accepted), str, bool, list (of ranks), or a str Enum
    required: bool = False
    nullable: bool = False  # None allowed
    low: float = 0
    high: float = 0
    max_len: int = 0

    def problem(self, value: object) -> str | None:
        """Why `value` does not fit, or None when it does."""
        if value is None:
            return None if self.nullable else "is null"
        t = self.of
        if t is bool:
            return None if isinstance(value, bool) else f"is not a bool: {show(value)}"
        if t is int or t is float:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or (
                    t is int and not isinstance(value, int)):
                return f"is not {'an int' if t is int else 'a number'}: {show(value)}"
            finite = not isinstance(value, float) or math.isfinite(value)
            if not (finite and self.low <= value <= self.high):
                return f"is out of [{self.low:g}, {self.high:g}]: {show(value)}"
            return None
        if t is list:
            if not isinstance(value, list):
                return f"is not a list: {show(value)}"
            if len(value) > self.max_len:
                return f"lists {len(value)} items, more than {self.max_len}"
            item = Field(int, low=self.low, high=self.high or MAX_RANK)  # default: ranks
            bad = next((v for v in value if item.problem(v) is not None), None)
            return None if bad is None else f"lists a bad item: {show(bad)}"
        if not isinstance(value, str):
            return f"is not a string: {show(value)}"
        if issubclass(t, Enum):
            names = [str(m.value) for m in t]
            return None if value in names else f"is not one of {'/'.join(names)}: {show(value)}"
        if len(value) > self.max_len:
            return f"is {len(value)} characters long, more than {self.max_len}"
        return None


def int_field(low: int, high: int, required: bool = False, nullable: bool = False) -> Field:
    return Field(int, required, nullable, low, high)


def seconds_field(low: float = 0.0, nullable: bool = True) -> Field:
    return Field(float, nullable=nullable, low=low, high=MAX_SECONDS)


def text_field(max_len: int, required: bool = False, nullable: bool = False) -> Field:
    return Field(str, required, nullable, max_len=max_len)


def checked(kind: str, spec: dict[str, Field], fields: dict[str, Any]) -> dict[str, Any]:
    """The fields `spec` names, each checked (required ones present, values in bounds)."""
    for name, f in spec.items():
        if name not in fields:
            if f.required:
                raise ContractError(f"{kind}: required field {name!r} is missing")
            continue
        why = f.problem(fields[name])
        if why is not None:
            raise ContractError(f"{kind}: field {name!r} {why}")
    return {name: v for name, v in fields.items() if name in spec}


def show(v: object) -> str:
    return r if len(r := repr(v)) <= 60 else r[:57] + "..."
