"""The files of a job the dashboard opens (rank logs, stack dumps, hang.json), and how: only
regular files inside the job dir it lists, owned by that dir's owner, never through a symlink
(walk-through 32 #5: a job dir under a shared `--root` is whoever made it; its symlinks and its
store's `log_dir` made the dashboard read any file *its* user could, for any local user).

- The job dir is opened and its real path checked against the catalog's (no symlink put in
  its path since it was found); every dir below it is opened with O_NOFOLLOW relative to its
  parent, the file itself with O_NOFOLLOW | O_NONBLOCK (a FIFO must not hang the request),
  then checked with fstat: a regular file, owned by the job dir's owner (a hard link to
  somebody else's file is theirs).
- The log dir a store names outside its job dir (`--log-dir /scratch/logs`) is read only
  when the job dir is the dashboard user's own and writable by nobody else: then the store
  that names it is that user's too. Other users' jobs show their logs inside their job dir.
- A job's store (`trainguard.db`) must be a regular file, not a symlink, of the same owner.

A file refused is `Refused` (HTTP 403, the message says why and what to do).
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainguard.controller.store_rows import log_dir_of
from trainguard.paths import DB_NAME

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_WHAT = "the dashboard serves only regular files inside a job dir, owned by its owner"


class Refused(Exception):
    """A file or dir the dashboard will not read, and why (HTTP 403)."""


@dataclass(frozen=True)
class LogRoot:
    """Where a job's rank logs are, and what may be read under them."""

    path: Path  # the log dir, as shown
    base: Path  # a real dir (no symlink in it) that the walk starts from
    parts: tuple[str, ...]  # from `base` down to the log dir
    owner: int  # the uid every file read must have: the job dir's owner

    def under(self, *names: str) -> Path:
        return self.path.joinpath(*names)


def owner_of(job_dir: Path) -> int:
    try:
        return os.stat(job_dir).st_uid
    except OSError as e:
        raise Refused(f"cannot read the job dir {job_dir}: {e.strerror}") from e


def own_and_private(job_dir: Path) -> bool:
    """Whether the job dir is the dashboard user's own and nobody else can write to it."""
    try:
        st = os.lstat(job_dir)
    except OSError:
        return False
    return st.st_uid == os.geteuid() and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def check_store(job_dir: Path) -> None:
    """Refused unless JOB_DIR/trainguard.db and the files SQLite opens beside it (-wal, -shm,
    -journal) are regular files (not symlinks: one would show another job's store, or lay
    another store's recent pages over this one) of the job dir's owner; absent is fine here
    (the store's own open says so)."""
    owner: int | None = None
    for suffix in ("", "-wal", "-shm", "-journal"):
        path = job_dir / f"{DB_NAME}{suffix}"
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if not stat.S_ISREG(st.st_mode):
            raise Refused(f"{path} is {_kind(st.st_mode)}, not the job's store: {_WHAT}. "
                          "Fix: remove it, or show the job dir the symlink leads to")
        owner = owner_of(job_dir) if owner is None else owner
        if st.st_uid != owner:
            raise Refused(f"{path} is owned by uid {st.st_uid}, not by the job dir's owner "
                          f"(uid {owner}): {_WHAT}")


def log_root(job_dir: Path, meta: dict[str, Any]) -> LogRoot:
    """The job's log dir (log_dir_of), with where reading it starts; Refused when it lies
    outside the job dir of another user (or of a dir others can write)."""
    _still_real(job_dir, os.path.realpath(job_dir))
    shown = log_dir_of(meta, job_dir)
    owner = owner_of(job_dir)
    real = Path(os.path.realpath(job_dir / shown))
    if real == job_dir or job_dir in real.parents:
        return LogRoot(shown, job_dir, real.relative_to(job_dir).parts, owner)
    if own_and_private(job_dir):
        return LogRoot(shown, real, (), owner)
    raise Refused(f"the job's log dir {shown} is outside its job dir {job_dir} (or leads out "
                  f"of it through a symlink), and the job dir is not this dashboard user's "
                  f"own and private, so its store could name any dir ({_WHAT}). Fix: read "
                  "those logs as the job's user (trainguard logs), or run the dashboard as "
                  "that user")


