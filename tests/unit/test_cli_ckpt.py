"""`trainguard ckpt ls|verify` through the real command line: a job dir stands for its
checkpoints, a path that is not there is an error, and a missing step is named."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest
import torch

from tests.unit.helpers import TG, tg
from trainguard.checkpoint import Checkpointer
from trainguard.cli import main
from trainguard.controller.store import JobStore
from trainguard.exitcodes import ExitCode


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


@pytest.mark.parametrize("verb", ["ls", "verify"])
def test_ckpt_of_a_folder_of_job_dirs_says_so_and_how_to_list_them(
    verb: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`trainguard-runs/` is neither a job dir nor a checkpoint dir: exit 2 naming `ls`, as
    every other read command does, not "no checkpoints" with exit 0."""
    root = tmp_path / "runs"
    job_dir(root)
    assert main(["ckpt", verb, str(root)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "no checkpoints" not in err
    assert f"{root} holds job dirs" in err and f"`trainguard ls {root}`" in err


def test_ckpt_ls_of_a_checkpoint_dir_beside_a_job_dir_still_lists_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job_dir(tmp_path / "ck")  # a job dir inside: the steps there still make it checkpoints
    save_steps(tmp_path / "ck", (1,))
    assert ls_json(capsys, tmp_path / "ck") == [1]


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


# -- walk-through 4, through the real command (`python -m trainguard`) --------------------


def recorded_job(job: Path, checkpoint_dir: Path) -> Path:
    """A job store as `trainguard run` writes it: absolute job and checkpoint dirs."""
    with JobStore.create(job, "tg-test") as store:
        store.set_meta(job_dir=str(job), checkpoint_dir=str(checkpoint_dir))
    return job


@pytest.mark.parametrize("cmd", [["ls"], ["ls", "--json"], ["verify"], ["verify", "--json"]])
def test_ckpt_piped_into_a_reader_that_stopped_ends_quietly_with_exit_1(
    cmd: list[str], tmp_path: Path
) -> None:
    save_steps(tmp_path / "c", (10, 20))
    read, write = os.pipe()
    os.close(read)  # `| head -1` that has already gone
    r = subprocess.run([*TG, "ckpt", *cmd, str(tmp_path / "c")], stdout=write,
                       stderr=subprocess.PIPE, text=True, timeout=120, check=False)
    os.close(write)
    assert r.stderr == "", r.stderr  # was "cannot read ...: BrokenPipeError ..." and exit 2
    assert r.returncode == ExitCode.OUTPUT_CLOSED


def test_ckpt_ls_of_a_copied_job_dir_reads_the_copys_checkpoints_and_says_so(
    tmp_path: Path
) -> None:
    job = recorded_job(tmp_path / "job", tmp_path / "job" / "checkpoints")
    save_steps(job / "checkpoints", (10,))
    copy = tmp_path / "copy"
    shutil.copytree(job, copy)
    save_steps(copy / "checkpoints", (20,))  # the copy trains on; the original does not
    r = tg("ckpt", "ls", str(copy), "--json")
    assert r.returncode == 0, r.stderr
    assert [d["step"] for d in json.loads(r.stdout)] == [20, 10]  # was [10]: the original's
    assert f"reading {copy / 'checkpoints'}" in r.stderr and str(job) in r.stderr
    assert str(copy / "checkpoints") in tg("ckpt", "ls", str(copy)).stdout.splitlines()[0]
    original = tg("ckpt", "ls", str(job), "--json")  # the job dir where it was: no note
    assert [d["step"] for d in json.loads(original.stdout)] == [10] and original.stderr == ""


def test_ckpt_ls_of_a_copied_job_dir_still_reads_a_checkpoint_dir_outside_it(
    tmp_path: Path
) -> None:
    elsewhere = tmp_path / "shared" / "ck"
    job = recorded_job(tmp_path / "job", elsewhere)
    save_steps(elsewhere, (5,))
    shutil.copytree(job, tmp_path / "copy")
    r = tg("ckpt", "ls", str(tmp_path / "copy"), "--json")
    assert [d["step"] for d in json.loads(r.stdout)] == [5] and r.stderr == ""


@pytest.mark.parametrize("json_flag", [[], ["--json"]])
def test_ckpt_ls_warns_when_latest_points_to_a_step_that_is_not_there(
    json_flag: list[str], tmp_path: Path
) -> None:
    save_steps(tmp_path / "c", (10, 20))
    (tmp_path / "c" / "latest").write_text("step-000000090")
    r = tg("ckpt", "ls", str(tmp_path / "c"), *json_flag)
    assert r.returncode == 0, r.stderr
    assert "warning: `latest` points to step 90 (step-000000090), which is not there" \
        in r.stderr, r.stderr
    if json_flag:
        assert not any(d["latest"] for d in json.loads(r.stdout))  # stdout is still JSON


def test_ckpt_ls_says_nothing_about_a_latest_that_points_to_a_step_there(
    tmp_path: Path
) -> None:
    save_steps(tmp_path / "c", (10, 20))
    r = tg("ckpt", "ls", str(tmp_path / "c"))
    assert r.returncode == 0 and r.stderr == "", r.stderr


def test_logs_and_diagnose_of_a_copied_job_dir_read_the_copys_logs(tmp_path: Path) -> None:
    """As `ckpt ls` reads the copy's checkpoints: the store's absolute log dir lay inside
    the job dir it recorded, so a copy (or a moved dir) reads its own logs."""
    job = tmp_path / "job"
    with JobStore.create(job, "tg-test") as store:
        store.set_meta(job_dir=str(job), log_dir=str(job / "logs"))
    (job / "logs" / "attempt-0").mkdir(parents=True)
    (job / "logs" / "attempt-0" / "rank-0.log").write_text("original line\n")
    copy = tmp_path / "copy"
    shutil.copytree(job, copy)
    (copy / "logs" / "attempt-0" / "rank-0.log").write_text("copy line\n")
    r = tg("logs", str(copy), "--rank", "0")
    assert r.returncode == 0, r.stderr
    assert "copy line" in r.stdout and "original line" not in r.stdout
    shutil.rmtree(job)  # the original gone: the copy still reads
    assert "copy line" in tg("logs", str(copy), "--rank", "0").stdout


def test_ckpt_ls_names_a_save_that_did_not_finish(tmp_path: Path) -> None:
    """Walk-through 13: a rank stopped during the step-10 save left
    `.tmp-step-000000010-.../`; `ckpt ls` said only `no checkpoints` while `ls` showed the
    bytes."""
    staging = tmp_path / "ckpt" / ".tmp-step-000000010-tg-72d12749-0-58561"
    staging.mkdir(parents=True)
    (staging / "rank-0.pt").write_bytes(b"x" * 100)
    r = tg("ckpt", "ls", str(tmp_path / "ckpt"))
    assert r.returncode == 0, r.stderr
    assert "no checkpoints at" in r.stdout
    assert "1 save(s) did not finish (.tmp-step-000000010-tg-72d12749-0-58561)" in r.stderr


def test_ckpt_verify_of_a_corrupt_newest_step_names_why_and_the_newest_valid_step(
        tmp_path: Path) -> None:
    """Walk-through 17: exit 1 and a REASON column, but no line saying what a resume loads."""
    save_steps(tmp_path / "c")
    data = next(p for p in (tmp_path / "c" / "step-000000030").iterdir()
                if p.name != "manifest.json")
    raw = bytearray(data.read_bytes())
    raw[-1] ^= 0xFF
    data.write_bytes(bytes(raw))
    r = tg("ckpt", "verify", str(tmp_path / "c"))
    assert r.returncode == 1, r.stderr
    assert f"trainguard ckpt verify: error: step 30 is corrupt ({data.name}: checksum " \
           "differs from the manifest); the newest valid step is 20: a resume loads it" \
        in r.stderr, r.stderr
    # walk-through 35 F4: with --json it exited 1 and said nothing; stdout stays the JSON
    r = tg("ckpt", "verify", str(tmp_path / "c"), "--json")
    assert r.returncode == 1 and json.loads(r.stdout)[0]["status"] == "corrupt"
    assert "error: step 30 is corrupt" in r.stderr, r.stderr
    r = tg("ckpt", "verify", str(tmp_path / "c"), "--step", "30")
    assert r.returncode == 1 and "step 30 is corrupt" in r.stderr and "newest" not in r.stderr


def test_ckpt_verify_goes_on_when_a_running_jobs_pruning_removes_a_step_it_checks(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Walk-through 35 F13: `verify` of a live S3 dir listed the steps, then read a file of
    the oldest as the job's commit pruned it: "cannot read ... check the path or URL", exit
    2, after most saves. Here the pruning happens inside the hash of step 10's file."""
    from trainguard.checkpoint.storage import Storage

    save_steps(tmp_path / "c")
    sha256 = Storage.sha256

    def pruned_while_read(st: Storage, rel: str) -> str:
        if rel.startswith("step-000000010/"):
            shutil.rmtree(tmp_path / "c" / "step-000000010")
            raise FileNotFoundError(2, "The specified key does not exist.")
        return sha256(st, rel)

    monkeypatch.setattr(Storage, "sha256", pruned_while_read)
    assert main(["ckpt", "verify", str(tmp_path / "c"), "--json"]) == 0
    std = capsys.readouterr()
    assert [(d["step"], d["status"]) for d in json.loads(std.out)] == [(30, "valid"),
                                                                       (20, "valid")]
    assert "note: step(s) 10 went while being checked" in std.err, std.err
    save_steps(tmp_path / "c")  # --step 10: it went, not "no checkpoint at" the location
    assert main(["ckpt", "verify", str(tmp_path / "c"), "--step", "10", "--json"]) == 1
    std = capsys.readouterr()
    assert "note: step(s) 10 went while being checked" in std.err, std.err
    assert "error: step 10 is not at " in std.err and "(steps there: 30, 20)" in std.err, \
        std.err


def _removed_file_by_file(step: Path, gap_s: float) -> threading.Thread:
    """As shutil.rmtree on a local or NFS dir: one file at a time, the directory last."""
    def remove() -> None:
        for f in sorted(step.iterdir()):
            f.unlink()
            time.sleep(gap_s)
        step.rmdir()

    first = sorted(step.iterdir())[0]
    first.unlink()  # the removal has begun when verify reads the step
    t = threading.Thread(target=remove, daemon=True)
    t.start()
    return t


def test_ckpt_verify_waits_out_a_step_removed_file_by_file(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Review 38 #9: three tries within a few ms read a step that a local prune was removing
    file by file as damaged (exit 1) or unreadable (exit 2)."""
    save_steps(tmp_path / "c")
    step10 = tmp_path / "c" / "step-000000010"
    for _ in range(30):  # files enough for the removal to last about a second
        (step10 / f"zz-extra-{_:02d}.bin").write_bytes(b"x")
    remover = _removed_file_by_file(step10, 0.03)
    assert main(["ckpt", "verify", str(tmp_path / "c"), "--json"]) == 0
    remover.join(10)
    std = capsys.readouterr()
    assert [(d["step"], d["status"]) for d in json.loads(std.out)] == [(30, "valid"),
                                                                       (20, "valid")]
    assert "note: step(s) 10 went while being checked" in std.err, std.err


def test_ckpt_verify_says_a_step_that_lost_a_file_is_damaged_after_one_pause(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    save_steps(tmp_path / "c")
    data = next(p for p in (tmp_path / "c" / "step-000000010").iterdir()
                if p.name != "manifest.json")
    data.unlink()
    t0 = time.monotonic()
    assert main(["ckpt", "verify", str(tmp_path / "c"), "--step", "10", "--json"]) == 1
    assert time.monotonic() - t0 < 5
    (doc,) = json.loads(capsys.readouterr().out)
    assert doc["status"] != "valid", doc


def test_ckpt_ls_looks_at_all_damaged_steps_again_after_one_pause(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Review 39 #4: each damaged step paused on its own (0.2 s and three listings each)."""
    import trainguard.cli.ckpt as ckpt_cli

    save_steps(tmp_path / "c", tuple(range(10, 110, 10)))  # keep=10
    for step in (10, 20, 30, 40, 50):
        data = next(p for p in (tmp_path / "c" / f"step-{step:09d}").iterdir()
                    if p.name != "manifest.json")
        data.unlink()
    pauses: list[float] = []
    monkeypatch.setattr(ckpt_cli.time, "sleep", pauses.append)
    assert main(["ckpt", "ls", str(tmp_path / "c"), "--json"]) == 0
    docs = json.loads(capsys.readouterr().out)
    assert sum(d["status"] != "valid" for d in docs) == 5 and len(docs) == 10
    assert pauses == [0.2], pauses
