"""The row types of the job store and their conversion to and from what SQLite keeps.

Times are stored as full-precision ISO 8601 strings, so a row reads back exactly as written.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from trainguard.records import RunningRecord, from_iso

NODE_STATES = ("healthy", "spare", "lost", "isolated")
NODE_BACKENDS = ("local", "slurm")


@dataclass(frozen=True)
class WorkerRow:
    """One worker process of one attempt, as the controller last saw it."""

    attempt: int
    rank: int
    local_rank: int
    node: str
    pid: int | None
    state: str  # starting | running | succeeded | failed | stopped
    exit_code: int | None = None
    signal: str | None = None  # e.g. "SIGKILL" when a signal ended it
    started_at: datetime | None = None
    ended_at: datetime | None = None
    start_count: int = 1
    oom_killed: bool | None = None  # SIGKILLed while the kernel's OOM-kill count rose


@dataclass(frozen=True)
class NodeRow:
    """One node of a multi-node job, as the controller last saw it."""

    name: str
    host: str
    state: str  # healthy | spare | lost | isolated (NODE_STATES)
    agent_pid: int | None  # the node agent's pid, None when none runs
    slot: int | None  # group rank in the current placement; None for spares and isolated
    reason: str | None  # why the node is lost or isolated
    updated_at: datetime
    backend: str  # local | slurm (NODE_BACKENDS)
    times_implicated: int = 0  # faults this node was blamed for


WORKER_COLUMNS = tuple(f.name for f in dataclasses.fields(WorkerRow))
NODE_COLUMNS = tuple(f.name for f in dataclasses.fields(NodeRow))


def node_order(node: NodeRow) -> tuple[bool, int, str]:
    """The order of nodes(): by slot, nodes without one last, then by name."""
    return (node.slot is None, node.slot or 0, node.name)


def check_nodes(nodes: list[NodeRow]) -> None:
    """Refuse unknown states or backends and a name given twice (ValueError)."""
    names = [n.name for n in nodes]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"put_nodes: nodes {twice} are given more than once")
    for n in nodes:
        if n.state not in NODE_STATES:
            raise ValueError(f"put_nodes: node {n.name!r} has state {n.state!r}, "
                             f"not one of {', '.join(NODE_STATES)}")
        if n.backend not in NODE_BACKENDS:
            raise ValueError(f"put_nodes: node {n.name!r} has backend {n.backend!r}, "
                             f"not one of {', '.join(NODE_BACKENDS)}")


def to_row(obj: WorkerRow | NodeRow) -> tuple[Any, ...]:
    """The column values of a row object, times as full-precision ISO strings."""
    return tuple(
        v.isoformat() if isinstance(v, datetime) else v
        for v in (getattr(obj, f.name) for f in dataclasses.fields(obj))
    )


def _precise_times(obj: Any, d: dict[str, Any]) -> dict[str, Any]:
    """Replace the millisecond times of to_dict() by full-precision ones (exact round trip)."""
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if isinstance(value, datetime):
            d[f.name] = value.isoformat()
    return d


def running_to_json(rec: RunningRecord) -> dict[str, Any]:
    d = _precise_times(rec, rec.to_dict())
    d["recover_records"] = [_precise_times(r, r.to_dict()) for r in rec.recover_records]
    return d


def worker_from_row(row: tuple[Any, ...]) -> WorkerRow:
    values = dict(zip(WORKER_COLUMNS, row, strict=True))
    values["started_at"] = from_iso(values["started_at"])
    values["ended_at"] = from_iso(values["ended_at"])
    values["oom_killed"] = None if values["oom_killed"] is None else bool(values["oom_killed"])
    return WorkerRow(**values)


def node_from_row(row: tuple[Any, ...]) -> NodeRow:
    values = dict(zip(NODE_COLUMNS, row, strict=True))
    values["updated_at"] = datetime.fromisoformat(values["updated_at"])
    return NodeRow(**values)
