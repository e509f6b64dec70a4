"""What a checkpoint location holds, step by step: `Checkpointer.list()` and
`trainguard.checkpoint.list_checkpoints` (sizes checked, not checksums: quick_verdict)."""

from __future__ import annotations

from dataclasses import dataclass

from trainguard.checkpoint.manifest import Status
from trainguard.checkpoint.saving import quick_verdict
from trainguard.checkpoint.storage import Storage


@dataclass(frozen=True)
class CheckpointInfo:
    step: int
    status: Status
    reason: str = ""


def list_checkpoints(st: Storage) -> list[CheckpointInfo]:
    """Every `step-N` at the location with its status (sizes checked, not checksums)."""
    out = []
    for step in st.steps():
        v, _ = quick_verdict(st, step)
        out.append(CheckpointInfo(step, v.status, v.reason))
    return out
