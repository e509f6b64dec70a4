"""Walk-through 31, the load side, for real (the decisions: tests/unit/test_ckpt_load_walk31*).

- #6, real processes: a 2-rank FSDP2 checkpoint (DCP shards) resumed by one rank, with a
  byte of rank 1's shard of the newest step flipped. Rank 0 reads that shard under the
  world-size change; it was never checksummed, so the corrupt step loaded (or DCP crashed
  the job). Now it is skipped as corrupt and the step before it loads.
- #10, a real Checkpointer: one read error while resuming is tried again.
- #1, a real Checkpointer: a manifest edited to say another step is skipped, saying so.
"""

from __future__ import annotations

import errno
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.checkpoint.conftest import (
    AgentChannel,
    Where,
    assert_state_is_step,
    free_port,
    fresh_state,
    step_state,
)
from trainguard.checkpoint import Checkpointer, loading
from trainguard.checkpoint.manifest import step_dir
from trainguard.checkpoint.storage import Storage

SCRIPT = Path(__file__).parent / "scripts" / "fsdp_reshard.py"


@pytest.mark.integration
def test_one_rank_resuming_a_two_rank_fsdp_checkpoint_skips_a_corrupt_shard_of_rank_1(
        tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "ck"), str(free_port())],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout.strip().splitlines()[-1]) == {"resumed": 5}, r.stdout
    assert "step 10 (corrupt): ValueError: sharded/__1_0.distcp: checksum differs" in r.stderr


@pytest.mark.usefixtures("keep_rng")
def test_one_read_error_while_resuming_is_retried_not_taken_for_corruption(
        where: Where, agent_channel: AgentChannel, monkeypatch: pytest.MonkeyPatch) -> None:
    """Walk-through 31 #10 through a real Checkpointer (local disk and the S3 server): one
    EIO while reading the newest step made it 'corrupt': the resume fell back a step and
    the good step was marked bad (rewritten when reached, a CheckpointCorrupt event)."""
    ckpt = where.checkpointer(async_save=False)
    for step in (1, 2):
        ckpt.save(step, step_state(step))
    ckpt.close()
    monkeypatch.setattr(loading, "RETRY_DELAYS", (0.0, 0.0, 0.0))
    failed: list[str] = []
    for method in ("sha256", "read_bytes"):  # local disk hashes a file, S3 reads it whole
        real = getattr(Storage, method)

        def flaky(self: Storage, rel: str, real: Any = real) -> Any:
            if rel == f"{step_dir(2)}/replicated.pt" and not failed:
                failed.append(rel)
                raise OSError(errno.EIO, "Input/output error (injected once)")
            return real(self, rel)

        monkeypatch.setattr(Storage, method, flaky)
    resumer = where.checkpointer(async_save=False)
    state = fresh_state()
    assert resumer.load_latest(state) == 2
    assert failed and resumer._bad_steps == set()
    assert_state_is_step(state, 2)
    assert agent_channel.wait_for("resumed")["step"] == 2
    assert agent_channel.of_kind("checkpoint_corrupt") == []


@pytest.mark.usefixtures("keep_rng")
def test_a_manifest_edited_to_another_step_is_skipped_saying_so(
        tmp_path: Path, agent_channel: AgentChannel) -> None:
    """Walk-through 31 #1 through a real Checkpointer: step 2's manifest edited to say 3 was
    skipped with 'FileNotFoundError: .../step-000000003/replicated.pt', a directory that
    never existed; the reason now names both steps and the fix."""
    loc = str(tmp_path / "ck")
    ckpt = Checkpointer(loc, async_save=False)
    for step in (1, 2):
        ckpt.save(step, step_state(step))
    ckpt.close()
    manifest = tmp_path / "ck" / step_dir(2) / "manifest.json"
    doc = json.loads(manifest.read_text())
    doc["step"] = 3
    manifest.write_text(json.dumps(doc))
    state = fresh_state()
    assert Checkpointer(loc, async_save=False).load_latest(state) == 1
    assert_state_is_step(state, 1)
    reason = agent_channel.wait_for("checkpoint_corrupt", step=2)["reason"]
    assert "manifest.json says step 3 but lies in step-000000002" in reason, reason
    assert "FileNotFoundError" not in reason
