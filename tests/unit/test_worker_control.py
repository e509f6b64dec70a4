"""The rank's control inbox (a real socket pair, one end handed to the agent over the
worker channel since walk-through 32 #4) and run_resilient without a launcher verdict:
what a training script sees of in-process restarts."""

from __future__ import annotations

import itertools
import json
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from trainguard.node.channel import ChannelServer
from trainguard.worker import control, resilient
from trainguard.worker.contract import ControlKind
from trainguard.worker.transient import is_transient

ENDS: dict[str, socket.socket] = {}  # the end each test inbox handed over, by its name


def inbox() -> control.Inbox:
    """An inbox whose other end this test keeps (the agent's, under a launcher)."""
    def keep(name: str, end: socket.socket) -> bool:
        ENDS[name] = end.dup()
        return True
    return control.Inbox(f"@tg-test-{uuid.uuid4().hex[:8]}", hand_over=keep)


def send(name: str, msg: dict[str, object] | bytes) -> None:
    data = msg if isinstance(msg, bytes) else json.dumps(msg).encode()
    ENDS[name].send(data)


RESTART = {"kind": "restart", "generation": 2, "master_addr": "127.0.0.1", "master_port": 29501}
REFORM = {"kind": "reform", "step": 4, "generation": 1, "master_addr": "127.0.0.1",
          "master_port": 29502}


def test_a_verdict_the_waiter_does_not_take_is_kept_for_the_next() -> None:
    box = inbox()
    try:
        send(box.name, b"not json")  # ignored
        send(box.name, {"kind": "explode"})  # not a verdict: ignored
        send(box.name, RESTART)
        send(box.name, REFORM)
        got = box.wait(lambda v: v["kind"] == ControlKind.REFORM, 2.0)
        assert got is not None and got["step"] == 4
        kept = box.take(lambda v: v["kind"] == ControlKind.RESTART)
        assert kept is not None and kept["generation"] == 2
        assert box.take(lambda v: True) is None
    finally:
        box.close()


def test_a_wait_ticks_every_second_and_gives_up_at_its_deadline() -> None:
    box = inbox()
    ticks: list[float] = []
    try:
        t0 = time.monotonic()
        assert box.wait(lambda v: True, 3.5, lambda: ticks.append(time.monotonic())) is None
        assert time.monotonic() - t0 >= 3.5
        # at once, then at 1, 2 and 3 s (a loaded machine may stall the last past the
        # deadline): a second apart, never less
        assert ticks[0] - t0 < 0.5 and 3 <= len(ticks) <= 4, [t - t0 for t in ticks]
        assert all(b - a >= 1.0 for a, b in itertools.pairwise(ticks)), ticks
    finally:
        box.close()


def test_without_a_launcher_run_resilient_calls_the_function_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRAINGUARD_IN_PROCESS_RESTART", raising=False)
    calls: list[int] = []

    def main(x: int) -> int:
        calls.append(x)
        if len(calls) == 1:
            raise RuntimeError("Connection closed by peer")
        return x

    with pytest.raises(RuntimeError, match="Connection closed"):
        resilient.run_resilient(main, 3)
    assert calls == [3]


def test_only_collective_failures_count_as_transient() -> None:
    assert is_transient(RuntimeError("[gloo/pair.cc:553] Connection closed by peer"))
    assert is_transient(type("DistNetworkError", (RuntimeError,), {})("anything"))
    assert not is_transient(ValueError("Connection closed by peer"))  # not a RuntimeError
    assert not is_transient(RuntimeError("CUDA out of memory"))


@pytest.fixture
def launched(monkeypatch: pytest.MonkeyPatch) -> Iterator[ChannelServer]:
    """A rank under the launcher with in-process restart on; its agent's channel (a real
    one: the rank hands it its inbox)."""
    agent = ChannelServer(f"@tg-test-{uuid.uuid4().hex[:8]}")
    monkeypatch.setenv("TRAINGUARD_AGENT_SOCKET", agent.name)
    monkeypatch.setenv("TRAINGUARD_IN_PROCESS_RESTART", "1")
    monkeypatch.setenv("TRAINGUARD_IN_PROCESS_TIMEOUT_S", "2")
    monkeypatch.setenv("RANK", "1")
    for var in ("MASTER_ADDR", "MASTER_PORT", "TRAINGUARD_PG_GENERATION"):
        monkeypatch.setenv(var, "")  # recorded: run_resilient sets them, the test undoes it
        monkeypatch.delenv(var)
    monkeypatch.setattr(control, "_inbox", None)
    monkeypatch.setattr(control, "_failed", False)
    box = control.inbox()
    assert box is not None
    yield agent
    box.close()
    agent.close()


