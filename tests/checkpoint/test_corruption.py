"""A damaged newest checkpoint is skipped, with the reason; the one before it is loaded.

Damage is done through the same fsspec filesystem the library uses, so every case runs
on local disk and on the S3 server.
"""

from __future__ import annotations

import hashlib
import io
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.checkpoint.conftest import (
    AgentChannel,
    Where,
    assert_state_is_step,
    fresh_state,
    step_state,
)
from trainguard import __version__
from trainguard.checkpoint import Checkpointer, Status
from trainguard.checkpoint.manifest import FileEntry, Manifest, rank_file, step_dir

pytestmark = pytest.mark.usefixtures("keep_rng")

REPLICATED = "replicated.pt"
RANK0 = rank_file(0)
MANIFEST = "manifest.json"


def saved(where: Where, steps: tuple[int, ...] = (1, 2)) -> Checkpointer:
    ckpt = where.checkpointer(async_save=False)
    for step in steps:
        ckpt.save(step, step_state(step))
    ckpt.close()
    return ckpt


def path(ckpt: Checkpointer, step: int, name: str) -> str:
    return ckpt.storage.path(step_dir(step), name)


def truncate(ckpt: Checkpointer, p: str) -> None:
    data = ckpt.storage.fs.cat_file(p)
    ckpt.storage.fs.pipe_file(p, data[: len(data) // 2])


def flip_a_byte(ckpt: Checkpointer, p: str) -> None:
    data = bytearray(ckpt.storage.fs.cat_file(p))
    data[len(data) // 2] ^= 0x01  # in the middle: tensor bytes, not the zip structure
    ckpt.storage.fs.pipe_file(p, bytes(data))


def delete(ckpt: Checkpointer, p: str) -> None:
    ckpt.storage.fs.rm(p)


def garbage_text(ckpt: Checkpointer, p: str) -> None:
    ckpt.storage.fs.pipe_file(p, b"not json{")


def garbage_bytes(ckpt: Checkpointer, p: str) -> None:
    ckpt.storage.fs.pipe_file(p, b"\x00\xffnot json{")  # json.loads guesses UTF-16


def other_format(ckpt: Checkpointer, p: str) -> None:
    ckpt.storage.fs.pipe_file(p, b'{"format": "someone-elses/2", "files": []}')


Damage = tuple[Callable[[Checkpointer, str], None], str, Status, Status, str]

# (damage, file, status in list() (sizes only), status on load, what the reason says)
DAMAGE: dict[str, Damage] = {
    "truncated-replicated": (truncate, REPLICATED, Status.CORRUPT, Status.CORRUPT,
                             "replicated.pt has"),
    "truncated-rank-file": (truncate, RANK0, Status.CORRUPT, Status.CORRUPT, "rank-00000.pt has"),
    "flipped-byte-replicated": (flip_a_byte, REPLICATED, Status.VALID, Status.CORRUPT,
                                "replicated.pt: checksum differs"),
    "flipped-byte-rank-file": (flip_a_byte, RANK0, Status.VALID, Status.CORRUPT,
                               "rank-00000.pt: checksum differs"),
    "deleted-manifest": (delete, MANIFEST, Status.INCOMPLETE, Status.INCOMPLETE, "no manifest"),
    "garbage-text-manifest": (garbage_text, MANIFEST, Status.CORRUPT, Status.CORRUPT,
                              "malformed manifest"),
    "garbage-bytes-manifest": (garbage_bytes, MANIFEST, Status.CORRUPT, Status.CORRUPT,
                               "malformed manifest"),
    "manifest-of-another-format": (other_format, MANIFEST, Status.CORRUPT, Status.CORRUPT,
                                   "unknown format"),
    "deleted-rank-file": (delete, RANK0, Status.CORRUPT, Status.CORRUPT,
                          "rank-00000.pt is missing"),
    "deleted-replicated": (delete, REPLICATED, Status.CORRUPT, Status.CORRUPT,
                           "replicated.pt is missing"),
}


@pytest.mark.parametrize("kind", DAMAGE)
def test_a_damaged_newest_checkpoint_is_skipped_and_the_previous_one_loads_exactly(
        where: Where, kind: str, agent_channel: AgentChannel,
        caplog: pytest.LogCaptureFixture) -> None:
    damage, name, listed, on_load, reason = DAMAGE[kind]
    ckpt = saved(where)
    damage(ckpt, path(ckpt, 2, name))

    listing = {c.step: c for c in ckpt.list()}
    assert listing[1].status == Status.VALID
    assert listing[2].status == listed, listing[2]
    if listed != Status.VALID:
        assert reason in listing[2].reason, listing[2]

    state = fresh_state()
    with caplog.at_level(logging.WARNING, logger="trainguard.checkpoint"):
        assert where.checkpointer().load_latest(state) == 1
    assert_state_is_step(state, 1)

    warned = [r.getMessage() for r in caplog.records if "skipping checkpoint step 2" in
              r.getMessage()]
    assert len(warned) == 1 and f"({on_load.value})" in warned[0] and reason in warned[0], \
        caplog.text
    msg = agent_channel.wait_for("checkpoint_corrupt", step=2)
    assert msg["status"] == on_load.value and reason in msg["reason"], msg
    assert msg["location"] == where.url
    assert agent_channel.wait_for("resumed")["step"] == 1
    assert [m["step"] for m in agent_channel.of_kind("checkpoint_corrupt")] == [2]


def test_two_damaged_checkpoints_fall_back_two_steps_each_reported(
        where: Where, agent_channel: AgentChannel) -> None:
    ckpt = saved(where, (1, 2, 3))
    flip_a_byte(ckpt, path(ckpt, 3, REPLICATED))
    delete(ckpt, path(ckpt, 2, MANIFEST))
    state = fresh_state()
    assert where.checkpointer().load_latest(state) == 1
    assert_state_is_step(state, 1)
    reports = [(m["step"], m["status"]) for m in agent_channel.of_kind("checkpoint_corrupt")]
    assert reports == [(3, "corrupt"), (2, "incomplete")]


def test_the_lowest_rank_that_failed_tells_its_own_reason(where: Where) -> None:
    """(walk-through 22) Rank 1's part failed its checksum; the job's CheckpointCorrupt came
    from rank 0 and said only 'another rank could not load it' (the reason sat in rank 1's
    log). The ranks now learn which failed; the lowest of them tells, with its own reason."""
    from trainguard.checkpoint.loading import load_newest
    from trainguard.checkpoint.manifest import Verdict

    ckpt = saved(where)
    told: list[tuple[int, str, bool]] = []

    def report(v: Verdict, tell: bool) -> None:
        told.append((v.step, v.reason, tell))

    # rank 0 loads each step fine, rank 1 does not: rank 0 skips them too, and keeps quiet
    assert load_newest(ckpt.storage, 0, lambda ok: [1] if ok else [0, 1], report) is None
    assert told == [(2, "rank 1 could not load it", False), (1, "rank 1 could not load it",
                                                             False)]
    flip_a_byte(ckpt, path(ckpt, 1, RANK0))  # now rank 0 itself fails on step 1
    told.clear()
    assert load_newest(ckpt.storage, 0, lambda ok: [] if ok else [0, 1], report).step == 2
    flip_a_byte(ckpt, path(ckpt, 2, RANK0))
    told.clear()
    assert load_newest(ckpt.storage, 0, lambda ok: [] if ok else [0, 1], report) is None
    assert [(s, t) for s, _, t in told] == [(2, True), (1, True)]
    assert all("rank-00000.pt: checksum differs" in r and "(rank 0, 1 could not load it)" in r
               for _, r, _ in told), told


def test_nothing_loadable_gives_none_after_reporting_every_checkpoint(
        where: Where, agent_channel: AgentChannel) -> None:
    ckpt = saved(where)
    for step in (1, 2):
        truncate(ckpt, path(ckpt, step, RANK0))
    assert where.checkpointer().load_latest(fresh_state()) is None
    assert [m["step"] for m in agent_channel.of_kind("checkpoint_corrupt")] == [2, 1]
    assert agent_channel.of_kind("resumed") == []


# -- loading never runs pickled code ------------------------------------------------------

class MakesAFile:
    """Unpickled by a plain pickle.load, this opens (creates) a file: code from the data."""

    def __init__(self, target: Path) -> None:
        self.target = target

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (str(self.target), "w"))


def plant_malicious_step(ckpt: Checkpointer, step: int, target: Path) -> bytes:
    """A step-N whose replicated.pt holds a pickled object, with a manifest that matches it
    (sizes, SHA-256) and a genuine rank file: only the content is wrong."""
    buf = io.BytesIO()
    torch.save({**step_state(step)["model"].state_dict(), "payload": MakesAFile(target)}, buf)
    payload = buf.getvalue()
    fs, d = ckpt.storage.fs, ckpt.storage.path(step_dir(step))
    fs.makedirs(d, exist_ok=True)
    rank = fs.cat_file(path(ckpt, step - 1, RANK0))
    fs.pipe_file(f"{d}/{REPLICATED}", payload)
    fs.pipe_file(f"{d}/{RANK0}", rank)
    files = tuple(FileEntry(name, len(data), hashlib.sha256(data).hexdigest(), 0)
                  for name, data in ((REPLICATED, payload), (RANK0, rank)))
    manifest = Manifest(step=step, world_size=1, files=files, library_version=__version__,
                        created_at=time.time())
    fs.pipe_file(f"{d}/{MANIFEST}", manifest.to_json())
    return payload


def test_a_malicious_pickle_with_a_matching_checksum_never_runs_its_code(
        where: Where, tmp_path: Path) -> None:
    ckpt = saved(where)
    target = tmp_path / "pwned"
    payload = plant_malicious_step(ckpt, 3, target)
    newest = ckpt.list()[0]
    assert (newest.step, newest.status) == (3, Status.VALID)  # sizes and manifest match

    where.checkpointer().load_latest(fresh_state())
    assert not target.exists(), "loading a checkpoint ran code from it"

    torch.load(io.BytesIO(payload), weights_only=False)  # the payload is live: it does run
    assert target.exists()


def test_a_checkpoint_that_is_not_plain_data_is_skipped_as_corrupt(
        where: Where, tmp_path: Path, agent_channel: AgentChannel) -> None:
    ckpt = saved(where)
    plant_malicious_step(ckpt, 3, tmp_path / "pwned")
    state = fresh_state()
    assert where.checkpointer().load_latest(state) == 2
    assert_state_is_step(state, 2)
    msg = agent_channel.wait_for("checkpoint_corrupt", step=3)
    assert msg["status"] == "corrupt" and msg["reason"], msg
    assert not (tmp_path / "pwned").exists()


def test_a_step_skipped_as_corrupt_is_written_again_when_training_reaches_it(
        where: Where) -> None:
    ckpt = saved(where)
    flip_a_byte(ckpt, path(ckpt, 2, REPLICATED))
    resumed = where.checkpointer(async_save=False)
    assert resumed.load_latest(fresh_state()) == 1
    resumed.save(2, step_state(2, attempt=1))  # the resumed run trains on to step 2
    state = fresh_state()
    assert where.checkpointer().load_latest(state) == 2, "step 2 is still the corrupt one"
    assert_state_is_step(state, 2, attempt=1)


def test_a_step_written_anew_after_corrupt_on_load_is_kept_by_later_pruning(
        where: Where) -> None:
    """Walk-through 4: steps 50, 60, 70 with 70 corrupt; a resumed run re-saves 70 and saves
    75. The new 70 is valid: pruning keeps 75, 70, 60 (it deleted the new 70, kept 50)."""
    ckpt = saved(where, (1, 2, 3))
    flip_a_byte(ckpt, path(ckpt, 3, REPLICATED))
    resumed = where.checkpointer(async_save=False)  # keep=3
    assert resumed.load_latest(fresh_state()) == 2
    resumed.save(3, step_state(3, attempt=1))  # written anew
    resumed.save(4, step_state(4, attempt=1))  # prunes
    resumed.close()
    assert [c.step for c in resumed.list()] == [4, 3, 2]
    resumed.storage.remove(step_dir(4))
    state = fresh_state()
    assert where.checkpointer().load_latest(state) == 3, "the new step 3 must load"
    assert_state_is_step(state, 3, attempt=1)
