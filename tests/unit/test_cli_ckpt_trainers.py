"""`trainguard ckpt ls|verify` of the checkpoints a trainer integration committed (walk-through
29, #8: an HF job's `ckpt ls` said "no checkpoints" and `verify` exited 1 while it had
committed several): listed from their commit markers, sizes checked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.unit.helpers import tg
from trainguard.cli import main
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
    assert "trainguard ckpt verify: error: step 4 is damaged (model.safetensors is 10 bytes, " \
        "1000 when it was committed); the newest valid step is 2: a resume loads it" \
        in r.stderr, r.stderr
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
    assert r.returncode == 0 and f"no checkpoints at {tmp_path}\n" == r.stdout
    # walk-through 39 #6: a trainer's checkpoints written without the integration are named
    (tmp_path / "checkpoint-5").mkdir()
    (tmp_path / "epoch=0-step=4.ckpt").write_bytes(b"x")
    r = tg("ckpt", "ls", str(tmp_path))
    assert r.returncode == 0 and f"no checkpoints at {tmp_path} committed by trainguard (2 " \
        "trainer checkpoint(s) there with no commit marker: written without a trainguard " \
        "integration, so nothing vouches for them; a resume under --auto-resume hf|lightning " \
        "takes the newest complete one while none there is marked: docs/integrations.md)" \
        in r.stdout, r.stdout


CHECKPOINT_ROW_KEYS = {"step", "status", "reason", "latest", "world_size", "files", "bytes",
                       "created_at"}  # cli.md: every JSON row has every key


def test_integration_rows_have_every_key_and_verify_json_says_why(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Walk-through 35 F4: an HF row had no `latest` nor `created_at`, and `verify --json`
    of a damaged newest step exited 1 with nothing on stderr."""
    out = tmp_path / "out"
    hf_dir(out, 2)
    (hf_dir(out, 4) / "model.safetensors").write_bytes(b"w" * 10)
    assert main(["ckpt", "verify", str(out), "--json"]) == 1
    std = capsys.readouterr()
    rows = json.loads(std.out)
    assert set(rows[0]) == CHECKPOINT_ROW_KEYS | {"path", "format"}
    assert (rows[0]["latest"], rows[0]["world_size"], rows[0]["files"]) == (False, None, 2)
    # walk-through 39 #9: the newest valid one, the one a resume takes, is the latest
    assert [(r["step"], r["latest"]) for r in rows] == [(4, False), (2, True)]
    assert rows[0]["created_at"].endswith("+00:00") and rows[0]["format"] == "dir"
    assert "trainguard ckpt verify: error: step 4 is damaged" in std.err, std.err


def test_verify_step_of_an_integration_dir_checks_that_step(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Walk-through 35 F11: `--step 2` looked where trainguard.checkpoint writes and said
    "steps there: none" of the steps the listing had just shown."""
    out = tmp_path / "out"
    hf_dir(out, 2)
    (hf_dir(out, 4) / "model.safetensors").write_bytes(b"w" * 10)
    assert main(["ckpt", "verify", str(out), "--step", "2"]) == 0
    std = capsys.readouterr()
    assert "step 2 is valid: checkpoint-2" in std.out and "checkpoint-4" not in std.out
    assert main(["ckpt", "verify", str(out), "--step", "3"]) == 1
    assert f"step 3 is not at {out} (steps there: 4, 2)" in capsys.readouterr().err


def test_a_damaged_copy_beside_a_valid_one_of_the_newest_step_is_a_warning(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Walk-through 35 F12: Lightning re-saved step 20 as `-v1` beside the damaged file;
    verify said "step 20 is damaged; the newest valid step is 20" and exited 1."""
    d = tmp_path / "ckpts"
    d.mkdir()
    for name in ("epoch=1-step=20.ckpt", "epoch=1-step=20-v1.ckpt"):
        (d / name).write_bytes(b"x" * 100)
        mark_file_committed(d / name, 20, tell=False)
    (d / "epoch=1-step=20.ckpt").write_bytes(b"x" * 50)
    assert main(["ckpt", "verify", str(d)]) == 0
    std = capsys.readouterr()
    assert "step 20 is valid: epoch=1-step=20-v1.ckpt" in std.out
    assert "warning: epoch=1-step=20.ckpt, a copy of step 20, is damaged (" in std.err


def test_a_lightning_default_root_dir_lists_the_checkpoints_a_resume_finds(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Walk-through 39 #10: with no ModelCheckpoint dirpath Lightning saves under
    default_root_dir/lightning_logs/version_N/checkpoints, where a resume looks; `ckpt ls`
    of the default_root_dir said no checkpoints."""
    root = tmp_path / "out"
    for version, step in ((0, 12), (1, 24)):
        d = root / "lightning_logs" / f"version_{version}" / "checkpoints"
        d.mkdir(parents=True)
        (d / f"epoch=0-step={step}.ckpt").write_bytes(b"x" * 10)
        mark_file_committed(d / f"epoch=0-step={step}.ckpt", step, tell=False)
    assert main(["ckpt", "ls", str(root), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["step"], r["latest"]) for r in rows] == [(24, True), (12, False)]


def test_the_latest_of_two_valid_copies_of_a_step_is_the_one_a_resume_takes(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Review 47 #7: a resume takes the latest written among equal steps; `latest` went by
    name."""
    import os

    from trainguard.integrations.lightning import newest_committed

    d = tmp_path / "ckpts"
    d.mkdir()
    for i, name in enumerate(("epoch=1-step=20.ckpt", "epoch=1-step=20-v1.ckpt")):
        (d / name).write_bytes(b"x" * 100)
        mark_file_committed(d / name, 20, tell=False)
        os.utime(d / name, (1_000_000 + i, 1_000_000 + i))
    assert main(["ckpt", "ls", str(d), "--json"]) == 0
    (latest,) = [r["path"] for r in json.loads(capsys.readouterr().out) if r["latest"]]
    found = newest_committed([d])
    assert found is not None and latest == str(found[1])
