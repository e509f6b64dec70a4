"""Walk-through 31 #10, DCP's part: a storage error while DCP reads the shards of the step
every rank agreed on is tried again, and when it lasts it is said as a storage error (it
escaped as DCP's CheckpointException, a BaseException, after the step had been checked).
A real DCP checkpoint in one process (no process group); the read errors are fakes."""

from __future__ import annotations

import errno
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.distributed.checkpoint.filesystem import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

from trainguard.checkpoint import loading
from trainguard.checkpoint.errors import CheckpointError
from trainguard.checkpoint.sharded import SUBDIR, load_sharded
from trainguard.checkpoint.storage import Storage


class Holder:
    def __init__(self) -> None:
        self.t = torch.zeros(6)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {"t": self.t}

    def load_state_dict(self, sd: dict[str, torch.Tensor]) -> None:
        self.t = sd["t"]


@pytest.fixture
def saved(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Storage:
    monkeypatch.setattr(loading, "RETRY_DELAYS", (0.0, 0.0, 0.0))
    dcp_save({"w": {"t": torch.arange(6.0)}},
             storage_writer=FileSystemWriter(tmp_path / SUBDIR), no_dist=True)
    return Storage(tmp_path)


def _flaky_reads(monkeypatch: pytest.MonkeyPatch, times: int) -> list[int]:
    real = FileSystemReader.read_data
    failed: list[int] = []

    def read_data(self: Any, plan: Any, planner: Any) -> Any:
        if len(failed) < times:
            failed.append(1)
            raise OSError(errno.EIO, "Input/output error (injected)")
        return real(self, plan, planner)

    monkeypatch.setattr(FileSystemReader, "read_data", read_data)
    return failed


def test_a_read_error_of_dcp_is_tried_again_and_the_shards_load(
        saved: Storage, monkeypatch: pytest.MonkeyPatch) -> None:
    failed = _flaky_reads(monkeypatch, times=2)
    state = {"w": Holder()}
    load_sharded(saved, ".", state, ["w"])
    assert len(failed) == 2 and torch.equal(state["w"].t, torch.arange(6.0))


def test_a_lasting_read_error_of_dcp_says_the_storage_cannot_be_read(
        saved: Storage, monkeypatch: pytest.MonkeyPatch) -> None:
    failed = _flaky_reads(monkeypatch, times=99)
    with pytest.raises(CheckpointError) as e:
        load_sharded(saved, ".", {"w": Holder()}, ["w"])
    msg = str(e.value)
    assert "cannot read the DCP shards" in msg and "not corruption" in msg, msg
    assert "reading a DCP shard failed: OSError: [Errno 5]" in msg and "Fix:" in msg, msg
    assert len(failed) == len(loading.RETRY_DELAYS) + 1
