"""Checkpoints on a real S3 server (moto, loopback): round trip, listing, pruning, and
storage that dies mid-save or comes back empty."""

from __future__ import annotations

import time
from typing import Any

import pytest
import torch
from torch import nn

from tests.checkpoint.conftest import (
    AgentChannel,
    S3Location,
    S3Server,
    Where,
    assert_state_is_step,
    fresh_state,
    step_state,
)
from trainguard.checkpoint import Checkpointer, CheckpointError, ResumableSampler, Status
from trainguard.checkpoint.manifest import step_dir

pytestmark = [pytest.mark.s3, pytest.mark.usefixtures("keep_rng")]

# Fail fast when the server is gone: botocore's own retry schedule is not under test.
FAIL_FAST = {"retries": {"max_attempts": 1}, "connect_timeout": 2, "read_timeout": 20}


def training_objects(seed: int) -> dict[str, Any]:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    for _ in range(3):
        opt.zero_grad()
        model(torch.randn(8, 16)).square().mean().backward()
        opt.step()
        sched.step()
    sampler = ResumableSampler(100, seed=5, rank=0, world_size=1)  # same data order
    list(zip(range(7 * seed), sampler, strict=False))  # another position
    return {"model": model, "optimizer": opt, "scheduler": sched, "sampler": sampler}


def test_a_checkpoint_round_trips_through_s3_bit_for_bit(
        s3_location: S3Location, no_agent: None) -> None:
    saved = training_objects(seed=1)
    plain = {"step": 7, "name": "run-a", "history": [0.5, 0.25, None],
             "tensors": {"bf16": torch.randn(5, 3).bfloat16(), "int8": torch.arange(-5, 5,
                         dtype=torch.int8), "bool": torch.tensor([True, False]),
                         "f64": torch.randn(4, dtype=torch.float64),
                         "strided": torch.arange(24.0).reshape(4, 6).t()}}
    ckpt = Checkpointer(s3_location.url, storage_options=s3_location.storage_options)
    ckpt.save(7, {**saved, "plain": plain})
    ckpt.close()

    loaded = training_objects(seed=2)  # other weights, other moments, other position
    target: dict[str, Any] = {**loaded, "plain": None}
    again = Checkpointer(s3_location.url, storage_options=s3_location.storage_options)
    assert again.load_latest(target) == 7
    for a, b in zip(saved["model"].state_dict().values(),
                    loaded["model"].state_dict().values(), strict=True):
        assert torch.equal(a, b)
    for key in ("exp_avg", "exp_avg_sq"):
        assert torch.equal(saved["optimizer"].state_dict()["state"][0][key],
                           loaded["optimizer"].state_dict()["state"][0][key])
    assert saved["scheduler"].state_dict() == loaded["scheduler"].state_dict()
    assert saved["sampler"].state_dict() == loaded["sampler"].state_dict()
    got = target["plain"]
    assert {k: got[k] for k in ("step", "name", "history")} == {
        k: plain[k] for k in ("step", "name", "history")}
    for name, t in plain["tensors"].items():
        assert got["tensors"][name].dtype == t.dtype and torch.equal(got["tensors"][name], t)


def test_listing_on_s3_shows_each_checkpoints_status(
        s3_location: S3Location, no_agent: None) -> None:
    where = Where("s3", s3_location.url, s3_location.storage_options)
    ckpt = where.checkpointer(async_save=False, keep=5)
    for step in (1, 2, 3):
        ckpt.save(step, step_state(step))
    fs = s3_location.fs()
    fs.rm(s3_location.key(f"{step_dir(3)}/manifest.json"))
    fs.pipe_file(s3_location.key(f"{step_dir(2)}/replicated.pt"), b"short")
    listing = [(c.step, c.status) for c in ckpt.list()]
    assert listing == [(3, Status.INCOMPLETE), (2, Status.CORRUPT), (1, Status.VALID)]
    reasons = {c.step: c.reason for c in ckpt.list()}
    assert "no manifest" in reasons[3] and "replicated.pt has 5 bytes" in reasons[2]


