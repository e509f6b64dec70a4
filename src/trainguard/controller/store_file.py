"""The job store's file: a read-only connection, the files of a store half made, and the
fix for a store that cannot be opened (split from store.py)."""

from __future__ import annotations

import contextlib
import os
import sqlite3
from pathlib import Path

from trainguard.controller.store_rows import move_aside_fix
from trainguard.errors import StoreError

BUSY_TIMEOUT_S = 5.0
_SIDE_FILES = ("-wal", "-shm", "-journal")  # SQLite's files beside the store


def remove_store_files(path: Path) -> None:
    """Remove a store and SQLite's files beside it (one this launch half made)."""
    for f in (path, *(path.with_name(path.name + side) for side in _SIDE_FILES)):
        with contextlib.suppress(OSError):
            f.unlink()


def connect_readonly(path: Path) -> sqlite3.Connection:
    """A read-only connection. Immutable (no locks, no WAL read) only where nobody writes:
    this user cannot write the dir and no write-ahead log is left (a live writer keeps
    one; an immutable reader would miss what it holds)."""
    wal = path.with_name(path.name + "-wal")
    idle = not wal.exists() or wal.stat().st_size == 0
    query = ("mode=ro" if os.access(path.parent, os.W_OK) or not idle
             else "mode=ro&immutable=1")
    try:
        conn = sqlite3.connect(
            f"{path.resolve().as_uri()}?{query}",
            uri=True,
            timeout=BUSY_TIMEOUT_S,
            isolation_level=None,
            check_same_thread=False,
        )
        conn.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()
    except sqlite3.Error as e:
        why = ("; it is being written (a -wal file exists) and this user cannot write "
               f"{path.parent}. Fix: read it as the job's owner, or once the job ended"
               if not idle and not os.access(path.parent, os.W_OK) else store_fix(e, path))
        raise StoreError(f"cannot read the job store {path}: {e}{why}") from e
    return conn


def store_fix(e: sqlite3.Error, path: Path) -> str:
    """The fix for a store file that is no database or a damaged one, or on a full disk
    (walk-through 40 #6: "database or disk is full" said no fix); '' for any other error."""
    words = str(e).lower()
    if full_disk(e):
        return (f". Fix: free space on the disk of {path.parent} (`df -h {path.parent}`) or "
                "check it, or launch with another --job-dir")
    if not isinstance(e, sqlite3.DatabaseError) or not (
            "not a database" in words or "malformed" in words):
        return ""
    return move_aside_fix(path)


def full_disk(e: BaseException) -> bool:
    """Whether SQLite's error (or one raised from it) says the disk is full."""
    words = f"{e} {e.__cause__ or ''}".lower()
    return "disk is full" in words or "disk i/o error" in words
