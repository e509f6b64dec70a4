"""The README's sample output is rewritten from a real run (scripts/readme_samples.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("readme_samples",
                                               ROOT / "scripts" / "readme_samples.py")
assert _spec is not None and _spec.loader is not None
samples = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(samples)


def test_the_sample_keeps_launcher_lines_and_read_commands_but_not_rank_lines() -> None:
    out = "\n".join([
        "$ TRAINGUARD_FAULT='...' run ...", "[rank 0] step 1 loss 3.4",
        "[trainguard] 07:00:00 Info JobCreated: job created", "",
        "$ trainguard events /tmp/j", "TIME LEVEL", "07:00 Info JobCreated", "",
        "$ trainguard recovery /tmp/j", "run tg-1 · succeeded", "x" * 300])
    got = samples.sample(out).splitlines()
    assert got[0].startswith("[trainguard]") and "$ trainguard recovery /tmp/j" in got
    assert not any(g.startswith(("[rank", "TIME", "$ trainguard events")) for g in got)
    assert got[-1].endswith(" ...") and len(got[-1]) == samples.WIDTH


def test_rewrite_replaces_only_the_marked_block() -> None:
    readme = f"intro\n{samples.START}\nold\n{samples.END}\nrest\n"
    new = samples.rewrite(readme, "fresh output", "2026-12-02")
    assert new.startswith("intro\n") and new.endswith(f"{samples.END}\nrest\n")
    assert "fresh output" in new and "old" not in new and "2026-12-02" in new


def test_the_readme_sample_came_from_the_script() -> None:
    text = (ROOT / "README.md").read_text()
    block = text.split(samples.START, 1)[1].split(samples.END, 1)[0]
    assert "rewritten by `scripts/readme_samples.py`" in block
    assert "$ trainguard recovery" in block and "$ trainguard report" in block
