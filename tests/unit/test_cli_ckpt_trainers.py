"""`trainguard ckpt ls|verify` of the checkpoints a trainer integration committed (walk-through
29, #8: an HF job's `ckpt ls` said "no checkpoints" and `verify` exited 1 while it had
committed several): listed from their commit markers, sizes checked."""

from __future__ import annotations

import json
from pathlib import Path

from tests.unit.helpers import tg
from trainguard.integrations.common import mark_committed, mark_file_committed


def hf_dir(out: Path, step: int) -> Path:
    d = out / f"checkpoint-{step}"
    d.mkdir(parents=True)
    (d / "model.safetensors").write_bytes(b"w" * 1000)
    (d / "trainer_state.json").write_text("{}")
    mark_committed(d, step)
    return d


def test_hf_checkpoints_are_listed_and_a_damaged_newest_fails_verify(tmp_path: Path) -> None:
    out = tmp_path / "out"
    hf_dir(out, 2)
    newest = hf_dir(out, 4)
    (out / "checkpoint-6").mkdir()  # a save cut short: never committed, not listed
    r = tg("ckpt", "ls", str(out), "--json")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    assert [(x["step"], x["status"]) for x in rows] == [(4, "valid"), (2, "valid")]
    assert tg("ckpt", "verify", str(out)).returncode == 0
    (newest / "model.safetensors").write_bytes(b"w" * 10)
    r = tg("ckpt", "verify", str(out))
    assert r.returncode == 1
    assert "step 4 is damaged (model.safetensors is 10 bytes, 1000 when it was committed); " \
        "the newest valid step is 2: a resume takes it" in r.stderr, r.stderr
    assert "checkpoints committed by a trainer integration" in r.stdout


def test_lightning_files_are_listed(tmp_path: Path) -> None:
    d = tmp_path / "ckpts"
    d.mkdir()
    for name, step in (("epoch=0-step=4.ckpt", 4), ("last.ckpt", 8)):
        (d / name).write_bytes(b"x" * 100)
        mark_file_committed(d / name, step, tell=False)
    (d / "epoch=0-step=4.ckpt").write_bytes(b"x" * 50)  # damaged since
    rows = json.loads(tg("ckpt", "ls", str(d), "--json").stdout)
    assert [(x["step"], x["status"], Path(x["path"]).name) for x in rows] == [
        (8, "valid", "last.ckpt"), (4, "damaged", "epoch=0-step=4.ckpt")]


def test_a_dir_with_nothing_committed_still_says_no_checkpoints(tmp_path: Path) -> None:
    r = tg("ckpt", "ls", str(tmp_path))
    assert r.returncode == 0 and f"no checkpoints at {tmp_path}" in r.stdout
