"""The controller's hang watch (controller/hang_watch.py): what a cleared suspicion says.
The detector and the recorder are fakes: only the wording of the decision is under test."""

from __future__ import annotations

from datetime import datetime, timezone
from types import SimpleNamespace
from typing import Any

from trainguard.controller.hang_watch import HangWatch
from trainguard.hang.detector import HangState


def watch(states: list[HangState]) -> tuple[HangWatch, list[str]]:
    said: list[str] = []
    w = object.__new__(HangWatch)
    w.rec = SimpleNamespace(event=lambda level, reason, message, **kw: said.append(  # type: ignore[assignment]
        f"{reason.value}: {message}"), paths=SimpleNamespace(log_dir="/nonexistent"))
    w.agent = SimpleNamespace(dump_stacks=lambda cmd: [])  # type: ignore[assignment]
    w.enabled, w._attempt, w.confirmed, w._ending = True, 0, None, None
    w._looks, w._working_told, w._looked = {}, False, 0.0
    w._state = HangState.OK
    verdicts = iter(states)
    w.detector = SimpleNamespace(  # type: ignore[assignment]
        observe=lambda liveness, now, ending: SimpleNamespace(
            state=next(verdicts), stuck_ranks=[0], describe=lambda: "rank 0 stuck",
            last_progress_at=None, idle_s=9.0, threshold_s=8.0, p99_s=None, basis="floor",
            waiting_for=None))
    return w, said


def report(succeeded: list[int]) -> Any:
    from trainguard.states import WorkerState
    return SimpleNamespace(at=datetime.now(timezone.utc), liveness=[], progress=None,
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
