"""Walk-through 31 #6, the load side: every shard a resume reads is checked.

A sharded (DCP) checkpoint resumed by fewer ranks: rank 0 reads rank 1's shards, whose
checksums no rank checked (a corrupt step loaded, or crashed the job in DCP). Checkpoints
are written by hand (real files, a real manifest) on local disk and loaded by the real
`load_newest`; the other ranks' votes and the world size are fakes. (Helpers here serve
test_ckpt_load_walk31_retry.py and _step.py too.)
"""

from __future__ import annotations

import hashlib
import io
import time
from pathlib import Path

import pytest
import torch

from trainguard.checkpoint import loading
from trainguard.checkpoint.loading import load_newest
from trainguard.checkpoint.manifest import (
    MANIFEST,
    FileEntry,
    Manifest,
    Status,
    Verdict,
    rank_file,
    step_dir,
)
from trainguard.checkpoint.storage import Storage

SHARD1 = "sharded/__1_0.distcp"


def _pt(value: float) -> bytes:
    buf = io.BytesIO()
    torch.save({"w": torch.full((4,), value)}, buf)
    return buf.getvalue()


def write_step(root: Path, step: int, *, sharded: bool = False, manifest_step: int | None = None
               ) -> None:
    """A 2-rank checkpoint of `step` as a save writes it (DCP shards: opaque bytes here)."""
    files: dict[str, tuple[bytes, int]] = {
        "replicated.pt": (_pt(step), 0), rank_file(0): (_pt(step + 0.5), 0),
        rank_file(1): (_pt(step + 0.25), 1)}
    if sharded:
        files.update({"sharded/.metadata": (b"meta%d" % step, 0),
                      "sharded/__0_0.distcp": (bytes(range(256)) * 8, 0),
                      SHARD1: (bytes(range(255, -1, -1)) * 8, 1)})
    d = root / step_dir(step)
    entries = []
    for name, (data, rank) in files.items():
        (d / name).parent.mkdir(parents=True, exist_ok=True)
        (d / name).write_bytes(data)
        entries.append(FileEntry(name, len(data), hashlib.sha256(data).hexdigest(), rank))
    m = Manifest(step=step if manifest_step is None else manifest_step, world_size=2,
                 files=tuple(sorted(entries, key=lambda e: e.name)),
                 library_version="test", created_at=time.time())
    (d / MANIFEST).write_bytes(m.to_json())


def flip(p: Path, at: int = 100) -> None:
    data = bytearray(p.read_bytes())
    data[at] ^= 0x10  # same size: only the checksum can tell
    p.write_bytes(bytes(data))


def alone(rank: int = 0) -> loading.Agree:
    return lambda ok: [] if ok else [rank]


class Told:
    def __init__(self) -> None:
        self.verdicts: list[Verdict] = []

    def __call__(self, v: Verdict, tell: bool) -> None:
        self.verdicts.append(v)


def test_one_rank_resuming_a_two_rank_sharded_checkpoint_checks_rank_1s_shard(
        tmp_path: Path) -> None:
    """The finding: 2 ranks saved, 1 resumes; DCP makes rank 0 read __1_0.distcp, whose
    checksum no rank checked: the corrupt step 20 loaded (or crashed in DCP)."""
    for step in (15, 20):
        write_step(tmp_path, step, sharded=True)
    flip(tmp_path / step_dir(20) / SHARD1)
    told = Told()
    loaded = load_newest(Storage(tmp_path), 0, alone(), told)
    assert loaded is not None and loaded.step == 15
    assert [(v.step, v.status) for v in told.verdicts] == [(20, Status.CORRUPT)]
    assert f"{SHARD1}: checksum differs" in told.verdicts[0].reason


def test_the_shards_are_checked_once_split_across_the_ranks_of_the_resuming_world(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Same world: each rank hashes its own shards (no extra reads); one rank: all of them.
    A failure on one rank is every rank's through the vote (agree)."""
    write_step(tmp_path, 20, sharded=True)
    hashed: list[str] = []
    real = Storage.sha256

    def sha256(self: Storage, rel: str) -> str:
        hashed.append(rel.split("/", 1)[1])
        return real(self, rel)

    monkeypatch.setattr(Storage, "sha256", sha256)
    shards = {"sharded/.metadata", "sharded/__0_0.distcp", SHARD1}
    for world, rank, expected in ((2, 0, {"sharded/.metadata", "sharded/__0_0.distcp"}),
                                  (2, 1, {SHARD1}), (1, 0, shards)):
        monkeypatch.setattr(loading, "_world", lambda w=world: w)
        hashed.clear()
        assert load_newest(Storage(tmp_path), rank, alone(rank), Told()) is not None
        assert {h for h in hashed if h.startswith("sharded/")} == expected, (world, rank)
    flip(tmp_path / step_dir(20) / SHARD1)
    monkeypatch.setattr(loading, "_world", lambda: 2)
    # rank 0 does not read the bad shard itself; rank 1 finds it and the vote skips the step
    assert load_newest(Storage(tmp_path), 0, lambda ok: [1], Told()) is None
