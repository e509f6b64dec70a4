"""`trainguard ckpt ls|verify` on an object store (walk-through 31), against a real S3 server
(moto, loopback):

- #9: `ckpt ls|verify JOB_DIR` of a job that checkpoints to s3:// said "no checkpoints" (the
  recorded URL was looked up as a local path): it is read where it is.
- #2: `ckpt ls s3://nobucket/x` printed "no checkpoints" and exited 0: a bucket that does not
  exist (and a prefix with nothing under it, given as LOCATION) exits 2 naming it and the fix,
  as a local path that does not exist does.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.checkpoint.conftest import S3Location
from tests.unit.helpers import tg
from trainguard.checkpoint import Checkpointer
from trainguard.cli import main
from trainguard.controller.store import JobStore

pytestmark = [pytest.mark.s3]


def _options(loc: S3Location) -> list[str]:
    """The location's storage options as `-o KEY=VALUE` flags."""
    opts: dict[str, Any] = loc.storage_options
    return ["-o", f"client_kwargs.endpoint_url={opts['client_kwargs']['endpoint_url']}",
            "-o", f"key={opts['key']}", "-o", f"secret={opts['secret']}"]


def _env(loc: S3Location) -> dict[str, str]:
    """What a user sets for an S3-compatible server (as the walk-through's s3env.sh)."""
    opts: dict[str, Any] = loc.storage_options
    return {**os.environ, "AWS_ENDPOINT_URL": opts["client_kwargs"]["endpoint_url"],
            "AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "x",
            "AWS_DEFAULT_REGION": "us-east-1"}


@pytest.fixture
def s3_job(tmp_path: Path, s3_location: S3Location, no_agent: None) -> Path:
    """A job dir whose store records an s3:// checkpoint dir holding steps 5 and 10."""
    ckpt = Checkpointer(s3_location.url, storage_options=s3_location.storage_options,
                        async_save=False, keep=5)
    for step in (5, 10):
        ckpt.save(step, {"w": torch.full((4,), float(step))})
    ckpt.close()
    job = tmp_path / "job"
    with JobStore.create(job, "tg-s3") as store:
        store.set_meta(job_dir=str(job), checkpoint_dir=s3_location.url)
    return job


def test_ckpt_ls_and_verify_of_a_job_dir_read_its_s3_checkpoints(
        s3_job: Path, s3_location: S3Location, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ckpt", "ls", str(s3_job), "--json", *_options(s3_location)]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["step"], r["status"], r["latest"]) for r in rows] == [
        (10, "valid", True), (5, "valid", False)]
    assert main(["ckpt", "verify", str(s3_job), *_options(s3_location)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == s3_location.url, out
    assert "step 10 is valid: 2 data files, every checksum matches the manifest" in out, out


def test_ckpt_ls_of_an_s3_job_dir_through_the_real_command(
        s3_job: Path, s3_location: S3Location) -> None:
    """The finding's command: the endpoint and keys in the environment, JOB_DIR given."""
    r = tg("ckpt", "ls", str(s3_job), env=_env(s3_location))
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0] == s3_location.url, r.stdout
    assert "no checkpoints" not in r.stdout
    steps = [ln.split()[:3] for ln in r.stdout.splitlines()[2:4]]
    assert steps == [["10", "valid", "*"], ["5", "valid", "1"]], r.stdout  # 1: WORLD


def test_a_missing_bucket_or_prefix_is_an_error_naming_it(
        tmp_path: Path, s3_location: S3Location, capsys: pytest.CaptureFixture[str]) -> None:
    opts = _options(s3_location)
    endpoint = s3_location.storage_options["client_kwargs"]["endpoint_url"]
    for verb in ("ls", "verify"):
        assert main(["ckpt", verb, "s3://nobucket-w31/x", "--json", *opts]) == 2
        out, err = capsys.readouterr()
        assert out == ""
        assert err == (f"trainguard ckpt: error: LOCATION: the bucket 'nobucket-w31' of "
                       f"s3://nobucket-w31/x does not exist on {endpoint}. Fix: check the "
                       "bucket's name and the endpoint (AWS_ENDPOINT_URL or -o client_kwargs."
                       "endpoint_url=...); a job that saves there needs the bucket made "
                       "first\n"), err
    typo = f"s3://{s3_location.bucket}/rnu"
    assert main(["ckpt", "ls", typo, *opts]) == 2
    assert (f"LOCATION: nothing is stored under {typo} on {endpoint}: the bucket "
            f"'{s3_location.bucket}' exists, but holds no object under 'rnu'. Fix: check the "
            "prefix") in capsys.readouterr().err
    # a bucket that is there but empty, and a job dir whose location holds nothing yet: none
    assert main(["ckpt", "ls", f"s3://{s3_location.bucket}", *opts]) == 0
    assert capsys.readouterr().out == f"no checkpoints at s3://{s3_location.bucket}\n"
    job = tmp_path / "job"
    with JobStore.create(job, "tg-new") as store:
        store.set_meta(job_dir=str(job), checkpoint_dir=s3_location.url)
    assert main(["ckpt", "ls", str(job), *opts]) == 0
    assert capsys.readouterr().out == f"no checkpoints at {s3_location.url}\n"
    with JobStore.create(job, "tg-new") as store:  # ... but not in a bucket that is not there
        store.set_meta(checkpoint_dir="s3://nobucket-w31/run")
    assert main(["ckpt", "verify", str(job), *opts]) == 2
    assert "the bucket 'nobucket-w31' of s3://nobucket-w31/run does not exist" in \
        capsys.readouterr().err


def test_a_missing_bucket_names_the_endpoint_botocore_used(
        tmp_path: Path, s3_location: S3Location) -> None:
    """Review of walk-through 31 #16: with the endpoint in AWS_ENDPOINT_URL_S3 (or a config
    file), botocore asked the right server, and the error said "on AWS (no AWS_ENDPOINT_URL
    is set)", sending the user to fix an endpoint that was fine."""
    env = _env(s3_location)
    endpoint = env.pop("AWS_ENDPOINT_URL")
    env["AWS_ENDPOINT_URL_S3"] = endpoint
    env["AWS_CONFIG_FILE"] = str(tmp_path / "none")  # this user's own config: not read
    r = tg("ckpt", "ls", "s3://nobucket-w31/x", env=env)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert (f"LOCATION: the bucket 'nobucket-w31' of s3://nobucket-w31/x does not exist on "
            f"{endpoint}. Fix: ") in r.stderr, r.stderr


def test_ckpt_verify_of_s3_goes_on_when_pruning_removes_a_step_it_checks(
        s3_job: Path, s3_location: S3Location, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Walk-through 35 F13 on the store it was seen on: a job's commit pruned step 5 while
    `verify` hashed it, and verify failed, `cannot read ...: FileNotFoundError`, exit 2."""
    from trainguard.checkpoint.storage import Storage

    sha256 = Storage.sha256

    def pruned_while_read(st: Storage, rel: str) -> str:
        if rel.startswith("step-000000005/"):
            st.remove("step-000000005")  # as prune does
        return sha256(st, rel)

    monkeypatch.setattr(Storage, "sha256", pruned_while_read)
    assert main(["ckpt", "verify", str(s3_job), "--json", *_options(s3_location)]) == 0
    std = capsys.readouterr()
    assert [(r["step"], r["status"]) for r in json.loads(std.out)] == [(10, "valid")]
    assert "note: step(s) 5 went while being checked" in std.err, std.err
