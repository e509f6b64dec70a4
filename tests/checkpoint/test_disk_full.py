"""A full disk fails saves, not training; the last valid checkpoint stays intact.

A 24 MiB tmpfs holds two checkpoints of ~10 MiB; the third save runs out of space.
"""

from __future__ import annotations

import gc
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.checkpoint.conftest import AgentChannel, fresh_state, state_diff, step_state
from trainguard.checkpoint import Checkpointer, CheckpointError, Status

pytestmark = pytest.mark.usefixtures("keep_rng")

SIZE_MIB = 24
STATE_MIB = 8  # + ~2 MiB of step_state: two fit, a third does not


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    if not sys.platform.startswith("linux"):
        pytest.skip("needs Linux: mounts a tmpfs to fill")
    if os.geteuid() != 0:
        pytest.skip("needs root: mounts a tmpfs to fill (mount -t tmpfs)")
    mnt = tmp_path / "small"
    mnt.mkdir()
    out = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={SIZE_MIB}m", "tmpfs", str(mnt)],
                         capture_output=True, text=True, check=False)
    if out.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {out.stderr.strip() or out.returncode}")
    try:
        yield mnt
    finally:
        gc.collect()  # loaded tensors map checkpoint files (torch.load(mmap=True))
        if subprocess.run(["umount", str(mnt)], capture_output=True, check=False).returncode:
            subprocess.run(["umount", "-l", str(mnt)], check=True)  # detach it anyway


def used_mib(path: Path) -> float:
    return shutil.disk_usage(path).used / 2**20


def test_a_full_disk_fails_saves_without_stopping_training_and_keeps_the_last_checkpoint(
        small_disk: Path, agent_channel: AgentChannel) -> None:
    loc = small_disk / "ckpt"
    ckpt = Checkpointer(loc, keep=3, async_save=True, max_consecutive_failures=3)
    for step in (1, 2):
        ckpt.save(step, step_state(step, mib=STATE_MIB))
    ckpt.wait()
    assert [m["step"] for m in agent_channel.of_kind("checkpoint_saved")] == [1, 2]
    used_with_two = used_mib(small_disk)

    ckpt.save(3, step_state(3, mib=STATE_MIB))  # returns: the write fails behind it
    ckpt.wait()  # no exception: 1 failure < max_consecutive_failures
    failed = agent_channel.wait_for("checkpoint_save_failed", step=3)
    assert failed["consecutive"] == 1 and failed["location"] == str(loc), failed
    assert "No space left on device" in failed["error"], failed["error"]
    assert sorted(p.name for p in loc.iterdir()) == ["latest", "step-000000001",
                                                     "step-000000002"]
    assert used_mib(small_disk) <= used_with_two + 0.1, "the half-written save still uses space"
    assert (loc / "latest").read_text() == "step-000000002"

    ckpt.save(4, step_state(4, mib=STATE_MIB))  # the retry fails too, still no exception
    ckpt.save(5, step_state(5, mib=STATE_MIB))
    with pytest.raises(CheckpointError, match="3 checkpoint saves in a row failed"):
        ckpt.wait()
    assert [m["consecutive"] for m in agent_channel.of_kind("checkpoint_save_failed")] == [
        1, 2, 3]
    assert sorted(p.name for p in loc.iterdir()) == ["latest", "step-000000001",
                                                     "step-000000002"]

    listing = [(c.step, c.status) for c in Checkpointer(loc).list()]
    assert listing == [(2, Status.VALID), (1, Status.VALID)]
    assert load_and_compare(loc) == (2, [])
    # walk-through 24: once the limit is reached the loop stops at its next step, not at
    # its next save (ten steps trained that could not be kept, each attempt)
    with pytest.raises(CheckpointError, match="3 checkpoint saves in a row failed"):
        ckpt.maybe_save(6, step_state(6, mib=STATE_MIB))  # not a save step (every_steps 0)


def load_and_compare(loc: Path) -> tuple[int | None, list[str]]:
    """(step loaded, differences from what was saved); the loaded tensors map files on the
    small disk (torch.load(mmap=True)) and are gone when this returns."""
    state = fresh_state()
    step = Checkpointer(loc).load_latest(state)
    return step, state_diff(state, step_state(step or 0, mib=STATE_MIB))


def test_the_disk_full_event_says_the_disk_is_full(
        small_disk: Path, agent_channel: AgentChannel) -> None:
    ckpt = Checkpointer(small_disk / "ckpt", keep=3, async_save=False)
    for step in (1, 2, 3):
        ckpt.save(step, step_state(step, mib=STATE_MIB))
    failed = agent_channel.wait_for("checkpoint_save_failed", step=3)
    assert "No space left on device" in failed["error"], failed["error"]
