"""controller/step_retry.StepRetries waits for every running rank's report of a failed step
before the ladder decides (review 37 #2): with 4 ranks a `collective` fault fails the step at
once on ranks 0-2 while rank 3 stays blocked in the broken collective (gloo wakes it only
when a connection it waits on closes). The re-formed group's rendezvous then waited
--step-retry-timeout for rank 3 and failed, and the failed init left torch's group counter
behind (every rank then deadlocked in init_process_group). A rank silent for half of
--step-retry-timeout after the first report gives the step up: the in-process restart
replaces it; a rank that is only slow reports within it (review 38 #1)."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import pytest

from trainguard.controller.step_retry import StepRetries
from trainguard.policy.decision import Action, HAPolicy, History, Incident, IncidentKind
from trainguard.policy.ladder import decide
from trainguard.policy.step import reports_within_s
from trainguard.protocol import NodeReport, Progress, Tell, WorkerFact, WorkerMessage
from trainguard.states import WorkerState
from trainguard.worker.contract import ControlKind, MessageKind

AT = datetime(2026, 12, 6, 12, 0, tzinfo=timezone.utc)
POL = HAPolicy(operator_reexecution=True)


class Book:
    def __init__(self) -> None:
        self.incidents: list[Any] = []

    def step_incident(self, attempt: int, decision: Any, fault: Any, step: int) -> None:
        self.incidents.append(decision)


class Rec:
    def __init__(self) -> None:
        self.book, self.events = Book(), []  # type: ignore[var-annotated]
        self.spec = type("Spec", (), {"master_addr": "127.0.0.1", "step_retry_timeout_s": 60.0})()

    def event(self, level: Any, reason: Any, text: str, **_: Any) -> None:
        self.events.append((reason, text))


class Agent:
    def __init__(self) -> None:
        self.told: list[dict[str, Any]] = []

    def rendezvous(self, addr: str, port: int | None) -> tuple[str, int]:
        return addr, 29999

    def tell(self, t: Tell) -> int:
        self.told.append(dict(t.control))
        return 4


def report(*failed: int) -> NodeReport:
    return NodeReport(
        node="n", attempt=0, progress=Progress(), at=AT,
        workers=[WorkerFact(rank=r, local_rank=r, pid=100 + r, state=WorkerState.RUNNING)
                 for r in range(4)],
        messages=[WorkerMessage(kind=MessageKind.STEP_FAILED.value, rank=r, at=AT, data={
            "step": 6, "generation": 0, "error": "RuntimeError: Connection closed by peer"})
            for r in failed])


def retries() -> tuple[StepRetries, Agent, list[Incident]]:
    seen: list[Incident] = []

    def decide_it(incident: Incident) -> Any:
        seen.append(incident)
        return decide(incident, History(), POL)

    agent = Agent()
    return StepRetries(Rec(), agent, decide_it), agent, seen  # type: ignore[arg-type]


def kinds(agent: Agent) -> list[str]:
    return [str(c["kind"]) for c in agent.told]


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """StepRetries' monotonic clock, moved by the test (clock[0] += s)."""
    now = [1000.0]
    monkeypatch.setattr("trainguard.controller.step_retry.time.monotonic", lambda: now[0])
    return now


def test_the_step_is_decided_once_every_running_rank_reported_it() -> None:
    steps, agent, seen = retries()
    steps.observe(report(1, 0), 0)
    assert seen == [] and agent.told == []  # ranks 2 and 3 may still fail the step
    steps.observe(report(2, 3), 0)
    assert [i.silent_ranks for i in seen] == [()]
    assert kinds(agent) == [ControlKind.REFORM.value, ControlKind.REFORM_GO.value]


def test_a_rank_silent_half_the_step_retry_timeout_gives_the_step_up(
        clock: list[float]) -> None:
    steps, agent, seen = retries()
    steps.observe(report(1, 0, 2), 0)
    clock[0] += 3.0  # a rank only slow (review 38 #1: 3 s late into the step) is waited for
    steps.observe(report(), 0)
    assert seen == []
    clock[0] += reports_within_s(60.0) - 3.0 - 0.01
    steps.observe(report(), 0)
    assert seen == []
    clock[0] += 0.01
    steps.observe(report(), 0)
    assert [i.silent_ranks for i in seen] == [(3,)]
    assert kinds(agent) == [ControlKind.GIVE_UP.value]  # no rendezvous rank 3 never joins
    assert "rank(s) 3 did not report step 6's failure within half of --step-retry-timeout " \
        "(blocked in the broken collective)" in agent.told[0]["reason"]
    steps.observe(report(3), 0)  # its report after all: answered already
    assert len(seen) == 1


def test_a_slow_rank_s_report_after_3_s_gets_the_step_re_executed(
        clock: list[float]) -> None:
    steps, agent, seen = retries()
    steps.observe(report(1, 2, 3), 0)
    clock[0] += 3.0
    steps.observe(report(0), 0)
    assert [i.silent_ranks for i in seen] == [()]
    assert kinds(agent) == [ControlKind.REFORM.value, ControlKind.REFORM_GO.value]


def test_a_silent_rank_downgrades_the_step_without_spending_its_budget() -> None:
    d = decide(Incident(IncidentKind.STEP_FAILED, step=6, why="Connection closed by peer",
                        silent_ranks=(3,)), History(), POL)
    assert d.action == Action.DOWNGRADE and d.history.step_retries == 0
    assert "rank(s) 3 did not report" in d.reason
