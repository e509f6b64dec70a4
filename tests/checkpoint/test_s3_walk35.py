"""Walk-through 35 F2: a checkpoint bucket that does not exist was not refused at launch
(the owner mark's read and write took NoSuchBucket for a store that did not answer) and
load_latest read it as "no checkpoint yet": the job trained three save intervals, then
failed with nothing saved."""

from __future__ import annotations

from pathlib import Path

import pytest

import trainguard.launch_ckpt_dir as lc
from tests.checkpoint.conftest import S3Location
from tests.checkpoint.test_owner_s3_race import paths, s3_env
from trainguard.checkpoint import Checkpointer, CheckpointError
from trainguard.errors import SpecError

pytestmark = [pytest.mark.s3]
__all__ = ["s3_env"]  # the fixture, used by name


def test_a_launch_into_a_bucket_that_does_not_exist_is_refused(
        s3_env: S3Location, tmp_path: Path) -> None:
    url = f"s3://no-{s3_env.bucket}/run1"
    with pytest.raises(SpecError) as e:  # `run` and `run --dry-run` (launch_checks.prepare)
        lc.check_checkpoint_url(paths(tmp_path / "job", url))
    assert f"the bucket 'no-{s3_env.bucket}' of {url} does not exist" in str(e.value)
    assert "make the bucket first" in str(e.value)
    lc.check_checkpoint_url(paths(tmp_path / "job", s3_env.url))  # there, nothing saved: ok


def test_load_latest_at_a_bucket_that_does_not_exist_is_a_checkpoint_error(
        s3_location: S3Location, no_agent: None) -> None:
    opts = s3_location.storage_options
    url = f"s3://no-{s3_location.bucket}/run1"
    with pytest.raises(CheckpointError, match=rf"^the bucket 'no-{s3_location.bucket}' of "
                       rf"{url} does not exist .*: nothing can be saved there. Fix: make the "
                       "bucket first"):
        Checkpointer(url, storage_options=opts, save_on_exit=False).load_latest({})
    empty = Checkpointer(s3_location.url, storage_options=opts, save_on_exit=False)
    assert empty.load_latest({}) is None  # a bucket with nothing saved yet
