"""`make test` runs the tests marked serial from the files the Makefile lists (SERIAL_FILES,
so that their run does not collect all of tests/ again): the list must name every file that
holds one, or that test would run in neither of make test's two pytest calls."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_makefile_lists_every_file_with_a_serial_test() -> None:
    text = (REPO / "Makefile").read_text()
    m = re.search(r"^SERIAL_FILES := (.*?)(?<!\\)\n", text, re.S | re.M)
    assert m is not None, "no SERIAL_FILES in the Makefile"
    listed = set(m.group(1).replace("\\\n", " ").split())
    marked = {str(p.relative_to(REPO)) for p in (REPO / "tests").rglob("test_*.py")
              if re.search(r"pytest\.mark\.serial\b", p.read_text(encoding="utf-8"))}
    assert marked, "no test is marked serial: the pattern is stale"
    assert marked <= listed, f"marked serial but not in SERIAL_FILES: {sorted(marked - listed)}"
    assert all((REPO / f).is_file() for f in listed), sorted(listed)


def test_the_parallel_run_keeps_the_longest_first_order_of_a_table_of_real_files() -> None:
    """tests/file_order.py queues the long files first; xdist's default reorder (by number of
    tests) would undo it, and a file renamed or deleted would drop out of the order unseen."""
    from tests.file_order import FILE_SECONDS

    text = (REPO / "Makefile").read_text()
    parallel = re.search(r"^\t\$\(PYTEST\) [^\n]*-n 2 --dist loadfile \\\n\t\t([^\n]*)", text,
                         re.M)
    assert parallel is not None, "no parallel pytest call in the Makefile"
    assert "--no-loadscope-reorder" in parallel.group(1)
    assert [f for f in FILE_SECONDS if not (REPO / f).is_file()] == []
