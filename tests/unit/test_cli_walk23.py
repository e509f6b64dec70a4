"""Nits the twenty-third walk-through (multi-node, the everyday loop, the dashboard and its
security) met, with the real command."""

from __future__ import annotations

from pathlib import Path

from tests.unit.helpers import tg


def test_ui_refuses_a_token_short_enough_to_guess(tmp_path: Path) -> None:
    """`ui --host 0.0.0.0 --token abc` served with a three-letter token."""
    (tmp_path / "runs").mkdir()
    r = tg("ui", "--root", "runs", "--host", "0.0.0.0", "--port", "0", "--token", "abc",
           cwd=tmp_path)
    assert r.returncode == 2, r.stdout
    assert "--token has 3 characters: one that short can be guessed" in r.stderr
    assert "Fix: give 16 or more" in r.stderr
