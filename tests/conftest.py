"""How `make test` spreads the suite over two pytest-xdist workers (`-n 2 --dist loadgroup`).

Each test file is one group, so a file's tests run in order on one worker and its module and
session fixtures are built once; the multi-node files share one group (one Slurm cluster per
worker, and only one apt-get at a time). Tests marked `serial` (timing-sensitive under a
second job's load: the chaos run, the hang false-alarm run, the browser) are left out of the
parallel run and run alone after it (the Makefile's second pytest call).

Every test starts without COLUMNS (an xdist worker has COLUMNS=80 in its environment): the
commands' table width in a pipe is their own default unless a test sets it.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        path = item.nodeid.split("::", 1)[0]
        group = "multinode" if path.startswith("tests/multinode/") else path
        item.add_marker(pytest.mark.xdist_group(group))


@pytest.fixture(autouse=True)
def _no_columns(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("COLUMNS", raising=False)
    yield
