"""What the analysis reads beyond exact signatures (issue 17, fifteenth round, after the
nineteenth blind set): an exception that names the setting it objects to by its flag or as an
argument by name is the configuration's, as is a data root that does not exist; an INFO line
that names no failure decides nothing; torch >= 2.2's wording of torchrun's exit notice is an
exit; a hydra launcher or sweeper config that cannot be found is a missing plugin, and any
`Could not find` line gets an answer; a distribution's parameters that fail their constraint
are NaNs. The lines are worded unlike the cases they were learnt from where they can be: the
structure is what is tested."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.helpers import diagnose_text, traceback_of
from trainguard.diagnosis.taxonomy import Category, RestartHelps


@pytest.mark.parametrize("line", [
    "ValueError: --caption_column' value 'text' needs to be one of: image",
    "ValueError: `--image_column` value 'img' is not a column of the dataset",
    "ValueError: The arg 'group_size' (8) must not exceed the world size (2)",
    "RuntimeError: the argument 'micro_batches' (3) is larger than the global batch (2)",
])
def test_an_exception_naming_a_setting_by_its_flag_or_name_is_the_configurations(
        tmp_path: Path, line: str) -> None:
    d = diagnose_text(tmp_path, traceback_of(line))
    assert d.category == Category.CONFIG_ERROR
    assert d.restart_helps == RestartHelps.NO
    assert d.evidence is not None and d.evidence.text == line


@pytest.mark.parametrize("line", [
    # a call in the code, not a setting
    "TypeError: forward() got an unexpected keyword argument 'training'",
    # "checking argument for argument index" is a tensor op's argument
    "RuntimeError: Expected all tensors to be on the same device, but found at least two "
    "devices, cuda:0 and cpu! (when checking argument for argument index in method "
    "wrapper__index_select)",
])
def test_a_call_in_the_code_stays_the_codes(tmp_path: Path, line: str) -> None:
    assert diagnose_text(tmp_path, traceback_of(line)).category == Category.USER_CODE_ERROR


@pytest.mark.parametrize("line", [
    "ValueError: Instance images root doesn't exists.",
    "FileNotFoundError: training data folder does not exist: /data/train",
])
def test_a_data_root_that_does_not_exist_is_the_configurations(tmp_path: Path,
                                                               line: str) -> None:
    d = diagnose_text(tmp_path, traceback_of(line))
    assert d.category == Category.CONFIG_ERROR
    assert d.evidence is not None and d.evidence.text == line


def test_an_info_line_of_a_completed_barrier_decides_nothing(tmp_path: Path) -> None:
    text = (
        "[2024-01-24 15:07:20,199][distributed_c10d.py][INFO] Added key: "
        "store_based_barrier_key:1 to store for rank: 0\n"
        "[2024-01-24 15:07:20,199][distributed_c10d.py][INFO] Rank 0: Completed store-based "
        "barrier for key:store_based_barrier_key:1 with 1 nodes.\n"
        "using fused AdamW: True\n"
        "ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: -11) "
        "local_rank: 0 (pid: 1299143) of binary: /usr/bin/python\n")
    d = diagnose_text(tmp_path, text)
    assert d.category == Category.SEGFAULT_OR_ABORT
    assert d.evidence is not None and "exitcode: -11" in d.evidence.text


@pytest.mark.parametrize("line", [
    # an INFO line that names a failure still decides
    "2023-05-01 10:00:00,000 - mmdet - INFO - Epoch [1][50/500] lr: 1.0e-02, loss: nan",
    "2023-05-01 10:00:00 [INFO] Timed out initializing process group in store based barrier "
    "on rank: 3, for key: store_based_barrier_key:1 (world_size=4, worker_count=2, "
    "timeout=0:30:00)",
])
def test_an_info_line_that_names_a_failure_still_decides(tmp_path: Path, line: str) -> None:
    d = diagnose_text(tmp_path, line + "\n")
    assert d.category in (Category.NUMERICAL, Category.NETWORK_OR_RENDEZVOUS)
    assert d.evidence is not None and d.evidence.text == line


def test_torchruns_newer_exit_notice_is_an_exit(tmp_path: Path) -> None:
    line = ("[2026-03-30 19:24:42,731] torch.distributed.elastic.multiprocessing.api: [ERROR] "
            "failed (exitcode: -11) for binary located at /opt/conda/bin/python3.10 with "
            "local_rank: 3 (process ID: 71)")
    d = diagnose_text(tmp_path, "step 2465/50000\n" + line + "\n")
    assert d.category == Category.SEGFAULT_OR_ABORT
    assert d.culprit_rank == 3
    # SIGKILL without an OOM line, from torchrun: host memory, as the older wording
    killed = line.replace("-11", "-9").replace("[2026", "[node-master-0] [2026")
    (tmp_path / "k").mkdir()
    d = diagnose_text(tmp_path / "k", killed + "\n")
    assert d.category == Category.HOST_OOM
    assert d.evidence is not None and "exitcode: -9" in d.evidence.text


@pytest.mark.parametrize("line", [
    "In 'hydra/config': Could not find 'hydra/launcher/submitit_local'",
    "In 'config': Could not load 'hydra/sweeper/optuna'.",
])
def test_a_hydra_launcher_or_sweeper_not_found_is_a_missing_plugin(tmp_path: Path,
                                                                   line: str) -> None:
    d = diagnose_text(tmp_path, "Setting OMP_NUM_THREADS environment variable\n" + line + "\n")
    assert d.category == Category.DEPENDENCY_OR_IMPORT_ERROR
    assert d.restart_helps == RestartHelps.NO
    assert d.evidence is not None and d.evidence.text == line


def test_a_could_not_find_line_is_never_left_without_an_answer(tmp_path: Path) -> None:
    line = "In 'train': Could not find 'model/resnet_huge'"
    d = diagnose_text(tmp_path, "Setting OMP_NUM_THREADS environment variable\n" + line + "\n")
    assert d.evidence is not None and d.evidence.text == line


@pytest.mark.parametrize("line", [
    "ValueError: Expected parameter loc (Tensor of shape (128, 10)) of distribution "
    "Normal(loc: torch.Size([128, 10]), scale: torch.Size([128, 10])) to satisfy the "
    "constraint Real(), but found invalid values:",
    "ValueError: Expected parameter probs (Tensor of shape (64, 7)) of distribution "
    "Categorical(probs: torch.Size([64, 7])) to satisfy the constraint Simplex(), but found "
    "invalid values:",
])
def test_a_distributions_parameters_out_of_their_constraint_are_nans(tmp_path: Path,
                                                                     line: str) -> None:
    d = diagnose_text(tmp_path, traceback_of(line))
    assert d.category == Category.NUMERICAL
    assert d.restart_helps == RestartHelps.NO
    assert d.evidence is not None and d.evidence.text == line
