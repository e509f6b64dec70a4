"""What the analysis reads beyond exact signatures (issue 17, eighth round, after the
eleventh blind set): a configuration system saying a key does not exist, a KeyError of a key
read from the run's settings, a shared-memory explanation on the line after a worker's
death notice, an abort after a collective timeout, and the restart verdicts that follow
from the whole story. The lines are worded unlike the cases they were learnt from: the
structure is what is tested."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.helpers import diagnose_text
from trainguard.diagnosis.sources import diagnose_paths
from trainguard.diagnosis.taxonomy import Category, RestartHelps


@pytest.mark.parametrize("line", [
    "KeyError: 'Non-existent config key: MODEL.HEAD.NUM_ANCHORS'",
    "omegaconf_like.ConfigKeyError: Unknown config key 'trainer.max_stepz'",
    "ValueError: unrecognized configuration option: warmup_ratioo",
])
def test_a_config_system_saying_a_key_does_not_exist_is_the_configs(tmp_path: Path,
                                                                     line: str) -> None:
    text = ("Traceback (most recent call last):\n"
            '  File "tools/train.py", line 40, in <module>\n'
            "    cfg.merge_from_file(args.config_file)\n" + line + "\n")
    d = diagnose_text(tmp_path, text)
    assert d.category == Category.CONFIG_ERROR
    assert d.restart_helps == RestartHelps.NO


@pytest.mark.parametrize("source", [
    "    warmup = hparams['schedule']['warmup_iters']",
    "    n = int(model_cfg[\"warmup_iters\"])",
    "    n = self.opts.sched['warmup_iters']",
])
def test_a_key_the_runs_settings_lack_is_the_configs(tmp_path: Path, source: str) -> None:
    text = ("Traceback (most recent call last):\n"
            '  File "run.py", line 17, in build\n' + source + "\n"
            "KeyError: 'warmup_iters'\n")
    d = diagnose_text(tmp_path, text)
    assert d.category == Category.CONFIG_ERROR
    assert d.evidence is not None and "warmup_iters" in d.evidence.text


@pytest.mark.parametrize("source", [
    # a key read from a batch, a sample or a checkpoint is not a setting
    "    x = batch['warmup_iters']",
    # a setting read, but not the key that is missing
    "    n = cfg['steps'][lookup['warmup_iters']]",
])
def test_a_key_missing_elsewhere_stays_the_codes(tmp_path: Path, source: str) -> None:
    text = ("Traceback (most recent call last):\n"
            '  File "run.py", line 17, in build\n' + source + "\n"
            "KeyError: 'warmup_iters'\n")
    assert diagnose_text(tmp_path, text).category == Category.USER_CODE_ERROR


def test_a_worker_notice_cut_before_its_signal_then_shared_memory_named(
        tmp_path: Path) -> None:
    text = ("epoch 3 iter 200 loss 0.31\n"
            "ERROR: DataLoader worker (pid 4411) is killed by signal: \n"
            "Bus error. Most likely the workers ran out of shared memory (/dev/shm).\n")
    d = diagnose_text(tmp_path, text)
    assert d.category == Category.SHARED_MEMORY
    assert d.evidence is not None and "shared memory" in d.evidence.text


def test_an_abort_after_a_collective_timeout_is_the_hangs(tmp_path: Path) -> None:
    text = ("step 9000 loss 1.2\n"
            "[Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=88, "
            "OpType=BROADCAST, NumelIn=4, NumelOut=4, Timeout(ms)=600000) ran for 600012 "
            "milliseconds before timing out.\n"
            "srun: error: node17: task 3: Aborted (core dumped)\n")
    d = diagnose_text(tmp_path, text)
    assert d.category == Category.NCCL_TIMEOUT_OR_HANG
    assert d.evidence is not None and "Watchdog" in d.evidence.text


def test_an_abort_with_nothing_before_it_stays_an_abort(tmp_path: Path) -> None:
    d = diagnose_text(tmp_path, "step 9000 loss 1.2\nsrun: error: node17: task 3: Aborted "
                                "(core dumped)\n")
    assert d.category == Category.SEGFAULT_OR_ABORT


@pytest.mark.parametrize("line", [
    "Segmentation fault (core dumped)",
    "  8812 segmentation fault (core dumped)  python main.py --cfg a.yaml",
    "./run.sh: line 12: 30121 Segmentation fault      (core dumped) python fit.py",
])
def test_a_native_crash_only_the_shell_reports_does_not_restart(tmp_path: Path,
                                                                line: str) -> None:
    d = diagnose_text(tmp_path, "building vocabulary\nepoch 0 batch 3\n" + line + "\n")
    assert d.category == Category.SEGFAULT_OR_ABORT
    assert d.restart_helps == RestartHelps.NO


def test_a_crash_that_faulthandler_reports_keeps_maybe(tmp_path: Path) -> None:
    text = ("epoch 0 batch 3\nFatal Python error: Segmentation fault\n\n"
            "Current thread 0x00007f (most recent call first):\n"
            '  File "/opt/lib/python3.10/site-packages/torch/autograd/__init__.py", line 200 '
            "in backward\n")
    d = diagnose_text(tmp_path, text)
    assert d.category == Category.SEGFAULT_OR_ABORT
    assert d.restart_helps == RestartHelps.MAYBE


def test_a_trackers_error_that_is_no_refusal_is_not_a_no(tmp_path: Path) -> None:
    # an experiment tracker's error type alone does not say access was denied
    text = ("wandb: Tracking run with wandb version 0.16.1\n"
            "wandb.errors.CommError: Timed out waiting for the service after 30 seconds\n")
    d = diagnose_text(tmp_path, text)
    assert d.category == Category.OTHER
    assert d.restart_helps != RestartHelps.NO


def test_a_traceback_cut_where_the_loader_waits_for_its_workers(tmp_path: Path) -> None:
    text = ("Traceback (most recent call last):\n"
            '  File "fit.py", line 71, in <module>\n'
            "    for images, labels in loader:\n"
            '  File "/opt/py/site-packages/torch/utils/data/dataloader.py", line 1003, in '
            "_try_get_data\n"
            "    data = self._data_queue.get(timeout=timeout)\n"
            '  File "/usr/lib/python3.8/queue.py", line 179, in get\n'
            "    self.not_empty.wait(remaining)\n"
            '  File "/usr/lib/python3.8/threading.py", line 306, in wait\n'
            "    gotit = waiter.acquire(True, timeout)\n")
    d = diagnose_text(tmp_path, "epoch 2 it 80\n" + text)
    assert d.category == Category.DATALOADER_WORKER_CRASH


def test_a_traceback_cut_in_another_wait_is_no_loaders(tmp_path: Path) -> None:
    text = ("Traceback (most recent call last):\n"
            '  File "serve.py", line 30, in <module>\n'
            "    job = jobs.get()\n"
            '  File "/usr/lib/python3.8/queue.py", line 170, in get\n'
            "    self.not_empty.wait()\n"
            '  File "/usr/lib/python3.8/threading.py", line 302, in wait\n'
            "    waiter.acquire()\n")
    p = tmp_path / "console.log"
    p.write_text("waiting for jobs\n" + text, encoding="utf-8")
    d = diagnose_paths([p]).diagnosis
    assert d is None or d.category != Category.DATALOADER_WORKER_CRASH


def test_a_traceback_cut_in_a_writers_code_is_the_storages(tmp_path: Path) -> None:
    text = ("Traceback (most recent call last):\n"
            '  File "export.py", line 12, in <module>\n'
            "    shards.finish()\n"
            '  File "/opt/py/site-packages/webdataset/shardwriter.py", line 88, in close\n'
            "    self.tarstream.close()\n")
    d = diagnose_text(tmp_path, "writing shard 511\n" + text)
    assert d.category == Category.DISK_FULL_OR_STORAGE_IO


def test_a_traceback_cut_where_the_store_is_set_up_is_the_rendezvous(tmp_path: Path) -> None:
    text = ("Traceback (most recent call last):\n"
            '  File "main.py", line 9, in <module>\n'
            "    dist.init_process_group('nccl', init_method=url, rank=r, world_size=w)\n"
            '  File "/opt/py/site-packages/torch/distributed/rendezvous.py", line 160, in '
            "_env_rendezvous_handler\n"
            "    store = _create_c10d_store(master_addr, master_port, rank, world_size, t)\n")
    d = diagnose_text(tmp_path, "node 1 starting\n" + text)
    assert d.category == Category.NETWORK_OR_RENDEZVOUS
    assert d.restart_helps == RestartHelps.YES


def test_a_traceback_cut_anywhere_still_gets_an_answer(tmp_path: Path) -> None:
    # a traceback the log ends in, cut before its exception line, is an error shown:
    # never no answer, and the innermost frame is the deciding line
    text = ("Traceback (most recent call last):\n"
            '  File "render.py", line 210, in <module>\n'
            "    main(opts)\n"
            '  File "render.py", line 185, in main\n'
            "    img = shade(mesh, lights)\n")
    d = diagnose_text(tmp_path, "frame 12/300\n" + text)
    assert d.evidence is not None and "line 185, in main" in d.evidence.text


def test_gloo_that_cannot_connect_its_mesh_does_not_restart(tmp_path: Path) -> None:
    text = ("initializing process group on 2 nodes\n"
            "[E1203 11:02:03.1 ProcessGroupGloo.cpp:143] Gloo connectFullMesh failed with "
            "[../third_party/gloo/gloo/transport/tcp/pair.cc:144] no error\n")
    d = diagnose_text(tmp_path, text)
    assert d.category == Category.NETWORK_OR_RENDEZVOUS
    assert d.restart_helps == RestartHelps.NO
