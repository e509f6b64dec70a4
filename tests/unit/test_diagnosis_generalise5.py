"""What the analysis reads beyond exact signatures (issue 17, fifth round, after the eighth
blind set): an exception type that says misconfiguration, a precision mode the hardware
lacks, a missing input file, a name only an optional import defines, a process group that
cannot set up its mesh, a platform taking machines away, the resource named before the
words that say it ran out, any HTTP client's connection pool, an NPU operator without a
binary, Windows crash codes, and four restart rows. The lines are worded unlike the cases
they were learnt from: the structure is what is tested."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.helpers import diagnose_text
from trainguard.diagnosis.exit_notices import exit_code
from trainguard.diagnosis.taxonomy import Category, RestartHelps


@pytest.mark.parametrize("text,category", [
    # an exception type that says the configuration is wrong, as a line or as a repr
    ("Traceback (most recent call last):\n  File \"fit.py\", line 3, in <module>\n"
     "    run()\nsomelib.errors.ConfigurationError: optimizer 'adamx' is unknown\n",
     Category.CONFIG_ERROR),
    ('MisconfigurationException("The strategy you asked for needs 2 devices, found 1")\n',
     Category.CONFIG_ERROR),
    # a precision mode the hardware lacks
    ("ValueError: fp16 is not supported on this device (compute capability 5.2)\n",
     Category.CONFIG_ERROR),
    ("RuntimeError: FlashAttention requires an Ampere GPU or newer\n", Category.CONFIG_ERROR),
    # an input file the run was pointed at is missing
    ("FileNotFoundError: [Errno 2] No such file or directory: 'data/voc/labels/train.txt'\n",
     Category.CONFIG_ERROR),
    # a name that only an optional import defines
    ("NameError: name 'xformers_ops' is not defined\n", Category.DEPENDENCY_OR_IMPORT_ERROR),
])
def test_a_generic_exception_takes_its_family(tmp_path: Path, text: str,
                                              category: Category) -> None:
    d = diagnose_text(tmp_path, "step 1 loss 2.0\n" + text)
    assert d.category == category
    assert d.evidence is not None and d.evidence.text.strip() == text.splitlines()[-1].strip()


def test_a_plain_name_error_stays_the_codes(tmp_path: Path) -> None:
    d = diagnose_text(tmp_path, "NameError: name 'lerning_rate' is not defined\n")
    assert d.category == Category.USER_CODE_ERROR


def test_a_missing_library_file_is_no_config_error(tmp_path: Path) -> None:
    d = diagnose_text(tmp_path, "OSError: libcudart.so.11.0: cannot open shared object file: "
                                "No such file or directory\n")
    assert d.category == Category.DEPENDENCY_OR_IMPORT_ERROR


@pytest.mark.parametrize("text,category", [
    ("[E1203 10:00:00.0 ProcessGroupGloo.cpp:143] Gloo connectFullMesh failed with "
     "[pair.cc:510] Connection timed out\n", Category.NETWORK_OR_RENDEZVOUS),
    ("INFO:worker: ShutdownHook: lame workers found: worker-3\n",
     Category.KILLED_BY_SIGNAL_UNKNOWN),
    ("WARNING: spot instance interruption notice received, shutting down in 120s\n",
     Category.KILLED_BY_SIGNAL_UNKNOWN),
])
def test_setup_and_platform_words_name_their_family(tmp_path: Path, text: str,
                                            category: Category) -> None:
    d = diagnose_text(tmp_path, "step 100 loss 0.5\n" + text)
    assert d.category == category


def test_the_resource_named_decides_over_the_words_that_say_it_ran_out(tmp_path: Path) -> None:
    d = diagnose_text(tmp_path, "tensorflow.python.framework.errors_impl.ResourceExhaustedError:"
                                " /ckpt/model.ckpt-100; Disk quota exceeded\n")
    assert d.category == Category.DISK_FULL_OR_STORAGE_IO


def test_an_http_connection_pool_is_a_remote_service_not_the_rendezvous(tmp_path: Path) -> None:
    d = diagnose_text(tmp_path, (
        "requests.exceptions.ConnectionError: HTTPSConnectionPool(host='datasets.example.org', "
        "port=443): Max retries exceeded with url: /x.tar (Caused by NewConnectionError("
        "'Failed to establish a new connection: [Errno 101] Network is unreachable'))\n"))
    assert d.category == Category.OTHER
    assert d.restart_helps == RestartHelps.NO  # no route from this machine


def test_a_socket_timeout_is_the_stores_not_a_collectives(tmp_path: Path) -> None:
    d = diagnose_text(tmp_path, "RuntimeError: Socket Timeout\n")
    assert d.category == Category.NETWORK_OR_RENDEZVOUS


def test_an_npu_operator_without_a_binary_is_an_installation_problem(tmp_path: Path) -> None:
    d = diagnose_text(tmp_path, (
        "RuntimeError: call aclnnMul failed, detail:EZ9999: Inner Error!\n"
        "EZ9999: 2025-01-01-00:00:00.000.000  Op Mul does not have any binary.\n"))
    assert d.category == Category.DEPENDENCY_OR_IMPORT_ERROR
    assert d.evidence is not None and d.evidence.line == 2
    # the header alone still decides: an operator error that repeats
    d = diagnose_text(tmp_path, "RuntimeError: call aclnnMul failed, detail:EZ9999: Inner "
                                "Error!\n")
    assert d.category == Category.NPU_HARDWARE_OR_DRIVER and d.restart_helps == RestartHelps.NO


@pytest.mark.parametrize("text,code", [
    ("Process finished with exit code -1073741819 (0xC0000005)", -11),
    ("Process finished with exit code -1073741795 (0xC000001D)", -4),
    ("exit code 0xc0000409", -6),
    ("Process finished with exit code 3221225725", -11),
    ("Process finished with exit code 1", None),
])
def test_windows_crash_codes_are_exit_notices(text: str, code: int | None) -> None:
    assert exit_code(text) == (None, code)


def test_an_illegal_instruction_on_windows_does_not_restart(tmp_path: Path) -> None:
    d = diagnose_text(tmp_path, "epoch 1\nProcess finished with exit code -1073741795 "
                                "(0xC000001D)\n")
    assert d.category == Category.SEGFAULT_OR_ABORT and d.restart_helps == RestartHelps.NO


def _watchdog(rank: int, seq: int, op: str) -> str:
    return (f"[E ProcessGroupNCCL.cpp:616] [Rank {rank}] Watchdog caught collective operation "
            f"timeout: WorkNCCL(SeqNum={seq}, OpType={op}, NumelIn=8, NumelOut=8, "
            "Timeout(ms)=600000) ran for 600018 milliseconds before timing out.\n")


def test_a_desync_is_different_works_at_one_seqnum(tmp_path: Path) -> None:
    d = diagnose_text(tmp_path, _watchdog(0, 90, "ALLREDUCE") + _watchdog(1, 90, "BROADCAST"))
    assert d.restart_helps == RestartHelps.NO
    # one rank a collective behind the other: a straggler, not a different program
    d = diagnose_text(tmp_path, _watchdog(0, 90, "ALLREDUCE") + _watchdog(1, 91, "BROADCAST"))
    assert d.category == Category.NCCL_TIMEOUT_OR_HANG and d.restart_helps == RestartHelps.YES


@pytest.mark.parametrize("path,restart", [
    (r'  File "E:\envs\py39\lib\site-packages\torch\utils\data\dataloader.py", line 1133',
     RestartHelps.NO),
    ('  File "/Users/me/miniforge3/lib/python3.10/site-packages/torch/utils/data/'
     'dataloader.py", line 1133', RestartHelps.NO),
    ('  File "/opt/conda/lib/python3.10/site-packages/torch/utils/data/dataloader.py", '
     "line 1133", RestartHelps.MAYBE),
])
def test_a_dataloader_worker_that_exits_where_workers_are_spawned(
        tmp_path: Path, path: str, restart: RestartHelps) -> None:
    d = diagnose_text(tmp_path, (
        "Traceback (most recent call last):\n" + path + ", in _try_get_data\n"
        "    data = self._data_queue.get(timeout=timeout)\n"
        "RuntimeError: DataLoader worker (pid(s) 4242) exited unexpectedly\n"))
    assert d.category == Category.DATALOADER_WORKER_CRASH and d.restart_helps == restart


def test_nccl_saying_a_feature_is_not_supported_does_not_restart(tmp_path: Path) -> None:
    d = diagnose_text(tmp_path, (
        "step 0\nnode1:77:88 [2] transport/p2p.cc:190 NCCL WARN failed to open CUDA IPC "
        "handle : 801 operation not supported\n"))
    assert d.category == Category.NCCL_COMMUNICATION_ERROR
    assert d.restart_helps == RestartHelps.NO


@pytest.mark.parametrize("line,restart", [
    ("[W socket.cpp:601] [c10d] The client socket has failed to connect to [gpu-17]:29400 "
     "(errno: 113 - No route to host).", RestartHelps.NO),
    ("[E socket.cpp:957] [c10d] The client socket has timed out after 900s while trying to "
     "connect to (10.0.0.7, 29400).", RestartHelps.YES),
])
def test_a_store_client_that_cannot_connect_at_all_does_not_restart(
        tmp_path: Path, line: str, restart: RestartHelps) -> None:
    d = diagnose_text(tmp_path, line + "\n")
    assert d.category == Category.NETWORK_OR_RENDEZVOUS and d.restart_helps == restart


@pytest.mark.parametrize("line,category", [
    # one dimension other than the batch differs: a count the config sets (classes, channels)
    ("ValueError: Target size (torch.Size([8, 21, 64, 64])) must be the same as input size "
     "(torch.Size([8, 19, 64, 64]))", Category.CONFIG_ERROR),
    # a different rank, or a different batch: the code's (and, since the ninth round, two
    # tensors' sizes at one dimension: tests/unit/test_diagnosis_generalise9.py)
    ("ValueError: Target size (torch.Size([64])) must be the same as input size "
     "(torch.Size([64, 1]))", Category.USER_CODE_ERROR),
    ("RuntimeError: The size of tensor a (4) must match the size of tensor b (8) at "
     "non-singleton dimension 0", Category.USER_CODE_ERROR),
])
def test_a_shape_mismatch_in_a_count_is_the_configs(tmp_path: Path, line: str,
                                                    category: Category) -> None:
    d = diagnose_text(tmp_path, "Traceback (most recent call last):\n  File \"train.py\", "
                                "line 9, in <module>\n    loss = crit(out, y)\n" + line + "\n")
    assert d.category == category and d.restart_helps == RestartHelps.NO
