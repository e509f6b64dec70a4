"""What the analysis reads beyond exact signatures (issue 17, twenty-third round, after the
twenty-seventh blind set): a loss printed as a tensor holding NaN, and any reading printed as
`name=nan`, is a divergence; TensorFlow's device allocator that cannot allocate is a GPU OOM
(and its device line, `pci bus id`, no hardware fault); CPython refusing an invalid
PYTHONHASHSEED is the environment's configuration; torch.save into a directory that does not
exist is the code's, not a checkpoint that cannot load; ENOTEMPTY while a checkpoint directory
is removed or renamed is a race between ranks (`other`). Every answer shows the line that
decided it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.helpers import diagnose_text
from trainguard.diagnosis.families import load_families
from trainguard.diagnosis.taxonomy import Category, RestartHelps

LOSS_DICT = ("loss_dict = {'loss_cls': tensor(nan, device='cuda:0', grad_fn=<DivBackward0>), "
             "'loss_box_reg': tensor(1310.0702, device='cuda:0', grad_fn=<DivBackward0>)}")


# heldout27's detectron2-214 (its FloatingPointError cut; the SIGSEGV exit after it), as
# heldout6's and heldout7's detectron2 logs print it
def test_a_loss_tensor_holding_nan_is_a_divergence(tmp_path: Path) -> None:
    d = diagnose_text(tmp_path, LOSS_DICT + "\n\n"
                      "Process finished with exit code 139 (interrupted by signal 11: SIGSEGV)\n")
    assert d.category == Category.NUMERICAL
    assert d.restart_helps == RestartHelps.NO
    assert d.evidence is not None and d.evidence.text == LOSS_DICT


# heldout27's x-vits-5: a GAN's losses, none of them called a loss
def test_a_reading_printed_as_nan_is_a_divergence(tmp_path: Path) -> None:
    line = "b=3.985, disc=nan, gen=nan, fm=nan,"
    d = diagnose_text(tmp_path, line + "\n")
    assert d.category == Category.NUMERICAL
    assert d.evidence is not None and d.evidence.text == line


# heldout27's tensorflow-upstream-82 (ROCm/tensorflow-upstream issue 82): TF's allocator on
# ROCm, after the line that names the device (with its `pci bus id`)
def test_tensorflows_device_allocation_failure_is_a_gpu_oom(tmp_path: Path) -> None:
    alloc = ("2019-01-08 19:06:11.303639: E tensorflow/stream_executor/rocm/rocm_driver.cc:601] "
             "failed to allocate 7.35G (7889485824 bytes) from device: hipError_t(1002)")
    d = diagnose_text(tmp_path, (
        "2019-01-08 19:06:10.822532: I tensorflow/core/common_runtime/gpu/gpu_device.cc:1189] "
        "Created TensorFlow device (/job:localhost/replica:0/task:0/device:GPU:0 with 7524 MB "
        "memory) -> physical GPU (device: 0, name: Vega 10 XL/XT [Radeon RX Vega 56/64], pci "
        "bus id: 0000:03:00.0)\n" + alloc + "\n"))
    assert d.category == Category.GPU_OOM
    assert d.evidence is not None and "failed to allocate 7.35G" in d.evidence.text


def test_tensorflows_pci_bus_id_is_no_hardware_fault() -> None:
    fam = load_families()
    line = ("Created TensorFlow device (/job:localhost/replica:0/task:0/device:GPU:0 with 7524 "
            "MB memory) -> physical GPU (device: 0, name: Vega 10 XL/XT, pci bus id: "
            "0000:03:00.0)")
    assert Category.GPU_HARDWARE not in fam.scores(line)
    # the kernel's PCIe error report still is (cases/' returnn-1486, heldout7's gpu-burn-1)
    assert Category.GPU_HARDWARE in fam.scores(
        "pcieport 0000:00:02.0: PCIe Bus Error: severity=Uncorrected (Fatal), "
        "type=Transaction Layer, id=0010(Receiver ID)")


# heldout27's f5-tts-231 (SWivid/F5-TTS issue 231): not a native crash
def test_an_invalid_pythonhashseed_is_the_configuration(tmp_path: Path) -> None:
    line = ('Fatal Python error: config_init_hash_seed: PYTHONHASHSEED must be "random" or an '
            "integer in range [0; 4294967295]")
    d = diagnose_text(tmp_path, "accelerate launch finetune-cli.py --exp_name F5TTS_Base\n"
                      + line + "\nPython runtime state: preinitialized\n")
    assert d.category == Category.CONFIG_ERROR
    assert d.restart_helps == RestartHelps.NO
    assert d.evidence is not None and d.evidence.text == line


# heldout27's nanochat-336 (karpathy/nanochat PR 336): a save, not a load
def test_torch_save_into_a_missing_directory_is_the_code(tmp_path: Path) -> None:
    line = ("RuntimeError: Parent directory /data/home/u/.cache/nanochat/base_checkpoints/d20 "
            "does not exist.")
    d = diagnose_text(tmp_path, line + "\n"
                      '  File "nanochat/checkpoint_manager.py", line 38, in save_checkpoint\n'
                      "    torch.save(optimizer_data, optimizer_path)\n")
    assert d.category == Category.USER_CODE_ERROR
    assert d.evidence is not None and d.evidence.text == line


# heldout27's speechbrain-2250, heldout25's ms-swift-3031
@pytest.mark.parametrize("line", [
    "OSError: [Errno 39] Directory not empty: 'location/to/CKPT'",
    "[rank3]: OSError: [Errno 39] Directory not empty: '/w/output/v5/tmp-checkpoint-djiermq4' "
    "-> '/w/output/v5/checkpoint-100'",
])
def test_a_checkpoint_directory_not_empty_is_a_race(tmp_path: Path, line: str) -> None:
    d = diagnose_text(tmp_path, "Traceback (most recent call last):\n"
                      '  File "/usr/lib/python3.10/shutil.py", line 731, in rmtree\n'
                      "    onerror(os.rmdir, path, sys.exc_info())\n" + line + "\n")
    assert d.category == Category.OTHER
    assert d.restart_helps == RestartHelps.NO
    assert d.evidence is not None and "Directory not empty" in d.evidence.text


# heldout24's megatron-807 (NVIDIA/Megatron-LM issue 807): Megatron-core's fixed message after
# `make` of its dataset helpers failed (the model read it before the twenty-third round's
# retraining, and not after)
def test_megatrons_dataset_helpers_that_do_not_compile_are_the_build(tmp_path: Path) -> None:
    line = "ERROR:megatron.core.datasets.utils:Failed to compile the C++ dataset helper functions"
    d = diagnose_text(tmp_path, (
        "make: Entering directory '/workspace/megatron-lm/megatron/core/datasets'\n"
        "g++ -O3 -Wall -shared -std=c++11 -fPIC -fdiagnostics-color -I/usr/include/python3.10 "
        "helpers.cpp -o helpers.cpython-310-x86_64-linux-gnu.so\n"
        "make: Leaving directory '/workspace/megatron-lm/megatron/core/datasets'\n"
        + line + "\n"))
    assert d.category == Category.DEPENDENCY_OR_IMPORT_ERROR
    assert d.restart_helps == RestartHelps.NO
    assert d.evidence is not None and d.evidence.text == line
