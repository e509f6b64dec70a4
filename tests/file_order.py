"""The order `make test` hands test files to its two pytest-xdist workers: longest first.

With `--dist loadfile` a worker takes the next file in the queue when it is nearly done with
its own. xdist's default (`--loadscope-reorder`) queues the files with the most tests first,
which put the files of one or a few long tests (the chaos run: 90-105 s) at the end, where
one worker could be left with the last of them while the other has nothing to do. The
Makefile passes `--no-loadscope-reorder`, and tests/conftest.py sorts the collected tests by
the table below: the long files start first and the many short ones fill in at the end.

The table needs no precision, only the order of the long files. Its figures (seconds on one
of `make test`'s workers): the tests of the slowest-30 lists of five `make test` runs on the
2-core CI machine (December 6; the median of each, a failed test's time left out), 2 s for
each other test of those files; for tests/unit half of one run's times (that run was at a
load of 4-5), and for test_run_surface.py and test_corruption.py half of a run of the two
files alone at a load of 7. A file not listed counts as 0 s: it keeps its place in the
collection order, after the listed ones.
"""

from __future__ import annotations

import pytest

FILE_SECONDS: dict[str, float] = {
    "tests/multinode/test_slurm_jobs.py": 167,
    "tests/integration/test_hang.py": 107,
    "tests/chaos/test_chaos.py": 93,
    "tests/integration/test_multinode_local.py": 86,
    "tests/integration/test_standby.py": 86,
    "tests/integration/test_multinode_agents.py": 75,
    "tests/integration/test_checkpoint_wirein.py": 75,
    "tests/integration/test_in_process_restart.py": 72,
    "tests/integration/test_integrations_hf.py": 67,
    "tests/integration/test_integrations_lightning.py": 54,
    "tests/integration/test_run_surface.py": 50,
    "tests/integration/test_silent_eval.py": 41,
    "tests/multinode/test_slurm_cluster.py": 40,
    "tests/integration/test_memory_snapshots.py": 34,
    "tests/integration/test_precheck_real.py": 34,
    "tests/unit/test_cli_walk18.py": 34,
    "tests/integration/test_everyday.py": 33,
    "tests/unit/test_diagnosis_rules.py": 30,
    "tests/integration/test_exit_save_crash.py": 27,
    "tests/integration/test_goodput.py": 27,
    "tests/integration/test_diagnose_job_dir.py": 26,
    "tests/checkpoint/test_sharded.py": 26,
    "tests/integration/test_wire_fuzz.py": 26,
    "tests/checkpoint/test_crash_consistency.py": 22,
    "tests/integration/test_diagnosis_launcher.py": 21,
    "tests/checkpoint/test_corruption.py": 20,
    "tests/checkpoint/test_s3.py": 20,
    "tests/integration/test_processes.py": 18,
    "tests/integration/test_hang_dump.py": 18,
    "tests/integration/test_survived_error.py": 17,
    "tests/unit/test_cli_ckpt.py": 17,
    "tests/integration/test_cluster_wire.py": 16,
    "tests/unit/test_cli_walk19.py": 15,
    "tests/unit/test_cli_fifth_walk.py": 14,
    "tests/integration/test_restart.py": 14,
    "tests/unit/test_cli_fourth_walk.py": 12,
    "tests/unit/test_cli_fifth_walk_status.py": 11,
}


def file_of(item: pytest.Item) -> str:
    """The test's file as the table names it (its node id's part before the first `::`)."""
    return item.nodeid.split("::", 1)[0]


def longest_first(items: list[pytest.Item]) -> None:
    """Sort `items` in place: files by their seconds in the table, the longest first; each
    file's tests together and in their own order; unlisted files in collection order."""
    first_seen: dict[str, int] = {}
    for i, item in enumerate(items):
        first_seen.setdefault(file_of(item), i)
    items.sort(key=lambda it: (-FILE_SECONDS.get(file_of(it), 0.0), first_seen[file_of(it)]))
