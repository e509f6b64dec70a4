"""What the analysis reads beyond exact signatures (issue 17, twentieth round, after the
twenty-fourth blind set): the shell's job-status words in another locale (glibc's translated
strsignal() for SIGSEGV, SIGABRT, SIGBUS, SIGKILL, and bash's translated "(core dumped)", as
po/*.po of glibc and bash spell them) are the same crash or kill as the English words, and a
translated segfault with its core dump is the shell row of the restart table; CUDA's `invalid
device function` (a kernel not built for this GPU) is a build that does not fit the GPU.
Every answer shows the line that decided it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.helpers import diagnose_text
from trainguard.diagnosis.sources import diagnose_paths
from trainguard.diagnosis.taxonomy import Category, RestartHelps


# heldout24's fgfa-46: the whole log (Flow-Guided-Feature-Aggregation issue 46)
def test_a_chinese_shell_segfault_has_an_answer(tmp_path: Path) -> None:
    d = diagnose_text(tmp_path, "段错误 (核心已转储)\n")
    assert d.category == Category.SEGFAULT_OR_ABORT
    assert d.restart_helps == RestartHelps.NO  # the shell row: the same crash again
    assert d.evidence is not None and d.evidence.text == "段错误 (核心已转储)"


@pytest.mark.parametrize("line", [
    "段错误\uff08核心已转储\uff09",  # bash's zh_CN.po now: full-width parentheses
    "Speicherzugriffsfehler (Speicherabzug geschrieben)",  # de
    "Ошибка сегментирования (образ памяти сброшен на диск)",  # ru
    "Erreur de segmentation (core dumped)",  # fr (bash keeps the English words)
    "./train.sh: 第 3 行\uff1a 20731 段错误 (核心已转储) python train.py",  # bash's zh_CN prefix
])
def test_translated_shell_segfaults_are_the_shell_row(tmp_path: Path, line: str) -> None:
    d = diagnose_text(tmp_path, "epoch 1 step 20 loss 0.41\n" + line + "\n")
    assert d.category == Category.SEGFAULT_OR_ABORT
    assert d.restart_helps == RestartHelps.NO
    assert d.evidence is not None and d.evidence.text.strip() == line


@pytest.mark.parametrize("line", [
    "已放弃 (核心已转储)",  # zh_CN before glibc 2.39 (nerfstudio issue 1534)
    "已中止 (核心已转储)",  # zh_CN since
    "Abgebrochen (Speicherabzug geschrieben)",  # de
    "Аварийный останов (образ памяти сброшен на диск)",  # ru
    "中止 (コアダンプ)",  # ja
    "Abandon (core dumped)",  # fr
])
def test_translated_shell_aborts_are_native_crashes(tmp_path: Path, line: str) -> None:
    d = diagnose_text(tmp_path, "epoch 1 step 20 loss 0.41\n" + line + "\n")
    assert d.category == Category.SEGFAULT_OR_ABORT
    assert d.evidence is not None and d.evidence.text.strip() == line


@pytest.mark.parametrize("line", [
    "总线错误(吐核)",  # zh_CN, an older bash (sinovation/ZEN issue 11)
    "总线错误 (核心已转储)",  # zh_CN
    "Bus-Zugriffsfehler (Speicherabzug geschrieben)",  # de
    "Ошибка шины (образ памяти сброшен на диск)",  # ru
    "バスエラー (コアダンプ)",  # ja
])
def test_translated_shell_bus_errors_are_sigbus(tmp_path: Path, line: str) -> None:
    d = diagnose_text(tmp_path, "epoch 1 step 20 loss 0.41\n" + line + "\n")
    assert d.category == Category.SHARED_MEMORY
    assert d.evidence is not None and d.evidence.text.strip() == line


@pytest.mark.parametrize("line", [
    "已杀死",  # zh_CN (dreamerv3 issue 203)
    "Getötet",  # de
    "Убито",  # ru
    "強制終了",  # ja
    "Processus arrêté",  # fr
    "./run.sh: Zeile 4: 31337 Getötet                 python train.py",  # bash's job line
])
def test_translated_shell_kills_are_kills(tmp_path: Path, line: str) -> None:
    d = diagnose_text(tmp_path, "epoch 1 step 20 loss 0.41\n" + line + "\n")
    assert d.category == Category.HOST_OOM
    assert d.evidence is not None and d.evidence.text.strip() == line


@pytest.mark.parametrize("line", [
    "Abandon de l'entraînement demandé par l'utilisateur",
    "Morto il processo di valutazione, riprendo",
    "中止条件を確認しています",
])
def test_common_words_of_the_locales_are_no_crash(tmp_path: Path, line: str) -> None:
    p = tmp_path / "console.log"
    p.write_text("epoch 1 step 20 loss 0.41\n" + line + "\n", encoding="utf-8")
    d = diagnose_paths([p]).diagnosis
    assert d is None or d.evidence is None or d.evidence.text.strip() != line


# heldout24's ppdm-46 (PyTorch 0.4 on an RTX 3070) and dle-649 (a self-built extension)
@pytest.mark.parametrize("text", [
    "THCudaCheck FAIL file=/opt/conda/conda-bld/pytorch_1535491974311/work/aten/src/THC/"
    "THCGeneral.cpp line=663 error=8 : invalid device function\n"
    "Traceback (most recent call last):\n"
    '  File "train.py", line 12, in <module>\n'
    "RuntimeError: cuda runtime error (8) : invalid device function at /opt/conda/conda-bld/"
    "pytorch_1535491974311/work/aten/src/THC/THCGeneral.cpp:663\n",
    "THCudaCheck FAIL file=/home/pinnocenti/vmr/SSD/csrc/random_horiz_flip.cu line=158 "
    "error=98 : invalid device function\n",
])
def test_invalid_device_function_is_a_build_for_another_gpu(tmp_path: Path, text: str) -> None:
    d = diagnose_text(tmp_path, text)
    assert d.category == Category.DEPENDENCY_OR_IMPORT_ERROR
    assert d.restart_helps == RestartHelps.NO
    assert d.evidence is not None and "invalid device function" in d.evidence.text
