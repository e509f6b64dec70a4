"""Whose job a log or checkpoint dir is, and whether that job still runs.

A launch writes an owner mark (OWNER_NAME: `{"run_id", "job_dir", "host", "pid", "at"}`,
`at` the launch's time) into a --log-dir or --checkpoint-dir that is not its job dir's own;
the launch checks read it to refuse a dir another running job writes, and `prune` to find the
job dirs that use a dir it would delete. One writer and one reader here, for local dirs and
object-store URLs alike; a rank's save reads a checkpoint dir's mark too (the library's own
reader, checkpoint/sharing.py: which of another job's steps its pruning leaves alone).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from trainguard.backends.orphans import AgentsSeen, agents_seen
from trainguard.checkpoint.manifest import OWNER_NAME
from trainguard.checkpoint.store_errors import missing_bucket, s3_error
from trainguard.controller.shown import shown_state
from trainguard.controller.store import JobStore, db_path
from trainguard.errors import StoreError
from trainguard.paths import LOCK_NAME, is_url
from trainguard.states import JOB_ENDED, JobState

T = TypeVar("T")

__all__ = ["ABSENT", "OWNER_NAME", "bounded", "default_owner", "fs_of", "locked",
           "lost_agents", "missing_bucket_of", "owner_version", "read_owner", "running",
           "write_owner"]


def read_owner(location: str | Path) -> dict[str, str] | None:
    """The mark of a local dir or a URL (None: none, unreadable, or a store not reachable:
    the ranks say why)."""
    try:
        if is_url(location):
            raw = fs_of(str(location)).cat_file(_mark_url(location))
        else:
            raw = (Path(location) / OWNER_NAME).read_bytes()
        data = json.loads(raw)
    except Exception:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("job_dir"), str) \
            or not data["job_dir"]:
        return None
    return {k: str(v) for k, v in data.items()}


def missing_bucket_of(url: str) -> str | None:
    """The bucket of `url` when the store answers that it does not exist (NoSuchBucket,
    asked with a HEAD of the mark); None when it exists or the store answered otherwise (a
    403, an error: the ranks say it)."""
    fs, path = fs_of(url), _mark_url(url)
    try:
        fs.invalidate_cache(path)
        fs.info(path)
    except Exception as e:
        return missing_bucket(e, url)
    return None


ABSENT = ""  # the version of a mark that is not there (owner_version)


def owner_version(url: str) -> str | None:
    """The version (ETag) of an S3 URL's mark, ABSENT where there is none; None where the
    store cannot write on a condition (not S3: nothing asked). Read before the mark itself: a
    write on this version fails when anything changed since (write_owner). Raises what the
    store's HEAD raises (a 403, say)."""
    fs = fs_of(url)
    if "s3" not in _protocols(fs):
        return None
    path = _mark_url(url)
    fs.invalidate_cache(path)
    try:
        return str(fs.info(path)["ETag"])
    except FileNotFoundError:
        return ABSENT


def write_owner(location: str | Path, run_id: str, job_dir: Path,
                if_version: str | None = None) -> bool:
    """Mark `location` as the job's (a local dir: written aside, then renamed into place).
    `if_version` (an S3 URL, owner_version's): only while the mark is still that version (a
    conditional PUT: If-None-Match for ABSENT, If-Match for an ETag); False, nothing
    written, where another launch wrote it since. Raises OSError (local) or what the URL's
    filesystem raises."""
    data = json.dumps({"run_id": run_id, "job_dir": str(job_dir),
                       "host": socket.gethostname(), "pid": os.getpid(),
                       "at": time.time()}).encode()
    if is_url(location):
        path = _mark_url(location)
        fs = fs_of(str(location))
        if if_version is None:
            fs.pipe_file(path, data)
            return True
        try:
            if if_version == ABSENT:
                fs.pipe_file(path, data, mode="create")
            else:
                fs.pipe_file(path, data, IfMatch=if_version)
        except OSError as e:
            why = s3_error(e)
            if isinstance(e, FileExistsError) or why in LOST:
                return False
            if why not in REFUSED:
                raise
            # an S3-compatible store that refuses the conditional headers: the plain write,
            # with the checks around it as on any other store
            fs.pipe_file(path, data)
        return True
    tmp = Path(location) / f"{OWNER_NAME}.{os.getpid()}.tmp"
    try:
        tmp.write_bytes(data)
        os.replace(tmp, tmp.with_name(OWNER_NAME))
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    return True


