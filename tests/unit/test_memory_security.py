"""The memory snapshots' shared-memory region cannot be planted by another local user
(walk-through 32 #9): its name was known in advance (the job's public marker and the node)
and an existing directory was used as it was, its slot files opened through symlinks, so the
ranks wrote their snapshots into any file the job's user could write. Now the agent makes a
new, private region (mode 0700, a random part in its name) and never one that exists, and a
rank writes nothing through a symlink or into a directory that is not its user's alone."""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

import pytest
import torch

from trainguard.checkpoint import memory_format
from trainguard.checkpoint.errors import CheckpointError
from trainguard.checkpoint.memory import RankSlots
from trainguard.node import procs
from trainguard.node.memory import MemoryRegion
from trainguard.worker.contract import ENV_MEMORY_DIR, ENV_MEMORY_EVERY

STRANGER = 65534  # nobody


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    v = tmp_path / "victim.txt"
    v.write_text("precious\n")
    os.chmod(v, 0o600)
    return v


def plant(d: Path, victim: Path) -> None:
    """What the attacker left: a dir every user may write, rank-0/slot-N.bin -> victim."""
    (d / "rank-0").mkdir(parents=True)
    for n in memory_format.PINNED_SLOTS:
        (d / "rank-0" / f"slot-{n}.bin").symlink_to(victim)
    for p in (d, d / "rank-0"):
        os.chmod(p, 0o777)
        if os.geteuid() == 0:
            os.chown(p, STRANGER, STRANGER, follow_symlinks=False)


def snapshot(region: str | Path) -> None:
    slots = RankSlots(region, 0, 1, "run")
    try:
        slots.snapshot(1, {"w": torch.ones(4096)})
        slots.wait()
    finally:
        slots.close()


def test_a_region_planted_under_the_jobs_name_is_not_used_and_nothing_is_written_through_it(
        shm: Path, victim: Path, guardian: procs.Guardian) -> None:
    marker, node = "c0eade7323c748eb81e2f6de5f661732-node-0", "node-0"
    planted = shm / f"trainguard-{marker}-{node}"  # the name the region had
    plant(planted, victim)
    region = MemoryRegion(marker, node, guardian)
    try:
        env = region.env({ENV_MEMORY_EVERY: "1"})
        made = Path(env[ENV_MEMORY_DIR])
        assert made != planted and made.name.startswith(planted.name)
        st = made.lstat()
        assert stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o700
        assert st.st_uid == os.geteuid()
        snapshot(made)  # the ranks write their snapshots there
        assert victim.read_text() == "precious\n"
        assert (made / "rank-0" / "slot-0.bin").stat().st_size > 0
    finally:
        region.close()
    assert victim.read_text() == "precious\n"
    assert MemoryRegion(marker, node, guardian).path != region.path  # a new name each time


def test_a_name_someone_took_first_is_refused_with_the_problem_and_the_fix(
        shm: Path, tmp_path: Path, guardian: procs.Guardian, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(memory_format.secrets, "token_hex", lambda n: "0" * 2 * n)
    region = MemoryRegion("m", "node-0", guardian)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    region.path.symlink_to(elsewhere)  # guessed, and made first
    with caplog.at_level(logging.WARNING):
        assert region.env({ENV_MEMORY_EVERY: "1"}) == {ENV_MEMORY_EVERY: "0"}
    assert f"{region.path} exists already and this job did not make it" in caplog.text
    assert "Fix: remove it" in caplog.text
    assert region.held() is None and list(elsewhere.iterdir()) == []
    region.close()
    assert region.path.is_symlink()  # not ours: left as it is


def test_a_root_others_may_rename_in_is_refused(shm: Path, guardian: procs.Guardian) -> None:
    os.chmod(shm, 0o777)  # no sticky bit
    region = MemoryRegion("m", "node-0", guardian)
    assert region.env({ENV_MEMORY_EVERY: "1"}) == {ENV_MEMORY_EVERY: "0"}
    assert list(shm.iterdir()) == []


def test_a_rank_writes_through_no_symlink_and_into_no_dir_of_another_user(
        tmp_path: Path, victim: Path) -> None:
    open_region = tmp_path / "planted"
    plant(open_region, victim)
    with pytest.raises(CheckpointError, match=r"memory snapshots refused: .*Fix"):
        snapshot(open_region)
    own = tmp_path / "own"  # a private region with a symlinked slot file in it
    own.mkdir(mode=0o700)
    (own / "rank-0").mkdir(mode=0o700)
    (own / "rank-0" / "slot-0.bin").symlink_to(victim)
    with pytest.raises(OSError, match="is a symlink: not followed"):
        snapshot(own)
    (own / "rank-0" / "slot-0.bin").unlink()
    os.link(victim, own / "rank-0" / "slot-0.bin")  # a hard link: another name of the file
    with pytest.raises(OSError, match="not a regular file of this user with one name"):
        snapshot(own)
    assert victim.read_text() == "precious\n"
