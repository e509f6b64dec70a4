"""Walk-through 31 #10: a read error of the storage (EIO, a timeout, a throttled object
store) on a valid checkpoint is tried again and, when it lasts, stops the resume saying the
storage cannot be read. It was taken for corruption: the resume fell back a step and marked
the good step bad. Real files on local disk (test_ckpt_load_walk31's helpers); the read
errors and the other ranks' votes are fakes.
"""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from tests.unit.test_ckpt_load_walk31 import SHARD1, Told, alone, flip, write_step
from trainguard.checkpoint import loading
from trainguard.checkpoint.errors import CheckpointError
from trainguard.checkpoint.loading import load_newest
from trainguard.checkpoint.manifest import MANIFEST, Status, step_dir
from trainguard.checkpoint.storage import Storage


@pytest.fixture(autouse=True)
def no_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loading, "RETRY_DELAYS", (0.0, 0.0, 0.0))


def _flaky(monkeypatch: pytest.MonkeyPatch, method: str, target: str, times: int) -> list[str]:
    """Storage.<method> raises EIO for `target` the first `times` calls."""
    real = getattr(Storage, method)
    calls: list[str] = []

    def flaky(self: Storage, rel: str) -> object:
        if rel.endswith(target) and len(calls) < times:
            calls.append(rel)
            raise OSError(errno.EIO, "Input/output error (injected)")
        return real(self, rel)

    monkeypatch.setattr(Storage, method, flaky)
    return calls


@pytest.mark.parametrize(("method", "target"), [
    ("sha256", f"{step_dir(30)}/replicated.pt"),
    ("read_bytes", f"{step_dir(30)}/{MANIFEST}"),
    ("sha256", f"{step_dir(30)}/{SHARD1}"),
])
def test_a_transient_read_error_is_tried_again_and_the_newest_step_loads(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, method: str, target: str) -> None:
    """The finding: one EIO while hashing step 30 -> 'skipping checkpoint step 30
    (corrupt)', 25 loaded, and 30 marked bad (a manifest read error raised raw)."""
    for step in (25, 30):
        write_step(tmp_path, step, sharded=True)
    calls = _flaky(monkeypatch, method, target, times=2)
    told = Told()
    loaded = load_newest(Storage(tmp_path), 0, alone(), told)
    assert len(calls) == 2
    assert loaded is not None and loaded.step == 30
    assert told.verdicts == []


def test_storage_that_stays_unreadable_stops_the_resume_saying_so_not_corrupt(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for step in (25, 30):
        write_step(tmp_path, step)
    calls = _flaky(monkeypatch, "sha256", f"{step_dir(30)}/replicated.pt", times=99)
    told = Told()
    with pytest.raises(CheckpointError) as e:
        load_newest(Storage(tmp_path), 0, alone(), told)
    msg = str(e.value)
    assert "cannot read the checkpoint of step 30" in msg and "not corruption" in msg
    assert "Input/output error" in msg and "Fix:" in msg and "corrupt" not in msg.split(
        "not corruption")[0]
    assert len(calls) == len(loading.RETRY_DELAYS) + 1
    assert told.verdicts == []  # not skipped, not marked bad


def test_a_rank_whose_storage_failed_stops_every_rank_with_its_name(tmp_path: Path) -> None:
    """Rank 0 read step 30; rank 1's storage failed. Rank 0 must not skip to 25 alone nor
    call 30 corrupt: both votes (loaded? read?) say rank 1 could not read it."""
    write_step(tmp_path, 30)
    votes = iter([[1], [0]])  # loaded: rank 1 did not; "answered" (not-ok flags): rank 0
    told = Told()
    with pytest.raises(CheckpointError, match=r"rank 1 could not read it .*not corruption"):
        load_newest(Storage(tmp_path), 0, lambda ok: next(votes), told)
    assert told.verdicts == []


def test_a_checksum_failure_is_still_corruption_and_is_not_retried(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for step in (25, 30):
        write_step(tmp_path, step)
    flip(tmp_path / step_dir(30) / "replicated.pt", at=-100)
    sleeps: list[float] = []
    monkeypatch.setattr("trainguard.checkpoint.loading.time.sleep", sleeps.append)
    told = Told()
    loaded = load_newest(Storage(tmp_path), 0, alone(), told)
    assert loaded is not None and loaded.step == 25
    assert [(v.step, v.status) for v in told.verdicts] == [(30, Status.CORRUPT)]
    assert "replicated.pt: checksum differs" in told.verdicts[0].reason
    assert sleeps == []