def test_on_the_launchers_restart_the_function_is_entered_again_on_the_new_group(
        launched: ChannelServer) -> None:
    entries: list[tuple[str | None, str | None]] = []

    def main() -> str:
        entries.append((os.environ.get("MASTER_PORT"),
                        os.environ.get("TRAINGUARD_PG_GENERATION")))
        if len(entries) == 1:
            assert launched.tell([1], RESTART) == 1  # the verdict, as a peer's death brings it
            raise RuntimeError("[gloo/pair.cc:553] Connection closed by peer")
        return "done"

    assert resilient.run_resilient(main) == "done"
    assert entries == [(None, None), ("29501", "2")]


def test_no_restart_or_no_verdict_raises_the_error_and_a_script_error_is_raised_at_once(
        launched: ChannelServer) -> None:
    def broken() -> None:
        launched.tell([1], {"kind": "no_restart", "generation": 0, "reason": "nothing died"})
        raise RuntimeError("Connection reset by peer")

    with pytest.raises(RuntimeError, match="reset by peer"):
        resilient.run_resilient(broken)
    calls: list[int] = []

    def bug() -> None:
        calls.append(1)
        raise ValueError("a bug")

    with pytest.raises(ValueError, match="a bug"):
        resilient.run_resilient(bug)
    assert calls == [1]


def test_a_verdict_from_another_user_is_dropped() -> None:
    """Abstract sockets have no permissions: the kernel's credentials decide."""
    if os.getuid() != 0:
        pytest.skip("needs root to send as another user")
    box = inbox()
    try:
        send = ("import os, socket, sys; os.setuid(65534); s = socket.socket(fileno=int("
                "sys.argv[1])); s.send(sys.argv[2].encode())")
        verdict = json.dumps({"kind": "give_up", "step": 1, "reason": "forged"})
        end = ENDS[box.name]
        subprocess.run([sys.executable, "-c", send, str(end.fileno()), verdict], check=True,
                       timeout=30, pass_fds=[end.fileno()])
        assert box.wait(lambda v: True, 0.5) is None
    finally:
        box.close()


def guard_on(box: control.Inbox, generation: int = 0) -> Any:
    """A StepGuard's verdict half, on a real inbox (no process group needed for it)."""
    from trainguard.worker.step import StepGuard

    g = StepGuard.__new__(StepGuard)
    g._inbox, g.generation, g._timeout_s = box, generation, 1.0
    return g


@pytest.mark.parametrize("then, want", [
    ({"kind": "reform_go", "step": 4, "generation": 1}, "reform_go"),
    ({"kind": "give_up", "step": 4, "reason": "only 1 of 2 rank(s) got the verdict"}, "give_up"),
    (None, None),  # nothing more: the rank gives the step up after --step-retry-timeout
])
def test_a_reform_is_joined_only_once_the_launcher_confirms_it(
        then: dict[str, object] | None, want: str | None) -> None:
    """A REFORM that did not reach every rank is taken back by a GIVE_UP (walk-through 12:
    the survivor waited in a rendezvous its dead peer never joined); a rank joins only on
    REFORM_GO, which carries no address: the REFORM's is kept."""
    box = inbox()
    try:
        send(box.name, {"kind": "reform_go", "step": 3, "generation": 1})  # another step's
        if then is not None:
            send(box.name, then)
        got = guard_on(box)._confirmation({**REFORM, "kind": ControlKind.REFORM})
        if want is None:
            assert got is None
        else:
            assert got is not None and got["kind"] == want
        if want == "reform_go":
            assert got is not None and (got["master_port"], got["generation"]) == (29502, 1)
    finally:
        box.close()
