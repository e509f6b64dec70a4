"""`trainguard run` with job files and flag combinations, through the real command line
(`trainguard.cli.main`, `--dry-run`): a job file takes what a flag takes, its values are as
strict as a flag's, its script is found next to it, and an error names real flags and keys."""

from __future__ import annotations

import json
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

from trainguard.cli import main

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "job.yaml"


@pytest.fixture(autouse=True)
def _in_a_dir_with_the_scripts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`run --dry-run` checks that the script is there, as `run` does."""
    monkeypatch.chdir(tmp_path)
    for name in ("t.py", "train.py", "mine.py"):
        (tmp_path / name).write_text("")


def dry_run(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    assert main(["run", "--dry-run", *argv]) == 0, capsys.readouterr().err
    doc: dict[str, Any] = json.loads(capsys.readouterr().out)
    return doc


def refused(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert main(["run", "--dry-run", *argv]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1, err
    assert err.startswith("trainguard run: error: ") and "Fix:" in err
    return err


def job(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(text, encoding="utf-8")
    return path


# --- flag combinations: real flags and keys, never a dict dump or `--job` -----------------


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--restart-backoff", "10", "--restart-backoff-max", "5"],
         ["--restart-backoff-max / 'restart_backoff_max_s'", "--restart-backoff / "
          "'restart_backoff_s'", "at least 10"]),
        (["--node-rank", "1"], ["--node-rank / 'node_rank'", "drop --node-rank"]),
        (["--nnodes", "2", "--node-rank", "1"], ["--node-rank", "one controller"]),
        (["-m", "--no-python"], ["-m/--module", "--no-python", "keep one"]),
        (["--scenario", "llm", "--restart-backoff-max", "2"],
         ["(from the llm preset)", "at least 5"]),
    ],
)
def test_a_bad_combination_of_flags_names_the_flags_and_the_fix(
    argv: list[str], words: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    err = refused(capsys, *argv, "train.py")
    for word in words:
        assert word in err
    assert "{" not in err and "--job " not in err and "'job'" not in err


def test_a_bad_combination_from_a_job_file_names_the_job_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = job(tmp_path, "restart_backoff_s: 10\nrestart_backoff_max_s: 5\n")
    err = refused(capsys, "--config", str(path), "train.py")
    assert f"(from the job file {path})" in err


# --- job files take what flags take ---------------------------------------------------------


@pytest.mark.parametrize("word", ["auto", "cpu"])
def test_nproc_per_node_in_a_job_file_takes_the_words_the_flag_takes(
    word: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("os.cpu_count", lambda: 6)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    doc = dry_run(capsys, "--config", str(job(tmp_path, f"nproc_per_node: {word}\n")), "t.py")
    assert doc["nproc_per_node"] == 6


def test_nproc_per_node_gpu_in_a_job_file_counts_the_visible_gpus(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2")
    doc = dry_run(capsys, "--config", str(job(tmp_path, "nproc_per_node: gpu\n")), "t.py")
    assert doc["nproc_per_node"] == 3


def test_a_bad_word_for_nproc_per_node_in_a_job_file_names_the_file_and_the_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = job(tmp_path, "nproc_per_node: lots\n")
    err = refused(capsys, "--config", str(path), "t.py")
    assert f"job file {path}: nproc_per_node" in err and "N, cpu, gpu or auto" in err


def test_the_entrypoint_of_a_job_file_is_found_next_to_the_job_file_not_in_the_cwd(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "train.py").write_text("")
    path = job(tmp_path / "jobs", "entrypoint: train.py\n")
    monkeypatch.chdir(tmp_path)
    assert dry_run(capsys, "--config", str(path))["entrypoint"] == str(tmp_path / "jobs" /
                                                                      "train.py")


def test_a_script_on_the_command_line_stays_relative_to_the_cwd(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = job(tmp_path, "entrypoint: train.py\n")
    assert dry_run(capsys, "--config", str(path), "mine.py")["entrypoint"] == "mine.py"


def test_a_module_entrypoint_in_a_job_file_is_not_a_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = job(tmp_path, "entrypoint: pkg.train\nmodule: true\n")
    assert dry_run(capsys, "--config", str(path))["entrypoint"] == "pkg.train"


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("max_restarts: yes\n", ["max_restarts", "True (bool) is not a whole number",
                                 "yes/no/on/off"]),
        ("max_restarts: '3'\n", ["max_restarts", "is not a whole number"]),
        ("precheck: 'no'\n", ["precheck", "is not true or false"]),
        ("restart_on_hang: 1\n", ["restart_on_hang", "is not true or false"]),
    ],
)
def test_a_job_file_value_of_the_wrong_type_is_an_error_not_a_guess(
    text: str, words: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    err = refused(capsys, "--config", str(job(tmp_path, text)), "t.py")
    for word in words:
        assert word in err


# --- the example job file in the docs --------------------------------------------------------


def test_the_example_job_file_loads_and_validates(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # the script is found next to the job file, from anywhere
    doc = dry_run(capsys, "--config", str(EXAMPLE))
    assert doc["entrypoint"] == str(REPO / "examples" / "train_ddp.py")
    assert Path(doc["entrypoint"]).is_file()
    assert doc["args"] == ["--steps", "200", "--ckpt-every", "10"]
    assert (doc["scenario"], doc["max_restarts"], doc["restart_on_hang"]) == (
        "single-node", 5, True)
    assert doc["nproc_per_node"] >= 1


def test_the_docs_show_the_example_job_file() -> None:
    docs = (REPO / "docs" / "scenarios.md").read_text(encoding="utf-8")
    assert "../examples/job.yaml" in docs


def test_a_bad_value_says_where_it_came_from(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    err = refused(capsys, "--max-restarts", "129", "t.py")
    assert "--max-restarts / 'max_restarts' to 128 or less (this value came from the command " \
        "line)" in err
    assert "in the job file" not in err
    path = job(tmp_path, "max_restarts: 500\n")
    assert f"(this value came from the job file {path})" in refused(
        capsys, "--config", str(path), "t.py")


def test_the_error_samples_in_the_docs_are_what_the_command_prints(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/scenarios.md shows two errors; job.yaml there holds `max_restarts: yes`."""
    monkeypatch.chdir(tmp_path)
    job(tmp_path, "max_restarts: yes\n")
    lines = (REPO / "docs" / "scenarios.md").read_text(encoding="utf-8").splitlines()
    samples = [(a.removeprefix("$ trainguard "), b) for a, b in pairwise(lines)
               if a.startswith("$ trainguard run") and b.startswith("trainguard run: error:")]
    assert len(samples) == 2
    for command, shown in samples:
        assert main(command.split()) == 2
        assert capsys.readouterr().err.strip() == shown


def test_a_list_of_the_wrong_items_says_what_the_items_must_be(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    err = refused(capsys, "--config", str(job(tmp_path, "local_ranks_filter: [a]\n")), "t.py")
    assert "is not a list of whole numbers" in err and "`local_ranks_filter: [0, 1]`" in err


def test_redirects_in_a_job_file_take_the_flags_values_and_no_others(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert dry_run(capsys, "--config", str(job(tmp_path, "redirects: 3\n")), "t.py")[
        "redirects"] == {"-1": 3}
    err = refused(capsys, "--config", str(job(tmp_path, "redirects: {0: 9}\n")), "t.py")
    assert "redirects" in err and "0 none, 1 stdout, 2 stderr, 3 both" in err
