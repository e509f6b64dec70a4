"""The in-memory checkpoint tier's layout on disk (tmpfs): names, manifest, rules. Stdlib only.

The node agent owns one region per node (a directory under /dev/shm, made before its
workers start, freed when the job ends however it ends); each rank writes its snapshots in
its own subdirectory:

    <region>/rank-R/slot-0.bin   raw tensor bytes of one snapshot (posix_fallocate'd: a full
    <region>/rank-R/slot-1.bin   /dev/shm is an error at allocation, never a SIGBUS later)
    <region>/rank-R/manifest.json   the slots that hold a whole snapshot: step, generation,
                                  size, CRC-32 of the bytes, and the tree (plain values
                                  inline, tensors as dtype, shape, offset) - no pickle
    <region>/rank-R/.manifest.spare   the next manifest is written here, then swapped in

Double buffering: a snapshot is written into the slot the manifest does not name as the
newest, after the manifest stopped naming that slot at all; the manifest naming it again
(an atomic swap of the two manifest files) commits it. A crash at any moment leaves the
other slot whole. Nothing is allocated after the first snapshot: a /dev/shm that fills up
later cannot break a copy or a commit.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import json
import logging
import mmap
import os
import secrets
import stat
import zlib
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

FORMAT = 1
MANIFEST = "manifest.json"
SLOTS = (0, 1)  # double buffering
# with peer copies: two more keep the pinned steps, the last one copied whole to the peers
# and the one being copied (until its copy is whole, a node loss resumes at the first)
PINNED_SLOTS = (0, 1, 2, 3)
PIN = "pin"  # in a rank's directory: the steps its snapshots keep (those copied to peers)
ALIGN = 64  # every tensor starts on a cache line
DEFAULT_ROOT = "/dev/shm"
REGION_PREFIX = "trainguard-"


@dataclass(frozen=True)
class SlotEntry:
    slot: int
    step: int
    generation: int  # counts snapshots of the rank over the job: the newer of two is higher
    size: int  # bytes used in the slot file
    crc32: int | None  # of those bytes; None for a moment after the copy (added after)
    tree: Any  # the skeleton: plain values, {"__t": i} for tensor i, {"__d": [[k, v]...]}...
    tensors: list[dict[str, Any]]  # {"dtype", "shape", "offset", "nbytes"}
    world_size: int
    run_id: str
    origin: str = ""  # "": the rank's own snapshot; else the node whose copy it came from


@dataclass
class MemoryManifest:
    rank: int
    slots: list[SlotEntry] = field(default_factory=list)
    keep: int = 3  # the rank's Checkpointer's `keep`: what persisting it to storage prunes to
    format: int = FORMAT

    def newest(self) -> SlotEntry | None:
        return max(self.slots, key=lambda s: s.generation, default=None)

    def without(self, slot: int) -> MemoryManifest:
        return MemoryManifest(self.rank, [s for s in self.slots if s.slot != slot], self.keep)

    def with_entry(self, entry: SlotEntry) -> MemoryManifest:
        return MemoryManifest(self.rank, [*self.without(entry.slot).slots, entry], self.keep)

    def to_json(self) -> bytes:
        """The manifest as JSON; each entry encoded once (the tree is the costly part, and
        an entry is written unchanged many times)."""
        entries = ",".join(_encoded(e) for e in self.slots)
        return (f'{{"rank":{self.rank},"slots":[{entries}],"keep":{self.keep},'
                f'"format":{self.format}}}').encode()

    @classmethod
    def from_json(cls, raw: bytes) -> MemoryManifest:
        d = json.loads(raw)
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            raise ValueError(f"not a memory snapshot manifest of format {FORMAT}")
        slots = [SlotEntry(**s) for s in d["slots"]]
        if any(s.slot not in PINNED_SLOTS for s in slots) or \
                len({s.slot for s in slots}) != len(slots):
            raise ValueError("the manifest names a slot twice or a slot that does not exist")
        return cls(int(d["rank"]), slots, max(1, int(d.get("keep", 3))))


def fits(entry: SlotEntry, other: SlotEntry) -> bool:
    """Can `other`'s bytes, patched with `entry`'s small tensors, be `entry`'s snapshot?
    (The same size and tensor layout.)"""
    return entry.size == other.size and [(t["dtype"], t["shape"], t["offset"], t["nbytes"])
                                         for t in entry.tensors] == \
        [(t["dtype"], t["shape"], t["offset"], t["nbytes"]) for t in other.tensors]


def open_slot_bytes(region: str | os.PathLike[str], rank: int, entry: SlotEntry,
                    lock: bool = False, check: bool = True) -> tuple[memoryview, Any]:
    """A committed slot's bytes, checked against the manifest's CRC; raises ValueError when
    they are not whole. `lock` (another process's snapshot, whose writer may live): hold a
    shared lock, so a writer skips the slot, and check that the manifest still names this
    snapshot (a writer drops it from the manifest before it writes the slot). `check`
    False: no CRC pass (a reader that checks the bytes another way)."""
    path = slot_path(region, rank, entry.slot)
    fd = open_file(path, os.O_RDONLY)
    try:
        if lock:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                raise ValueError(f"{path.name} is being written") from None
            now = read_manifest(region, rank)
            if now is None or not any(s.slot == entry.slot and s.generation == entry.generation
                                      for s in now.slots):
                raise ValueError(f"{path.name} was overwritten since the manifest was read")
        if os.fstat(fd).st_size < entry.size:
            raise ValueError(f"{path.name} is shorter than its snapshot")
        # copy-on-write: writable for torch.frombuffer, never written (the file stays as is)
        m = mmap.mmap(fd, entry.size, access=mmap.ACCESS_COPY) if entry.size else None
        view = memoryview(m) if m is not None else memoryview(b"")
        if check and entry.crc32 is not None and zlib.crc32(view) != entry.crc32:
            raise ValueError(f"{path.name}: CRC-32 differs from the manifest (a torn copy)")
        return view, (fd, m)
    except BaseException:
        os.close(fd)
        raise


def close_slot_bytes(handle: Any) -> None:
    fd, m = handle
    if m is not None:
        with contextlib.suppress(BufferError):
            m.close()
    os.close(fd)


def free_slot(manifest: MemoryManifest, slots: Sequence[int],
              pinned: Collection[int] = ()) -> int:
    """The slot the next snapshot goes into: not the newest, not a pinned step's; the
    empty or oldest of the others."""
    by_slot = {e.slot: e for e in manifest.slots}
    newest = manifest.newest()
    keep = {e.slot for e in manifest.slots if e.step in pinned}
    if newest is not None:
        keep.add(newest.slot)
    free = [s for s in slots if s not in keep] or [s for s in slots if newest is None
                                                    or s != newest.slot]
    return min(free, key=lambda s: by_slot[s].generation if s in by_slot else -1)


def read_pin(region: str | os.PathLike[str], rank: int) -> frozenset[int]:
    """The steps the rank keeps (none when there is no pin or it cannot be read)."""
    try:
        return frozenset(int(s) for s in (rank_dir(region, rank) / PIN).read_text().split())
    except (OSError, ValueError):
        return frozenset()


def write_pin(region: str | os.PathLike[str], rank: int, steps: Iterable[int]) -> None:
    d = rank_dir(region, rank)
    tmp = d / f".{PIN}.tmp"
    fd = open_file(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    with open(fd, "w") as f:
        f.write(" ".join(str(s) for s in sorted(set(steps))))
    os.replace(tmp, d / PIN)


_ENCODED: dict[int, tuple[SlotEntry, str]] = {}  # id(entry) -> (entry, its JSON)


def _encoded(e: SlotEntry) -> str:
    hit = _ENCODED.get(id(e))
    if hit is not None and hit[0] is e:
        return hit[1]
    text = json.dumps(dict(vars(e)), separators=(",", ":"))
    if len(_ENCODED) >= 16:
        _ENCODED.clear()
    _ENCODED[id(e)] = (e, text)
    return text


def loadable(region: str | os.PathLike[str], rank: int, world_size: int,
             run_id: str) -> dict[int, SlotEntry]:
    """The rank's snapshots that can be loaded, by step: of this run (any, when `run_id` is
    empty) and world size, their bytes whole (the CRC-32 checked when known)."""
    manifest = read_manifest(region, rank)
    out: dict[int, SlotEntry] = {}
    for e in manifest.slots if manifest is not None else []:
        if e.world_size != world_size or (run_id and e.run_id != run_id):
            continue
        try:
            view, handle = open_slot_bytes(region, rank, e)
        except (OSError, ValueError) as err:
            log.warning("memory snapshot of step %s of rank %s is not usable: %s", e.step,
                        rank, err)
            continue
        view.release()
        close_slot_bytes(handle)
        if e.step not in out or e.generation > out[e.step].generation:
            out[e.step] = e
    return out


def rank_dir(region: str | os.PathLike[str], rank: int) -> Path:
    return Path(region) / f"rank-{rank}"


def slot_path(region: str | os.PathLike[str], rank: int, slot: int) -> Path:
    return rank_dir(region, rank) / f"slot-{slot}.bin"


def read_manifest(region: str | os.PathLike[str], rank: int) -> MemoryManifest | None:
    """The rank's manifest, or None when there is none or it is unreadable (no snapshot)."""
    try:
        return MemoryManifest.from_json((rank_dir(region, rank) / MANIFEST).read_bytes())
    except (OSError, ValueError, TypeError, KeyError):
        return None


