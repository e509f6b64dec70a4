"""What the analysis reads beyond exact signatures (issue 17, twenty-first round, after the
twenty-fifth blind set): Windows' `The paging file is too small` (WinError 1455, the commit
limit of RAM plus the paging file) is the host's memory, in any locale; a program that
subprocess cannot find on the PATH (`[Errno 2] No such file or directory: 'python'`) is a
program that was not started, as the shell's `command not found` is. Every answer shows the
line that decided it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.helpers import diagnose_text
from trainguard.diagnosis.taxonomy import Category, RestartHelps

PAGING = ('OSError: [WinError 1455] The paging file is too small for this operation to complete. '
          'Error loading "E:\\Yolov7\\yolov7training\\lib\\site-packages\\torch\\lib\\'
          'caffe2_detectron_ops_gpu.dll" or one of its dependencies.')


# heldout25's yolov7-1036: the whole log (WongKinYiu/yolov7 issue 1036)
def test_the_windows_paging_file_is_host_memory(tmp_path: Path) -> None:
    d = diagnose_text(tmp_path, PAGING + "\n")
    assert d.category == Category.HOST_OOM
    assert d.restart_helps == RestartHelps.NO  # the same load fails until the file grows
    assert d.evidence is not None and d.evidence.text == PAGING


@pytest.mark.parametrize("line", [
    # zh_CN Windows: the same code, the system's message translated
    'OSError: [WinError 1455] 页面文件太小\uff0c无法完成操作\u3002 Error loading '
    '"C:\\Anaconda3\\envs\\torch\\lib\\site-packages\\torch\\lib\\cudnn_cnn_infer64_8.dll" '
    'or one of its dependencies.',
    # the system's message without the code (a DataLoader worker's ImportError)
    'ImportError: DLL load failed while importing _multiarray_umath: The paging file is too '
    'small for this operation to complete.',
])
def test_the_paging_file_in_other_words_is_host_memory(tmp_path: Path, line: str) -> None:
    d = diagnose_text(tmp_path, "Epoch 0/299  12/1250\n" + line + "\n")
    assert d.category == Category.HOST_OOM
    assert d.evidence is not None and d.evidence.text.strip() == line


def test_another_windows_dll_error_is_not_memory(tmp_path: Path) -> None:
    d = diagnose_text(tmp_path, 'OSError: [WinError 126] The specified module could not be found. '
                      'Error loading "C:\\Python39\\lib\\site-packages\\torch\\lib\\c10.dll" or '
                      'one of its dependencies.\n')
    assert d.category != Category.HOST_OOM


# heldout25's xtuner-858: the whole log (InternLM/xtuner issue 858)
def test_a_python_not_on_the_path_was_not_started(tmp_path: Path) -> None:
    line = ("07/22 03:04:52 - mmengine - WARNING - WARNING: command error: '[Errno 2] No such "
            "file or directory: 'python''!")
    d = diagnose_text(tmp_path, line + "\n")
    assert d.category == Category.DEPENDENCY_OR_IMPORT_ERROR
    assert d.restart_helps == RestartHelps.NO
    assert d.evidence is not None and "No such file or directory: 'python'" in d.evidence.text


@pytest.mark.parametrize("prog", ["torchrun", "deepspeed", "python3", "nvidia-smi"])
def test_subprocess_finds_no_launcher(tmp_path: Path, prog: str) -> None:
    line = f"FileNotFoundError: [Errno 2] No such file or directory: '{prog}'"
    d = diagnose_text(tmp_path, "Traceback (most recent call last):\n"
                      '  File "/usr/lib/python3.10/subprocess.py", line 1863, in _execute_child\n'
                      "    raise child_exception_type(errno_num, err_msg, err_filename)\n"
                      + line + "\n")
    assert d.category == Category.DEPENDENCY_OR_IMPORT_ERROR
    assert d.evidence is not None and d.evidence.text.strip() == line


@pytest.mark.parametrize("path", ["python/train.py", "python.txt", "torchrun_config.yaml"])
def test_a_missing_file_named_like_a_program_is_not_a_missing_program(
        tmp_path: Path, path: str) -> None:
    d = diagnose_text(tmp_path, f"FileNotFoundError: [Errno 2] No such file or directory: "
                      f"'{path}'\n")
    assert d.category != Category.DEPENDENCY_OR_IMPORT_ERROR
