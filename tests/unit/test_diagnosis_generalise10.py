"""What the analysis reads beyond exact signatures (issue 17, tenth round, after the
thirteenth blind set): an invalid device ordinal as the launch configuration's, a port that
is "not available", Python's tempfile finding no usable directory, gRPC's UNAVAILABLE as an
exception type, a loss printed as `name: nan`, NCCL's own refused or timed-out connect, an
image the data pipeline cannot decode, and two restart verdicts (a segfault only an IDE
reports, NCCL's unhandled CUDA error). The lines are worded unlike the cases they were
learnt from: the structure is what is tested."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.helpers import diagnose_text
from trainguard.diagnosis.taxonomy import Category, RestartHelps


@pytest.mark.parametrize("line", [
    "RuntimeError: CUDA error: invalid device ordinal",
    "[rank3]: torch.AcceleratorError: CUDA error: invalid device ordinal",
    "jaxlib.xla_extension.XlaRuntimeError: INTERNAL: cudaErrorInvalidDevice: failed to set "
    "device 6",
])
def test_an_invalid_device_ordinal_is_the_launch_configuration(tmp_path: Path,
                                                               line: str) -> None:
    # more processes per node than visible GPUs: not a kernel's error, and no rerun helps
    text = ("Traceback (most recent call last):\n"
            '  File "train.py", line 41, in <module>\n'
            "    torch.cuda.set_device(args.local_rank)\n" + line + "\n")
    d = diagnose_text(tmp_path, text)
    assert d.category == Category.CONFIG_ERROR
    assert d.restart_helps == RestartHelps.NO
    assert d.evidence is not None and line.endswith(d.evidence.text)  # a rank prefix is cut


def test_a_generic_cuda_error_stays_a_kernels(tmp_path: Path) -> None:
    d = diagnose_text(tmp_path, "RuntimeError: CUDA error: an illegal memory access was "
                                "encountered\n")
    assert d.category == Category.CUDA_KERNEL_ERROR


@pytest.mark.parametrize("line", [
    "Error: port 40112 is not available.",
    "kvserver: fatal: port 9091 not available",
])
def test_a_port_that_is_not_available_is_a_port_conflict(tmp_path: Path, line: str) -> None:
    text = "starting 4 servers\n" + line + "\n" + line + "\n"
    d = diagnose_text(tmp_path, text)
    assert d.category == Category.PORT_CONFLICT
    assert d.restart_helps == RestartHelps.YES
    assert d.evidence is not None and "not available" in d.evidence.text


def test_no_usable_temporary_directory_is_storage(tmp_path: Path) -> None:
    # tempfile found no directory it can write to: a full or read-only disk
    text = ("Traceback (most recent call last):\n"
            '  File "/usr/lib/python3.10/tempfile.py", line 379, in mkdtemp\n'
            "    prefix, suffix, dir, output_type = _sanitize_params(prefix, suffix, dir)\n"
            "FileNotFoundError: [Errno 2] No usable temporary directory found in ['/tmp', "
            "'/var/tmp', '/usr/tmp', '/srv/job']\n")
    d = diagnose_text(tmp_path, text)
    assert d.category == Category.DISK_FULL_OR_STORAGE_IO
    assert d.evidence is not None and "No usable temporary directory" in d.evidence.text


@pytest.mark.parametrize("line", [
    "tensorflow.python.framework.errors_impl.UnavailableError: Socket closed",
    "grpc._channel._InactiveRpcError: <_InactiveRpcError of RPC that terminated with: status = "
    "StatusCode.UNAVAILABLE details = \"failed to connect to all addresses\">",
])
def test_grpcs_unavailable_with_a_connection_word_is_the_network(tmp_path: Path,
                                                                  line: str) -> None:
    text = ("Traceback (most recent call last):\n"
            '  File "train.py", line 77, in <module>\n'
            "    strategy.run(step)\n" + line + "\n")
    d = diagnose_text(tmp_path, text)
    assert d.category == Category.NETWORK_OR_RENDEZVOUS
    assert d.evidence is not None and d.evidence.text == line


def test_an_unavailable_error_without_a_connection_word_stays_the_codes(tmp_path: Path) -> None:
    text = ("Traceback (most recent call last):\n"
            '  File "train.py", line 77, in <module>\n'
            "    load(x)\n"
            "tensorflow.python.framework.errors_impl.UnavailableError: resource busy\n")
    assert diagnose_text(tmp_path, text).category != Category.NETWORK_OR_RENDEZVOUS


@pytest.mark.parametrize("line", [
    "[ep 2][it 300/5000] loss: nan, lr: 2.0e-04",
    "step 4100 | total_loss: NaN | grad_norm 3.1",
])
def test_a_loss_printed_as_nan_is_numerical(tmp_path: Path, line: str) -> None:
    # a weights file loaded at the start is not what failed
    text = ("Loading pretrained weights from weights/backbone_r50.pth\n"
            "[ep 1][it 100/5000] loss: 1.9921, lr: 2.0e-04\n" + line + "\n" + line + "\n")
    d = diagnose_text(tmp_path, text)
    assert d.category == Category.NUMERICAL
    assert d.restart_helps == RestartHelps.NO
    assert d.evidence is not None and d.evidence.text == line


@pytest.mark.parametrize("line", [
    "node7:811:902 [2] include/socket.h:361 NCCL WARN Call to connect timeout : Connection "
    "refused",
    "gpu-a-3:1201:1266 [0] misc/socket.cc:480 NCCL WARN socketStartConnect: Connection refused",
])
def test_nccls_own_refused_connect_is_a_communication_error(tmp_path: Path, line: str) -> None:
    text = ("gpu-a-3:1201:1266 [0] NCCL INFO NET/Socket : 2 interfaces found\n" + line + "\n"
            "gpu-a-3:1201:1266 [0] NCCL INFO bootstrap.cc:19 -> 2\n")
    d = diagnose_text(tmp_path, text)
    assert d.category == Category.NCCL_COMMUNICATION_ERROR
    assert d.evidence is not None and d.evidence.text == line


@pytest.mark.parametrize("line", [
    "PIL.UnidentifiedImageError: cannot identify image file 'data/train/cat_0412.jpg'",
    "OSError: image file is truncated (17 bytes not processed)",
])
def test_an_image_the_data_pipeline_cannot_decode(tmp_path: Path, line: str) -> None:
    # read in a generator of the main process, no DataLoader worker: the data file is bad
    text = ("Traceback (most recent call last):\n"
            '  File "fit.py", line 90, in <module>\n'
            "    model.fit(gen, epochs=5)\n"
            '  File "data.py", line 31, in __getitem__\n'
            "    img = Image.open(path).convert('RGB')\n" + line + "\n")
    d = diagnose_text(tmp_path, text)
    assert d.category == Category.DATALOADER_WORKER_CRASH
    assert d.restart_helps == RestartHelps.NO
    assert d.evidence is not None and d.evidence.text == line


@pytest.mark.parametrize("line", [
    "Process finished with exit code 139 (interrupted by signal 11: SIGSEGV)",
    "Process finished with exit code 139 (interrupted by signal 11:SIGSEGV)",
])
def test_a_segfault_only_an_ide_reports_repeats(tmp_path: Path, line: str) -> None:
    text = "epoch 1/20\n  step 12/400 loss 0.731\n\n" + line + "\n"
    d = diagnose_text(tmp_path, text)
    assert d.category == Category.SEGFAULT_OR_ABORT
    assert d.restart_helps == RestartHelps.NO
    assert d.evidence is not None and d.evidence.text == line


def test_a_segfault_a_launcher_reports_keeps_maybe(tmp_path: Path) -> None:
    text = ("epoch 1/20\n"
            "torch.multiprocessing.spawn.ProcessExitedException: process 2 terminated with "
            "signal SIGSEGV\n")
    d = diagnose_text(tmp_path, text)
    assert d.category == Category.SEGFAULT_OR_ABORT
    assert d.restart_helps == RestartHelps.MAYBE


def test_nccls_unhandled_cuda_error_repeats(tmp_path: Path) -> None:
    # a CUDA call inside NCCL (peer access the GPUs lack, a build for another CUDA); the NCCL
    # library's in the eleventh round, NCCL's since the fourteenth, the majority of its labels
    # (test_diagnosis_generalise14.py)
    line = ("RuntimeError: NCCL error in: /opt/pytorch/torch/csrc/distributed/c10d/"
            "ProcessGroupNCCL.cpp:1205, unhandled cuda error, NCCL version 2.18.1")
    d = diagnose_text(tmp_path, line + "\n")
    assert d.category == Category.NCCL_COMMUNICATION_ERROR
    assert d.restart_helps == RestartHelps.NO


@pytest.mark.parametrize("iface", ["lo:127.0.0.1<0>", "docker0:172.17.0.1<0>"])
def test_nccl_using_a_virtual_interface_in_its_info_lines_repeats(tmp_path: Path,
                                                                  iface: str) -> None:
    # the transport picked an interface the peers cannot reach through: NCCL_SOCKET_IFNAME
    text = (f"gpu-b-7:501:560 [0] NCCL INFO NET : Using interface {iface}\n"
            "gpu-b-7:501:560 [0] NCCL INFO NET : Using interface ens5:10.2.0.17<0>\n"
            "gpu-b-7:501:560 [0] NCCL INFO NET/Socket : 2 interfaces found\n"
            "gpu-b-7:501:577 [0] include/socket.h:361 NCCL WARN Call to connect timeout : "
            "Connection refused\n"
            "gpu-b-7:501:577 [0] NCCL INFO bootstrap.cc:19 -> 2\n")
    d = diagnose_text(tmp_path, text)
    assert d.category == Category.NCCL_COMMUNICATION_ERROR
    assert d.restart_helps == RestartHelps.NO


def test_nccl_using_only_real_interfaces_keeps_yes(tmp_path: Path) -> None:
    text = ("gpu-b-7:501:560 [0] NCCL INFO NET : Using interface ens5:10.2.0.17<0>\n"
            "gpu-b-7:501:577 [0] include/socket.h:361 NCCL WARN Call to connect timeout : "
            "Connection refused\n")
    d = diagnose_text(tmp_path, text)
    assert d.category == Category.NCCL_COMMUNICATION_ERROR
    assert d.restart_helps == RestartHelps.YES
