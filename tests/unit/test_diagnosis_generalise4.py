"""What the analysis reads beyond exact signatures (issue 17, fourth round, after the seventh
blind set): a traceback cut before its exception line is read by its innermost frame and
source line, an exception a registry's builder raised is the config's, a setting quoted as
`name=value` and called invalid, an exception whose message starts on the next line, a kill
verb with its signal, and an illegal instruction that repeats."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.helpers import diagnose_text
from trainguard.diagnosis.restart import story_restart
from trainguard.diagnosis.taxonomy import Category, Diagnosis, Evidence, FaultDomain, RestartHelps


def _cut(frame: str, statement: str) -> str:
    """A traceback that the log ends in, before its exception line."""
    return ("epoch 0 step 10 loss 1.2\n"
            "Traceback (most recent call last):\n"
            '  File "train.py", line 30, in <module>\n'
            "    main()\n"
            f"{frame}\n{statement}\n")


@pytest.mark.parametrize("frame,statement,category", [
    ('  File "/opt/py/site-packages/somecv/registry/builder.py", line 88, in build_from_cfg',
     "    raise KeyError(", Category.CONFIG_ERROR),
    ('  File "/opt/py/site-packages/somelib/store.py", line 120, in _write_shards',
     "    fh.write(buf)", Category.DISK_FULL_OR_STORAGE_IO),
    ('  File "/opt/py/site-packages/somelm/arguments.py", line 61, in check_args',
     "    assert args.hidden_size % args.num_heads == 0, \\", Category.CONFIG_ERROR),
])
def test_a_traceback_cut_before_its_exception_is_read_where_it_stopped(
        tmp_path: Path, frame: str, statement: str, category: Category) -> None:
    d = diagnose_text(tmp_path, _cut(frame, statement))
    assert d.category == category
    assert d.rule == f"family:{category.value}"
    assert d.evidence is not None and d.evidence.line in (5, 6)


def test_the_frames_of_a_finished_traceback_are_not_context(tmp_path: Path) -> None:
    d = diagnose_text(tmp_path, _cut(
        '  File "/opt/py/site-packages/somelib/store.py", line 120, in _write_shards',
        "    fh.write(buf)") + "ZeroDivisionError: division by zero\n")
    assert d.category == Category.USER_CODE_ERROR


def test_an_exception_a_registry_builder_raised_is_the_configs(tmp_path: Path) -> None:
    d = diagnose_text(tmp_path, _cut(
        '  File "/opt/py/site-packages/somecv/utils/registry.py", line 44, in build_from_cfg',
        "    raise KeyError(f'{t} unknown')") + "KeyError: 'FancyHead'\n")
    assert d.category == Category.CONFIG_ERROR and d.restart_helps == RestartHelps.NO
    assert d.evidence is not None and d.evidence.text == "KeyError: 'FancyHead'"


@pytest.mark.parametrize("text", [
    "ValueError: You gave an invalid optimizer name: `optimizer='adamx'`.\n",
    "ValueError:\nYou gave an invalid optimizer name: `optimizer='adamx'`.\n",
    "RuntimeError: `Loader(shards=[])` value is not a valid input for this backend.\n",
    "ValueError: `--precision` arg cannot be set to `fp8` when `fp16` is set in the config.\n",
    "KeyError: 'FancyRunner is not in the runner registry'\n",
])
def test_a_setting_called_invalid_is_a_config_error(tmp_path: Path, text: str) -> None:
    d = diagnose_text(tmp_path, "step 1\n" + text)
    assert d.category == Category.CONFIG_ERROR


def test_a_kill_verb_with_its_signal_is_a_kill_from_outside(tmp_path: Path) -> None:
    d = diagnose_text(tmp_path, "epoch 3\nCommand terminated by signal 15\n")
    assert d.category == Category.KILLED_BY_SIGNAL_UNKNOWN
    assert d.restart_helps == RestartHelps.YES


def test_device_memory_words_read_an_hbm_with_its_number(tmp_path: Path) -> None:
    d = diagnose_text(tmp_path, "step 9\n[3] Resource exhausted: Attempting to allocate 1.2G. "
                                "There are 0.4G free.; (0x0x0_HBM0)\n")
    assert d.category == Category.GPU_OOM


def test_an_illegal_instruction_says_no() -> None:
    d = Diagnosis(Category.SEGFAULT_OR_ABORT, FaultDomain.FRAMEWORK, RestartHelps.MAYBE, "x",
                  "advice.", evidence=Evidence(
                      "console.log", 1, "mpirun noticed that process rank 0 with PID 7 on node "
                      "n1 exited on signal 4 (Illegal instruction)."))
    assert story_restart(d, []).restart_helps == RestartHelps.NO
    other = Diagnosis(Category.SEGFAULT_OR_ABORT, FaultDomain.FRAMEWORK, RestartHelps.MAYBE,
                      "x", "advice.", evidence=Evidence("console.log", 1,
                                                        "Fatal Python error: Segmentation "
                                                        "fault"))
    assert story_restart(other, []).restart_helps == RestartHelps.MAYBE
