"""Walk-through 31 #6, real processes: a 2-rank FSDP2 checkpoint (DCP shards) resumed by one
rank, with a byte of rank 1's shard of the newest step flipped. Rank 0 reads that shard
under the world-size change; it was never checksummed, so the corrupt step loaded (or DCP
crashed the job). Now it is skipped as corrupt and the step before it loads.
(The decisions: tests/unit/test_ckpt_load_walk31.py.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.checkpoint.conftest import free_port

SCRIPT = Path(__file__).parent / "scripts" / "fsdp_reshard.py"


@pytest.mark.integration
def test_one_rank_resuming_a_two_rank_fsdp_checkpoint_skips_a_corrupt_shard_of_rank_1(
        tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "ck"), str(free_port())],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout.strip().splitlines()[-1]) == {"resumed": 5}, r.stdout
    assert "step 10 (corrupt): ValueError: sharded/__1_0.distcp: checksum differs" in r.stderr
