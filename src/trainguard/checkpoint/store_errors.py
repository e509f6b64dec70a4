"""What an object store's error says. s3fs raises OSErrors whose cause is botocore's
ClientError, with S3's error code in its response: a bucket that does not exist is a definite
answer (NoSuchBucket), unlike a store that does not answer. Pure: read by the launch's claim
on a --checkpoint-dir (controller/dir_owner.py) and by the ranks' load_latest."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit


def bucket_of(location: str) -> str | None:
    """The bucket of an fsspec URL (`s3://ckb/run4/step-30`: 'ckb'), None for a local path."""
    return urlsplit(location).netloc if "://" in location else None


def s3_error(e: BaseException) -> str:
    """The S3 error code behind s3fs's OSError (its cause's response), else the HTTP status,
    else ''."""
    response = getattr(e.__cause__, "response", None) or {}
    code = response.get("Error", {}).get("Code")
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return str(code or status or "")


def missing_bucket(e: BaseException, location: str) -> str | None:
    """The bucket the store answered does not exist (NoSuchBucket), else None: the bucket
    the error names, or the first part of `location` (`s3://bucket/prefix`)."""
    if s3_error(e) != "NoSuchBucket":
        return None
    response = getattr(e.__cause__, "response", None) or {}
    named = response.get("Error", {}).get("BucketName")
    return str(named or bucket_of(location) or location)


def missing_bucket_problem(location: str, bucket: str) -> tuple[str, str]:
    """(the problem, the fix) of a location whose bucket does not exist (walk-through 35 F2:
    a job trained three save intervals before its first save found it)."""
    return (f"the bucket {bucket!r} of {location} does not exist (the store answered "
            "NoSuchBucket: The specified bucket does not exist)",
            "make the bucket first, or check its name and the endpoint (AWS_ENDPOINT_URL)")


def says_bucket_missing(line: str, location: str) -> bool:
    """Whether an error line is missing_bucket_problem's for `location`'s bucket (a rank's
    CheckpointError: the launcher tells the checkpoint bucket gone from another one)."""
    bucket = bucket_of(location)
    return bucket is not None and f"the bucket {bucket!r} of " in line and \
        "does not exist" in line


def same_bucket(location: str | None, other: str | Path) -> bool:
    """Whether two fsspec URLs name the same bucket (`s3://ckb/run4/step-30` and
    `s3://ckb/run4`: scheme and bucket); never a local path."""
    if location is None or bucket_of(location) is None:
        return False
    a, b = urlsplit(location), urlsplit(str(other))
    return bucket_of(str(other)) == a.netloc and a.scheme == b.scheme


def committed_bucket_lost(newest_location: str | None, checkpoint_dir: str | Path,
                          error_lines: list[str]) -> bool:
    """Whether a failed attempt's error lines say the bucket this job committed its newest
    checkpoint to (`newest_location`) is gone: that checkpoint's bucket is the checkpoint
    dir's, and some line is missing_bucket_problem's for it (review 45 #6: a dataset's
    bucket gone is not the checkpoints')."""
    return same_bucket(newest_location, checkpoint_dir) and \
        any(says_bucket_missing(line, str(checkpoint_dir)) for line in error_lines)
