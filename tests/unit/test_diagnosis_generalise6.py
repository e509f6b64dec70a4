"""What the analysis reads beyond exact signatures (issue 17, sixth round, after the ninth
blind set): the CUDA runtime's own out-of-memory string, the host's memory named in an OOM
whose type or call says otherwise, torch's shared-memory file however a paste shortened it,
a loss reported as NaN in the past tense, and torchrun's exit code in a paste that ran its
fields together. The lines are worded unlike the cases they were learnt from: the
structure is what is tested."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.helpers import diagnose_text
from trainguard.diagnosis.exit_notices import exit_code
from trainguard.diagnosis.taxonomy import Category, RestartHelps


@pytest.mark.parametrize("text", [
    # the runtime's error string after `CUDA error:` (and HIP's), not a kernel's failure
    "Traceback (most recent call last):\n  File \"eval.py\", line 40, in <module>\n"
    "    feats = backbone(x.cuda())\nRuntimeError: CUDA error: out of memory\n",
    "terminate called after throwing an instance of 'c10::Error'\n"
    "  what():  HIP error: out of memory\n",
    # printed alone by a check macro, before what the failed allocation caused
    "out of memory\nRuntimeError: CUDA error: an illegal memory access was encountered\n",
])
def test_the_cuda_runtimes_out_of_memory_string_is_gpu_oom(tmp_path: Path, text: str) -> None:
    d = diagnose_text(tmp_path, "epoch 3 iter 200 loss 0.71\n" + text)
    assert d.category == Category.GPU_OOM
    assert d.restart_helps == RestartHelps.NO


@pytest.mark.parametrize("text", [
    # a memory monitor that says the machine runs low, whatever the exception's type
    "OutOfMemoryError: the host is running low on memory (31.2GB / 32GB), killing worker 7\n",
    # pinned host memory for the input pipeline, behind a call whose name says CUDA
    "E1203 data_queue.cc:88] cudaMallocHost failed for 512MB prefetch buffer: out of memory\n",
    "RuntimeError: out of host memory while staging batch 1200\n",
])
def test_an_oom_that_names_the_hosts_memory_is_host_oom(tmp_path: Path, text: str) -> None:
    d = diagnose_text(tmp_path, "step 1200 loss 1.3\n" + text)
    assert d.category == Category.HOST_OOM


def test_torchs_shared_memory_file_however_the_paste_shortened_it(tmp_path: Path) -> None:
    d = diagnose_text(tmp_path, "RuntimeError: unable to write to file </torch> at "
                                "THAllocator.c:383\n")
    assert d.category == Category.SHARED_MEMORY


def test_a_loss_reported_as_nan_in_the_past_tense_is_numerical(tmp_path: Path) -> None:
    d = diagnose_text(tmp_path, "ValueError: Validation loss was nan at epoch 12; stopping\n")
    assert d.category == Category.NUMERICAL


@pytest.mark.parametrize("text,code", [
    ("  host      : node-7\n  rank      : 3 (local_rank: 3)exitcode  : -9 (pid: 123)\n", -9),
    ("rank: 1 (local_rank: 1) exitcode: -6 (pid: 42) error_file: <N/A>", -6),
    ("exitcode: 1 (pid: 7)", 1),
    # a word that merely ends in `exitcode` is none
    ("myexitcode: 3", None),
])
def test_torchruns_exit_code_in_a_paste_that_ran_its_fields_together(text: str,
                                                                      code: int | None) -> None:
    line = text.splitlines()[-1]
    assert exit_code(line) == (None, code)


def test_an_operators_output_that_finds_no_memory_is_the_devices(tmp_path: Path) -> None:
    # `node:<graph path>` names a node of the graph (an operator), not a machine
    d = diagnose_text(tmp_path, "RuntimeError: Alloc for kernel workspace failed, memory is not "
                                "enough, node:Gradients/Default/MatMul-op12\n")
    assert d.category == Category.GPU_OOM


@pytest.mark.parametrize("text", [
    # a setting quoted as `name=value` that the message says the setup does not support
    "NotImplementedError: sliding window attention does not support "
    "`attn_implementation=sdpa`; please set `attn_implementation=eager`\n",
    # a count held to a bound it misses, in the words of a check that expected more
    "ValueError: Expected more than 2 samples per group when training, got group size 1\n",
    # an index exactly at its dimension's size: one class or token more than the count set
    "IndexError: index 1000 is out of bounds for axis 0 with size 1000\n",
])
def test_a_generic_exception_that_says_a_setting_does_not_fit_is_the_configs(
        tmp_path: Path, text: str) -> None:
    d = diagnose_text(tmp_path, "epoch 1 step 10 loss 0.9\n" + text)
    assert d.category == Category.CONFIG_ERROR


def test_an_index_further_out_than_the_size_stays_the_codes(tmp_path: Path) -> None:
    d = diagnose_text(tmp_path, "IndexError: index 1500 is out of bounds for dimension 0 with "
                                "size 1000\n")
    assert d.category == Category.USER_CODE_ERROR


def test_a_framework_worker_that_died_explains_its_peers_network_errors(tmp_path: Path) -> None:
    d = diagnose_text(tmp_path, (
        "ray.exceptions.WorkerCrashedError: The worker died unexpectedly while executing "
        "this task.\n"
        "node2:88:99 [0] NCCL WARN NET/IB : Got completion from peer 10.0.0.2<4372> with "
        "error 12, opcode 0, len 0, vendor err 129\n"))
    assert d.category == Category.KILLED_BY_SIGNAL_UNKNOWN
    assert d.restart_helps == RestartHelps.YES


def test_a_native_crash_while_a_module_loads_does_not_restart(tmp_path: Path) -> None:
    d = diagnose_text(tmp_path, (
        "loading plugins\nFatal Python error: Aborted\n\n"
        "Thread 0x00007f00aa (most recent call first):\n"
        '  File "<frozen importlib._bootstrap_external>", line 1176 in create_module\n'
        '  File "<frozen importlib._bootstrap>", line 571 in module_from_spec\n'
        '  File "/opt/env/lib/python3.11/site-packages/jaxlib/__init__.py", line 12 in '
        "<module>\n"))
    assert d.category == Category.SEGFAULT_OR_ABORT
    assert d.restart_helps == RestartHelps.NO


def test_a_native_crash_in_the_training_loop_keeps_its_default(tmp_path: Path) -> None:
    d = diagnose_text(tmp_path, (
        "Fatal Python error: Segmentation fault\n\n"
        "Current thread 0x00007f00aa (most recent call first):\n"
        '  File "/work/train.py", line 88 in step\n'
        '  File "/work/train.py", line 120 in main\n'))
    assert d.category == Category.SEGFAULT_OR_ABORT
    assert d.restart_helps == RestartHelps.MAYBE


def test_a_save_that_could_not_be_done_is_storages(tmp_path: Path) -> None:
    d = diagnose_text(tmp_path, "epoch 4 done\nWARNING: could not write checkpoint to "
                                "/mnt/runs/step_4000, giving up\n")
    assert d.category == Category.DISK_FULL_OR_STORAGE_IO


def test_an_exception_message_quoted_without_its_type_is_an_answer(tmp_path: Path) -> None:
    d = diagnose_text(tmp_path, "step 3\n'NoneType' object is not subscriptable\n")
    assert d.evidence is not None and "not subscriptable" in d.evidence.text
