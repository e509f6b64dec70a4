"""Where checkpoints live: a local directory or any fsspec URL (s3://bucket/prefix, ...).

Local writes are fsynced (file, then directory) and published by atomic rename; object
stores have no rename, so files go to their final names and the manifest, one atomic PUT,
is what publishes them. Either way a reader sees a checkpoint only once it is complete.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import posixpath
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

from trainguard.checkpoint.errors import CheckpointError
from trainguard.checkpoint.manifest import parse_step_dir, step_dir
from trainguard.checkpoint.store_errors import missing_bucket, missing_bucket_problem

CHUNK = 8 << 20
SLICE = 4 << 20


class HashingWriter:
    """A write-only file object that counts and hashes what passes through it."""

    def __init__(self, raw: IO[bytes]) -> None:
        self._raw = raw
        self._sha = hashlib.sha256()
        self.size = 0
        self.error: OSError | None = None  # the first write error (ENOSPC...), kept verbatim

    def write(self, data: bytes | bytearray | memoryview) -> int:
        # Hash and write slice by slice: each slice is still in the CPU cache when written
        # (whole 64 MiB tensor records were read from memory twice: measured 1.3x slower).
        view = memoryview(data).cast("B")
        for start in range(0, len(view), SLICE):
            piece = view[start:start + SLICE]
            self._sha.update(piece)
            try:
                self._raw.write(piece)
            except OSError as e:
                self.error = self.error or e
                raise
        self.size += len(view)
        return len(view)

    def flush(self) -> None:
        self._raw.flush()

    def hexdigest(self) -> str:
        return self._sha.hexdigest()


class Storage:
    """A checkpoint location. Paths given to methods are relative to it, with '/'."""

    def __init__(self, location: str | os.PathLike[str],
                 storage_options: dict[str, Any] | None = None) -> None:
        self.location = str(location)
        self.storage_options = dict(storage_options or {})
        fs, root = fsspec.core.url_to_fs(self.location, **self.storage_options)
        self.fs: fsspec.AbstractFileSystem = fs
        self.root: str = root.rstrip("/") or "/"
        self.local = isinstance(fs, LocalFileSystem)

    def path(self, *parts: str) -> str:
        return posixpath.join(self.root, *parts)

    # -- writing --------------------------------------------------------------------------

    def staging_dir(self, step: int, token: str) -> str:
        """Where a save of `step` writes first (shared by every rank of one save)."""
        return f".tmp-{step_dir(step)}-{token}" if self.local else step_dir(step)

    def write_stream(self, rel: str, write: Callable[[HashingWriter], None]) -> tuple[int, str]:
        """Write a file through `write`, durable when this returns: (size, sha256)."""
        path = self.path(rel)
        w: HashingWriter | None = None
        try:
            if self.local:
                Path(path).parent.mkdir(parents=True, exist_ok=True)
                with open(path, "wb") as raw:
                    w = HashingWriter(raw)
                    write(w)
                    raw.flush()
                    os.fsync(raw.fileno())
                _fsync_dir(Path(path).parent)
            else:
                with self.fs.open(path, "wb") as raw:
                    w = HashingWriter(raw)
                    write(w)
        except Exception as e:
            # torch's zip writer turns an ENOSPC from write() into "unexpected pos ...":
            # report the storage's own error, which names the cause
            if w is not None and w.error is not None and w.error is not e:
                raise w.error from e
            raise
        return w.size, w.hexdigest()

    def write_atomic(self, rel: str, data: bytes) -> None:
        """Replace a small file in one step (readers see the old or the new, never half)."""
        path = self.path(rel)
        if not self.local:
            self.fs.pipe_file(path, data)
            return
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex[:8]}.tmp")
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
        _fsync_dir(target.parent)

    def publish(self, staging: str, step: int) -> None:
        """Move a complete local save to `step-N` atomically (object stores: in place already)."""
        if not self.local or staging == step_dir(step):
            return
        final = Path(self.path(step_dir(step)))
        if final.exists():  # a broken leftover of this step (a valid one is never re-saved)
            self.remove(final.name)
        os.rename(self.path(staging), final)
        _fsync_dir(final.parent)

    def remove(self, rel: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm(self.path(rel), recursive=True)

    # -- reading --------------------------------------------------------------------------

    def read_bytes(self, rel: str) -> bytes:
        data = self.fs.cat_file(self.path(rel))
        return bytes(data)

    def exists(self, rel: str) -> bool:
        return bool(self.fs.exists(self.path(rel)))

    def sha256(self, rel: str) -> str:
        h = hashlib.sha256()
        with self.fs.open(self.path(rel), "rb") as f:
            while chunk := f.read(CHUNK):
                h.update(chunk)
        return h.hexdigest()

    def sizes(self, rel: str) -> dict[str, int]:
        """Files directly in a directory: name -> size (empty when it does not exist)."""
        try:
            entries = self.fs.ls(self.path(rel), detail=True, refresh=True)
        except (FileNotFoundError, NotADirectoryError):
            return {}
        return {posixpath.basename(e["name"].rstrip("/")): int(e.get("size") or 0)
                for e in entries if e.get("type") == "file"}

    def tree_sizes(self, rel: str) -> dict[str, int]:
        """Every file under a directory, by path relative to it: name -> size."""
        base = self.path(rel).rstrip("/") + "/"
        try:
            found = self.fs.find(self.path(rel), detail=True)
        except FileNotFoundError:
            return {}
        return {str(name)[len(base):] if str(name).startswith(base) else str(name):
                int(info.get("size") or 0) for name, info in found.items()}

    def children(self) -> list[str]:
        """Names directly under the location."""
        try:
            entries = self.fs.ls(self.root, detail=False, refresh=True)
        except FileNotFoundError:
            return []
        return [posixpath.basename(str(e).rstrip("/")) for e in entries]

    def check_bucket(self) -> None:
        """Raise CheckpointError when the store answers that the location's bucket does not
        exist (NoSuchBucket; walk-through 35 F2: the listing read it as no checkpoint yet, and
        the job trained until its first saves failed); any other answer passes."""
        if self.local:
            return
        try:
            self.fs.ls(self.root, detail=False, refresh=True)
        except Exception as e:
            bucket = missing_bucket(e, self.location)
            if bucket is not None:
                problem, fix = missing_bucket_problem(self.location, bucket)
                raise CheckpointError(f"{problem}: nothing can be saved there. Fix: {fix}, "
                                      "then run the job again") from e

    def steps(self) -> list[int]:
        """Steps that have a `step-N` directory, newest first."""
        found = {s for name in self.children() if (s := parse_step_dir(name)) is not None}
        return sorted(found, reverse=True)

    def local_path(self, rel: str) -> Path | None:
        return Path(self.path(rel)) if self.local else None


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
