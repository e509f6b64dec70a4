"""Which commands and environments a standby worker may take (node/standby.py, pure parts)."""

from __future__ import annotations

import sys

from trainguard.node.standby import PER_RANK_ENV, _shared, interpreter
from trainguard.worker import contract as c


def test_only_the_launchers_python_with_u_running_a_script_or_a_module_qualifies() -> None:
    py = sys.executable
    assert interpreter([py, "-u", "train.py", "--lr", "3"]) == ([py, "-u"], ["train.py", "--lr",
                                                                              "3"])
    assert interpreter([py, "-u", "-m", "pkg.train", "x"]) == ([py, "-u"], ["-m", "pkg.train",
                                                                             "x"])
    assert interpreter(["/bin/true"]) is None  # --no-python
    assert interpreter(["/other/python", "-u", "train.py"]) is None  # another interpreter
    assert interpreter([py, "train.py"]) is None  # other flags: sys.flags would differ
    assert interpreter([py, "-u", "-X", "dev", "train.py"]) is None
    assert interpreter([py, "-u", "-m"]) is None


def test_per_rank_variables_do_not_matter_and_import_time_ones_do() -> None:
    base = {"OMP_NUM_THREADS": "1", "PATH": "/bin", c.ENV_RANK: "0", c.ENV_MASTER_PORT: "1",
            c.ENV_MARKER: "m1"}
    other_rank = {**base, c.ENV_RANK: "3", c.ENV_MASTER_PORT: "2", c.ENV_MARKER: "m2"}
    assert _shared(base) == _shared(other_rank)
    assert _shared(base) != _shared({**base, "OMP_NUM_THREADS": "4"})
    assert {c.ENV_RANK, c.ENV_RESTART_COUNT, c.ENV_PG_GENERATION} <= PER_RANK_ENV
    assert "OMP_NUM_THREADS" not in PER_RANK_ENV and "PYTHONHASHSEED" not in PER_RANK_ENV


def test_standbys_import_the_prewarm_list_and_what_the_workers_imported_bounded() -> None:
    from trainguard.node.standby import DEFAULT_IMPORTS, MAX_LEARNED, StandbyPool

    pool = StandbyPool(guardian=None, imports=DEFAULT_IMPORTS)  # type: ignore[arg-type]
    argv = [sys.executable, "-u", "train.py"]
    pool.configure(0, argv, {}, "/", ["transformers", "bad name", "numpy.linalg"])
    pool.learn(["numpy", "transformers", "torch", "1x"])  # known, default, not a name
    assert pool.imports == (*DEFAULT_IMPORTS, "transformers", "numpy.linalg", "numpy")
    pool.learn([f"pkg{i}" for i in range(2 * MAX_LEARNED)])
    assert len(pool.imports) == len(DEFAULT_IMPORTS) + MAX_LEARNED
