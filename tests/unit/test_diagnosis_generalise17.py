"""What the analysis reads beyond exact signatures (issue 17, seventeenth round, after the
twenty-first blind set): gloo's transport dropping a pair's connection in a collective is the
collective library's; Paddle's empty `MemoryError:` names no memory (its C++ summary below
does); torch_npu's `HCCL function error` is HCCL's, with the CANN code beside it deciding; a
local object that a spawned process cannot pickle is the code's, not a checkpoint's (the
child's `Ran out of input`); an extension's exception whose message is only its source file
and line is read by its next line; nnU-Net's background workers that died are data workers.
Every answer shows the line that decided it."""

from __future__ import annotations

from pathlib import Path

from tests.unit.helpers import diagnose_text, traceback_of
from trainguard.diagnosis.taxonomy import Category, RestartHelps


def test_gloos_transport_dropping_a_pair_in_a_collective_is_the_collective_librarys(
        tmp_path: Path) -> None:
    line = ("RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection "
            "closed by peer [127.0.0.1]:10895")
    text = ('  File "/opt/conda/lib/python3.10/site-packages/torch/distributed/'
            'distributed_c10d.py", line 1451, in broadcast\n'
            '    work = default_pg.broadcast([tensor], opts)\n' + line)
    d = diagnose_text(tmp_path, traceback_of(text))
    assert d.category == Category.NCCL_COMMUNICATION_ERROR
    assert d.restart_helps == RestartHelps.YES
    assert d.evidence is not None and d.evidence.text == line


def test_paddles_empty_memory_error_is_read_by_the_summary_below(tmp_path: Path) -> None:
    text = ("MemoryError: \n\n--------------------------------------\n"
            "C++ Traceback (most recent call last):\n"
            "--------------------------------------\nNot support stack backtrace yet.\n\n"
            "----------------------\nError Message Summary:\n----------------------\n"
            "ResourceExhaustedError: \n\n"
            "Out of memory error on GPU 0. Cannot allocate 128.000000MB memory on GPU 0, "
            "7.995605GB memory has been allocated and available memory is only 0.000000B.\n")
    d = diagnose_text(tmp_path, text)
    assert d.category == Category.GPU_OOM
    assert d.evidence is not None and "MemoryError" not in d.evidence.text


def test_a_memory_error_with_a_message_or_none_is_still_the_hosts(tmp_path: Path) -> None:
    for line in ("MemoryError", "MemoryError: Unable to allocate 6.41 GiB for an array"):
        d = diagnose_text(tmp_path, traceback_of(line))
        assert d.category == Category.HOST_OOM, line


def test_torch_npus_hccl_function_error_is_hccls(tmp_path: Path) -> None:
    line = ("RuntimeError: create_config:build/CMakeFiles/torch_npu.dir/compiler_depend.ts:102 "
            "HCCL function error: hcclCommInitRootInfoConfig(numRanks, &rootInfo, rank, config, "
            "&(comm->hcclComm_)), error code is 7")
    d = diagnose_text(tmp_path, traceback_of(line))
    assert d.category == Category.NPU_HARDWARE_OR_DRIVER
    assert d.restart_helps == RestartHelps.YES
    assert d.evidence is not None and d.evidence.text == line


def test_a_local_object_a_spawned_process_cannot_pickle_is_the_codes(tmp_path: Path) -> None:
    # PaSST#48 on Windows: the child's EOFError comes first in the log, the parent's below
    child = ('Traceback (most recent call last):\n  File "<string>", line 1, in <module>\n'
             '  File "C:\\venv\\lib\\multiprocessing\\spawn.py", line 126, in _main\n'
             '    self = reduction.pickle.load(from_parent)\nEOFError: Ran out of input\n')
    line = "AttributeError: Can't pickle local object 'get_roll_func.<locals>.roll_func'"
    parent = ('Traceback (most recent call last):\n'
              '  File "C:\\venv\\lib\\multiprocessing\\reduction.py", line 60, in dump\n'
              '    ForkingPickler(file, protocol).dump(obj)\n' + line + "\n")
    d = diagnose_text(tmp_path, child + parent)
    assert d.category == Category.USER_CODE_ERROR
    assert d.restart_helps == RestartHelps.NO
    assert d.evidence is not None and d.evidence.text == line


def test_an_exception_naming_only_its_source_line_is_read_by_the_next_line(
        tmp_path: Path) -> None:
    head = ("RuntimeError: /io/build/temp.linux-x86_64-3.6/spconv/build/src/cumm/conv/main/"
            "ConvMainUnitTest/ConvMainUnitTest_implicit_gemm2.cu 3187")
    nxt = "cuda execution failed with error 700 an illegal memory access was encountered"
    d = diagnose_text(tmp_path, traceback_of(head) + nxt + "\n")
    assert d.category == Category.CUDA_KERNEL_ERROR
    assert d.evidence is not None and d.evidence.text == nxt


def test_nnunets_background_workers_no_longer_alive_are_data_workers(tmp_path: Path) -> None:
    line = ("RuntimeError: One or more background workers are no longer alive. Exiting. Please "
            "check the print statements above for the actual error message")
    d = diagnose_text(tmp_path, traceback_of(line))
    assert d.category == Category.DATALOADER_WORKER_CRASH
    assert d.restart_helps == RestartHelps.MAYBE
    assert d.evidence is not None and d.evidence.text == line