SPARE = ".manifest.spare"  # the manifest's other file: written, then swapped in
MANIFEST_ROOM = 64 << 10  # bytes each manifest file holds at first (grown when needed)


def write_manifest(region: str | os.PathLike[str], manifest: MemoryManifest) -> None:
    """Replace the manifest atomically without allocating memory: the JSON, padded with
    spaces to the spare file's allocated size, goes into the spare, and the two names are
    swapped (renameat2 RENAME_EXCHANGE). A /dev/shm that filled up since cannot fail it;
    only growing past the room allocated can (OSError ENOSPC)."""
    d = rank_dir(region, manifest.rank)
    data = manifest.to_json()
    spare, current = d / SPARE, d / MANIFEST
    fd = open_file(spare, os.O_RDWR | os.O_CREAT)
    try:
        room = os.fstat(fd).st_size
        if room < len(data):
            room = max(MANIFEST_ROOM, 2 * len(data))
            os.posix_fallocate(fd, 0, room)
        os.pwrite(fd, data.ljust(room), 0)
    finally:
        os.close(fd)
    if not current.exists():
        os.rename(spare, current)
        write_manifest(region, manifest)  # and make the spare, while there is room
        return
    try:
        _exchange(spare, current)
    except OSError as e:  # a kernel or file system without RENAME_EXCHANGE
        if e.errno not in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
            raise
        os.replace(spare, current)