def test_pruning_on_s3_keeps_the_newest_and_removes_older_leftovers(
        s3_location: S3Location, no_agent: None) -> None:
    where = Where("s3", s3_location.url, s3_location.storage_options)
    ckpt = where.checkpointer(async_save=True, keep=2)
    for step in range(1, 6):
        ckpt.save(step, step_state(step))
    ckpt.wait()
    assert [(c.step, c.status) for c in ckpt.list()] == [(5, Status.VALID), (4, Status.VALID)]
    fs = s3_location.fs()
    keys = {k.removeprefix(s3_location.key("")) for k in fs.find(s3_location.key(""))}
    assert {k.split("/")[0] for k in keys} == {"latest", step_dir(4), step_dir(5)}
    assert fs.cat_file(s3_location.key("latest")) == step_dir(5).encode()

    # a save that died: files of step 3 without a manifest (older than the newest valid),
    # and of step 9 (newer: perhaps another attempt still writing it)
    for step in (3, 9):
        fs.pipe_file(s3_location.key(f"{step_dir(step)}/replicated.pt"), b"partial")
    ckpt.save(6, step_state(6))
    ckpt.close()
    listing = [(c.step, c.status) for c in ckpt.list()]
    assert listing == [(9, Status.INCOMPLETE), (6, Status.VALID), (5, Status.VALID)]
    state = fresh_state()
    assert where.checkpointer().load_latest(state) == 6
    assert_state_is_step(state, 6)


def test_a_resume_from_s3_lists_the_store_once(s3_location: S3Location,
                                               no_agent: None) -> None:
    """A listing is a request (and a page per 1,000 keys): the reachability check's one is
    the one the load reads."""
    where = Where("s3", s3_location.url, s3_location.storage_options)
    ckpt = where.checkpointer()
    for step in (1, 2):
        ckpt.save(step, step_state(step))
    ckpt.close()
    again = where.checkpointer()
    listed = again.storage.steps
    calls: list[list[int]] = []
    again.storage.steps = lambda: calls.append(listed()) or calls[-1]  # type: ignore[method-assign]
    state = fresh_state()
    assert again.load_latest(state) == 2 and calls == [[2, 1]]
    assert_state_is_step(state, 2)


# -- storage that dies --------------------------------------------------------------------

def start_multipart_and_kill(server: S3Server, bucket: str, timeout_s: float = 60) -> None:
    """Kill the server once a multipart upload (a big file being written) is under way."""
    import fsspec

    fs = fsspec.filesystem("s3", skip_instance_cache=True, **server.options())
    deadline = time.monotonic() + timeout_s
    while not fs.call_s3("list_multipart_uploads", Bucket=bucket).get("Uploads"):
        assert time.monotonic() < deadline, "the big write never started"
        time.sleep(0.01)
    server.kill()


def test_a_save_while_the_server_dies_fails_without_stopping_training_and_the_next_retries(
        private_s3: S3Server, agent_channel: AgentChannel) -> None:
    bucket = private_s3.new_bucket()
    url = f"s3://{bucket}/run"
    ckpt = Checkpointer(url, storage_options=private_s3.options(**FAIL_FAST))
    ckpt.save(1, step_state(1))
    ckpt.wait()
    agent_channel.wait_for("checkpoint_saved", step=1)

    ckpt.save(2, step_state(2, mib=160))  # returns once the state is copied to host memory
    # ... while the write (in 50 MiB parts) is still under way: that is when storage dies
    start_multipart_and_kill(private_s3, bucket)
    model = nn.Linear(8, 8)  # training goes on while the save fails behind it
    model(torch.randn(4, 8)).sum().backward()

    ckpt.wait()  # the failure is counted, not raised: 1 < max_consecutive_failures
    failed = agent_channel.wait_for("checkpoint_save_failed", step=2)
    assert failed["consecutive"] == 1 and failed["location"] == url and failed["error"]

    private_s3.start()  # storage is back (empty: re-create the bucket)
    private_s3.new_bucket_named(bucket)
    ckpt.save(3, step_state(3))
    ckpt.close()
    agent_channel.wait_for("checkpoint_saved", step=3)
    state = fresh_state()
    assert Checkpointer(url, storage_options=private_s3.options()).load_latest(state) == 3
    assert_state_is_step(state, 3)


