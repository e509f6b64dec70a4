"""Facts the agent reads from the node, on fake files."""

from __future__ import annotations

from pathlib import Path

from trainguard.node.facts import oom_kill_count


def test_the_oom_kill_count_is_read_from_vmstat(tmp_path: Path) -> None:
    vmstat = tmp_path / "vmstat"
    vmstat.write_text("nr_free_pages 100\noom_kill 7\npgfault 3\n")
    assert oom_kill_count(vmstat) == 7


def test_an_unreadable_or_old_vmstat_gives_no_oom_count(tmp_path: Path) -> None:
    assert oom_kill_count(tmp_path / "missing") is None
    old = tmp_path / "vmstat"
    old.write_text("nr_free_pages 100\n")
    assert oom_kill_count(old) is None
