"""`trainguard ckpt ls|verify` through the real command line: a job dir stands for its
checkpoints, a path that is not there is an error, and a missing step is named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from trainguard.checkpoint import Checkpointer
from trainguard.cli import main
from trainguard.controller.store import JobStore


def save_steps(location: Path, steps: tuple[int, ...] = (10, 20, 30)) -> None:
    ckpt = Checkpointer(location, async_save=False, keep=10)
    state = {"w": torch.zeros(4)}
    for step in steps:
        ckpt.save(step, state)
    ckpt.close()


def job_dir(tmp_path: Path, checkpoint_dir: Path | None = None) -> Path:
    job = tmp_path / "job"
    with JobStore.create(job, "tg-test") as store:
        if checkpoint_dir is not None:
            store.set_meta(checkpoint_dir=str(checkpoint_dir))
    return job


def ls_json(capsys: pytest.CaptureFixture[str], location: Path) -> list[int]:
    assert main(["ckpt", "ls", str(location), "--json"]) == 0
    return [d["step"] for d in json.loads(capsys.readouterr().out)]


def test_ckpt_ls_of_a_job_dir_lists_the_jobs_checkpoints(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = job_dir(tmp_path)
    save_steps(job / "checkpoints")
    assert ls_json(capsys, job) == [30, 20, 10]


def test_ckpt_ls_of_a_job_dir_reads_the_checkpoint_dir_its_store_records(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    elsewhere = tmp_path / "elsewhere"
    job = job_dir(tmp_path, checkpoint_dir=elsewhere)
    save_steps(elsewhere, (5,))
    assert ls_json(capsys, job) == [5]


def test_ckpt_ls_of_a_checkpoint_dir_still_lists_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    save_steps(tmp_path / "ck", (1, 2))
    assert ls_json(capsys, tmp_path / "ck") == [2, 1]


@pytest.mark.parametrize("verb", ["ls", "verify"])
def test_ckpt_of_a_path_that_does_not_exist_exits_2_with_a_clear_error(
    verb: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "no" / "such" / "path"
    assert main(["ckpt", verb, str(missing)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert f"{missing} does not exist" in err and "Fix:" in err


def test_ckpt_verify_of_a_missing_step_names_it_and_lists_the_steps_there(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = job_dir(tmp_path)
    save_steps(job / "checkpoints")
    assert main(["ckpt", "verify", str(job), "--step", "35"]) == 1
    err = capsys.readouterr().err
    assert "step 35 is not at" in err and "steps there: 30, 20, 10" in err
    assert "no checkpoint" not in err


def test_ckpt_verify_of_a_step_that_is_there_checks_only_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = job_dir(tmp_path)
    save_steps(job / "checkpoints")
    assert main(["ckpt", "verify", str(job), "--step", "20", "--json"]) == 0
    docs = json.loads(capsys.readouterr().out)
    assert [(d["step"], d["status"]) for d in docs] == [(20, "valid")]


def test_ckpt_ls_counts_the_data_files_of_the_manifest_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    save_steps(tmp_path / "c", (10,))
    manifest = json.loads((tmp_path / "c" / "step-000000010" / "manifest.json").read_text())
    assert main(["ckpt", "ls", str(tmp_path / "c")]) == 0
    out = capsys.readouterr().out
    header, row = (ln.split() for ln in out.splitlines()[1:3])
    assert header[:6] == ["STEP", "STATUS", "LATEST", "WORLD", "DATA", "FILES"]
    assert row[4] == str(len(manifest["files"])) and row[4] != str(
        len(list((tmp_path / "c" / "step-000000010").iterdir())))
    assert "DATA FILES and SIZE: the files the manifest lists" in out


def test_ckpt_sizes_read_in_kib_and_verify_says_its_verdict(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    save_steps(tmp_path / "c", (10,))  # a few KiB
    assert main(["ckpt", "verify", str(tmp_path / "c")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[2].split()[6] == "KiB" and "0.0 MiB" not in lines[2]
    assert lines[-1].startswith("step 10 is valid: ") and "every checksum matches" in lines[-1]
    assert max(map(len, lines[-3:-1])) <= 80  # the note fits a terminal, not cut mid-line