def test_the_failure_reported_for_a_save_is_the_write_that_failed_not_the_cleanup(
        private_s3: S3Server, agent_channel: AgentChannel) -> None:
    bucket = private_s3.new_bucket()
    ckpt = Checkpointer(f"s3://{bucket}/run", storage_options=private_s3.options(**FAIL_FAST))
    ckpt.save(2, step_state(2, mib=160))
    start_multipart_and_kill(private_s3, bucket)
    ckpt.wait()
    failed = agent_channel.wait_for("checkpoint_save_failed", step=2)
    assert "replicated.pt" in failed["error"], failed["error"]


@pytest.mark.parametrize("async_save", [True, False])
def test_saves_that_keep_failing_raise_checkpoint_error_after_the_configured_number(
        private_s3: S3Server, agent_channel: AgentChannel, async_save: bool) -> None:
    bucket = private_s3.new_bucket()
    url = f"s3://{bucket}/run"
    ckpt = Checkpointer(url, storage_options=private_s3.options(**FAIL_FAST),
                        async_save=async_save, max_consecutive_failures=3)
    ckpt.save(1, step_state(1))
    ckpt.wait()
    private_s3.kill()
    returned = []
    with pytest.raises(CheckpointError) as err:
        for step in range(2, 10):
            ckpt.save(step, step_state(step))
            returned.append(step)
    # async: the third failure is known when the save after it waits for it
    assert returned == ([2, 3, 4] if async_save else [2, 3])
    assert "3 checkpoint saves in a row failed" in str(err.value) and url in str(err.value)
    failures = agent_channel.of_kind("checkpoint_save_failed")
    assert [(m["step"], m["consecutive"]) for m in failures] == [(2, 1), (3, 2), (4, 3)]


def test_a_restarted_empty_server_is_a_vanished_bucket_and_load_says_so_or_gives_none(
        private_s3: S3Server, agent_channel: AgentChannel) -> None:
    bucket = private_s3.new_bucket()
    url = f"s3://{bucket}/run"
    ckpt = Checkpointer(url, storage_options=private_s3.options(**FAIL_FAST))
    for step in (1, 2):
        ckpt.save(step, step_state(step))
    ckpt.wait()
    private_s3.restart()

    again = Checkpointer(url, storage_options=private_s3.options(**FAIL_FAST))
    try:
        loaded = again.load_latest(fresh_state())
    except CheckpointError as e:
        assert bucket in str(e) and "exist" in str(e), e
    else:
        assert loaded is None
    assert again.list() == []

    ckpt.save(3, step_state(3))  # the writer that was running: its next save fails, clearly
    ckpt.wait()
    failed = agent_channel.wait_for("checkpoint_save_failed", step=3)
    assert "bucket does not exist" in failed["error"], failed


def test_a_store_that_is_down_at_load_is_a_checkpoint_error_naming_the_location(
        private_s3: S3Server, no_agent: None) -> None:
    """Walk-through 19: with the store down when a job started, every rank died with
    botocore's 150-line traceback and nothing named the checkpoint location."""
    bucket = private_s3.new_bucket()
    url = f"s3://{bucket}/run"
    options = private_s3.options(**FAIL_FAST)
    private_s3.kill()
    ckpt = Checkpointer(url, storage_options=options)
    with pytest.raises(CheckpointError, match=rf"^cannot list the checkpoints at {url}: \w+"
                                              r".*Fix: check that the storage is reachable"):
        ckpt.load_latest(fresh_state())
