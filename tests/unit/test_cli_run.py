"""`trainguard run` parsing: torchrun's flags in both spellings, job files, argv and errors."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import pytest

from trainguard.cli import main, parser
from trainguard.cli.run import spec_from_args
from trainguard.cli.run_checks import worker_argv
from trainguard.errors import SpecError
from trainguard.spec import JobSpec
from trainguard.spec_build import build_spec


def spec(*argv: str) -> JobSpec:
    return spec_from_args(parser().parse_args(["run", *argv])).spec


def dump(s: JobSpec) -> dict[str, Any]:
    return s.model_dump(exclude={"run_id"})  # run_id is random unless given


def spec_error(*argv: str) -> SpecError:
    with pytest.raises(SpecError) as info:
        spec(*argv)
    return info.value


# --- torchrun flags in both spellings ----------------------------------------------------


@pytest.mark.parametrize(
    ("dashed", "underscored"),
    [
        (["--nproc-per-node", "4"], ["--nproc_per_node", "4"]),
        (["--max-restarts", "3"], ["--max_restarts", "3"]),
        (["--master-port", "29501"], ["--master_port", "29501"]),
        (["--master-addr", "10.0.0.1"], ["--master_addr", "10.0.0.1"]),
        (["--monitor-interval", "0.5"], ["--monitor_interval", "0.5"]),
        (["--log-dir", "/tmp/logs"], ["--log_dir", "/tmp/logs"]),
        (["--node-rank", "0"], ["--node_rank", "0"]),
        (["--local-ranks-filter", "0,2"], ["--local_ranks_filter", "0,2"]),
        (["--no-python"], ["--no_python"]),
        (["--rdzv-backend", "c10d", "--rdzv-endpoint", "h:1"],
         ["--rdzv_backend", "c10d", "--rdzv_endpoint", "h:1"]),
    ],
)
def test_dash_and_underscore_forms_give_the_same_spec(
    dashed: list[str], underscored: list[str]
) -> None:
    assert dump(spec(*dashed, "train.py")) == dump(spec(*underscored, "train.py"))


@pytest.mark.parametrize("flag", ["--run-id", "--run_id", "--rdzv-id", "--rdzv_id"])
def test_run_id_and_rdzv_id_both_name_the_job(flag: str) -> None:
    assert spec(flag, "exp-42", "train.py").run_id == "exp-42"


def test_torchrun_flags_land_in_the_spec() -> None:
    s = spec("--nproc-per-node", "4", "--max-restarts", "3", "--master-port", "29501",
             "--monitor-interval", "0.5", "--log-dir", "/tmp/logs", "train.py")
    assert (s.nproc_per_node, s.max_restarts, s.master_port) == (4, 3, 29501)
    assert (s.monitor_interval, s.log_dir) == (0.5, "/tmp/logs")


def test_nproc_per_node_cpu_means_one_worker_per_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("os.cpu_count", lambda: 6)
    assert spec("--nproc-per-node", "cpu", "train.py").nproc_per_node == 6


def test_nproc_per_node_gpu_without_a_visible_gpu_is_a_spec_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert spec_error("--nproc-per-node", "gpu", "train.py").key == "--nproc-per-node"


def test_nproc_per_node_gpu_counts_the_visible_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,3")
    assert spec("--nproc-per-node", "gpu", "train.py").nproc_per_node == 2


def test_a_word_for_nproc_per_node_is_a_spec_error() -> None:
    assert "N, cpu, gpu or auto" in str(spec_error("--nproc-per-node", "many", "train.py"))


@pytest.mark.parametrize(
    ("value", "redirects"), [("3", {-1: 3}), ("0:1,1:2", {0: 1, 1: 2}), ("0", {-1: 0})])
def test_redirects_take_torchrun_stream_maps(value: str, redirects: dict[int, int]) -> None:
    assert spec("--redirects", value, "train.py").redirects == redirects
    assert spec("-r", value, "train.py").redirects == redirects


@pytest.mark.parametrize("value", ["4", "0:9", "a:b", "0-1"])
def test_a_bad_stream_map_is_a_spec_error(value: str) -> None:
    assert spec_error("--redirects", value, "train.py").key == "--redirects"


def test_tee_alone_changes_nothing_every_stream_reaches_the_console_and_the_files() -> None:
    assert dump(spec("--tee", "3", "train.py")) == dump(spec("train.py"))
    assert dump(spec("-t", "0:3", "train.py")) == dump(spec("train.py"))


def test_tee_brings_back_to_the_console_what_redirects_keeps_off_as_torchrun() -> None:
    """Walk-through 28: `--redirects 3 --tee 3` (torchrun: files and the console) left the
    console empty."""
    assert spec("--redirects", "3", "--tee", "3", "train.py").redirects == {-1: 0}
    assert spec("--redirects", "3", "--tee", "1", "train.py").redirects == {-1: 2}
    assert spec("-r", "3", "-t", "0:3", "train.py").redirects == {-1: 3, 0: 0}


def test_local_ranks_filter_lists_the_ranks_shown() -> None:
    assert spec("--local-ranks-filter", "0,2", "train.py").local_ranks_filter == [0, 2]


def test_a_bad_local_ranks_filter_is_a_spec_error() -> None:
    assert spec_error("--local-ranks-filter", "0,x", "train.py").key == "--local-ranks-filter"


def test_standalone_is_accepted_and_changes_nothing() -> None:
    assert dump(spec("--standalone", "train.py")) == dump(spec("train.py"))


def test_dash_m_runs_a_module() -> None:
    s = spec("-m", "pkg.train", "--epochs", "2")
    assert (s.module, s.entrypoint, s.args) == (True, "pkg.train", ["--epochs", "2"])


def test_no_python_runs_a_program() -> None:
    s = spec("--no-python", "./train.sh")
    assert (s.no_python, s.module) == (True, False)


def test_a_c10d_endpoint_becomes_the_master_address_and_port() -> None:
    s = spec("--rdzv-backend", "c10d", "--rdzv-endpoint", "host:1234", "train.py")
    assert (s.master_addr, s.master_port) == ("host", 1234)


def test_an_explicit_master_port_beats_the_rdzv_endpoint() -> None:
    s = spec("--rdzv-endpoint", "host:1234", "--master-port", "29600", "train.py")
    assert (s.master_addr, s.master_port) == ("host", 29600)


def test_an_endpoint_without_a_port_is_a_spec_error() -> None:
    assert "HOST:PORT" in str(spec_error("--rdzv-endpoint", "host", "train.py"))


def test_rdzv_conf_is_accepted_and_ignored() -> None:
    assert dump(spec("--rdzv-conf", "timeout=60", "train.py")) == dump(spec("train.py"))


def test_the_etcd_backend_is_a_spec_error_with_a_clear_message() -> None:
    err = spec_error("--rdzv-backend", "etcd", "train.py")
    assert err.key == "--rdzv-backend"
    assert "'etcd' is not supported" in err.problem
    assert "drop it" in err.fix


@pytest.mark.parametrize("nnodes", ["1:2", "x"])
def test_an_elastic_range_or_a_non_number_is_a_spec_error(nnodes: str) -> None:
    assert spec_error("--nnodes", nnodes, "train.py").key in ("--nnodes", "nnodes")


def test_several_nodes_with_spares_on_a_backend_make_a_multi_node_spec() -> None:
    s = spec("--nnodes", "2", "--spare-nodes", "1", "--backend", "slurm", "--node-timeout",
             "5", "--queue-timeout", "30", "--no-precheck", "train.py")
    assert (s.nnodes, s.spare_nodes, s.backend, s.node_timeout_s, s.queue_timeout_s,
            s.precheck, s.multi_node, s.world_size) == (2, 1, "slurm", 5.0, 30.0, False, True,
                                                       2 * s.nproc_per_node)
    assert not spec("train.py").multi_node


def test_a_degenerate_range_of_one_node_is_accepted() -> None:
    assert spec("--nnodes", "1:1", "train.py").nnodes == 1


# --- the script's own arguments ------------------------------------------------------------


def test_the_scripts_arguments_pass_untouched_even_when_they_look_like_ours() -> None:
    s = spec("--max-restarts", "1", "train.py", "--max-restarts", "5", "--lr", "3e-4", "--",
             "x")
    assert s.entrypoint == "train.py"
    assert s.args == ["--max-restarts", "5", "--lr", "3e-4", "--", "x"]
    assert s.max_restarts == 1


def test_a_double_dash_before_the_script_ends_our_flags() -> None:
    s = spec("--max-restarts", "2", "--", "train.py", "--config", "model.yaml")
    assert (s.entrypoint, s.args, s.max_restarts) == ("train.py", ["--config", "model.yaml"], 2)


def test_the_scripts_dash_m_is_not_ours() -> None:
    s = spec("train.py", "-m", "resnet")
    assert (s.module, s.args) == (False, ["-m", "resnet"])


# --- job files ------------------------------------------------------------------------------


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def test_a_job_file_merges_with_the_flags_and_the_flags_win(tmp_path: Path) -> None:
    job = write(tmp_path, "nproc_per_node: 2\nmax_restarts: 5\nscenario: single-node\n")
    s = spec("--config", str(job), "--max-restarts", "7", "train.py")
    assert (s.nproc_per_node, s.max_restarts, s.scenario) == (2, 7, "single-node")


def test_a_job_file_may_spell_keys_with_dashes(tmp_path: Path) -> None:
    job = write(tmp_path, "max-restarts: 4\nrestart-backoff-s: 0.5\n")
    s = spec("--config", str(job), "train.py")
    assert (s.max_restarts, s.restart_backoff_s) == (4, 0.5)


def test_a_job_file_may_name_the_entrypoint_and_its_arguments(tmp_path: Path) -> None:
    job = write(tmp_path, "entrypoint: train.py\nargs: ['--lr', '0.1']\n")
    s = spec("--config", str(job))
    assert (s.entrypoint, s.args) == (str(tmp_path / "train.py"), ["--lr", "0.1"])


def test_a_job_file_may_name_the_entrypoint(tmp_path: Path) -> None:
    assert spec("--config", str(write(tmp_path, "entrypoint: train.py\n"))).entrypoint == (
        str(tmp_path / "train.py"))


def test_an_empty_job_file_is_fine(tmp_path: Path) -> None:
    assert spec("--config", str(write(tmp_path, "")), "train.py").max_restarts == 0


def test_invalid_yaml_is_a_spec_error_naming_the_file(tmp_path: Path) -> None:
    job = write(tmp_path, "max_restarts: [1, 2\n")
    err = spec_error("--config", str(job), "train.py")
    assert err.key == "--config"
    assert "not valid YAML" in err.problem and str(job) in err.problem


def test_a_list_instead_of_a_mapping_is_a_spec_error(tmp_path: Path) -> None:
    err = spec_error("--config", str(write(tmp_path, "- max_restarts: 3\n")), "train.py")
    assert "list, not a mapping" in err.problem


def test_an_unknown_job_file_key_names_the_file_the_key_and_the_close_match(
    tmp_path: Path,
) -> None:
    job = write(tmp_path, "max_restart: 3\n")
    err = spec_error("--config", str(job), "train.py")
    assert str(job) in err.key and "max_restart" in err.key
    assert "'max_restarts'" in err.fix


def test_a_missing_job_file_is_a_spec_error(tmp_path: Path) -> None:
    err = spec_error("--config", str(tmp_path / "nope.yaml"), "train.py")
    assert err.key == "--config" and "cannot read" in err.problem


def test_a_bad_value_in_the_job_file_names_the_job_file(tmp_path: Path) -> None:
    job = write(tmp_path, "max_restarts: 500\n")
    err = spec_error("--config", str(job), "train.py")
    assert err.key == "max_restarts" and str(job) in err.fix


# --- the worker command ---------------------------------------------------------------------


def test_a_script_runs_with_this_python_unbuffered(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n", encoding="utf-8")
    argv = worker_argv(spec(str(script), "--lr", "3e-4"))
    assert argv == [sys.executable, "-u", str(script), "--lr", "3e-4"]


def test_a_module_runs_with_python_dash_m() -> None:
    assert worker_argv(spec("-m", "pkg.train", "--x")) == [
        sys.executable, "-u", "-m", "pkg.train", "--x"]


def test_a_program_runs_as_is_with_no_python() -> None:
    assert worker_argv(spec("--no-python", "./train.sh", "a")) == ["./train.sh", "a"]


def test_a_missing_script_is_a_spec_error_that_mentions_module_and_program(
    tmp_path: Path,
) -> None:
    with pytest.raises(SpecError) as info:
        worker_argv(spec(str(tmp_path / "missing.py")))
    assert info.value.key == "training_script"
    assert "-m" in info.value.fix and "--no-python" in info.value.fix


# --- main(): exit code 2 and one line on stderr ---------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "--rdzv-backend", "etcd", "train.py"],
        ["run", "--nnodes", "1:2", "train.py"],
        ["run", "--max-restarts", "129", "train.py"],
        ["run", "MISSING_SCRIPT"],
        ["run"],
    ],
)
def test_main_reports_a_spec_error_as_one_line_and_exit_code_2(
    argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [str(tmp_path / "missing.py") if a == "MISSING_SCRIPT" else a for a in argv]
    assert main(argv) == 2
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("trainguard run: error: ")
    assert "Fix:" in lines[0]
    assert "Traceback" not in err and out == ""


def test_main_reports_a_bad_job_file_as_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = write(tmp_path, "max_restart: 3\n")
    assert main(["run", "--config", str(job), "train.py"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "did you mean 'max_restarts' (--max-restarts)?" in err


def test_main_without_a_command_prints_help_and_exits_2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main([]) == 2
    assert "usage: trainguard" in capsys.readouterr().err


def test_a_flag_of_the_wrong_type_is_an_argparse_usage_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as info:
        main(["run", "--max-restarts", "three", "train.py"])
    assert info.value.code == 2
    assert "--max-restarts" in capsys.readouterr().err


# --- the fix in a value error names a flag that exists --------------------------------------


def flag_accepted(flag: str, capsys: pytest.CaptureFixture[str]) -> bool:
    try:
        parser().parse_args(["run", flag, "1", "train.py"])
    except SystemExit:
        capsys.readouterr()
        return False
    return True


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("max_restarts", 129),
        ("no_progress_limit", 0),
        ("monitor_interval", 0),
        ("grace_period_s", -1),
        ("restart_backoff_s", -1),
        ("restart_backoff_max_s", -1),
    ],
)
def test_the_fix_for_a_bad_value_names_a_flag_that_trainguard_run_accepts(
    key: str, value: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SpecError) as info:
        build_spec(None, {"entrypoint": "train.py", key: value}, source="job file")
    flags = [f for f in re.findall(r"--[a-z][a-z-]*", info.value.fix) if f != "--help"]
    assert flags, info.value.fix
    assert all(flag_accepted(f, capsys) for f in flags), flags


def test_dry_run_prints_the_effective_settings_and_starts_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("")
    job = tmp_path / "job.yaml"
    job.write_text("max_restarts: 7\nhang_floor_s: 30\n")
    code = main(["run", "--dry-run", "--scenario", "llm", "--config", str(job),
                 "--max-restarts", "9", "--job-dir", str(tmp_path / "j"), "train.py", "--x"])
    assert code == 0
    doc = json.loads(capsys.readouterr().out)
    # preset (llm: memory snapshots) < job file (hang floor) < flags (max restarts)
    assert (doc["memory_every"], doc["hang_floor_s"], doc["max_restarts"]) == (10, 30.0, 9)
    assert doc["entrypoint"] == "train.py" and doc["args"] == ["--x"]
    assert doc["job_dir"] == str(tmp_path / "j") and doc["run_id"] is None
    assert not (tmp_path / "j").exists()


@pytest.mark.parametrize("content, says", [
    (b"\xff\xfe\x00 not text", "is not UTF-8 text"),
    (b"a: " + b"[" * 5000, "nested too deeply"),
])
def test_a_job_file_that_is_not_text_or_nested_too_deep_is_an_error_not_a_traceback(
        tmp_path: Path, content: bytes, says: str) -> None:
    """Audit D13."""
    from trainguard.cli.run import load_job_file

    path = tmp_path / "job.yaml"
    path.write_bytes(content)
    with pytest.raises(SpecError, match=says):
        load_job_file(path)


def test_script_arguments_that_start_like_a_flag_reach_the_script_untouched() -> None:
    """`--step 5` is the prefix of several trainguard flags: it is the script's all the same."""
    got = spec("train.py", "--step", "5", "--check", "1", "--log=wandb", "--max", "3", "--a",
               "1")
    assert got.entrypoint == "train.py"
    assert got.args == ["--step", "5", "--check", "1", "--log=wandb", "--max", "3", "--a", "1"]


