"""The pre-check's pure side: every judge, the report and the settings (no I/O)."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest
from pydantic import ValidationError

from trainguard.policy.precheck import (
    MIB,
    CheckResult,
    PrecheckConfig,
    PrecheckReport,
    check_crashed,
    is_local_path,
    judge_accelerators,
    judge_disk,
    judge_import,
    judge_nofile,
    judge_ports,
    judge_python,
    judge_shm,
    last_error_line,
    local_part,
    mib,
    visible_count,
)


def assert_failed(r: CheckResult, *words: str) -> None:
    assert not r.ok and r.fix, r
    for w in words:
        assert w in r.detail, (w, r.detail)


# -- disk -------------------------------------------------------------------------------------

def test_disk_with_enough_space_passes_and_reports_free_mib() -> None:
    r = judge_disk("/job", 5000 * MIB, 1024)
    assert r.ok and r.name == "disk:/job" and r.value == 5000 and r.fix is None
    assert "5000 MiB free" in r.detail


def test_disk_below_the_threshold_names_free_and_needed() -> None:
    r = judge_disk("/job/ckpt", 100 * MIB, 1024, judged_at="/job")
    assert_failed(r, "/job/ckpt (judged at /job)", "100 MiB free", "need 1024 MiB")
    assert r.fix is not None and "924 MiB" in r.fix


def test_disk_exactly_at_the_threshold_passes() -> None:
    assert judge_disk("/j", 1024 * MIB, 1024).ok
    assert not judge_disk("/j", 1024 * MIB - 1, 1024).ok


def test_a_read_only_disk_fails_whatever_its_space() -> None:
    assert_failed(judge_disk("/ro", 10**12, 1, writable=False), "not writable")


def test_judged_at_the_path_itself_is_not_repeated() -> None:
    assert "judged at" not in judge_disk("/j", 10**12, 1, judged_at="/j").detail


def test_small_sizes_keep_decimals() -> None:
    assert mib(0.5 * MIB) == "0.50 MiB" and mib(2048 * MIB) == "2048 MiB"


@pytest.mark.parametrize(("path", "local"), [
    ("/job", True), ("relative/dir", True), ("file:///job", True), ("s3://b/ckpt", False),
    ("gs://b", False), ("/odd/dir://x", True)])
def test_remote_urls_are_not_local(path: str, local: bool) -> None:
    assert is_local_path(path) is local


def test_file_urls_give_their_local_part() -> None:
    assert local_part("file:///job/x") == "/job/x" and local_part("/a") == "/a"


# -- /dev/shm ---------------------------------------------------------------------------------

def test_missing_shm_fails() -> None:
    assert_failed(judge_shm(None, None, 64), "/dev/shm is missing")


def test_docker_default_shm_of_64_mib_passes_the_default() -> None:
    assert judge_shm(64 * MIB, 64 * MIB, 64).ok


def test_small_shm_names_its_size() -> None:
    r = judge_shm(64 * MIB, 64 * MIB, 1024)
    assert_failed(r, "/dev/shm is 64 MiB", "need 1024 MiB")
    assert r.fix is not None and "--shm-size" in r.fix and r.value == 64


def test_full_shm_names_free_and_size() -> None:
    r = judge_shm(8192 * MIB, 10 * MIB, 64)
    assert_failed(r, "10 MiB free of 8192 MiB", "need 64 MiB")
    assert r.value == 10


# -- accelerators -----------------------------------------------------------------------------

@pytest.mark.parametrize(("nodes", "env", "visible"), [
    (8, None, 8), (8, "0,1", 2), (8, "", 0), (8, "-1", 0), (8, "0,-1,2", 1),
    (2, "0,1,2,3", 2), (0, "0", 0), (4, "GPU-abc, GPU-def", 2), (4, "0,,1", 1)])
def test_visible_count_follows_the_visibility_variable(nodes: int, env: str | None,
                                                       visible: int) -> None:
    assert visible_count(nodes, env) == visible


def test_accelerators_not_expected_pass_whatever_is_found() -> None:
    r = judge_accelerators(0, 0)
    assert r.ok and "not expected" in r.detail and r.value == 0


def test_too_few_accelerators_fail_with_both_counts() -> None:
    r = judge_accelerators(7, 8, kind="NVIDIA GPU(s)", source="/dev/nvidia*: 7")
    assert_failed(r, "7 NVIDIA GPU(s) visible, expected 8", "/dev/nvidia*: 7")


def test_enough_or_more_accelerators_pass() -> None:
    assert judge_accelerators(8, 8).ok and judge_accelerators(8, 4).ok


# -- interpreter and imports ------------------------------------------------------------------

TRACEBACK = ("Traceback (most recent call last):\n  File \"<string>\", line 1, in <module>\n"
             "ModuleNotFoundError: No module named 'torch'\n\n")


def test_last_error_line_is_the_exception() -> None:
    assert last_error_line(TRACEBACK) == "ModuleNotFoundError: No module named 'torch'"
    assert last_error_line("  \n") == ""


def test_python_that_runs_reports_its_version() -> None:
    r = judge_python("/env/bin/python", 0, "3.11.7\n")
    assert r.ok and r.detail == "Python 3.11.7 at /env/bin/python"


@pytest.mark.parametrize(("rc", "out", "error", "words"), [
    (None, "", "No such file or directory", ("cannot run /p", "No such file")),
    (None, "", None, ("did not answer",)),
    (1, "Fatal Python error: init_fs_encoding\n", None, ("exited 1", "init_fs_encoding")),
    (2, "", None, ("exited 2", "no output"))])
def test_python_that_cannot_run_fails(rc: int | None, out: str, error: str | None,
                                      words: tuple[str, ...]) -> None:
    r = judge_python("/p", rc, out, error)
    assert_failed(r, *words)
    assert r.name == "python"


def test_import_ok_reports_its_time() -> None:
    r = judge_import("torch", 0, "", 1.5, python="/env/bin/python")
    assert r.ok and r.name == "import:torch" and r.value == 1.5 and "1.50 s" in r.detail


def test_failed_import_names_the_exception_and_the_interpreter() -> None:
    r = judge_import("torch", 1, TRACEBACK, 0.04, python="/env/bin/python")
    assert_failed(r, "import torch failed in /env/bin/python", "exit 1",
                  "No module named 'torch'")
    assert r.fix is not None and "/env/bin/python -m pip install" in r.fix


def test_import_killed_by_a_signal_says_so() -> None:
    assert_failed(judge_import("torch", -11, "", 0.3), "killed by signal 11", "no error output")


def test_import_timeout_names_the_limit() -> None:
    r = judge_import("torch", None, "", 120.0, timeout_s=120)
    assert_failed(r, "did not finish in 120 s")
    assert r.fix is not None and "import_timeout_s" in r.fix


# -- ports and ulimit -------------------------------------------------------------------------

def test_all_ports_bound_passes() -> None:
    r = judge_ports(3, 3, None, fixed=[29500])
    assert r.ok and r.value == 3 and "29500" in r.detail


def test_a_port_in_use_fails_with_the_error() -> None:
    r = judge_ports(0, 2, "port 29500: [Errno 98] Address already in use", fixed=[29500])
    assert_failed(r, "bound 0 of 2", "Address already in use")


def test_fewer_ports_without_an_error_still_fail() -> None:
    assert_failed(judge_ports(1, 2, None), "bound 1 of 2")


def test_nofile_at_least_the_minimum_passes() -> None:
    assert judge_nofile(1024, 4096).ok and judge_nofile(None, None).ok
    assert judge_nofile(None, None).value is None


def test_low_nofile_says_how_far_it_can_be_raised() -> None:
    r = judge_nofile(256, 1048576)
    assert_failed(r, "soft 256, hard 1048576", "need 1024")
    assert r.fix == "raise it before starting: ulimit -n 1048576" and r.value == 256


def test_low_hard_nofile_needs_the_hard_limit_raised() -> None:
    r = judge_nofile(256, 512, 1024)
    assert r.fix is not None and "hard limit" in r.fix


def test_a_crashed_check_names_its_exception() -> None:
    r = check_crashed("shm", PermissionError(13, "Permission denied"))
    assert_failed(r, "PermissionError", "Permission denied")
    assert r.name == "shm"


# -- report and settings ----------------------------------------------------------------------

def report(*checks: CheckResult) -> PrecheckReport:
    return PrecheckReport(node="node-0", host="host-a",
                          at=datetime(2026, 1, 1, tzinfo=timezone.utc), checks=list(checks))


def test_report_of_passing_checks() -> None:
    rep = report(judge_nofile(4096, 4096), judge_shm(MIB * 100, MIB * 100, 64))
    assert rep.ok and rep.failed == []
    assert rep.summary() == "precheck on node-0 (host-a): ok, 2 checks"


def test_report_summary_names_each_failure_on_one_line() -> None:
    bad_import = judge_import("torch", 1, TRACEBACK, 0.1, python="/p")
    rep = report(judge_nofile(4096, 4096), judge_shm(None, None, 64), bad_import)
    assert not rep.ok and [c.name for c in rep.failed] == ["shm", "import:torch"]
    s = rep.summary()
    assert "\n" not in s and s.startswith("precheck on node-0 (host-a): 2 of 3 failed: ")
    assert "shm: /dev/shm is missing" in s and "No module named 'torch'" in s


def test_a_node_that_never_answered_names_no_empty_host() -> None:
    """Walk-through 26: 'precheck on node-1 (): 1 of 1 failed: ...' for an agent that died."""
    rep = PrecheckReport(node="node-1", host="", at=datetime(2026, 1, 1, tzinfo=timezone.utc),
                         checks=[CheckResult(name="agent", ok=False, detail="no pre-check "
                                             "answer: its agent process ended")])
    assert rep.summary() == ("precheck on node-1: 1 of 1 failed: agent: no pre-check answer: "
                             "its agent process ended")


def test_report_round_trips_as_json() -> None:
    rep = report(judge_disk("/j", MIB, 1024), judge_nofile(None, None))
    assert PrecheckReport.model_validate_json(rep.model_dump_json()) == rep


def test_models_are_frozen_and_strict() -> None:
    r = judge_nofile(4096, 4096)
    with pytest.raises(ValidationError):
        r.ok = False  # type: ignore[misc]
    with pytest.raises(ValidationError):
        CheckResult(name="x", ok=True, detail="", extra=1)  # type: ignore[call-arg]


def test_config_defaults() -> None:
    cfg = PrecheckConfig(python="/env/bin/python", paths=["/job"])
    assert (cfg.min_free_disk_mb, cfg.min_shm_mb, cfg.expect_accelerators) == (1024, 64, 0)
    assert cfg.import_modules == ["torch"] and cfg.ports == 1 and cfg.bind_addr == "0.0.0.0"
    assert cfg.fixed_ports == [] and cfg.min_nofile == 1024 and cfg.import_timeout_s == 120


@pytest.mark.parametrize("bad", [
    {"import_modules": ["torch; import os"]}, {"import_modules": [""]},
    {"import_modules": ["a..b"]}, {"fixed_ports": [0]}, {"fixed_ports": [70000]},
    {"ports": -1}, {"min_free_disk_mb": -1}, {"expect_accelerators": -1}, {"python": ""},
    {"import_timeout_s": 0}, {"unknown": 1}])
def test_config_rejects_bad_values(bad: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        PrecheckConfig.model_validate({"python": "/p", "paths": [], **bad})


def test_config_accepts_dotted_modules() -> None:
    cfg = PrecheckConfig(python="/p", paths=[], import_modules=["torch.distributed", "numpy"])
    assert cfg.import_modules == ["torch.distributed", "numpy"]
