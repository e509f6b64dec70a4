"""What a job's store says, as `trainguard ls` and `trainguard prune` show it (one row per job
dir)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainguard.backends.orphans import agents_seen
from trainguard.cli.fmt import clock_or_dash, meta_time
from trainguard.controller.shown import last_progress, shown_state
from trainguard.controller.store import JobStore
from trainguard.errors import StoreError
from trainguard.node.usage import allocated_bytes
from trainguard.records import utcnow
from trainguard.states import JobState


def job_row(job_dir: Path) -> dict[str, Any]:
    """One job's line of `ls`: its size on disk, and what its store says (or the error)."""
    return {"job_dir": str(job_dir), "size_bytes": allocated_bytes(job_dir)[0]} | \
        read_job(job_dir)[0]


def read_job(job_dir: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """What the store says of a job (`ls`'s columns but the size), and its meta ({} when
    the store cannot be read: the row says why)."""
    try:
        with JobStore.open(job_dir) as store:
            meta = store.meta()
            attempts = len(store.running_records())
            progress = last_progress(meta, store.last_checkpoint())
            state = shown_state(meta)
            agents = agents_seen(meta, store.nodes(), state == JobState.LOST.value)
    except StoreError as e:
        return {"job_dir": str(job_dir), "run_id": None, "state": "unreadable",
                "error": str(e)}, {}
    return {
        "job_dir": str(job_dir),
        "run_id": meta.get("run_id"), "state": state, "attempts": attempts,
        "agents_without_controller": agents.alive, "agents_unknown": agents.unknown,
        "last_step": progress["step"], "last_progress_at": progress["time"],
        "progress_source": progress["source"],
        "created_at": meta.get("created_at"), "ended_at": meta.get("ended_at")}, meta


def when(value: Any) -> str:
    """A time of today as its clock, of another day as its date; `-` for none."""
    at = meta_time(value)
    if at is None:
        return "-"
    return clock_or_dash(value) if at.date() == utcnow().date() else at.strftime("%Y-%m-%d")