@pytest.mark.parametrize(("host", "problem"), [
    ("10.9.9.9", "'10.9.9.9' (10.9.9.9) is not an address of this machine: the controller "
                 "cannot listen there"),
    ("nosuchhost.invalid", "'nosuchhost.invalid' does not resolve"),
    ("::1", "'::1' has no IPv4 address: the controller listens on IPv4 only"),  # (review 40 #3)
])
def test_a_controller_host_this_machine_cannot_listen_on_is_refused_before_anything_is_made(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        host: str, problem: str) -> None:
    """Walk-through 36 #1: a raw OSError / socket.gaierror traceback after the job dir was
    made (its state '-', no event); --dry-run took it."""
    monkeypatch.chdir(tmp_path)
    script = tmp_path / "train.py"
    script.write_text("pass\n")
    for extra in (["--dry-run"], []):
        code = main(["run", "--nnodes", "2", "--controller-host", host, "--job-dir", "j",
                     *extra, str(script)])
        err = capsys.readouterr().err
        assert code == 2, err
        assert f"trainguard run: error: --controller-host / 'controller_host': {problem}" in err
        assert "Fix: give an address of this machine" in err and "Traceback" not in err
    assert not (tmp_path / "j").exists()
    assert main(["run", "--nnodes", "2", "--controller-host", "localhost", "--dry-run",
                 str(script)]) == 0
