"""Exact, validated, asynchronous checkpoints (docs/checkpoints.md).

Importable from a training script without the launcher: it needs torch and fsspec only.
"""

from trainguard.checkpoint.checkpointer import Checkpointer, CheckpointInfo, list_checkpoints
from trainguard.checkpoint.errors import CheckpointError
from trainguard.checkpoint.manifest import Status
from trainguard.checkpoint.sampler import ResumableSampler

__all__ = [
    "CheckpointError",
    "CheckpointInfo",
    "Checkpointer",
    "ResumableSampler",
    "Status",
    "list_checkpoints",
]
