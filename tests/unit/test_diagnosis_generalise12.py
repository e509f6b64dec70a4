"""What the analysis reads beyond exact signatures (issue 17, twelfth round, after the
fifteenth blind set): a name the resolver cannot resolve and a connection timeout cut
mid-line as the network's, a bind that failed as a port conflict, a library built without
a feature (`compile with USE_...=1`) as a dependency, and VS Code's `Exception has occurred:
X` line giving way to the message on the next line. The lines are worded unlike the cases
they were learnt from: the structure is what is tested."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.helpers import diagnose_text
from trainguard.diagnosis.taxonomy import Category, RestartHelps


@pytest.mark.parametrize("line", [
    "nslookup: can't resolve 'job-7f3a-worker-0': Name does not resolve",
    "ping: trainer-master.default.svc: Name does not resolve",
    "RuntimeError: Connection timed",
])
def test_unresolved_names_and_cut_timeouts_are_the_networks(tmp_path: Path, line: str) -> None:
    text = ("Traceback (most recent call last):\n"
            '  File "launch.py", line 40, in <module>\n'
            "    init_process_group(backend='gloo')\n" + line + "\n")
    d = diagnose_text(tmp_path, text)
    assert d.category == Category.NETWORK_OR_RENDEZVOUS
    assert d.restart_helps == RestartHelps.YES
    assert d.evidence is not None and d.evidence.text == line


def test_a_bind_that_failed_is_a_port_conflict(tmp_path: Path) -> None:
    line = ("mxnet.base.MXNetError: [11:02:07] src/van.cc:300: Check failed: "
            "(my_node_.port) != (-1) bind failed")
    d = diagnose_text(tmp_path, line + "\n")
    assert d.category == Category.PORT_CONFLICT
    assert d.evidence is not None and d.evidence.text == line


@pytest.mark.parametrize("line", [
    "mxnet.base.MXNetError: [09:41:12] src/kvstore/kvstore.cc:40: compile with "
    "USE_DIST_KVSTORE=1 to use dist_sync",
    "RuntimeError: operator not available: compile with USE_CUDNN=1 to enable it",
])
def test_a_feature_not_compiled_in_is_a_dependency(tmp_path: Path, line: str) -> None:
    d = diagnose_text(tmp_path, line + "\n")
    assert d.category == Category.DEPENDENCY_OR_IMPORT_ERROR
    assert d.restart_helps == RestartHelps.NO
    assert d.evidence is not None and d.evidence.text == line


def test_vscodes_exception_line_gives_way_to_its_message(tmp_path: Path) -> None:
    message = "CUDA error: no kernel image is available for execution on the device"
    text = ("Exception has occurred: RuntimeError\n" + message + "\n"
            '  File "/src/model/ops.py", line 60, in forward\n'
            "    out = ext.forward(x)\n")
    d = diagnose_text(tmp_path, text)
    assert d.category == Category.DEPENDENCY_OR_IMPORT_ERROR
    assert d.evidence is not None and d.evidence.text == message
    assert d.symptoms and d.symptoms[0].text.startswith("Exception has occurred:")


def test_vscodes_line_without_a_known_message_stays_the_codes(tmp_path: Path) -> None:
    text = "Exception has occurred: ValueError\nthe batch has 3 columns, expected 4\n"
    d = diagnose_text(tmp_path, text)
    assert d.category == Category.USER_CODE_ERROR


@pytest.mark.parametrize("code,message", [
    (30, "unknown error"), (4, "unspecified launch failure"),
])
def test_a_glog_check_of_a_cuda_call_is_the_cause_not_the_abort(
        tmp_path: Path, code: int, message: str) -> None:
    # Caffe's CHECK of a CUDA call, then glog's stack and the abort it ends in: the abort
    # is the symptom
    line = (f"F0312 08:01:44.120931  9120 syncedmem.cpp:56] Check failed: error == "
            f"cudaSuccess ({code} vs. 0)  {message}")
    text = (line + "\n*** Check failure stack trace: ***\n"
            "    @     0x7f0a1c2d5daa  (unknown)\n"
            "    @     0x7f0a1c2d5ce4  google::LogMessage::Fail()\n"
            "Aborted (core dumped)\n")
    d = diagnose_text(tmp_path, text)
    assert d.category == Category.CUDA_KERNEL_ERROR
    assert d.evidence is not None and d.evidence.text == line


def test_a_glog_check_of_cuda_out_of_memory_is_not_a_kernel_error(tmp_path: Path) -> None:
    # code 2 is cudaErrorMemoryAllocation: the CUDA rule leaves it to the memory rules
    line = ("F0312 08:01:44.120931  9120 syncedmem.cpp:56] Check failed: error == "
            "cudaSuccess (2 vs. 0)  out of memory")
    d = diagnose_text(tmp_path, line + "\nAborted (core dumped)\n")
    assert d.category != Category.CUDA_KERNEL_ERROR
