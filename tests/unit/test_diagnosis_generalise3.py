"""What the analysis reads beyond exact signatures (issue 17, third round, after the sixth
blind set): a failed assertion no rule knows is the configuration's, an address already in
use is a port conflict whoever prints it, torch's shared-memory file is /dev/shm's, a
DataLoader worker's own crash notice, a kernel assertion that lost its backticks, and a
misaligned address that repeats."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.helpers import diagnose_text
from trainguard.diagnosis.restart import story_restart
from trainguard.diagnosis.taxonomy import Category, Diagnosis, Evidence, FaultDomain, RestartHelps


def _traceback(last: str, statement: str = "    run(cfg)") -> str:
    return ("Traceback (most recent call last):\n"
            '  File "tools/train.py", line 12, in <module>\n'
            "    main()\n"
            '  File "/usr/lib/python3/site-packages/somelib/api.py", line 40, in run\n'
            f"{statement}\n{last}\n")


@pytest.mark.parametrize("statement,last", [
    ("    assert cfg.warmup_steps <= cfg.max_steps", "AssertionError"),
    ("    assert head.out_dim == len(data.labels), msg",
     "AssertionError: The `out_dim` (3) of Head does not match the number of labels (7)"),
])
def test_a_failed_assertion_no_rule_knows_is_a_config_error(
        tmp_path: Path, statement: str, last: str) -> None:
    d = diagnose_text(tmp_path, _traceback(last, statement))
    assert (d.category, d.restart_helps) == (Category.CONFIG_ERROR, RestartHelps.NO)
    assert d.evidence is not None and d.evidence.line == 6  # the exception's own line


def test_another_generic_exception_stays_user_code(tmp_path: Path) -> None:
    d = diagnose_text(tmp_path, _traceback("KeyError: 'image'"))
    assert d.category == Category.USER_CODE_ERROR


def test_an_address_in_use_is_a_port_conflict_even_in_a_collective_librarys_words(
        tmp_path: Path) -> None:
    d = diagnose_text(tmp_path, (
        "node7:140:140 [0] NCCL INFO Bootstrap : Using eth0:10.1.2.3<0>\n"
        "node7:140:140 [0] include/socket.h:333 NCCL WARN Call to bind failed : "
        "Address already in use\n"))
    assert (d.category, d.restart_helps) == (Category.PORT_CONFLICT, RestartHelps.YES)
    assert d.evidence is not None and d.evidence.line == 2


def test_torchs_shared_memory_file_failing_to_map_is_shared_memory(tmp_path: Path) -> None:
    d = diagnose_text(tmp_path, _traceback(
        "RuntimeError: unable to mmap 8192 bytes from file </torch_4242_1234567_17>: "
        "Cannot allocate memory (12)"))
    assert d.category == Category.SHARED_MEMORY


def test_a_dataloader_workers_own_crash_notice_names_the_worker(tmp_path: Path) -> None:
    d = diagnose_text(tmp_path, (
        "epoch 2 step 10 loss 0.5\n"
        "ERROR: Unexpected segmentation fault encountered in worker.\n"))
    assert d.category == Category.DATALOADER_WORKER_CRASH
    assert d.evidence is not None and d.evidence.line == 2


def test_a_kernel_assertion_without_backticks_is_a_device_side_assert(tmp_path: Path) -> None:
    d = diagnose_text(tmp_path, (
        "  0%|          | 0/90 [00:01<?, ?it/s]\n"
        "/build/aten/src/ATen/native/cuda/Loss.cu:250: nll_loss_kernel: block: [0,0,0], "
        "thread: [5,0,0] Assertion t >= 0 && t < n_classes failed.\n"))
    assert (d.category, d.restart_helps) == (Category.CUDA_KERNEL_ERROR, RestartHelps.NO)


def _cuda(text: str) -> Diagnosis:
    return Diagnosis(Category.CUDA_KERNEL_ERROR, FaultDomain.FRAMEWORK, RestartHelps.MAYBE,
                     text, "advice.", evidence=Evidence("f.log", 1, text))


@pytest.mark.parametrize("text,want", [
    ("RuntimeError: CUDA error: misaligned address", RestartHelps.NO),
    ("what():  CUDA error: misaligned address (insert_events at alloc.cpp:764)", RestartHelps.NO),
    # a warning printed while tearing down is no verdict on the inputs
    ("Warning: CUDA warning: misaligned address (function destroyEvent)", RestartHelps.MAYBE),
    ("RuntimeError: CUDA error: an illegal memory access was encountered", RestartHelps.MAYBE),
])
def test_a_misaligned_address_repeats(text: str, want: RestartHelps) -> None:
    d = story_restart(_cuda(text), [])
    assert d.restart_helps == want
    assert want == RestartHelps.MAYBE or "Restart helps: no" in d.advice
