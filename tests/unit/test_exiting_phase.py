"""A rank whose script ended is tearing down, not hung (CI saw one rank's torch teardown take
over 3 s on a loaded machine: a hang was confirmed after its last step, py-spy could not read
the finalizing interpreter, and the job restarted a finished rank)."""

from __future__ import annotations

import math
import uuid
from collections.abc import Iterator
from datetime import datetime, timezone

import pytest

from trainguard.controller.hang_evidence import job_ending
from trainguard.node.channel import ChannelServer
from trainguard.protocol import NodeReport, Progress, RankLiveness
from trainguard.worker import channel
from trainguard.worker import progress as prog
from trainguard.worker.contract import EXIT_SAVE_PHASE, EXITING_PHASE, MessageKind


@pytest.fixture
def agent(monkeypatch: pytest.MonkeyPatch) -> Iterator[ChannelServer]:
    server = ChannelServer(f"@tg-test-{uuid.uuid4().hex[:8]}")
    monkeypatch.setenv(channel.ENV_SOCKET, server.name)
    monkeypatch.setenv("RANK", "0")
    for name, new_process in (("_launcher", None), ("_last_step", 0), ("_unsent", False),
                              ("_next_send_at", -math.inf), ("_marks_failing", False)):
        monkeypatch.setattr(prog, name, new_process)
    try:
        yield server
    finally:
        server.close()


def test_at_interpreter_exit_a_reporting_script_opens_the_exiting_phase(
        agent: ChannelServer) -> None:
    prog.progress(10)
    prog._flush_at_exit()  # what atexit runs
    marks = [m for m in agent.drain() if m["kind"] == MessageKind.PHASE]
    assert [(m["name"], m["state"]) for m in marks] == [(EXITING_PHASE, "begin")]


def test_a_script_that_never_reported_sends_nothing_at_exit(agent: ChannelServer) -> None:
    prog._flush_at_exit()
    assert agent.drain() == []


def report(phase: str | None) -> NodeReport:
    now = datetime.now(timezone.utc)
    return NodeReport(node="node-0", attempt=1, workers=[], progress=Progress(), at=now,
                      liveness=[RankLiveness(rank=0, last_step=10, last_progress_at=now,
                                             phase=phase, phase_since=now)])


def test_a_rank_in_the_exiting_phase_makes_the_attempt_ending() -> None:
    assert job_ending(report(EXITING_PHASE)) == "rank(s) 0 exiting their interpreter"
    assert job_ending(report(EXIT_SAVE_PHASE)) == \
        "rank(s) 0 saving a checkpoint on the way out"
    assert job_ending(report("checkpoint")) is None
