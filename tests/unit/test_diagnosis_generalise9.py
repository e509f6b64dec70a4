"""What the analysis reads beyond exact signatures (issue 17, ninth round, after the twelfth
blind set): a launcher's exception that reports its child's signal, ... The lines are worded
unlike the cases they were learnt from: the structure is what is tested."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.helpers import diagnose_text
from trainguard.diagnosis.sources import diagnose_paths
from trainguard.diagnosis.taxonomy import Category, RestartHelps


@pytest.mark.parametrize("launcher", [
    '  File "/opt/venv/lib/python3.11/site-packages/accelerate/commands/launch.py", line 600,'
    " in simple_launcher\n",
    '  File "/usr/lib/python3.8/site-packages/torch/distributed/launch.py", line 250, in main\n',
])
def test_a_launchers_exception_that_reports_a_sigkill_is_an_exit_notice(
        tmp_path: Path, launcher: str) -> None:
    # the child died of SIGKILL while loading its weights: no Python error of its own, so
    # the kernel's OOM killer, not the checkpoint the progress line names
    text = ("Loading checkpoint shards:  50%|#####     | 1/2 [00:31<00:31]\n"
            "Traceback (most recent call last):\n" + launcher +
            "    raise subprocess.CalledProcessError(returncode=process.returncode, cmd=cmd)\n"
            "subprocess.CalledProcessError: Command '['/usr/bin/python', 'finetune.py', "
            "'--resume_from', 'ckpt/last.pt']' died with <Signals.SIGKILL: 9>.\n")
    d = diagnose_text(tmp_path, text)
    assert d.category == Category.HOST_OOM
    assert d.restart_helps == RestartHelps.MAYBE
    assert d.evidence is not None and "SIGKILL" in d.evidence.text


@pytest.mark.parametrize("line", [
    "torch.distributed.elastic.multiprocessing.api.SignalException",
    "[rank0]: torch.distributed.elastic.multiprocessing.api.SignalException: Process 77 got "
    "signal: 15",
])
def test_elastics_signal_exception_alone_is_a_kill_from_outside(tmp_path: Path,
                                                                 line: str) -> None:
    # the agent raises it only when a signal reached it (a closed terminal, a scheduler)
    text = ("epoch 3 step 1200 loss 1.873\n"
            "Traceback (most recent call last):\n"
            '  File "/usr/bin/torchrun", line 8, in <module>\n'
            "    sys.exit(main())\n" + line + "\n")
    d = diagnose_text(tmp_path, text)
    assert d.category == Category.KILLED_BY_SIGNAL_UNKNOWN
    assert d.restart_helps == RestartHelps.YES


@pytest.mark.parametrize("line", [
    "ConnectionError: Tried to launch distributed communication on port `29511`, but another "
    "process is utilizing it. Please specify a different port.",
    "RuntimeError: cannot start the rendezvous server: port 6000 is being used by pid 4242",
])
def test_a_numbered_port_another_process_holds_is_a_port_conflict(tmp_path: Path,
                                                                   line: str) -> None:
    text = ("Traceback (most recent call last):\n"
            '  File "/opt/venv/lib/python3.11/site-packages/launcher/cli.py", line 88, in run\n'
            "    raise ConnectionError(msg)\n" + line + "\n")
    d = diagnose_text(tmp_path, text)
    assert d.category == Category.PORT_CONFLICT
    assert d.restart_helps == RestartHelps.YES


def test_a_port_number_without_another_holder_is_no_port_conflict(tmp_path: Path) -> None:
    text = ("Traceback (most recent call last):\n"
            '  File "serve.py", line 12, in <module>\n'
            "    check(cfg)\n"
            "ValueError: port 29500 must be given as an integer, got '29500'\n")
    assert diagnose_text(tmp_path, text).category != Category.PORT_CONFLICT


def test_nccls_system_error_takes_the_shared_memory_call_that_failed(tmp_path: Path) -> None:
    # the generic error comes first in the paste; the WARN line says which call failed
    text = ("[rank1]: torch.distributed.DistBackendError: NCCL error in: "
            "/pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1970, unhandled system "
            "error (run with NCCL_DEBUG=INFO for details), NCCL version 2.20.5\n"
            "node3:811:902 [1] misc/shmutils.cc:72 NCCL WARN Error while creating shared memory "
            "segment /dev/shm/nccl-Qx81aP (size 9637888)\n")
    d = diagnose_text(tmp_path, text)
    assert d.category == Category.SHARED_MEMORY
    assert d.evidence is not None and "shared memory segment" in d.evidence.text


def test_nccls_system_error_with_a_socket_warn_stays_communication(tmp_path: Path) -> None:
    text = ("RuntimeError: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled system error\n"
            "node3:811:902 [1] misc/socket.cc:484 NCCL WARN socketStartConnect: Connect to "
            "10.0.0.7<41233> failed : Connection refused\n")
    assert diagnose_text(tmp_path, text).category == Category.NCCL_COMMUNICATION_ERROR


@pytest.mark.parametrize("reading", [
    "[INFO] [utils.py:840:see_memory_usage] CPU Virtual Memory:  used = 61.2 GB, percent = 97.4%",
    "step 40 | host RAM usage 93% (119.0/128.0 GB) | 2.1 it/s",
])
def test_host_memory_nearly_full_when_the_log_stops_is_host_oom(tmp_path: Path,
                                                                 reading: str) -> None:
    text = ("[INFO] building the optimizer\n"
            "[INFO] CPU Virtual Memory:  used = 30.1 GB, percent = 48.0%\n"
            + reading + "\n[INFO] initializing optimizer states\n")
    d = diagnose_text(tmp_path, text)
    assert d is not None and d.category == Category.HOST_OOM
    assert d.evidence is not None and "%" in d.evidence.text


def test_host_memory_with_room_left_is_no_oom(tmp_path: Path) -> None:
    text = ("[INFO] CPU Virtual Memory:  used = 30.1 GB, percent = 48.0%\n"
            "[INFO] CPU Virtual Memory:  used = 40.9 GB, percent = 61.5%\n"
            "[INFO] initializing optimizer states\n")
    p = tmp_path / "console.log"
    p.write_text(text, encoding="utf-8")
    d = diagnose_paths([p]).diagnosis
    assert d is None or d.category != Category.HOST_OOM


@pytest.mark.parametrize("exc", ["OSError", "PIL.UnidentifiedImageError"])
def test_a_data_file_a_worker_cannot_read_is_the_loaders(tmp_path: Path, exc: str) -> None:
    kind = exc.rsplit(".", 1)[-1]
    text = (f"{exc}: Caught {kind} in DataLoader worker process 5.\n"
            "Original Traceback (most recent call last):\n"
            '  File "/data/ds.py", line 31, in __getitem__\n'
            "    img = Image.open(path).convert('RGB')\n"
            f"{kind}: broken data stream when reading image file\n")
    d = diagnose_text(tmp_path, text)
    assert d.category == Category.DATALOADER_WORKER_CRASH
    assert d.restart_helps == RestartHelps.NO


def test_another_exception_caught_in_a_worker_stays_the_datasets_code(tmp_path: Path) -> None:
    text = "IndexError: Caught IndexError in DataLoader worker process 1.\n"
    assert diagnose_text(tmp_path, text).category == Category.USER_CODE_ERROR


@pytest.mark.parametrize("line", [
    "hccl fftsplus task timeout occurred during task execution, stream_id:3, timeout=1836s.",
    "[ERROR] HCCL(4412,python):2025-01-02-10:11:12 the HCCL task timeout on stream 12",
])
def test_an_hccl_task_timeout_is_the_collectives_hang(tmp_path: Path, line: str) -> None:
    text = "The error from device(chipId:3, dieId:0), serial number is 9,\n" + line + "\n"
    d = diagnose_text(tmp_path, text)
    assert d.category == Category.NCCL_TIMEOUT_OR_HANG


def test_a_socket_of_an_address_family_the_machine_lacks_does_not_restart(
        tmp_path: Path) -> None:
    # NCCL's generic error first, then the WARN that names the call that failed
    text = ("RuntimeError: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled system error\n"
            "worker-2:88:88 [3] misc/socket.cc:401 NCCL WARN Net : Socket creation failed : "
            "Address family not supported by protocol\n")
    d = diagnose_text(tmp_path, text)
    assert d.category == Category.NETWORK_OR_RENDEZVOUS
    assert d.restart_helps == RestartHelps.NO
    assert d.evidence is not None and "Address family" in d.evidence.text


@pytest.mark.parametrize("dim", [1, 2])
def test_two_tensors_sizes_at_one_dimension_are_the_codes(tmp_path: Path, dim: int) -> None:
    # both such cases of the labelled sets are user_code_error (a Target size that differs
    # in one class dimension stays the config's: tests/unit/test_diagnosis_generalise5.py)
    text = ("Traceback (most recent call last):\n  File \"model.py\", line 51, in forward\n"
            "    h = x + self.pos\n"
            f"RuntimeError: The size of tensor a (80) must match the size of tensor b (91) at "
            f"non-singleton dimension {dim}\n")
    d = diagnose_text(tmp_path, text)
    assert d.category == Category.USER_CODE_ERROR
