"""The controller's hang watch (controller/hang_watch.py): what a cleared suspicion says.
The detector and the recorder are fakes: only the wording of the decision is under test."""

from __future__ import annotations

from datetime import datetime, timezone
from types import SimpleNamespace
from typing import Any

from tests.unit.helpers import NO_STEPS, fake_hang_watch
from trainguard.controller.hang_watch import HangWatch
from trainguard.hang.detector import HangState


def watch(states: list[HangState]) -> tuple[HangWatch, list[str]]:
    said: list[str] = []
    agent = SimpleNamespace(dump_stacks=lambda cmd: [])
    return fake_hang_watch(states, said, agent, "/nonexistent"), said


def report(succeeded: list[int]) -> Any:
    from trainguard.states import WorkerState
    return SimpleNamespace(at=datetime.now(timezone.utc), liveness=[], progress=NO_STEPS,
                           workers=[SimpleNamespace(rank=r, state=WorkerState.SUCCEEDED)
                                    for r in succeeded])


def test_a_suspicion_cleared_by_the_attempt_ending_does_not_say_the_job_progresses() -> None:
    w, said = watch([HangState.SUSPECTED, HangState.OK])
    w.observe(report([]))
    w.observe(report([0]))  # rank 0 exited 0: the attempt is tearing down
    assert said[-1] == "HangCleared: not a hang: the attempt is ending (rank(s) 0 exited 0)"
    w, said = watch([HangState.SUSPECTED, HangState.OK])
    w.observe(report([]))
    w.observe(report([]))
    assert said[-1] == ("HangCleared: the job makes progress again; the suspected hang is "
                        "over")
