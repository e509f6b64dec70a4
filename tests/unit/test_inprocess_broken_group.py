"""controller/inprocess.InProcessRestarts on a broken group of 4 ranks, fed reports as the
agent sends them: each rank is judged by its own steps since the first waiting report
(review 37 #1: step lines on rank 0 only and rank 0 blocked; it was taken as "ran on", the
waiting ranks refused after 5 s and every process restarted), and the record's fault names
the ranks the group failed on and the blocked one killed (review 37 #6: it said "failed on
every rank" and `job`)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from trainguard.controller.inprocess import InProcessRestarts
from trainguard.policy.inprocess import BLOCKED_AFTER_S, REFUSE_AFTER_S
from trainguard.protocol import (
    NodeReport,
    Progress,
    RankLiveness,
    Tell,
    WorkerFact,
    WorkerMessage,
)
from trainguard.states import WorkerState
from trainguard.worker.contract import ControlKind, MessageKind

AT = datetime(2026, 12, 6, 12, 0, tzinfo=timezone.utc)
ERROR = "RuntimeError: Connection closed by peer"


class Rec:
    spec = type("Spec", (), {"in_process_restart": True, "master_addr": "127.0.0.1"})()


class Agent:
    def __init__(self) -> None:
        self.told: list[dict[str, Any]] = []

    def tell(self, t: Tell) -> int:
        self.told.append({"ranks": t.ranks, **t.control})
        return len(t.ranks or [])


def report(messages: list[WorkerMessage], steps: dict[int, int | None]) -> NodeReport:
    return NodeReport(
        node="n", attempt=0, progress=Progress(), at=AT, messages=messages,
        workers=[WorkerFact(rank=r, local_rank=r, pid=100 + r, state=WorkerState.RUNNING)
                 for r in range(4)],
        liveness=[RankLiveness(rank=r, last_step=s) for r, s in steps.items()])


def msg(kind: MessageKind, rank: int, **data: Any) -> WorkerMessage:
    return WorkerMessage(kind=kind.value, rank=rank, at=AT, data=data)


def waiting(*ranks: int) -> list[WorkerMessage]:
    return [msg(MessageKind.RESTART_WAITING, r, generation=0, error=ERROR,
                failed_at=(AT + timedelta(seconds=r / 100)).timestamp()) for r in ranks]


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    now = [1000.0]
    monkeypatch.setattr("trainguard.controller.inprocess.time.monotonic", lambda: now[0])
    return now


def entered(steps: dict[int, int | None]) -> tuple[InProcessRestarts, Agent]:
    agent = Agent()
    inproc = InProcessRestarts(Rec(), agent, None, single_node=True)  # type: ignore[arg-type]
    inproc.observe(report([msg(MessageKind.RESILIENT, r, generation=0) for r in range(4)],
                          steps), 0)
    return inproc, agent


RANK_0_ONLY = {0: 5, 1: None, 2: None, 3: None}  # the example's step lines, on rank 0 only


def test_a_blocked_rank_0_that_alone_prints_steps_is_replaced_not_taken_for_running_on(
        clock: list[float]) -> None:
    inproc, agent = entered(RANK_0_ONLY)
    inproc.observe(report(waiting(1, 2, 3), RANK_0_ONLY), 0)
    clock[0] += BLOCKED_AFTER_S
    inproc.observe(report([], RANK_0_ONLY), 0)
    assert inproc.broken == f"rank 1: {ERROR}" and inproc.blocked == (0,)
    clock[0] += REFUSE_AFTER_S
    inproc.observe(report([], RANK_0_ONLY), 0)
    assert agent.told == []  # nobody refused


def test_a_rank_0_that_alone_prints_steps_and_steps_on_gets_the_others_refused(
        clock: list[float]) -> None:
    inproc, agent = entered(RANK_0_ONLY)
    inproc.observe(report(waiting(1, 2, 3), RANK_0_ONLY), 0)
    clock[0] += REFUSE_AFTER_S
    inproc.observe(report([], {**RANK_0_ONLY, 0: 6}), 0)
    assert inproc.broken is None
    assert [(t["ranks"], t["kind"]) for t in agent.told] == [
        ([1, 2, 3], ControlKind.NO_RESTART.value)]
    assert "rank 0: step 5 -> 6" in agent.told[0]["reason"]


def test_the_record_names_the_ranks_the_group_failed_on_and_the_blocked_one_killed(
        clock: list[float]) -> None:
    steps = {r: 5 for r in range(4)}
    inproc, _ = entered(steps)
    inproc.observe(report(waiting(0, 1, 2), steps), 0)
    clock[0] += BLOCKED_AFTER_S
    inproc.observe(report([], steps), 0)
    assert inproc.broken_at is not None
    stopped = inproc.broken_at[1] + timedelta(seconds=0.01)
    fault = inproc.broken_fault(Progress(), stopped)
    assert fault.reason == ("the process group failed on rank(s) 0, 1, 2; rank(s) 3 blocked in "
                            f"the broken collective, killed: rank 0: {ERROR}")
    assert fault.related_task == "worker-3"
    assert (fault.fault_at, fault.stopped) == (AT, stopped)


def test_with_every_rank_waiting_the_record_says_every_rank_and_the_job(
        clock: list[float]) -> None:
    steps = {r: 5 for r in range(4)}
    inproc, _ = entered(steps)
    inproc.observe(report(waiting(0, 1, 2, 3), steps), 0)
    fault = inproc.broken_fault(Progress(), AT)
    assert fault.reason == f"the process group failed on every rank: rank 0: {ERROR}"
    assert fault.related_task == "job"
