"""What the analysis reads beyond exact signatures (issue 17, fourteenth round, after the
seventeenth and eighteenth blind sets): NCCL's `unhandled cuda error` as NCCL's (the majority
of its labels), CUDA's unknown error as the GPU's, TensorFlow's tensor that does not fit on
the CPU device as the host's memory, a FUSE mount gone from under a write as the storage's,
TensorFlow's events writer that cannot open its file as the storage's, PhysX's GPU failures
as a kernel error, PyTorch's device-index assert as the device assignment's, a checkpoint cut
short as a load error, a shared-memory handle that did not arrive as shared memory, a native
library's logged import error, torch_npu's `ACL stream synchronize failed` giving way to the
Ascend line that says why, and NPU memory deciding over the call that reported it. The lines
are worded unlike the cases they were learnt from: the structure is what is tested."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.helpers import diagnose_text
from trainguard.diagnosis.taxonomy import Category, RestartHelps


@pytest.mark.parametrize("line", [
    "RuntimeError: NCCL error in: /src/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:2006, "
    "unhandled cuda error (run with NCCL_DEBUG=INFO for details), NCCL version 2.21.5",
    "horovod.common.exceptions.HorovodInternalError: ncclBroadcast failed: unhandled cuda error",
])
def test_nccls_unhandled_cuda_error_is_nccls(tmp_path: Path, line: str) -> None:
    d = diagnose_text(tmp_path, line + "\n")
    assert d.category == Category.NCCL_COMMUNICATION_ERROR
    assert d.restart_helps == RestartHelps.NO
    assert d.evidence is not None and d.evidence.text == line


@pytest.mark.parametrize("line", [
    "RuntimeError: CUDA error: unknown error",
    "THCudaCheck FAIL file=/src/aten/src/THC/THCCachingAllocator.cpp line=412 error=30 : "
    "unknown error",
])
def test_cudas_unknown_error_is_the_gpus(tmp_path: Path, line: str) -> None:
    d = diagnose_text(tmp_path, line + "\n")
    assert d.category == Category.GPU_HARDWARE
    assert d.restart_helps == RestartHelps.YES
    assert d.evidence is not None and d.evidence.text == line


def test_caffes_check_of_an_unknown_error_stays_a_kernel_error(tmp_path: Path) -> None:
    line = ("F1203 08:00:01.000001  1234 syncedmem.cpp:71] Check failed: error == cudaSuccess "
            "(30 vs. 0)  unknown error")
    assert diagnose_text(tmp_path, line + "\n").category == Category.CUDA_KERNEL_ERROR


def test_a_tensor_that_does_not_fit_on_the_cpu_device_is_host_memory(tmp_path: Path) -> None:
    line = ("tensorflow.python.framework.errors_impl.ResourceExhaustedError: OOM when allocating "
            "tensor with shape[4096,32000] and type float on "
            "/job:localhost/replica:0/task:0/device:CPU:0 by allocator mklcpu")
    d = diagnose_text(tmp_path, line + "\n")
    assert d.category == Category.HOST_OOM
    assert d.restart_helps == RestartHelps.NO
    gpu = line.replace("device:CPU:0 by allocator mklcpu", "device:GPU:1 by allocator GPU_1_bfc")
    (tmp_path / "g").mkdir()
    assert diagnose_text(tmp_path / "g", gpu + "\n").category == Category.GPU_OOM


@pytest.mark.parametrize("line", [
    "OSError: [Errno 107] Transport endpoint is not connected",
    "tensorflow.python.framework.errors_impl.FailedPreconditionError: "
    "/mnt/bucket/logs/events.out.tfevents.1700000000.host.1.0; Transport endpoint is not "
    "connected",
])
def test_a_mount_gone_from_under_a_write_is_the_storages(tmp_path: Path, line: str) -> None:
    d = diagnose_text(tmp_path, line + "\n")
    assert d.category == Category.DISK_FULL_OR_STORAGE_IO
    assert d.evidence is not None and d.evidence.text == line


def test_a_socket_not_connected_stays_a_peer_gone(tmp_path: Path) -> None:
    line = "  what():  Transport endpoint is not connected"
    assert diagnose_text(tmp_path, line + "\n").category != Category.DISK_FULL_OR_STORAGE_IO


def test_an_events_file_that_cannot_be_opened_is_the_storages(tmp_path: Path) -> None:
    line = ("E tensorflow/core/util/events_writer.cc:62] Could not open events file: "
            "/scratch/run7/events.out.tfevents.1500000000.node3: Permission denied")
    assert diagnose_text(tmp_path, line + "\n").category == Category.DISK_FULL_OR_STORAGE_IO


@pytest.mark.parametrize("line", [
    "[Error] [omni.physx.plugin] PhysX error: GPU solver pipeline failed, switching to CPU! 719",
    "[Error] [omni.physx.plugin] PhysX error: GPU kernel 'integrateCoreParticles' failed to "
    "launch with error 700!!",
])
def test_physx_failing_on_the_gpu_is_a_kernel_error(tmp_path: Path, line: str) -> None:
    d = diagnose_text(tmp_path, line + "\n")
    assert d.category == Category.CUDA_KERNEL_ERROR
    assert d.restart_helps == RestartHelps.NO


def test_a_device_index_past_the_visible_gpus_is_the_assignments(tmp_path: Path) -> None:
    line = ("RuntimeError: device >= 0 && device < num_gpus INTERNAL ASSERT FAILED at "
            "\"/src/aten/src/ATen/cuda/CUDAContext.cpp\":50, please report a bug to PyTorch.")
    assert diagnose_text(tmp_path, line + "\n").category == Category.CONFIG_ERROR


def test_a_checkpoint_cut_short_is_a_load_error(tmp_path: Path) -> None:
    line = "RuntimeError: unexpected EOF, expected 4096 more bytes. The file might be corrupted."
    assert diagnose_text(tmp_path, line + "\n").category == Category.CHECKPOINT_LOAD_ERROR


def test_a_shared_memory_handle_that_did_not_arrive_is_shared_memory(tmp_path: Path) -> None:
    d = diagnose_text(tmp_path, "RuntimeError: received 0 items of ancdata\n")
    assert d.category == Category.SHARED_MEMORY
    assert d.restart_helps == RestartHelps.NO


def test_a_native_librarys_logged_import_error_is_a_dependency(tmp_path: Path) -> None:
    text = ("[ERROR] TBE(881,python):2025-01-02-03:04:05.678.901 [te_fusion.cc:12]"
            "\"ModuleNotFoundError: No module named 'te_fusion'\n"
            "[ERROR] TEFUSION(881,python):2025-01-02-03:04:05.679.000 [fusion_manager.cc:660] "
            "TbeInit failed.\n")
    d = diagnose_text(tmp_path, text)
    assert d.category == Category.DEPENDENCY_OR_IMPORT_ERROR
    assert d.evidence is not None and "No module named" in d.evidence.text


def test_acl_stream_synchronize_gives_way_to_the_line_that_says_why(tmp_path: Path) -> None:
    text = ("RuntimeError: ACL stream synchronize failed.\n"
            "EI9999: Inner Error!\n"
            "EI9999: 2025-01-02-03:04:05.000.000  The error from device(chipId:1, dieId:0), "
            "serial number is 2, hccl fftsplus task timeout occurred during task execution, "
            "stream_id:3, timeout:30min(default).\n")
    d = diagnose_text(tmp_path, text)
    assert d.category == Category.NCCL_TIMEOUT_OR_HANG
    assert d.evidence is not None and "fftsplus task timeout" in d.evidence.text


def test_npu_memory_decides_over_the_call_that_reported_it(tmp_path: Path) -> None:
    text = ("RuntimeError: npuSynchronizeDevice:build/torch_npu/compiler_depend.ts:480 NPU "
            "function error: AclrtSynchronizeDeviceWithTimeout, error code is 507013\n"
            "EL0004: [PID: 77] 2025-01-02-03:04:05.000.000 Failed to allocate memory.\n")
    d = diagnose_text(tmp_path, text)
    assert d.category == Category.GPU_OOM
    assert d.evidence is not None and d.evidence.text.startswith("EL0004")
