"""Walk-through 31 #1: a manifest whose step is not its directory's (edited by hand) is
invalid, with that reason. It was "valid" (`ckpt verify` exit 0) and the resume skipped it
with a FileNotFoundError of a directory that never existed.
"""

from __future__ import annotations

from pathlib import Path

from tests.unit.test_ckpt_load_walk31 import Told, alone, write_step
from trainguard.checkpoint.loading import load_newest, newest_valid_step
from trainguard.checkpoint.manifest import Manifest, Status, check_step
from trainguard.checkpoint.saving import quick_verdict
from trainguard.checkpoint.storage import Storage


def test_a_manifest_whose_step_is_not_its_directorys_is_invalid_with_that_reason(
        tmp_path: Path) -> None:
    """The finding: step-30's manifest edited to say 31: listed valid, and the resume
    skipped it with 'FileNotFoundError: .../step-000000031/replicated.pt'."""
    write_step(tmp_path, 25)
    write_step(tmp_path, 30, manifest_step=31)
    st = Storage(tmp_path)
    verdict, _ = quick_verdict(st, 30)
    assert verdict.status == Status.CORRUPT
    assert "says step 31 but lies in step-000000030" in verdict.reason
    assert newest_valid_step(st) == 25
    told = Told()
    loaded = load_newest(st, 0, alone(), told)
    assert loaded is not None and loaded.step == 25
    [v] = told.verdicts
    assert v.step == 30 and "says step 31" in v.reason and "FileNotFound" not in v.reason


def test_check_step_names_both_steps_and_the_fix() -> None:
    m = Manifest(step=31, world_size=1, files=(), library_version="t", created_at=0.0)
    assert check_step(m, 31) is None
    reason = check_step(m, 30)
    assert reason is not None
    assert "step 31" in reason and "step-000000030" in reason and "Fix:" in reason


def test_ckpt_verify_and_ls_call_such_a_manifest_corrupt(tmp_path: Path) -> None:
    """`ckpt verify` and `ckpt ls` read quick_verdict: they said step 30 was valid (exit 0)."""
    write_step(tmp_path, 30, manifest_step=31)
    verdict, _ = quick_verdict(Storage(tmp_path), 30)
    assert verdict.status == Status.CORRUPT and "says step 31" in verdict.reason
