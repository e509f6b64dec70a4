"""Which jobs the dashboard shows: the job dirs named on the command line, and every job
dir found under `--root` (a dir holding the job store, at most two levels down), looked for
again on each listing. Each job gets an id for URLs, made from its path (stable, unique)."""

from __future__ import annotations

import hashlib
import os
import re
import stat
import threading
from dataclasses import dataclass
from pathlib import Path

from trainguard.paths import DB_NAME

ROOT_DEPTH = 2
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def job_id(job_dir: Path) -> str:
    """`<dir name>-<6 hex digits of its path's hash>`: readable, and unique per path."""
    digest = hashlib.sha256(str(job_dir).encode()).hexdigest()[:6]
    name = _UNSAFE.sub("-", job_dir.name).strip("-.")[:40] or "job"
    return f"{name}-{digest}"


def find_job_dirs(root: Path, depth: int = ROOT_DEPTH) -> list[Path]:
    """Dirs at most `depth` levels under `root` (root itself included) that hold a store;
    a job dir's own subdirs (logs, checkpoints) are not searched."""
    found: list[Path] = []
    level = [root]
    for _ in range(depth + 1):
        below: list[Path] = []
        for d in level:
            if _holds_store(d):
                found.append(d)
                continue
            try:
                below += sorted(p for p in d.iterdir() if p.is_dir() and not p.is_symlink())
            except OSError:
                continue
        level = below
    return found


def _holds_store(d: Path) -> bool:
    """A store of its own: a regular file, not a symlink to another job's (that one would
    be shown under this dir's name; walk-through 32 #5)."""
    try:
        return stat.S_ISREG(os.lstat(d / DB_NAME).st_mode)
    except OSError:
        return False


@dataclass
class Catalog:
    """The jobs on show; `jobs()` rescans the root, `find(id)` rescans once on a miss."""

    dirs: list[Path]
    root: Path | None = None

    def __post_init__(self) -> None:
        self.dirs = [d.resolve() for d in self.dirs]
        self.root = self.root.resolve() if self.root is not None else None
        self._lock = threading.Lock()
        self._known: dict[str, Path] = {}

    def jobs(self) -> dict[str, Path]:
        """id -> job dir, in command-line order, then the root's jobs by path."""
        found = list(self.dirs)
        if self.root is not None:
            found += [d for d in find_job_dirs(self.root) if d not in found]
        ids = {job_id(d): d for d in found}
        with self._lock:
            self._known = dict(ids)
        return ids

    def find(self, jid: str) -> Path | None:
        with self._lock:
            hit = self._known.get(jid)
        return hit if hit is not None else self.jobs().get(jid)
