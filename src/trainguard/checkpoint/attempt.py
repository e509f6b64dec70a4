"""Who this rank is and which attempt it saves for: its rank and world size, the save token
every rank of one attempt shares (a checkpoint's staging dir is named by it), and what the
ranks decide together (a collective save: every rank enters it, or none)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Sequence
from typing import Literal

import torch

from trainguard.checkpoint.errors import CheckpointError
from trainguard.worker.contract import (
    ENV_MASTER_PORT,
    ENV_RANK,
    ENV_RESTART_COUNT,
    ENV_RUN_ID,
    ENV_WORLD_SIZE,
)


def rank_and_world() -> tuple[int, int]:
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    env = os.environ
    return int(env.get(ENV_RANK, "0")), int(env.get(ENV_WORLD_SIZE, "1"))


_TOKEN: list[str] = []  # agreed once per process when the launcher's variables are absent


def save_token() -> str:
    """The same on every rank of one attempt, different across attempts."""
    env = os.environ
    parts = [env.get(k, "") for k in (ENV_RUN_ID, ENV_RESTART_COUNT, ENV_MASTER_PORT)]
    token = "-".join(p for p in parts if p)
    if token:
        return token
    if not _TOKEN:
        _TOKEN.append(_agreed_token())
    return _TOKEN[0]


def _agreed_token() -> str:
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        box = [uuid.uuid4().hex[:12]]
        dist.broadcast_object_list(box, src=0)  # collective: every rank builds a Checkpointer
        return str(box[0])
    if int(os.environ.get(ENV_WORLD_SIZE, "1")) > 1:
        raise CheckpointError("several ranks but no shared save token. Fix: launch with "
                              "trainguard run or torchrun, or init the process group first")
    return uuid.uuid4().hex[:12]


def reduce_ints(values: Sequence[int], op: Literal["max", "sum"]) -> list[int]:
    """`values` all-reduced element by element across the ranks: one collective, which every
    rank must call at the same point with as many values; as given without a process group."""
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return list(values)
    device = "cuda" if dist.get_backend() == "nccl" else "cpu"
    t = torch.tensor(list(values), dtype=torch.int64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM)
    return [int(v) for v in t.tolist()]


def job_run_id() -> str:
    """The job's run id under the launcher (the same in every attempt), else "": a manifest
    records it, so a save can tell its own job's commit from another job's."""
    return os.environ.get(ENV_RUN_ID, "")
