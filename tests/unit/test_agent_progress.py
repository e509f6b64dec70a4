"""The node agent's progress (node/agent.py, node/reentry.py), walk-through 29: a frozen
rank re-reporting its last step as it was stopped moved the job's "last progress" to the stop;
an evaluation's progress bar (`500/500`) of a rank that reports its own steps read as steps."""

from __future__ import annotations

import io
import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone

import pytest

from trainguard.node import agent as agent_mod
from trainguard.node.agent import NodeAgent
from trainguard.node.logs import ConsoleOptions
from trainguard.spec import DEFAULT_STEP_PATTERN

T0 = datetime(2026, 12, 5, 19, 11, 3, tzinfo=timezone.utc)


@pytest.fixture
def agent(monkeypatch: pytest.MonkeyPatch) -> Iterator[NodeAgent]:
    monkeypatch.setattr(agent_mod.procs, "become_subreaper", lambda: False)  # not pytest
    a = NodeAgent("n0", io.StringIO(), ConsoleOptions({}), DEFAULT_STEP_PATTERN,
                  f"progress-{time.monotonic_ns()}")
    try:
        yield a
    finally:
        a.close()


def test_the_same_step_again_does_not_move_the_last_progress(agent: NodeAgent) -> None:
    agent._on_progress(0, 13, T0, line=False)
    agent._on_progress(0, 14, T0 + timedelta(seconds=1), line=False)
    agent._on_progress(0, 14, T0 + timedelta(minutes=5), line=False)  # on its way out
    p = agent.snapshot().progress
    assert (p.last_step, p.last_step_at) == (14, T0 + timedelta(seconds=1))
    agent._on_progress(0, 15, T0 + timedelta(minutes=6), line=False)
    assert agent.snapshot().progress.last_step_at == T0 + timedelta(minutes=6)


def test_log_steps_of_a_rank_that_reports_its_own_are_not_read(agent: NodeAgent) -> None:
    agent._on_progress(0, 1, T0)  # a log line: read while the rank reports nothing itself
    agent._on_progress(1, 1, T0)
    agent._reentry.seen({"kind": "progress", "rank": 0, "step": 2})
    agent._on_progress(0, 2, T0 + timedelta(seconds=1), line=False)
    agent._on_progress(0, 500, T0 + timedelta(seconds=2))  # its evaluation's bar: not a step
    assert agent.snapshot().progress.last_step == 2
    agent._on_progress(1, 3, T0 + timedelta(seconds=3))  # rank 1 reports nothing itself
    assert agent.snapshot().progress.last_step == 3
    agent._reentry.clear()  # a new attempt: read from the log again until it reports
    assert not agent._reentry.reports_itself(0)