def _exchange(a: Path, b: Path) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    fn = getattr(libc, "renameat2", None)
    if fn is None:
        raise OSError(errno.ENOSYS, "renameat2 is not available")
    at_fdcwd, rename_exchange = -100, 2
    if fn(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def agreed_step(per_rank: Sequence[Iterable[int]]) -> int | None:
    """The newest step every rank holds (each rank lists the steps it can load), or None."""
    sets = [set(s) for s in per_rank]
    if not sets:
        return None
    common = set.intersection(*sets)
    return max(common) if common else None


def region_path(root: str, marker: str, node: str) -> Path:
    """A new region's name: the job's marker and node (for people), then a random part:
    the marker is public (the agent's socket name), and a name known in advance can be
    made first by another user (walk-through 32 #9)."""
    safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in f"{marker}-{node}")
    return Path(root) / f"{REGION_PREFIX}{safe}-{secrets.token_hex(8)}"


def not_private(path: str | os.PathLike[str], what: str = "directory") -> str | None:
    """Why `path` is not a directory only this user can write (None: it is): not a
    directory (a symlink is not followed), another user's, or writable by others."""
    try:
        st = os.lstat(path)
    except OSError as e:
        return f"{path}: {e.strerror}"
    if not stat.S_ISDIR(st.st_mode):
        return f"{path} is not a {what} (a {'symlink' if stat.S_ISLNK(st.st_mode) else 'file'})"
    if st.st_uid != os.geteuid():
        return f"{path} belongs to uid {st.st_uid}, not to this user (uid {os.geteuid()})"
    if st.st_mode & 0o022:
        return f"{path} is writable by others (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def make_private(path: Path) -> None:
    """Make `path` a new directory of this user, mode 0700: never one that exists (made by
    someone else first, or a symlink), never in a directory where others may rename it
    (writable by group or others and not sticky: review of walk-through 32 #8, a group's
    0775 scratch dir passed). Raises OSError naming the problem and the fix."""
    root = os.stat(path.parent)
    if root.st_mode & 0o022 and not root.st_mode & stat.S_ISVTX:
        who = "every user" if root.st_mode & 0o002 else f"its group (gid {root.st_gid})"
        raise OSError(errno.EPERM, f"{path.parent} is writable by {who} and not sticky: "
                      "they could replace the region. Fix: chmod +t it, or set "
                      "TRAINGUARD_SHM_ROOT to a directory only this user can write")
    try:
        path.mkdir(mode=0o700)
    except FileExistsError:
        raise OSError(errno.EEXIST, f"{path} exists already and this job did not make it "
                      "(another user's, made before the job?); it is not used. Fix: remove "
                      "it (its owner or root), or set TRAINGUARD_SHM_ROOT to a directory "
                      "only this user can write") from None
    os.chmod(path, 0o700, follow_symlinks=False)  # whatever the umask
    why = not_private(path)
    if why is not None:  # it changed hands since the mkdir: only root can do that
        raise OSError(errno.EPERM, why)


def open_file(path: str | os.PathLike[str], flags: int) -> int:
    """os.open for a region's file: no symlink followed (O_NOFOLLOW), new ones 0600, and
    only a regular file of this user with one name (no hard link to a file elsewhere)."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as e:
        if e.errno != errno.ELOOP:
            raise
        raise OSError(errno.ELOOP, f"{path} is a symlink: not followed") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_nlink != 1:
        os.close(fd)
        raise OSError(errno.EPERM, f"{path} is not a regular file of this user with one "
                      "name: not used")
    return fd


def free_region(path: str | os.PathLike[str]) -> None:
    """Remove a region and everything in it when it is this user's private dir (the agent
    asks its guardian to free a region's path before it is made: a restore may make it,
    review of walk-through 32 #5); quietly when it is gone or not such a dir (a symlink,
    another user's: left as it is)."""
    import shutil

    if not_private(path) is None:
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(path)


def memory_resume_step(per_rank_steps: Sequence[Iterable[int]],
                       per_rank_storage: Sequence[int | None]) -> int | None:
    """The step to resume from memory, or None (storage): the newest step every rank holds
    in memory, when no rank sees a newer valid checkpoint in storage."""
    in_memory = agreed_step(per_rank_steps)
    stored = max((s for s in per_rank_storage if s is not None), default=None)
    if in_memory is None or (stored is not None and stored > in_memory):
        return None
    return in_memory
