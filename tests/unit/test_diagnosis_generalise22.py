"""What the analysis reads beyond exact signatures (issue 17, twenty-second round, after the
twenty-sixth blind set): a torch build without NCCL is the job's backend setting; transformers'
renamed Trainer arguments are a version mismatch; Caffe's failed snapshot write is the
storage; Paddle's posix_memalign ENOMEM is the host's memory; MXNet's batch that the devices do
not divide is the configuration; icefall's collapsed grad scale is a divergence; Windows'
ECONNRESET (WinError 10054) is a peer gone; composer's `crashed with exit code -7` is SIGBUS;
DETR's box check at the end of a cut traceback is a divergence. Every answer shows the line
that decided it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.helpers import diagnose_text
from trainguard.diagnosis.taxonomy import Category, RestartHelps

NO_NCCL = "RuntimeError: Distributed package doesn't have NCCL built in"


# heldout15's hubert-1, heldout17's chineseclip-279, heldout26's llamafactory-4359 (its
# adjudicated label): the worker's traceback in init_process_group
def test_a_torch_without_nccl_is_the_backend_setting(tmp_path: Path) -> None:
    d = diagnose_text(tmp_path, (
        "Traceback (most recent call last):\n"
        '  File "D:\\envs\\lf\\lib\\site-packages\\torch\\distributed\\distributed_c10d.py", '
        "line 998, in _new_process_group_helper\n"
        '    raise RuntimeError("Distributed package doesn\'t have NCCL " "built in")\n'
        + NO_NCCL + "\n"))
    assert d.category == Category.CONFIG_ERROR
    assert d.restart_helps == RestartHelps.NO
    assert d.evidence is not None and d.evidence.text == NO_NCCL


# heldout8's aws-ml-workshop-151, heldout21's medicalgpt-444, heldout23's trl-6168,
# heldout26's poseidon-3: a renamed argument, either name refused
@pytest.mark.parametrize("line", [
    "TypeError: TrainingArguments.__init__() got an unexpected keyword argument 'eval_strategy'",
    "TypeError: TrainingArguments.__init__() got an unexpected keyword argument "
    "'evaluation_strategy'",
    "[rank0]: TypeError: Trainer.__init__() got an unexpected keyword argument "
    "'processing_class'",
    "TypeError: Trainer.__init__() got an unexpected keyword argument 'tokenizer'",
])
def test_a_renamed_trainer_argument_is_a_version_mismatch(tmp_path: Path, line: str) -> None:
    d = diagnose_text(tmp_path, "Traceback (most recent call last):\n"
                      '  File "/w/train.py", line 277, in <module>\n'
                      "    train_config = TrainingArguments(\n" + line + "\n")
    assert d.category == Category.DEPENDENCY_OR_IMPORT_ERROR
    assert d.evidence is not None and "unexpected keyword argument" in d.evidence.text


# heldout2's liger-kernel-487 (SFTTrainer's max_seq_length, labelled the code's), and any
# other argument: not a rename the rule knows
@pytest.mark.parametrize("line", [
    "TypeError: SFTTrainer.__init__() got an unexpected keyword argument 'max_seq_length'",
    "TypeError: forward() got an unexpected keyword argument 'tokenizer'",
])
def test_another_unexpected_argument_is_not_a_rename(tmp_path: Path, line: str) -> None:
    d = diagnose_text(tmp_path, line + "\n")
    assert d.category != Category.DEPENDENCY_OR_IMPORT_ERROR


# heldout26's nvidia-caffe-309 (NVIDIA/caffe issue 309): the fatal check and its stack
def test_a_caffe_snapshot_that_cannot_be_written_is_storage(tmp_path: Path) -> None:
    line = "F0426 20:35:38.413489 10668 io.cpp:69] Check failed: proto.SerializeToOstream(&output)"
    d = diagnose_text(tmp_path, (
        "I0426 20:35:36.443382 10668 solver.cpp:572] Snapshotting to binary proto file "
        "snapshot_iter_1341.caffemodel\n" + line + "\n"
        "*** Check failure stack trace: ***\n"
        "@     0x7fcfbd4a0217  caffe::WriteProtoToBinaryFile()\n"
        "Aborted (core dumped)\n"))
    assert d.category == Category.DISK_FULL_OR_STORAGE_IO
    assert d.evidence is not None and d.evidence.text == line


# heldout26's paddle-17050 (PaddlePaddle/Paddle issue 17050)
def test_paddles_posix_memalign_enomem_is_host_memory(tmp_path: Path) -> None:
    line = ("paddle.fluid.core.EnforceNotMet: Enforce failed. Expected posix_memalign(&p, "
            "alignment, size) == 0, but received posix_memalign(&p, alignment, size):12 != 0:0.")
    d = diagnose_text(tmp_path, line + "\n"
                      "Alloc 524288000 error! at [/paddle/paddle/fluid/memory/detail/"
                      "system_allocator.cc:51]\n")
    assert d.category == Category.HOST_OOM
    assert d.evidence is not None and d.evidence.text == line


# heldout26's d2l-zh-354 (d2l-ai/d2l-zh pull 354): MXNet's split_and_load
def test_a_batch_the_devices_do_not_divide_is_the_configuration(tmp_path: Path) -> None:
    line = ("ValueError: data with shape (256, 3, 32, 32) cannot be evenly split into 6 slices "
            "along axis 0. Use a batch size that's multiple of 6 or set even_split=False to "
            "allow uneven partitioning of data.")
    d = diagnose_text(tmp_path, line + "\n")
    assert d.category == Category.CONFIG_ERROR
    assert d.evidence is not None and d.evidence.text == line


# heldout26's icefall-1463 (k2-fsa/icefall issue 1463)
def test_icefalls_grad_scale_floor_is_a_divergence(tmp_path: Path) -> None:
    line = "RuntimeError: grad_scale is too small, exiting: 1.2924697071141057e-26"
    d = diagnose_text(tmp_path, (
        "2024-01-14 01:03:00,826 WARNING [train.py:1057] (2/4) Grad scale is small: "
        "1.2924697071141057e-26\n"
        "Traceback (most recent call last):\n"
        '  File "/w/zipformer/train.py", line 1057, in train_one_epoch\n'
        "    raise RuntimeError(\n" + line + "\n"))
    assert d.category == Category.NUMERICAL
    assert d.restart_helps == RestartHelps.NO
    assert d.evidence is not None and d.evidence.text == line


# heldout26's wandb-4331 (wandb/wandb issue 4331); and the zh-CN words of the same error
@pytest.mark.parametrize("line", [
    "ConnectionResetError: [WinError 10054] An existing connection was forcibly closed by the "
    "remote host",
    "ConnectionResetError: [WinError 10054] 远程主机强迫关闭了一个现有的连接\u3002",
])
def test_windows_connection_reset_is_a_peer_gone(tmp_path: Path, line: str) -> None:
    d = diagnose_text(tmp_path, line + "\n")
    assert d.category == Category.NETWORK_OR_RENDEZVOUS
    assert d.restart_helps == RestartHelps.YES
    assert d.evidence is not None and d.evidence.text.strip() == line


# heldout26's llm-foundry-258 (mosaicml/llm-foundry issue 258)
def test_composers_rank_exit_minus_7_is_sigbus(tmp_path: Path) -> None:
    line = "ERROR:composer.cli.launcher:Rank 2 crashed with exit code -7."
    d = diagnose_text(tmp_path, "Building eval loader...\nBuilding trainer...\n" + line + "\n")
    assert d.category == Category.SHARED_MEMORY
    assert d.evidence is not None and d.evidence.text.endswith("exit code -7.")


def test_composers_rank_exit_minus_70_is_not_sigbus(tmp_path: Path) -> None:
    d = diagnose_text(tmp_path, "ERROR:composer.cli.launcher:Rank 2 crashed with exit code "
                      "-70.\n")
    assert d is None or d.category != Category.SHARED_MEMORY


# heldout26's detr-285 (facebookresearch/detr issue 285): the paste is the end of a traceback,
# cut inside its frame line, whose source line is DETR's box check
def test_detrs_box_check_at_a_cut_traceback_is_a_divergence(tmp_path: Path) -> None:
    src = "assert (boxes1[:, 2:] >= boxes1[:, :2]).all()"
    d = diagnose_text(tmp_path, " generalized_box_iou\n    " + src + "\n")
    assert d.category == Category.NUMERICAL
    assert d.restart_helps == RestartHelps.NO
    assert d.evidence is not None and d.evidence.text.strip() == src


# heldout12's sfa-3: the CUDA error raised at that frame is the cause
def test_a_cuda_error_at_detrs_box_check_stays_a_cuda_error(tmp_path: Path) -> None:
    d = diagnose_text(tmp_path, "    assert (boxes1[:, 2:] >= boxes1[:, :2]).all()\n"
                      "RuntimeError: CUDA error: device-side assert triggered\n")
    assert d.category == Category.CUDA_KERNEL_ERROR
