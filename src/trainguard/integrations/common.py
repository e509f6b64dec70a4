"""What every trainer integration shares: the commit marker and the newest committed
checkpoint. Standard library only (the frameworks are imported by their own modules).

A framework's checkpoint directory counts as committed only once trainguard wrote its marker
(COMMIT_MARKER, a small JSON file written atomically after every rank's part of the save has
returned). Resume takes the newest committed directory, or none: never an incomplete one
left by a kill in the middle of a save, and never an error on the first attempt.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from trainguard.worker import channel
from trainguard.worker.contract import ENV_AUTO_RESUME, SOURCE_STORAGE, MessageKind

COMMIT_MARKER = ".trainguard-committed"
__all__ = ["COMMIT_MARKER", "ENV_AUTO_RESUME", "is_committed", "mark_committed", "newest"]


def mark_committed(ckpt_dir: Path, step: int, write_s: float | None = None,
                   blocked_s: float | None = None) -> None:
    """Write `ckpt_dir`'s commit marker (atomically, durably) and tell the launcher: the
    job's CheckpointSaved event. Call once, on one rank, after every rank's save returned."""
    marker = ckpt_dir / COMMIT_MARKER
    tmp = ckpt_dir / f"{COMMIT_MARKER}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump({"step": step, "committed_at": time.time()}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, marker)
    fd = os.open(ckpt_dir, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    channel.send(MessageKind.CHECKPOINT_SAVED, step=step, location=str(ckpt_dir),
                 bytes=dir_bytes(ckpt_dir), write_s=write_s, blocked_s=blocked_s)


def resumed(ckpt_dir: Path, step: int) -> None:
    """Tell the launcher this rank resumes from `ckpt_dir` (the job's Resumed event)."""
    channel.send(MessageKind.RESUMED, step=step, location=str(ckpt_dir),
                 source=SOURCE_STORAGE)


def is_committed(ckpt_dir: Path) -> bool:
    try:
        return int(json.loads((ckpt_dir / COMMIT_MARKER).read_text())["step"]) >= 0
    except (OSError, ValueError, KeyError, TypeError):
        return False


def numbered_dirs(root: Path, pattern: str) -> list[tuple[int, Path]]:
    """(number, dir) of the dirs in `root` whose name matches `pattern` (one group: the
    number), newest number first."""
    rx = re.compile(pattern)
    found = []
    try:
        for d in root.iterdir():
            m = rx.fullmatch(d.name)
            if m and d.is_dir():
                found.append((int(m.group(1)), d))
    except OSError:
        return []
    return sorted(found, key=lambda x: x[0], reverse=True)


def newest(candidates: Iterable[tuple[int, Path]],
           complete: Callable[[Path], bool]) -> Path | None:
    """The newest committed candidate; when none carries a marker (saved before trainguard
    ran the job), the newest that `complete` accepts; else None."""
    ordered = list(candidates)
    for _, d in ordered:
        if is_committed(d):
            return d
    if any((d / COMMIT_MARKER).exists() for _, d in ordered):
        return None  # markers exist but none is readable: trust nothing unmarked
    return next((d for _, d in ordered if complete(d)), None)


def dir_bytes(path: Path) -> int:
    total = 0
    for dirpath, _, files in os.walk(path):
        for f in files:
            try:
                total += os.path.getsize(os.path.join(dirpath, f))
            except OSError:
                continue
    return total
