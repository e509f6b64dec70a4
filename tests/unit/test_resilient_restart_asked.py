"""worker/resilient.restart_if_asked: a wait outside any collective (a synchronous save's
commit) leaves for run_resilient when the launcher's RESTART is here (walk-through 34 #8),
only on the main thread inside run_resilient, and only for a newer generation."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from trainguard.worker import control, resilient
from trainguard.worker.contract import ControlKind


class Box:
    def __init__(self, verdicts: list[dict[str, Any]]) -> None:
        self.verdicts = verdicts

    def take(self, accept: Any) -> dict[str, Any] | None:
        for v in self.verdicts:
            if accept(v):
                self.verdicts.remove(v)
                return v
        return None


RESTART = {"kind": ControlKind.RESTART, "generation": 2, "master_addr": "127.0.0.1",
           "master_port": 1234}


def test_a_restart_for_a_newer_group_is_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(resilient, "_running", (Box([dict(RESTART)]), 1))
    with pytest.raises(control.RestartRequested) as e:
        resilient.restart_if_asked()
    assert e.value.verdict["generation"] == 2


def test_nothing_is_taken_outside_run_resilient_off_the_main_thread_or_for_an_old_group(
        monkeypatch: pytest.MonkeyPatch) -> None:
    resilient.restart_if_asked()  # not in run_resilient: nothing to read
    box = Box([dict(RESTART)])
    monkeypatch.setattr(resilient, "_running", (box, 2))  # this generation already
    resilient.restart_if_asked()
    monkeypatch.setattr(resilient, "_running", (box, 1))
    errors: list[BaseException] = []

    def in_a_save_thread() -> None:
        try:
            resilient.restart_if_asked()
        except BaseException as e:  # what the thread must not raise
            errors.append(e)
    t = threading.Thread(target=in_a_save_thread)
    t.start()
    t.join()
    assert errors == [] and box.verdicts == [RESTART]  # left for run_resilient
