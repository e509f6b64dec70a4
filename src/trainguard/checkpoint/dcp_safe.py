"""Loading a DCP checkpoint without running pickled code.

DCP keeps its `.metadata` as a pickle and loads non-tensor items with
`torch.load(weights_only=False)`. Here `.metadata` is read by an unpickler that admits only
DCP's own metadata classes, torch dtypes, `torch.Size`, the layout helper and paths, and
every non-tensor item must first load with `weights_only=True` (the same allowlist torch
uses). Anything else raises `pickle.UnpicklingError`: a checkpoint location someone else
could write cannot run code in the ranks that load it.
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Callable
from typing import Any

import torch
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import ReadItem

METADATA_MODULE = "torch.distributed.checkpoint.metadata"
_ALLOWED = frozenset({
    ("torch", "Size"), ("torch.serialization", "_get_layout"),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("pathlib", "PosixPath"), ("pathlib", "PurePosixPath"), ("collections", "OrderedDict")})


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if module == METADATA_MODULE or (module, name) in _ALLOWED:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not allowed in a DCP .metadata "
                                     "file (only DCP's metadata, dtypes and sizes are)")


def load_metadata(data: bytes) -> Metadata:
    md = _MetadataUnpickler(io.BytesIO(data)).load()
    if not isinstance(md, Metadata):
        raise pickle.UnpicklingError(f"a DCP .metadata file holds a {type(md).__name__}")
    return md


Retry = Callable[[str, Callable[[], Any]], Any]  # (what, read) -> read(), tried again


def _once(what: str, read: Callable[[], Any]) -> Any:
    return read()


def safe_reader(reader_cls: type[Any], metadata: Callable[[], bytes], *args: Any,
                retry: Retry = _once, **kwargs: Any) -> Any:
    """An instance of DCP's `reader_cls(*args, **kwargs)` whose `.metadata` is `metadata()`
    (the bytes, read by the caller) through the restricted unpickler. Its reads of the
    shards go through `retry` (a storage error tried again: every tensor read is a copy
    into its place, so a read done again is the same)."""

    class SafeReader(reader_cls):  # type: ignore[misc]
        def read_data(self, plan: Any, planner: Any) -> Any:
            return retry("a DCP shard", lambda: super(SafeReader, self).read_data(
                plan, planner))

        def read_metadata(self, *_: Any, **__: Any) -> Metadata:
            md = load_metadata(metadata())
            storage = md.storage_meta or StorageMeta()
            storage.load_id = self.load_id
            md.storage_meta = storage
            return md

    return SafeReader(*args, **kwargs)


class SafeLoadPlanner(DefaultLoadPlanner):
    """DCP's planner, but a non-tensor item must load with `weights_only=True` first."""

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        start = value.tell()
        torch.load(value, weights_only=True)  # raises on anything but plain data
        value.seek(start)
        super().load_bytes(read_item, value)
