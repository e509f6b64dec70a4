"""Exact, validated, asynchronous checkpoints (docs/checkpoints.md).

Importable from a training script without the launcher: it needs torch and fsspec only.
Names load on first use, so the launcher can read checkpoint listings without torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainguard.checkpoint.checkpointer import Checkpointer
    from trainguard.checkpoint.errors import CheckpointError
    from trainguard.checkpoint.listing import CheckpointInfo, list_checkpoints
    from trainguard.checkpoint.manifest import Status
    from trainguard.checkpoint.sampler import ResumableSampler

_WHERE = {
    "Checkpointer": "checkpointer", "CheckpointInfo": "listing",
    "list_checkpoints": "listing", "CheckpointError": "errors", "Status": "manifest",
    "ResumableSampler": "sampler",
}

__all__ = [
    "CheckpointError",
    "CheckpointInfo",
    "Checkpointer",
    "ResumableSampler",
    "Status",
    "list_checkpoints",
]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'trainguard.checkpoint' has no attribute {name!r}")
    return getattr(importlib.import_module(f"trainguard.checkpoint.{_WHERE[name]}"), name)