def _mark_url(location: str | Path) -> str:
    """The owner mark's URL in an object-store location."""
    return f"{str(location).rstrip('/')}/{OWNER_NAME}"


def _protocols(fs: Any) -> tuple[str, ...]:
    p = fs.protocol
    return (p,) if isinstance(p, str) else tuple(p)


# a conditional PUT's answers (S3's error code, else its HTTP status): another write came first
# (412; 409 where two conditional writes raced: review 34 #1), or the store does not do
# conditional writes (501, or a 400 naming the header)
LOST = frozenset({"PreconditionFailed", "ConditionalRequestConflict", "409", "412"})
REFUSED = frozenset({"NotImplemented", "InvalidArgument", "InvalidRequest", "501"})


@contextlib.contextmanager
def locked(directory: str | Path) -> Iterator[None]:
    """Hold an exclusive lock on a local dir (flock of the directory itself: no file is left
    there) while its mark is checked and written, so that two launches at once take turns.
    A URL, or a filesystem without flock, goes unlocked."""
    fd = None
    if not is_url(directory):
        with contextlib.suppress(OSError):
            fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
            fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        yield
    finally:
        if fd is not None:
            os.close(fd)  # lets the lock go


def default_owner(checkpoint_dir: str, job_dir: Path) -> dict[str, str] | None:
    """The job whose default checkpoint dir (JOB_DIR/checkpoints) `checkpoint_dir` is, when
    that is another job dir than `job_dir`."""
    ck = Path(checkpoint_dir)
    if is_url(checkpoint_dir) or ck.name != "checkpoints" or ck.parent == job_dir \
            or not db_path(ck.parent).is_file():
        return None
    try:
        with JobStore.open(ck.parent) as store:
            run_id = str(store.meta().get("run_id"))
    except (StoreError, OSError):
        run_id = "?"
    return {"run_id": run_id, "job_dir": str(ck.parent)}


def running(owner: dict[str, str]) -> bool:
    """Its launcher holds its job dir's lock (if here), or (this host) has not taken it yet."""
    with contextlib.suppress(OSError), open(Path(owner["job_dir"]) / LOCK_NAME) as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(f, fcntl.LOCK_UN)
    return _launcher_starting(owner)


def _launcher_starting(owner: dict[str, str]) -> bool:
    """The mark's launcher (this host) runs, its job dir's lock not taken yet."""
    pid = owner.get("pid", "")
    if owner.get("host") != socket.gethostname() or not pid.isdigit() or int(pid) == os.getpid():
        return False
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"trainguard" in f.read()
    except OSError:
        return False


def lost_agents(owner: dict[str, str]) -> AgentsSeen:
    """The nodes of the owner's job whose agent still runs: a job whose launcher is gone but
    whose workers train and save on, as `status` and `prune` say (review of walk-through 31
    #13: the launch check counted it as ended), or why Slurm could not say."""
    job_dir = Path(owner["job_dir"])
    if not db_path(job_dir).is_file():
        return AgentsSeen()
    try:
        with JobStore.open(job_dir) as store:  # (review 55 #1: an ended job's agents are
            meta = store.meta()  # not asked: its dir is taken over whatever Slurm says; its
            state = shown_state(meta)  # launcher on another host: active as recorded)
            return agents_seen(meta, store.nodes(), state == JobState.LOST.value
                               or state not in JOB_ENDED)
    except (StoreError, OSError):
        return AgentsSeen()


def fs_of(url: str) -> Any:
    import fsspec  # only for a URL
    return fsspec.core.url_to_fs(url)[0]


def bounded(fn: Callable[[], T], timeout_s: float = 10.0) -> T | None:
    """fn() on a daemon thread for at most `timeout_s` (a store that does not answer): None;
    not started at all when no time is left."""
    box: list[T] = []
    if timeout_s <= 0:
        return None

    def run() -> None:
        with contextlib.suppress(Exception):  # not reachable: the ranks say why
            box.append(fn())
    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout_s)
    return box[0] if box else None
