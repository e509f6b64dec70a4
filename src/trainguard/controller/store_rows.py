"""The row types of the job store and their conversion to and from what SQLite keeps (what
a reader shows of the job, its state first, is controller/shown.py's).

Times are stored as full-precision ISO 8601 strings, so a row reads back exactly as written;
states as their enum values (trainguard.states).
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from enum import Enum
from pathlib import Path
from typing import Any

from trainguard.errors import StoreError
from trainguard.paths import DB_NAME, is_url
from trainguard.records import Event, Involved, Level, RunningRecord, from_iso
from trainguard.states import NodeState, StopCause, WorkerState

NODE_BACKENDS = ("local", "slurm")
_NODE_STATE_VALUES = tuple(s.value for s in NodeState)
META_TIMES = ("created_at", "ended_at", "last_progress_at")  # ISO 8601 when a string
# what a value that does not decode raises: a time that is no time, JSON that is no JSON
# (json.JSONDecodeError is a ValueError), a state no version wrote, a key a record lacks,
# a record that is no object
UNDECODABLE = (ValueError, TypeError, KeyError, AttributeError)


@contextmanager
def decoding(path: Path, what: str) -> Iterator[None]:
    """Where the store's readers turn its rows into values: one that does not decode (an
    edited or damaged store) is a StoreError naming the table and the fix, as a damaged file
    is; the CLI prints it as one line, the dashboard as the job's row's `error` and a 503
    (walk-through 34 #3: one bad time made the whole job list a 500, `status` a traceback)."""
    try:
        yield
    except UNDECODABLE as e:
        raise StoreError(f"cannot read {what} from the job store {path}: one of its values "
                         f"cannot be decoded ({type(e).__name__}: {e})"
                         f"{move_aside_fix(path)}") from e


def move_aside_fix(path: Path) -> str:
    """The fix for a damaged store: a file that is no database, or a value in it that does
    not decode (walk-through 21: every command said only `file is not a database`)."""
    return (f". Fix: the store is damaged; move it and its -wal and -shm files aside (`for f "
            f"in {path}*; do mv $f $f.damaged; done`) and launch again with the same --job-dir "
            "(a new store: the checkpoints are still found and resumed, the old events and "
            "attempts are lost; a warning names the moved files), or use another --job-dir; "
            "the logs and checkpoints are intact (`trainguard diagnose LOG_DIR`, `trainguard "
            "ckpt ls CHECKPOINT_DIR`)")


STILL_CREATING_S = 10.0  # a launcher writes the schema within ms of making the file


def empty_store(path: Path) -> str:
    """What an empty store file (no schema) means: a launch making it now, or, unchanged for
    STILL_CREATING_S, one that died before it wrote it (walk-through 35 F5: "still being
    created; try again" of a file two days old)."""
    try:
        changed = path.stat().st_mtime
    except OSError:
        changed = time.time()
    if time.time() - changed < STILL_CREATING_S:
        return f"{path} is empty: the job is still being created; try again"
    since = datetime.fromtimestamp(changed, timezone.utc).isoformat(timespec="seconds")
    return (f"{path} is empty and has not changed since {since}: a launch that died before "
            "writing it (killed, or the disk full). Fix: run the `trainguard run` command "
            f"again with --job-dir {path.parent} (it makes the store anew), or remove "
            f"{path.parent}")


def meta_from_rows(rows: list[tuple[str, str]]) -> dict[str, Any]:
    """The meta table's (key, JSON) rows as a dict; a time of META_TIMES that is a string
    must be ISO 8601 (ValueError: the goodput and the list read them)."""
    meta = {k: json.loads(v) for k, v in rows}
    for key in META_TIMES:
        if isinstance(meta.get(key), str):
            datetime.fromisoformat(meta[key])
    return meta


@dataclass(frozen=True)
class WorkerRow:
    """One worker process of one attempt, as the controller last saw it."""

    attempt: int
    rank: int
    local_rank: int
    node: str
    pid: int | None
    state: WorkerState
    exit_code: int | None = None
    signal: str | None = None  # e.g. "SIGKILL" when a signal ended it
    started_at: datetime | None = None
    ended_at: datetime | None = None
    start_count: int = 1
    oom_killed: bool | None = None  # SIGKILLed while the kernel's OOM-kill count rose
    second_last_step_at: datetime | None = None  # when it reached the step before its latest
    stopped_by: StopCause | None = None  # a stopped rank's: the launcher, or from outside


@dataclass(frozen=True)
class NodeRow:
    """One node of a multi-node job, as the controller last saw it."""

    name: str
    host: str
    state: NodeState
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
        if n.state not in _NODE_STATE_VALUES:
            raise ValueError(f"put_nodes: node {n.name!r} has state {n.state!r}, "
                             f"not one of {', '.join(_NODE_STATE_VALUES)}")
        if n.backend not in NODE_BACKENDS:
            raise ValueError(f"put_nodes: node {n.name!r} has backend {n.backend!r}, "
                             f"not one of {', '.join(NODE_BACKENDS)}")


def to_row(obj: WorkerRow | NodeRow) -> tuple[Any, ...]:
    """The column values of a row object, times as full-precision ISO strings, states as
    their values."""
    return tuple(
        v.isoformat() if isinstance(v, datetime) else v.value if isinstance(v, Enum) else v
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
    values["second_last_step_at"] = from_iso(values["second_last_step_at"])
    values["oom_killed"] = None if values["oom_killed"] is None else bool(values["oom_killed"])
    values["state"] = WorkerState(values["state"])
    values["stopped_by"] = None if values["stopped_by"] is None else StopCause(
        values["stopped_by"])
    return WorkerRow(**values)


def node_from_row(row: tuple[Any, ...]) -> NodeRow:
    values = dict(zip(NODE_COLUMNS, row, strict=True))
    values["updated_at"] = datetime.fromisoformat(values["updated_at"])
    values["state"] = NodeState(values["state"])
    return NodeRow(**values)


def event_from_row(row: tuple[Any, ...]) -> Event:
    """An events row (time .. data) as an Event (ValueError, TypeError: see `decoding`)."""
    time, level, reason, message, job, node, rank, attempt, data = row
    return Event(
        time=datetime.fromisoformat(time),
        level=Level(level),
        reason=reason,
        message=message,
        involved=Involved(job=job, node=node, rank=rank, attempt=attempt),
        data=None if data is None else json.loads(data),
    )



def db_path(job_dir: Path) -> Path:
    """The store file of a job dir."""
    return Path(job_dir) / DB_NAME


def holds_job_dirs(d: Path) -> bool:
    """A folder of jobs (`trainguard-runs/`), not a job dir itself."""
    return not db_path(d).is_file() and any(p.is_file() for p in d.glob(f"*/{DB_NAME}"))


def moved_with_job_dir(recorded: str, recorded_job_dir: str | None, job_dir: Path) -> str:
    """Where to read a dir the store `recorded` (absolute) when the job dir is `job_dir`:
    the same place inside `job_dir` if it lay inside the job dir as recorded and the job dir
    has since moved (a copy, an archive, a renamed dir); otherwise as recorded (a URL, a dir
    outside the job dir such as `--checkpoint-dir /shared/ck`, or a job dir in place)."""
    if is_url(recorded) or not recorded_job_dir:
        return recorded
    try:
        inside = Path(recorded).relative_to(recorded_job_dir)
    except ValueError:
        return recorded
    here = job_dir.resolve()
    if here == Path(recorded_job_dir).resolve():
        return recorded
    return str(here / inside)


def log_dir_of(meta: dict[str, Any], job_dir: Path) -> Path:
    """Where the job's rank logs are, as seen from `job_dir` (`--log-dir`, else
    JOB_DIR/logs; inside a job dir that was moved or copied, the copy's)."""
    d, was_at = meta.get("log_dir"), meta.get("job_dir")
    if not isinstance(d, str) or not d:
        return job_dir / "logs"
    return Path(moved_with_job_dir(d, was_at if isinstance(was_at, str) else None, job_dir))


def checkpoint_dir_of(meta: dict[str, Any], job_dir: Path) -> str:
    """Where the job's checkpoints are, as seen from `job_dir` (`--checkpoint-dir`, a URL as
    given, else JOB_DIR/checkpoints; inside a job dir that was moved or copied, the copy's)."""
    d, was_at = meta.get("checkpoint_dir"), meta.get("job_dir")
    if not isinstance(d, str) or not d:
        return str(job_dir / "checkpoints")
    return moved_with_job_dir(d, was_at if isinstance(was_at, str) else None, job_dir)
