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
from trainguard.errors import SpecError
from trainguard.launch_checks import claim_log_dir
from trainguard.launch_ckpt_dir import claim_checkpoint_dir
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


class _S3Answer(Exception):
    """What s3fs sets as the cause of its OSError: botocore's error with the response."""

    def __init__(self, code: str, status: int) -> None:
        super().__init__(code)
        self.response = {"Error": {"Code": code}, "ResponseMetadata": {"HTTPStatusCode": status}}


class _Store:
    """An S3 filesystem whose conditional PUTs get `answer` (None: honoured as written)."""

    protocol = ("s3", "s3a")

    def __init__(self, answer: tuple[str, int] | None) -> None:
        self.answer = answer
        self.files: dict[str, bytes] = {}

    def pipe_file(self, path: str, data: bytes, **kw: object) -> None:
        if kw and self.answer is not None:
            try:
                raise _S3Answer(*self.answer)
            except _S3Answer as cause:
                raise OSError(5, self.answer[0]) from cause
        self.files[path] = data


@pytest.mark.parametrize("answer", [("NotImplemented", 501), ("InvalidArgument", 400),
                                    ("", 501)])
def test_a_store_that_refuses_conditional_writes_gets_the_plain_write(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, answer: tuple[str, int]) -> None:
    """An S3-compatible store without conditional PUTs answers the headers with an error (not
    a failed precondition): the mark is written plainly, not left unwritten."""
    import trainguard.controller.dir_owner as do

    fs = _Store(answer)
    monkeypatch.setattr(do, "fs_of", lambda url: fs)
    for version in (do.ABSENT, '"etag"'):
        assert do.write_owner("s3://b/run", "run-a", tmp_path, version)
        assert json.loads(fs.files[f"s3://b/run/{do.OWNER_NAME}"])["run_id"] == "run-a"
        fs.files.clear()


@pytest.mark.parametrize("answer", [("PreconditionFailed", 412),
                                    ("ConditionalRequestConflict", 409), ("", 409)])
def test_a_conditional_write_another_came_before_writes_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, answer: tuple[str, int]) -> None:
    """Review 34 #1: AWS answers two conditional writes of one key at once with 409
    ConditionalRequestConflict to one: the other launch came first, as with a 412 (the
    plain write that followed a 409 let both jobs run)."""
    import trainguard.controller.dir_owner as do

    fs = _Store(answer)
    monkeypatch.setattr(do, "fs_of", lambda url: fs)
    assert not do.write_owner("s3://b/run", "run-a", tmp_path, do.ABSENT)
    assert fs.files == {}


def test_any_other_error_of_a_conditional_write_is_raised(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import trainguard.controller.dir_owner as do

    monkeypatch.setattr(do, "fs_of", lambda url: _Store(("InternalError", 500)))
    with pytest.raises(OSError, match="InternalError"):
        do.write_owner("s3://b/run", "run-a", tmp_path, '"etag"')


def _claims(monkeypatch: pytest.MonkeyPatch, version: object, written: list[bool],
            ) -> list[object]:
    """launch_ckpt_dir's claim of s3://b/run with owner_version giving `version` (an exception
    is raised) and write_owner answering `written` in turn; the versions it wrote on."""
    import trainguard.launch_ckpt_dir as lcd

    asked: list[object] = []

    def owner_version(url: str) -> object:
        if isinstance(version, Exception):
            raise version
        return version

    def write_owner(url: str, run_id: str, job_dir: Path, if_version: object) -> bool:
        asked.append(if_version)
        return written.pop(0)
    monkeypatch.setattr(lcd, "owner_version", owner_version)
    monkeypatch.setattr(lcd, "write_owner", write_owner)
    monkeypatch.setattr(lcd, "read_owner", lambda url: None)
    return asked


def test_a_version_that_cannot_be_read_is_taken_as_no_mark(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Review 34 #2: a HEAD answered 403 (a missing key without s3:ListBucket) made the write
    unconditional; it is on 'no mark there' now, which fails where one is."""
    import trainguard.launch_ckpt_dir as lcd

    asked = _claims(monkeypatch, PermissionError("403 Forbidden"), [True])
    lcd.claim_checkpoint_dir(JobPaths(tmp_path / "j", tmp_path / "l", "s3://b/run",
                                      checkpoint_dir_key="checkpoint_dir"), "run-a")
    assert asked == [lcd.ABSENT]


def test_a_launch_whose_conditional_write_loses_every_time_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Review 34 #3: after CLAIM_TRIES lost writes the launch went on without its mark, in
    silence."""
    import trainguard.launch_ckpt_dir as lcd

    asked = _claims(monkeypatch, '"etag"', [False] * lcd.CLAIM_TRIES)
    with pytest.raises(SpecError, match=r"changed under this launch 3 times"):
        lcd.claim_checkpoint_dir(JobPaths(tmp_path / "j", tmp_path / "l", "s3://b/run",
                                          checkpoint_dir_key="checkpoint_dir"), "run-a")
    assert asked == ['"etag"'] * lcd.CLAIM_TRIES
