"""Settings for every test.

`make test` spreads the suite over two pytest-xdist workers with `--dist loadfile`: a test
file's tests run in order on one worker and its module and session fixtures are built once
per worker. (`--dist loadgroup` does not group with pytest 9.2: xdist 3.8 renames items
through an attribute pytest no longer reads.) Tests marked `serial` (timing-sensitive under a
second job's load: the chaos run, the hang false-alarm run, the browser) are left out of the
parallel run and run alone after it (the Makefile's second pytest call). The files are
queued longest first (tests/file_order.py; the Makefile's `--no-loadscope-reorder` keeps
that order).

Every test starts without COLUMNS (an xdist worker has COLUMNS=80 in its environment): the
commands' table width in a pipe is their own default unless a test sets it.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.file_order import longest_first


@pytest.hookimpl(trylast=True)  # after the deselection and pytest's own regrouping
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    longest_first(items)


@pytest.fixture(autouse=True)
def _no_columns(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("COLUMNS", raising=False)
    yield
