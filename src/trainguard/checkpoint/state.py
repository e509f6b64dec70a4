"""Turning training objects into a checkpointable tree and back.

- `stage` copies every tensor into host buffers that are allocated on the first save and
  reused after (a bare copy: the least a save can block the loop), so the background
  writer serialises a snapshot that training can no longer change.
- Only plain data goes in (tensors, numbers, strings, bools, None, lists, tuples, dicts), so
  loading never runs pickled code (`torch.load(weights_only=True)`).
- RNG states (Python, NumPy, torch CPU and CUDA) are captured and restored per rank.
"""

from __future__ import annotations

import random
import sys
from collections.abc import Mapping, MutableMapping
from typing import Any

import torch

from trainguard.checkpoint.errors import CheckpointError
from trainguard.checkpoint.sampler import data_state, is_data_position, load_data_state
from trainguard.checkpoint.sharded import KEYS as SHARDED_KEYS
from trainguard.checkpoint.sharded import is_sharded, sharded_state_dict

PLAIN = (int, float, bool, str, type(None))


class BufferPool:
    """Host buffers for staged tensors, kept between saves (same path, shape, dtype: reused)."""

    def __init__(self) -> None:
        self._bufs: dict[str, torch.Tensor] = {}
        self.cuda_copies = False

    def copy(self, path: str, t: torch.Tensor) -> torch.Tensor:
        buf = self._bufs.get(path)
        if buf is None or buf.shape != t.shape or buf.dtype != t.dtype:
            pin = t.is_cuda
            buf = torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=pin)
            buf.zero_()  # touch the pages now, not during the first copy
            self._bufs[path] = buf
        buf.copy_(t.detach(), non_blocking=t.is_cuda)
        self.cuda_copies |= t.is_cuda
        return buf

    def settle(self) -> None:
        """Make asynchronous device-to-host copies complete before the buffers are read."""
        if self.cuda_copies:
            torch.cuda.synchronize()


def _stage(value: Any, key: str, pool: BufferPool, part: str) -> Any:
    """`key`: the value's place in the user's state (`bad`, `optimizer/state/0`), named when
    it is not plain data; the pool's buffers are kept by `part` and key (walk-through 35 F7:
    the refusal named the internal path `r/bad`)."""
    if isinstance(value, torch.Tensor):
        return pool.copy(f"{part}/{key}", value)
    if isinstance(value, PLAIN):
        return value
    if isinstance(value, Mapping):
        return {k: _stage(v, f"{key}/{k}", pool, part) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        staged = [_stage(v, f"{key}/{i}", pool, part) for i, v in enumerate(value)]
        return staged if isinstance(value, list) else tuple(staged)
    kind = type(value).__name__
    raise CheckpointError(
        f"cannot checkpoint {key!r}: {'an' if kind[:1] in 'aeiouAEIOU' else 'a'} {kind} is "
        "not plain data. Fix: keep state to tensors, numbers, strings, lists and dicts (or "
        "objects with state_dict())")


def split(state: Mapping[str, Any]
          ) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """The user's state -> (replicated, per-rank, sharded) parts, as state dicts and data.

    Data positions (samplers, stateful data loaders) are per rank; state dicts holding
    DTensors (FSDP2) are sharded; everything else is replicated across data-parallel ranks
    and written once, by rank 0.
    """
    replicated: dict[str, Any] = {}
    per_rank: dict[str, Any] = {}
    sharded: dict[str, Any] = {}
    for key, obj in state.items():
        if is_data_position(obj):
            per_rank[key] = data_state(obj)
        elif hasattr(obj, "state_dict") and callable(obj.state_dict):
            sd = obj.state_dict()
            if is_sharded(sd):
                sharded[key] = sharded_state_dict(key, state)
            else:
                replicated[key] = sd
        else:
            replicated[key] = obj
    if sharded:
        replicated[SHARDED_KEYS] = sorted(sharded)
    return replicated, per_rank, sharded


def stage(tree: dict[str, Any], pool: BufferPool, part: str) -> dict[str, Any]:
    """`tree`'s tensors copied into the pool's host buffers of `part` (its name there)."""
    out = {k: _stage(v, str(k), pool, part) for k, v in tree.items()}
    pool.settle()
    return out


def apply(state: Mapping[str, Any], loaded: Mapping[str, Any], where: str) -> None:
    """Load a checkpoint part into the user's objects in place (plain values: into `state`)."""
    for key, value in loaded.items():
        if key not in state or key == SHARDED_KEYS:
            continue  # saved but no longer asked for: ignore
        obj = state[key]
        if is_data_position(obj):
            load_data_state(obj, value)
        elif hasattr(obj, "load_state_dict") and callable(obj.load_state_dict):
            obj.load_state_dict(value)
        elif isinstance(state, MutableMapping):
            state[key] = value
    sharded = set(loaded.get(SHARDED_KEYS, ())) if where == "replicated" else set()
    missing = [k for k in state if k not in loaded and k not in sharded
               and not _is_other_part(state[k], where)]
    if missing:
        raise CheckpointError(
            f"the checkpoint has no {', '.join(map(repr, missing))}. Fix: resume with the "
            "state keys it was saved with, or start from a fresh checkpoint location")


def _is_other_part(obj: Any, where: str) -> bool:
    return is_data_position(obj) != (where == "rank")


RNG_KEY = "__rng__"  # the key of the RNG state in a rank's per-rank part (saved and loaded)


def capture_rng() -> dict[str, Any]:
    version, internal, gauss = random.getstate()
    rng: dict[str, Any] = {"python": [version, list(internal), gauss],
                           "torch": torch.get_rng_state()}
    np = sys.modules.get("numpy")
    if np is not None:
        name, keys, pos, has_gauss, cached = np.random.get_state()
        rng["numpy"] = [str(name), torch.from_numpy(keys.copy()), int(pos), int(has_gauss),
                        float(cached)]
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        rng["cuda"] = torch.cuda.get_rng_state_all()
    return rng


def restore_rng(rng: Mapping[str, Any]) -> None:
    if "python" in rng:
        version, internal, gauss = rng["python"]
        random.setstate((version, tuple(internal), gauss))
    if "torch" in rng:
        torch.set_rng_state(rng["torch"])
    np = sys.modules.get("numpy")
    if np is not None and "numpy" in rng:
        name, keys, pos, has_gauss, cached = rng["numpy"]
        np.random.set_state((name, keys.numpy(), pos, has_gauss, cached))
    if "cuda" in rng and torch.cuda.is_available():
        states = rng["cuda"][: torch.cuda.device_count()]
        torch.cuda.set_rng_state_all(states)
