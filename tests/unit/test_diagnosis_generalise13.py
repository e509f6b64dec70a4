"""What the analysis reads beyond exact signatures (issue 17, thirteenth round, after the
sixteenth blind set): a connection that timed out while connecting as the network's (not a
remote service's slow answer), a Python warning giving way to the error the process died of,
glog's fatal CHECK of a condition no rule knows as a native abort, CUDA's `all CUDA-capable
devices are busy or unavailable` as the device assignment's, a cloud bucket's server error as
the storage's, a traceback cut where the process group is initialised as the rendezvous, and
a collective timeout while a rank was still evaluating as one a restart repeats. The lines
are worded unlike the cases they were learnt from: the structure is what is tested."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.helpers import diagnose_text
from trainguard.diagnosis.taxonomy import Category, RestartHelps

_TOP = ("Traceback (most recent call last):\n"
        '  File "/opt/env/lib/python3.11/site-packages/urllib3/util/connection.py", line 73, '
        "in create_connection\n"
        "    sock.connect(sa)\n")


@pytest.mark.parametrize("line", [
    "TimeoutError: timed out",
    "socket.timeout: timed out",
    "urllib3.exceptions.ConnectTimeoutError: (<urllib3.connection.HTTPSConnection object at "
    "0x7f00aa11bb22>, 'Connection to cdn.example-models.org timed out. (connect timeout=30)')",
    "requests.exceptions.ConnectTimeout: HTTPSConnectionPool(host='api.tracker.dev', "
    "port=443): Max retries exceeded with url: /v1/runs (Caused by ConnectTimeoutError(...))",
])
def test_a_connect_that_timed_out_is_the_networks(tmp_path: Path, line: str) -> None:
    d = diagnose_text(tmp_path, _TOP + line + "\n")
    assert d.category == Category.NETWORK_OR_RENDEZVOUS
    assert d.restart_helps == RestartHelps.NO
    assert d.evidence is not None and d.evidence.text == line


def test_a_read_that_timed_out_stays_the_remote_services(tmp_path: Path) -> None:
    # a slow answer, not a host out of reach: the labels split, the rule is unchanged
    line = ("urllib3.exceptions.ReadTimeoutError: HTTPSConnectionPool(host='hub.example.org', "
            "port=443): Read timed out. (read timeout=10)")
    d = diagnose_text(tmp_path, line + "\n")
    assert d.category == Category.OTHER


def test_a_warning_gives_way_to_the_error_the_process_died_of(tmp_path: Path) -> None:
    warning = ("/opt/env/lib/python3.10/site-packages/torch/cuda/__init__.py:107: UserWarning: "
               "CUDA initialization: The NVIDIA driver on your system is too old (found "
               "version 11040).")
    text = warning + "\n  return torch._C._cuda_getDeviceCount() > 0\n" + _TOP + \
        "TimeoutError: timed out\n"
    d = diagnose_text(tmp_path, text)
    assert d.category == Category.NETWORK_OR_RENDEZVOUS
    assert d.evidence is not None and d.evidence.text == "TimeoutError: timed out"


def test_a_warning_alone_still_answers(tmp_path: Path) -> None:
    warning = ("/opt/env/lib/python3.10/site-packages/torch/cuda/__init__.py:107: UserWarning: "
               "CUDA initialization: The NVIDIA driver on your system is too old (found "
               "version 11040).")
    d = diagnose_text(tmp_path, warning + "\n")
    assert d.category == Category.DEPENDENCY_OR_IMPORT_ERROR


@pytest.mark.parametrize("text", [
    "I0401 12:00:01.000001  2211 engine.cc:90] started\n"
    "F0401 12:00:03.418822  2213 scheduler.cc:212] Check failed: queue_depth >= 0 (-3 vs. 0)\n"
    "*** Check failure stack trace: ***\n",
    "Step 0:   0%|          | 0/500 [00:00<?, ?it/sF0911 07:15:02.500100   4410 "
    "shape_util.h:88] Check failed: dim < rank\n",
])
def test_a_glog_fatal_check_no_rule_knows_is_a_native_abort(tmp_path: Path, text: str) -> None:
    d = diagnose_text(tmp_path, text)
    assert d.category == Category.SEGFAULT_OR_ABORT
    assert d.evidence is not None and "Check failed" in d.evidence.text


def test_a_glog_check_of_cuda_out_of_memory_is_gpu_memory(tmp_path: Path) -> None:
    line = ("F0312 08:01:44.120931  9120 blob.cpp:41] Check failed: error == "
            "cudaSuccess (2 vs. 0)  out of memory")
    d = diagnose_text(tmp_path, line + "\n*** Check failure stack trace: ***\n")
    assert d.category == Category.GPU_OOM
    assert d.evidence is not None and d.evidence.text == line


@pytest.mark.parametrize("line", [
    "RuntimeError: CUDA error: all CUDA-capable devices are busy or unavailable",
    "pycuda._driver.Error: cudaErrorDevicesUnavailable while creating the context",
])
def test_gpus_that_take_no_more_processes_are_the_device_assignments(
        tmp_path: Path, line: str) -> None:
    d = diagnose_text(tmp_path, line + "\n")
    assert d.category == Category.CONFIG_ERROR
    assert d.restart_helps == RestartHelps.NO


def test_a_cloud_buckets_server_error_is_the_storages(tmp_path: Path) -> None:
    line = ("tensorflow.python.framework.errors_impl.UnavailableError: Error executing an HTTP "
            "request: HTTP response code 502 with body 'Bad Gateway'")
    d = diagnose_text(tmp_path, line + "\n\t when uploading gs://bucket/run/model.ckpt-9\n")
    assert d.category == Category.DISK_FULL_OR_STORAGE_IO
    assert d.evidence is not None and d.evidence.text == line


def test_a_traceback_cut_where_the_process_group_starts_is_the_rendezvous(
        tmp_path: Path) -> None:
    text = ("| distributed init (rank 1): tcp://10.0.0.7:23456\n"
            "Traceback (most recent call last):\n"
            '  File "/work/nmt/train.py", line 88, in main\n'
            "    cfg.rank = dist_utils.distributed_init(cfg)\n")
    d = diagnose_text(tmp_path, text)
    assert d.category == Category.NETWORK_OR_RENDEZVOUS


@pytest.mark.parametrize("busy", [
    "Evaluating the model on the test split...",
    "eval:  97%|#########7| 970/1000 [31:40<00:58,  1.95s/it]",
])
def test_a_timeout_while_a_rank_evaluates_repeats(tmp_path: Path, busy: str) -> None:
    text = (busy + "\n[E ProcessGroupNCCL.cpp:821] [Rank 2] Watchdog caught collective "
            "operation timeout: WorkNCCL(SeqNum=812, OpType=ALLREDUCE, Timeout(ms)=1800000) "
            "ran for 1800410 milliseconds before timing out.\n")
    d = diagnose_text(tmp_path, text)
    assert d.category == Category.NCCL_TIMEOUT_OR_HANG
    assert d.restart_helps == RestartHelps.NO


def test_a_line_that_only_names_an_evaluation_keeps_yes(tmp_path: Path) -> None:
    text = ("[eval] global_step = 0\n[E ProcessGroupNCCL.cpp:821] [Rank 2] Watchdog caught "
            "collective operation timeout: WorkNCCL(SeqNum=812, OpType=ALLREDUCE, "
            "Timeout(ms)=1800000) ran for 1800410 milliseconds before timing out.\n")
    d = diagnose_text(tmp_path, text)
    assert d.restart_helps == RestartHelps.YES