@contextmanager
def opened_dir(root: LogRoot, names: Sequence[str] = ()) -> Iterator[int]:
    """An fd of the dir `names` below the log dir, reached without following a symlink."""
    fd = _open_base(root.base)
    try:
        where = root.base
        for name in (*root.parts, *names):
            where = where / name
            below = _step(fd, name, where, _DIR_FLAGS)
            os.close(fd)  # one owner of each fd: only this loop closes them (review of
            fd = below  # walk-through 32 #6: a failed step closed its parent twice)
        yield fd
    finally:
        os.close(fd)


def open_file(root: LogRoot, names: Sequence[str]) -> int:
    """An fd of the regular file `names` below the log dir (the caller closes it):
    FileNotFoundError when there is none, Refused when it is not one to serve."""
    *dirs, name = names
    with opened_dir(root, dirs) as parent:
        where = root.under(*names)
        try:
            fd = os.open(name, _FILE_FLAGS, dir_fd=parent)
        except OSError as e:
            raise _refusal(e, parent, name, where) from None
    try:
        check_file(os.fstat(fd), root.owner, where)
    except BaseException:
        os.close(fd)
        raise
    return fd


def check_file(st: os.stat_result, owner: int, where: Path) -> None:
    if not stat.S_ISREG(st.st_mode):
        raise Refused(f"{where} is {_kind(st.st_mode)}: {_WHAT}")
    if st.st_uid != owner:
        raise Refused(f"{where} is owned by uid {st.st_uid}, not by the job dir's owner "
                      f"(uid {owner}): {_WHAT}")


def entries(root: LogRoot, names: Sequence[str] = ()) -> list[tuple[str, os.stat_result]]:
    """The names in a dir below the log dir with their lstat (a symlink is not followed);
    [] when the dir is not there."""
    try:
        with opened_dir(root, names) as fd:
            out = []
            for name in os.listdir(fd):
                try:
                    out.append((name, os.stat(name, dir_fd=fd, follow_symlinks=False)))
                except OSError:
                    continue
            return out
    except FileNotFoundError:
        return []


def _open_base(base: Path) -> int:
    """An fd of `base`, which must still be the real dir it was (no symlink in its path)."""
    try:
        fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise
    except OSError as e:
        raise Refused(f"cannot open {base}: {e.strerror}") from e
    proc = f"/proc/self/fd/{fd}"
    try:
        _still_real(base, os.readlink(proc) if os.path.islink(proc) else os.path.realpath(base))
    except Refused:
        os.close(fd)
        raise
    return fd


def _still_real(path: Path, real: str) -> None:
    """Refused unless `path` (as the catalog found it: real) still has no symlink in it."""
    if real != str(path):
        raise Refused(f"{path} leads to {real} now (a symlink was put in its path): {_WHAT}")


def _step(parent: int, name: str, where: Path, flags: int) -> int:
    """Open `name` in the dir `parent` (left open: the caller's to close)."""
    if name in ("", ".", "..") or "/" in name:
        raise Refused(f"{where}: a path out of the job dir: {_WHAT}")
    try:
        return os.open(name, flags, dir_fd=parent)
    except OSError as e:
        raise _refusal(e, parent, name, where) from None


def _refusal(e: OSError, parent: int, name: str, where: Path) -> Exception:
    if e.errno == errno.ENOENT:
        return FileNotFoundError(errno.ENOENT, "no such file", str(where))
    try:
        mode = os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode
    except OSError:
        mode = 0
    if e.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK) and mode:
        return Refused(f"{where} is {_kind(mode)}: {_WHAT}")
    return Refused(f"cannot open {where}: {e.strerror}")


def _kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISREG(mode):
        return "a regular file"
    return "not a regular file (a FIFO, socket or device)"
