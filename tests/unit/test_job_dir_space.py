"""A job dir on a disk with little or no room (walk-through 40 #6), on real tmpfs mounts."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.tmpfs import mount_tmpfs
from trainguard.controller.store import JobStore
from trainguard.errors import StoreError


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs (the launcher keeps 8 MiB of room beside the store)."""
    yield from mount_tmpfs(tmp_path / "disk", "size=1m")


def test_a_store_that_cannot_be_made_on_a_full_disk_names_the_fix_and_leaves_nothing(
        small_disk: Path) -> None:
    """"database or disk is full" said no fix, and the half-made store stayed behind."""
    (small_disk / "filler").write_bytes(b"\0" * ((1 << 20) - (56 << 10)))  # 56 KiB left
    job = small_disk / "job"
    with pytest.raises(StoreError) as e:
        JobStore.create(job, "r")
    assert f"Fix: free space on the disk of {job} (`df -h {job}`)" in str(e.value), e.value
    assert list(job.iterdir()) == []


def test_a_launch_without_room_for_the_store_s_last_writes_says_so_at_once(
        small_disk: Path) -> None:
    """A job on a disk with 196 KiB free started without a word; its end, unrecorded, read
    `lost`: the launch says at once that the room could not be kept."""
    from trainguard.controller.recorder import Recorder
    from trainguard.paths import JobPaths
    from trainguard.spec_build import build_spec

    spec = build_spec(None, {"entrypoint": "train.py", "run_id": "r"})
    job = small_disk / "job"
    paths = JobPaths(job, job / "logs", job / "ck")
    paths.make()
    with JobStore.create(job, "r") as store:
        Recorder(spec, paths, store, ["train.py"]).begin()
        events = [ev for _, ev in store.events()]
    assert [ev.reason for ev in events] == ["JobCreated", "JobDirLowOnSpace"], events
    assert events[1].level.value == "Warning"
    assert events[1].message.startswith(f"the disk of {job} has less than 8 MiB free")
    assert events[1].message.endswith("Fix: free space there, or launch with another --job-dir")


def test_a_launch_refused_by_a_store_made_meanwhile_leaves_that_store_alone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Review 49 #7: two launches into one new job dir: the other made its store between this
    one's look for it and its connect; this one, refused (another run's store), removed the
    store it had not made, and the other's job read 'no trainguard job'. Only a store half
    made on a full disk is removed."""
    import sqlite3

    from trainguard.controller import store as store_module

    job = tmp_path / "job"
    real_connect = sqlite3.connect

    def connect_after_the_other(*args: object, **kwargs: object) -> sqlite3.Connection:
        monkeypatch.setattr(store_module.sqlite3, "connect", real_connect)
        JobStore.create(job, "run-a").close()  # the other launch, in between
        return real_connect(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(store_module.sqlite3, "connect", connect_after_the_other)
    with pytest.raises(StoreError, match="run-a"):
        JobStore.create(job, "run-b")
    with JobStore.open(job) as other:
        assert other.meta()["run_id"] == "run-a"
