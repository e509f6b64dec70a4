"""Two launches into one s3:// checkpoint dir within one round trip of each other (review of
walk-through 31 #3's leftover), against a real S3 server (moto, loopback): the launch that
checked the mark before the other wrote it, and wrote its own after the other's check, started
beside a running job. The mark is now written on the condition that it is still the version
read before the check (a conditional PUT); the launch that lost checks again and is refused."""

from __future__ import annotations

import fcntl
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import trainguard.launch_ckpt_dir as lc
from tests.checkpoint.conftest import S3Location
from trainguard.controller.dir_owner import (
    ABSENT,
    OWNER_NAME,
    owner_version,
    read_owner,
    write_owner,
)
from trainguard.errors import SpecError
from trainguard.paths import LOCK_NAME, JobPaths

pytestmark = [pytest.mark.s3]


@pytest.fixture
def s3_env(s3_location: S3Location, monkeypatch: pytest.MonkeyPatch) -> S3Location:
    """What a user sets for an S3-compatible server: the launch's own fsspec reads it (a
    fresh filesystem: s3fs keeps instances by their arguments, not the environment, and a
    test before may have made one for another endpoint)."""
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()
    monkeypatch.setattr(s3fs.S3FileSystem, "_cache", {})
    opts: dict[str, Any] = s3_location.storage_options
    monkeypatch.setenv("AWS_ENDPOINT_URL", opts["client_kwargs"]["endpoint_url"])
    for k, v in (("AWS_ACCESS_KEY_ID", "x"), ("AWS_SECRET_ACCESS_KEY", "x"),
                 ("AWS_DEFAULT_REGION", "us-east-1")):
        monkeypatch.setenv(k, v)
    return s3_location


@pytest.fixture
def running_job(tmp_path: Path) -> Iterator[Path]:
    """A job dir whose launcher runs: its lock held, as a launcher holds it."""
    job = tmp_path / "job-a"
    job.mkdir()
    with open(job / LOCK_NAME, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield job


def paths(job: Path, url: str) -> JobPaths:
    return JobPaths(job, job / "logs", url, checkpoint_dir_key="checkpoint_dir")


def test_the_launch_whose_mark_write_comes_after_the_others_is_refused(
        s3_env: S3Location, running_job: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Launch b checks the dir (empty); launch a claims it in full (writes, checks again,
    passes: its job runs); then b writes. Before, b's write replaced a's mark and b's check
    after it read b's own: both jobs ran in one dir."""
    url = s3_env.url
    b = tmp_path / "job-b"
    check = lc.check_checkpoint_dir
    calls = []

    def a_claims_between(p: JobPaths, until: float | None = None) -> None:
        check(p, until)
        if not calls:  # b's first check done: a's whole launch lands in between
            calls.append(p)
            monkeypatch.setattr(lc, "check_checkpoint_dir", check)
            lc.claim_checkpoint_dir(paths(running_job, url), "run-a")
            monkeypatch.setattr(lc, "check_checkpoint_dir", a_claims_between)
    monkeypatch.setattr(lc, "check_checkpoint_dir", a_claims_between)
    with pytest.raises(SpecError) as e:
        lc.claim_checkpoint_dir(paths(b, url), "run-b")
    assert f"is the checkpoint dir of the running job 'run-a' (job dir {running_job})" \
        in str(e.value)
    assert read_owner(url) is not None and read_owner(url)["run_id"] == "run-a"  # type: ignore[index]


def test_a_mark_written_on_a_version_fails_once_another_is_written(
        s3_env: S3Location, tmp_path: Path) -> None:
    url = s3_env.url
    assert owner_version(url) == ABSENT
    assert write_owner(url, "run-a", tmp_path / "a", ABSENT)
    assert not write_owner(url, "run-b", tmp_path / "b", ABSENT)  # it is there now
    seen = owner_version(url)
    assert seen not in (None, ABSENT)
    assert write_owner(url, "run-c", tmp_path / "c", seen)  # nothing changed since
    assert not write_owner(url, "run-d", tmp_path / "d", seen)  # c's changed it
    mark = json.loads(s3_env.fs().cat_file(s3_env.key(OWNER_NAME)))
    assert mark["run_id"] == "run-c"


def test_a_store_without_conditional_writes_keeps_the_checks_around_the_write(
        tmp_path: Path) -> None:
    """memory:// (fsspec's, no conditional PUT): no version, the write is plain."""
    url = f"memory://tg-{tmp_path.name}/run"
    assert owner_version(url) is None
    assert write_owner(url, "run-a", tmp_path / "a", None)
    assert read_owner(url)["run_id"] == "run-a"  # type: ignore[index]
