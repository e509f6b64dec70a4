"""The owner mark (`.trainguard-job`) of a --log-dir or --checkpoint-dir has one writer and one
reader (controller/dir_owner.py), used by the launch checks and by `prune` (review of
walk-through 31 #8: it was written by two functions, read by three and named twice)."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import pytest

from trainguard.controller.dir_owner import OWNER_NAME, read_owner, write_owner
from trainguard.launch_checks import claim_checkpoint_dir, claim_log_dir
from trainguard.paths import JobPaths


def test_a_log_dir_and_a_checkpoint_dir_are_marked_alike_and_read_back(tmp_path: Path) -> None:
    job = tmp_path / "job"
    paths = JobPaths(job, tmp_path / "logs", str(tmp_path / "ck"), log_dir_key="log_dir",
                     checkpoint_dir_key="checkpoint_dir")
    for d in (tmp_path / "logs", tmp_path / "ck"):
        d.mkdir()
    before = time.time()
    claim_log_dir(paths, "run-1")
    claim_checkpoint_dir(paths, "run-1")
    want = {"run_id": "run-1", "job_dir": str(job), "host": socket.gethostname(),
            "pid": str(os.getpid())}
    for mark in (read_owner(tmp_path / "logs"), read_owner(str(tmp_path / "ck"))):
        assert mark is not None and before <= float(mark.pop("at")) <= time.time()  # launched
        assert mark == want
    assert sorted(os.listdir(tmp_path / "ck")) == [OWNER_NAME]  # no temporary file left


def test_an_object_store_mark_reads_back_and_a_broken_one_is_none(tmp_path: Path) -> None:
    url = f"memory://dir-owner-{os.getpid()}/run"
    write_owner(url, "run-2", tmp_path / "j")
    owner = read_owner(url)
    assert owner is not None and owner["job_dir"] == str(tmp_path / "j")
    (tmp_path / OWNER_NAME).write_text(json.dumps({"job_dir": ""}))
    assert read_owner(tmp_path) is None  # names no job dir
    (tmp_path / OWNER_NAME).write_text("{not json")
    assert read_owner(tmp_path) is None


def test_a_store_that_refuses_conditional_writes_gets_the_plain_write(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An S3-compatible store without conditional PUTs answers the headers with an error (not
    a failed precondition): the mark is written plainly, not left unwritten."""
    import trainguard.controller.dir_owner as do

    class Refusing:
        protocol = ("s3", "s3a")

        def __init__(self) -> None:
            self.files: dict[str, bytes] = {}

        def pipe_file(self, path: str, data: bytes, **kw: object) -> None:
            if kw:
                raise OSError(5, "NotImplemented: A header you provided implies "
                              "functionality that is not implemented")
            self.files[path] = data

    fs = Refusing()
    monkeypatch.setattr(do, "fs_of", lambda url: fs)
    for version in (do.ABSENT, '"etag"'):
        assert do.write_owner("s3://b/run", "run-a", tmp_path, version)
        assert json.loads(fs.files[f"s3://b/run/{do.OWNER_NAME}"])["run_id"] == "run-a"
        fs.files.clear()
