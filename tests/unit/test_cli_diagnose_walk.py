"""`trainguard diagnose` of a new user's walk-through: a SyntaxError's advice names the
file and line the log shows; a hang of a job of one rank names that rank."""

from __future__ import annotations

import json
from pathlib import Path

from tests.unit.helpers import tg
from trainguard.hang.stacks import RankStack, name_culprit, parse_pyspy_json

HANG_DATA = Path(__file__).resolve().parents[1] / "data" / "hang"

SYNTAX = """\
2026-12-03T08:23:30.612095+00:00 err   File "/tmp/walk6/syntax.py", line 1
2026-12-03T08:23:30.612095+00:00 err     def f(:
2026-12-03T08:23:30.612095+00:00 err           ^
2026-12-03T08:23:30.612095+00:00 err SyntaxError: invalid syntax
"""


def test_a_syntax_errors_advice_names_the_file_and_line_the_log_shows(tmp_path: Path) -> None:
    log = tmp_path / "rank-0.log"
    log.write_text(SYNTAX, encoding="utf-8")
    r = tg("diagnose", str(log), "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)["diagnosis"]
    assert d["category"] == "user_code_error" and d["subcategory"] == "SyntaxError", d
    assert "at /tmp/walk6/syntax.py:1" in d["advice"], d["advice"]
    assert "no traceback" not in d["advice"]
    assert d["culprit"]["frame"] == "/tmp/walk6/syntax.py:1"


def test_the_only_rank_of_a_job_is_the_culprit_of_its_hang() -> None:
    text = (HANG_DATA / "sleep.native.json").read_text(encoding="utf-8")
    stack = RankStack(0, json.loads(text)[0]["pid"], tuple(parse_pyspy_json(text)))
    c = name_culprit({0: stack}, {0: 5})
    assert c.rank == 0, c
    assert c.reason.startswith("Rank 0, the only rank, is sleeping (time.sleep"), c.reason
    assert "no single culprit" not in c.reason
