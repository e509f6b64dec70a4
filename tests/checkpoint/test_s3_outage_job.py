"""A real job whose checkpoint store (moto's S3 server) goes down mid-run: the ranks fail
after their failed saves in a row, the diagnosis reads the store, not the script, and the
job is restarted under the default (conditional) policy once the store is back.
Walk-through 19: the same outage of 25 s was read as the user's code (`CheckpointError`
raised in trainguard's own file), 'restart helps: no', and the job failed with its whole
restart budget left."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.checkpoint.conftest import S3Server
from tests.integration.conftest import EXAMPLE, TG

pytestmark = [pytest.mark.s3]


def _events(job: Path) -> list[dict[str, Any]]:
    if not (job / "trainguard.db").exists():
        return []
    out = subprocess.run([*TG, "events", str(job), "--json"], capture_output=True, text=True,
                         timeout=60)
    return json.loads(out.stdout) if out.returncode == 0 else []


def _wait(job: Path, reason: str, timeout: float = 120) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = [e for e in _events(job) if e["reason"] == reason]
        if found:
            return found[0]
        time.sleep(0.5)
    raise AssertionError(f"no {reason} within {timeout:g}s: {[e['reason'] for e in _events(job)]}")


@pytest.mark.long  # make test: its parts, tests/checkpoint/test_s3.py's outage tests (saves
# that fail while the server is down, a store down at load) and the diagnosis snippets of
# those S3 errors (a storage fault, restart helps); the whole job in make test-long
def test_a_checkpoint_store_outage_is_the_storages_and_the_job_is_restarted(
        private_s3: S3Server, tmp_path: Path) -> None:
    bucket = private_s3.new_bucket()
    job = tmp_path / "job"
    env = {k: v for k, v in os.environ.items() if k != "TRAINGUARD_FAULT"}
    env.update(AWS_ENDPOINT_URL=private_s3.url, AWS_ACCESS_KEY_ID="x",
               AWS_SECRET_ACCESS_KEY="x", AWS_DEFAULT_REGION="us-east-1",
               AWS_MAX_ATTEMPTS="1")  # botocore's own retries are not under test
    with open(tmp_path / "console.log", "w") as console:
        proc = subprocess.Popen(
            [*TG, "run", "--nproc-per-node", "1", "--max-restarts", "3", "--job-dir",
             str(job), "--checkpoint-dir", f"s3://{bucket}/run", "--no-standby-workers",
             str(EXAMPLE), "--steps", "400", "--step-time", "0.05", "--ckpt-every", "10"],
            env=env, stdout=console, stderr=subprocess.STDOUT)
    try:
        _wait(job, "CheckpointSaved")
        private_s3.kill()  # the store goes down mid-run
        diagnosed = _wait(job, "FailureDiagnosed")
        private_s3.start()  # ... and comes back (empty: the bucket is made again)
        private_s3.new_bucket_named(bucket)
        assert proc.wait(timeout=300) == 0, (tmp_path / "console.log").read_text()[-3000:]
    finally:
        proc.kill()
    assert diagnosed["message"].startswith(
        "disk_full_or_storage_io (storage, restart helps: maybe)"), diagnosed["message"]
    reasons = [e["reason"] for e in _events(job)]
    assert "RestartScheduled" in reasons and "JobFailed" not in reasons, reasons
    assert reasons[-1] == "JobSucceeded", reasons
