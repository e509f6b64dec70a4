"""The one reading of a location's bucket (checkpoint/store_errors.bucket_of) behind the
missing-bucket error, the launcher's reading of a rank's error line and same_bucket, and
the launcher's decision that the job's committed checkpoints went with their bucket."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainguard.checkpoint.store_errors import (
    bucket_of,
    committed_bucket_lost,
    missing_bucket,
    missing_bucket_problem,
    same_bucket,
    says_bucket_missing,
)


@pytest.mark.parametrize("location, bucket", [
    ("s3://ckb/run4/step-30", "ckb"), ("s3://ckb", "ckb"), ("gs://other/x", "other"),
    ("file:///tmp/x", ""), ("/tmp/ckpt", None), ("ckb/run4", None)])
def test_bucket_of(location: str, bucket: str | None) -> None:
    assert bucket_of(location) == bucket


def test_same_bucket() -> None:
    assert same_bucket("s3://ckb/run4/step-30", "s3://ckb/run4")
    assert not same_bucket("s3://ckb/run4", "s3://ckc/run4")
    assert not same_bucket("s3://ckb/run4", "gs://ckb/run4")
    assert not same_bucket("s3://ckb/run4", Path("/ckb/run4"))
    assert not same_bucket(None, "s3://ckb")
    assert not same_bucket("/ckb/run4", "/ckb/run4")


class _ClientError(Exception):
    def __init__(self, code: str, bucket: str | None = None) -> None:
        super().__init__(code)
        self.response = {"Error": {"Code": code, **({"BucketName": bucket} if bucket else {})}}


def _os_error(code: str, bucket: str | None = None) -> OSError:
    e = OSError("the store said no")
    e.__cause__ = _ClientError(code, bucket)
    return e


def test_missing_bucket_names_the_store_s_bucket_else_the_location_s() -> None:
    assert missing_bucket(_os_error("NoSuchBucket", "named"), "s3://ckb/run") == "named"
    assert missing_bucket(_os_error("NoSuchBucket"), "s3://ckb/run") == "ckb"
    assert missing_bucket(_os_error("AccessDenied"), "s3://ckb/run") is None


def test_says_bucket_missing_reads_only_its_own_bucket() -> None:
    problem, _ = missing_bucket_problem("s3://ckb/run4", "ckb")
    line = f"CheckpointError: {problem}"
    assert says_bucket_missing(line, "s3://ckb/run4")
    assert not says_bucket_missing(line, "s3://data/run4")
    assert not says_bucket_missing(line, "/ckb/run4")


def test_committed_bucket_lost_needs_the_commit_in_the_checkpoint_dir_s_bucket_and_its_error(
        ) -> None:
    problem, _ = missing_bucket_problem("s3://ckb/run4", "ckb")
    lines = ["step 30 ok", f"CheckpointError: {problem}"]
    assert committed_bucket_lost("s3://ckb/run4/step-30", "s3://ckb/run4", lines)
    assert not committed_bucket_lost("s3://ckb/run4/step-30", "s3://ckb/run4", lines[:1])
    assert not committed_bucket_lost(None, "s3://ckb/run4", lines)
    # the job's newest commit went to another bucket (a relaunch moved it): not this one's
    assert not committed_bucket_lost("s3://old/run4/step-30", "s3://ckb/run4", lines)
    # a dataset's bucket gone names another bucket (review 45 #6)
    data, _ = missing_bucket_problem("s3://data/x", "data")
    assert not committed_bucket_lost("s3://ckb/run4/step-30", "s3://ckb/run4",
                                     [f"CheckpointError: {data}"])
