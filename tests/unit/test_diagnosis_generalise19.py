"""What the analysis reads beyond exact signatures (issue 17, nineteenth round, after the
twenty-third blind set): CUDA's `system not yet initialized` (error 802) is the node's, behind
NCCL's generic `unhandled cuda error`; NCCL's bootstrap that finds no socket interface is a
launch setting, behind its generic `internal error`; torch.distributed.checkpoint's `Missing
key in checkpoint state_dict` is a failed load, not a configuration's missing key;
TensorFlow's `Resource exhausted` on a checkpoint's temporary file is storage, not memory; the
shell's `Killed` glued to the last progress bar is a kill like the bare word; a collective
timeout while a rank still scans its data files says a restart does not help. Every answer
shows the line that decided it."""

from __future__ import annotations

from pathlib import Path

from tests.unit.helpers import diagnose_text, traceback_of
from trainguard.diagnosis.taxonomy import Category, RestartHelps

_NCCL_UNHANDLED_CUDA = (
    "[rank0]: torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/"
    "distributed/c10d/NCCLUtils.cpp:77, unhandled cuda error (run with NCCL_DEBUG=INFO for "
    "details), NCCL version 2.25.1\n"
    "[rank0]: ncclUnhandledCudaError: Call to CUDA function failed.\n"
    "[rank0]: Last error:\n")


def test_cuda_system_not_yet_initialized_is_the_nodes(tmp_path: Path) -> None:
    text = _NCCL_UNHANDLED_CUDA + "[rank0]: Cuda failure 802 'system not yet initialized'\n"
    d = diagnose_text(tmp_path, text)
    assert d.category == Category.GPU_HARDWARE
    assert d.restart_helps == RestartHelps.YES
    assert d.isolate_node
    assert d.evidence is not None and "system not yet initialized" in d.evidence.text


def test_nccls_unhandled_cuda_error_alone_stays_nccls(tmp_path: Path) -> None:
    d = diagnose_text(tmp_path, _NCCL_UNHANDLED_CUDA)
    assert d.category == Category.NCCL_COMMUNICATION_ERROR


def test_nccls_bootstrap_without_a_socket_interface_is_a_launch_setting(
        tmp_path: Path) -> None:
    text = ("[rank0]: torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/"
            "distributed/c10d/ProcessGroupNCCL.cpp:2588, internal error - please report this "
            "issue to the NCCL developers, NCCL version 2.21.5\n"
            "[rank0]: ncclInternalError: Internal check failed.\n"
            "[rank0]: Last error:\n"
            "[rank0]: Bootstrap : no socket interface found\n")
    d = diagnose_text(tmp_path, text)
    assert d.category == Category.CONFIG_ERROR
    assert d.restart_helps == RestartHelps.NO
    assert d.evidence is not None and d.evidence.text.endswith("no socket interface found")


def test_nccls_internal_error_alone_stays_nccls(tmp_path: Path) -> None:
    d = diagnose_text(tmp_path, traceback_of(
        "torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/"
        "c10d/ProcessGroupNCCL.cpp:2588, internal error - please report this issue to the NCCL "
        "developers, NCCL version 2.21.5"))
    assert d.category == Category.NCCL_COMMUNICATION_ERROR


def test_a_key_missing_from_a_distributed_checkpoint_is_a_failed_load(tmp_path: Path) -> None:
    line = ("RuntimeError: Missing key in checkpoint state_dict: "
            "model.layers.0.attention.wq.weight.")
    d = diagnose_text(tmp_path, traceback_of(line))
    assert d.category == Category.CHECKPOINT_LOAD_ERROR
    assert d.restart_helps == RestartHelps.NO
    assert d.evidence is not None and d.evidence.text == line


def test_a_configurations_missing_key_stays_a_configurations(tmp_path: Path) -> None:
    d = diagnose_text(tmp_path, traceback_of(
        "omegaconf.errors.ConfigKeyError: Missing key optimizer"))
    assert d.category == Category.CONFIG_ERROR


def test_resource_exhausted_on_a_checkpoints_temporary_file_is_storage(tmp_path: Path) -> None:
    text = ("W tensorflow/core/framework/op_kernel.cc:993] Resource exhausted: train_log/"
            "Image2Image0310-010816/model-1200.data-00000-of-00001.tempstate17739147618128640016\n"
            + traceback_of("tensorflow.python.framework.errors_impl.ResourceExhaustedError: "
                           "train_log/Image2Image0310-010816/model-1200.data-00000-of-00001."
                           "tempstate17739147618128640016"))
    d = diagnose_text(tmp_path, text)
    assert d.category == Category.DISK_FULL_OR_STORAGE_IO
    assert d.evidence is not None and ".tempstate" in d.evidence.text


def test_resource_exhausted_allocating_a_tensor_stays_memory(tmp_path: Path) -> None:
    d = diagnose_text(tmp_path, traceback_of(
        "tensorflow.python.framework.errors_impl.ResourceExhaustedError: OOM when allocating "
        "tensor with shape[256,832,7,7]"))
    assert d.category == Category.GPU_OOM


def test_killed_glued_to_the_last_progress_bar_is_a_kill(tmp_path: Path) -> None:
    # the shard-loading bar would otherwise read as a failed checkpoint load
    line = ("Loading checkpoint shards:   0%|                                        "
            "| 0/2 [00:00<?, ?it/s]Killed")
    d = diagnose_text(tmp_path, line + "\n")
    assert d.category == Category.HOST_OOM
    assert d.evidence is not None and d.evidence.text.endswith("]Killed")


def test_killed_inside_a_word_is_no_kill(tmp_path: Path) -> None:
    d = diagnose_text(tmp_path, traceback_of("ValueError: process was NotKilled"))
    assert d.category != Category.HOST_OOM


def _timeout_behind(progress: str) -> str:
    return (progress + "[E ProcessGroupNCCL.cpp:567] [Rank 1] Watchdog caught collective "
            "operation timeout: WorkNCCL(OpType=ALLREDUCE, Timeout(ms)=60000) ran for 67438 "
            "milliseconds before timing out.\n")


def test_a_collective_timeout_while_a_rank_scans_its_data_says_no(tmp_path: Path) -> None:
    d = diagnose_text(tmp_path, _timeout_behind(
        "train: Scanning '../coco/labels/train' images and labels...43718 found, 110 missing, "
        "0 empty, 7 corrupted:  97%|██▉| 43830/45049 [01:07<00:18, 66.12it/s]"))
    assert d.category == Category.NCCL_TIMEOUT_OR_HANG
    assert d.restart_helps == RestartHelps.NO
    assert "preparing the data" in d.advice


def test_a_collective_timeout_after_a_training_bar_still_says_yes(tmp_path: Path) -> None:
    d = diagnose_text(tmp_path, _timeout_behind(
        " 20%|████      | 216/1063 [00:27<02:17,  6.17it/s]"))
    assert d.category == Category.NCCL_TIMEOUT_OR_HANG
    assert d.restart_helps == RestartHelps.YES
