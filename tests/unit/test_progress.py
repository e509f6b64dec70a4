"""trainguard.progress() and trainguard.phase(): messages, throttling, no-ops, cost."""

from __future__ import annotations

import json
import math
import socket
import threading
import time
import timeit
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import trainguard
from trainguard.node.channel import ChannelServer
from trainguard.worker import channel
from trainguard.worker import progress as prog
from trainguard.worker.progress import PROGRESS_INTERVAL_S, phase, progress


@pytest.fixture(autouse=True)
def fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    """No launcher unless a test adds one; the cached lookup and throttle start clean, as in
    a new process (and are put back as they were after the test)."""
    monkeypatch.delenv(channel.ENV_SOCKET, raising=False)
    monkeypatch.setenv("RANK", "2")
    for name, new_process in (("_launcher", None), ("_last_step", 0), ("_unsent", False),
                              ("_next_send_at", -math.inf), ("_marks_failing", False)):
        monkeypatch.setattr(prog, name, new_process)


@pytest.fixture
def agent(monkeypatch: pytest.MonkeyPatch) -> Iterator[ChannelServer]:
    server = ChannelServer(f"@tg-test-{uuid.uuid4().hex[:8]}")
    monkeypatch.setenv(channel.ENV_SOCKET, server.name)
    try:
        yield server
    finally:
        server.close()


class BusyAgent:
    """An agent that reads only when polled (no reader thread): its queue can fill up."""

    def __init__(self) -> None:
        self.name = f"@tg-busy-{uuid.uuid4().hex[:8]}"
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind("\0" + self.name[1:])
        self.sock.setblocking(False)

    def drain(self) -> list[dict[str, Any]]:
        out = []
        while True:
            try:
                out.append(json.loads(self.sock.recv(65536)))
            except BlockingIOError:
                return out


@pytest.fixture
def busy_agent(monkeypatch: pytest.MonkeyPatch) -> Iterator[BusyAgent]:
    server = BusyAgent()
    monkeypatch.setenv(channel.ENV_SOCKET, server.name)
    try:
        yield server
    finally:
        server.sock.close()


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    """A clock the test moves; the throttle alone: the flusher, which sends a held-back
    step when the interval ends in real time, is not started."""
    c = Clock()
    monkeypatch.setattr(prog, "_monotonic", c)
    monkeypatch.setattr(prog, "_wake_flusher", lambda: None)
    return c


def steps_sent(server: ChannelServer | BusyAgent) -> list[int]:
    got = server.drain()
    assert all(m["kind"] == "progress" and m["rank"] == 2 for m in got)
    return [m["step"] for m in got]


def sent_within(server: ChannelServer, timeout: float,
                done: Callable[[list[int]], bool]) -> list[int]:
    """Every step sent until `done` holds of them (or `timeout` passes): the held-back step
    goes from a thread, which a loaded machine may run late."""
    deadline = time.monotonic() + timeout
    sent = steps_sent(server)
    while not done(sent) and time.monotonic() < deadline:
        time.sleep(0.05)
        sent += steps_sent(server)
    return sent


def test_the_package_exports_the_api() -> None:
    assert trainguard.progress is progress
    assert trainguard.phase is phase


# --- progress --------------------------------------------------------------------------


def test_the_first_call_is_sent_then_calls_are_throttled(
        agent: ChannelServer, clock: Clock) -> None:
    for step in range(1, 6):
        progress(step)
        clock.now += 0.01
    assert steps_sent(agent) == [1]


def test_progress_is_sent_again_once_the_interval_has_passed(
        agent: ChannelServer, clock: Clock) -> None:
    progress(1)
    clock.now += PROGRESS_INTERVAL_S - 0.01
    progress(2)
    clock.now += 0.02
    progress(3)
    progress(4)
    clock.now += PROGRESS_INTERVAL_S
    progress(5)
    assert steps_sent(agent) == [1, 3, 5]


def test_a_step_going_backwards_is_sent_at_once(agent: ChannelServer, clock: Clock) -> None:
    progress(10)
    progress(11)
    progress(4)  # restarted from an older checkpoint
    progress(5)  # throttled again
    assert steps_sent(agent) == [10, 4]


def test_a_held_back_last_step_is_sent_when_the_interval_ends(agent: ChannelServer) -> None:
    # The script reports steps faster than the interval, then sleeps (or evaluates): the
    # last step used to wait for a later call that never came.
    progress(1)
    progress(2)  # held back: the interval has not ended
    progress(3)
    time.sleep(PROGRESS_INTERVAL_S)
    assert sent_within(agent, 5, lambda sent: sent[-1:] == [3]) == [1, 3]


def test_held_back_steps_do_not_send_more_than_one_message_per_interval(
        agent: ChannelServer) -> None:
    started = time.monotonic()
    step = 0
    while time.monotonic() - started < 5 * PROGRESS_INTERVAL_S:
        step += 1
        progress(step)
        time.sleep(0.003)
    time.sleep(PROGRESS_INTERVAL_S)
    sent = sent_within(agent, 5, lambda sent: sent[-1:] == [step])
    assert sent[-1] == step and sent == sorted(set(sent))
    assert len(sent) <= 5 + 2  # the first, one per interval, the held-back last one


def test_the_step_is_sent_as_an_int_and_the_message_names_the_sender(
        agent: ChannelServer) -> None:
    progress(True + 6)
    (msg,) = agent.drain()
    assert msg["kind"] == "progress" and msg["step"] == 7 and msg["rank"] == 2
    assert isinstance(msg["pid"], int) and isinstance(msg["at"], float)


def test_without_a_launcher_nothing_is_sent(monkeypatch: pytest.MonkeyPatch) -> None:
    sent: list[Any] = []
    monkeypatch.setattr(channel, "send", lambda *a, **k: sent.append((a, k)))
    progress(1)
    progress(0)
    with phase("eval"):
        pass
    assert sent == []


def test_the_launcher_lookup_is_made_once(agent: ChannelServer,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(channel.ENV_SOCKET)
    progress(1)  # no launcher: remembered
    monkeypatch.setenv(channel.ENV_SOCKET, agent.name)
    progress(0)
    assert agent.drain() == []


def _best_per_call_s(number: int = 100_000, repeat: int = 5) -> float:
    step = iter(range(10**9))
    return min(timeit.repeat(lambda: progress(next(step)), number=number,
                             repeat=repeat)) / number


def test_progress_costs_under_2_us_without_a_launcher() -> None:
    assert _best_per_call_s() < 2e-6


def test_progress_costs_under_10_us_amortised_with_a_launcher(agent: ChannelServer) -> None:
    per_call = _best_per_call_s()
    assert per_call < 10e-6
    assert agent.drain()[0]["kind"] == "progress"


def test_progress_costs_under_10_us_amortised_over_sends(agent: ChannelServer) -> None:
    calls, started = 0, time.perf_counter()
    while time.perf_counter() - started < 3 * PROGRESS_INTERVAL_S:  # several real sends
        for _ in range(1000):
            progress(calls)
            calls += 1
    per_call = (time.perf_counter() - started) / calls  # loop overhead included
    assert len(agent.drain()) >= 3
    assert per_call < 10e-6


# --- phase -----------------------------------------------------------------------------


def test_a_phase_sends_begin_and_end(agent: ChannelServer) -> None:
    with phase("eval", timeout_s=600):
        mid = agent.drain()
    end = agent.drain()
    assert [(m["kind"], m["name"], m["state"], m["timeout_s"], m["depth"]) for m in mid] == [
        ("phase", "eval", "begin", 600.0, 1)]
    assert [(m["name"], m["state"], m["depth"], m["ok"]) for m in end] == [
        ("eval", "end", 1, True)]
    assert mid[0]["seq"] == end[0]["seq"]


def test_nested_phases_send_their_depth(agent: ChannelServer) -> None:
    with phase("eval"), phase("checkpoint", timeout_s=30.5):
        pass
    with phase("checkpoint"):
        pass
    got = [(m["name"], m["state"], m["depth"], m["timeout_s"]) for m in agent.drain()]
    assert got == [("eval", "begin", 1, None), ("checkpoint", "begin", 2, 30.5),
                   ("checkpoint", "end", 2, 30.5), ("eval", "end", 1, None),
                   ("checkpoint", "begin", 1, None), ("checkpoint", "end", 1, None)]


def test_a_phase_left_by_an_exception_ends_and_lets_it_through(agent: ChannelServer) -> None:
    with pytest.raises(KeyError), phase("eval"):
        raise KeyError("x")
    got = agent.drain()
    assert [(m["state"], m.get("ok")) for m in got] == [("begin", None), ("end", False)]
    with phase("next"):
        pass
    assert [m["depth"] for m in agent.drain()] == [1, 1]


def test_begin_and_end_of_different_phases_pair_by_seq(agent: ChannelServer) -> None:
    with phase("a"):
        pass
    with phase("b"):
        pass
    a_begin, a_end, b_begin, b_end = agent.drain()
    assert a_begin["seq"] == a_end["seq"] != b_begin["seq"] == b_end["seq"]


@pytest.mark.parametrize("timeout_s", [0, -1, float("inf"), float("nan")])
def test_a_phase_timeout_must_be_positive_and_finite(timeout_s: float) -> None:
    with pytest.raises(ValueError, match="timeout_s"):
        phase("eval", timeout_s=timeout_s)


def test_a_phase_needs_a_name() -> None:
    with pytest.raises(ValueError, match="name"):
        phase("")


# --- delivery when the agent's queue is full or the agent is gone ----------------------


def fill_queue(server: BusyAgent) -> None:
    """Queue as many datagrams as the kernel lets in (net.unix.max_dgram_qlen + 1)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.setblocking(False)
    try:
        while True:
            s.sendto(b'{"kind": "junk"}', "\0" + server.name[1:])
    except BlockingIOError:
        pass
    finally:
        s.close()


def test_a_dropped_progress_is_tried_again_10_ms_later(
        busy_agent: BusyAgent, clock: Clock) -> None:
    agent = busy_agent
    fill_queue(agent)
    progress(1)  # dropped
    assert {m["kind"] for m in agent.drain()} == {"junk"}
    clock.now += 0.005
    progress(2)  # too soon
    clock.now += 0.006
    progress(3)
    assert steps_sent(agent) == [3]


def test_a_phase_mark_waits_for_a_full_queue_to_be_read(busy_agent: BusyAgent) -> None:
    agent = busy_agent
    fill_queue(agent)
    reader = threading.Timer(0.03, agent.drain)  # an agent poll
    reader.start()
    with phase("eval"):
        reader.join()
    got = [(m["name"], m["state"]) for m in agent.drain()]
    assert got == [("eval", "begin"), ("eval", "end")]


def test_with_the_agent_gone_phase_marks_stop_waiting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(channel.ENV_SOCKET, f"@tg-nobody-{uuid.uuid4().hex[:8]}")
    started = time.monotonic()
    with phase("eval"):
        pass
    first = time.monotonic() - started
    started = time.monotonic()
    with phase("eval"):
        pass
    again = time.monotonic() - started
    assert 0.1 < first < 1.0
    assert again < 0.01


# --- the checkpointer marks its blocking parts -----------------------------------------


def test_checkpoint_save_and_load_are_checkpoint_phases(
        agent: ChannelServer, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    from trainguard.checkpoint import Checkpointer

    monkeypatch.setenv("RANK", "0")  # a world of one

    def seen() -> list[tuple[str, str | None]]:
        return [(m["kind"], m.get("state")) for m in agent.drain() if m["kind"] != "imports"]

    begin, end = ("phase", "begin"), ("phase", "end")
    state = {"model": torch.nn.Linear(2, 2)}
    ckpt = Checkpointer(tmp_path / "ckpt", async_save=True, save_on_exit=False)
    assert ckpt.load_latest(state) is None
    assert seen() == [begin, ("no_checkpoint", None), end]
    ckpt.save(1, state)  # staging, in the loop; the write goes on in the background
    ckpt.close()  # waits for the write
    got = seen()
    assert got.count(begin) == got.count(end) in (1, 2)
    assert ("checkpoint_saved", None) in got
    assert ckpt.load_latest(state) == 1
    assert seen() == [begin, ("resumed", None), end]


def test_load_latest_tells_the_agent_once_which_installed_packages_the_script_imported(
        agent: ChannelServer, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    from trainguard.checkpoint import Checkpointer
    from trainguard.worker import imports

    monkeypatch.setenv("RANK", "0")
    monkeypatch.setattr(imports, "_sent", [])
    ckpt = Checkpointer(tmp_path / "ckpt", save_on_exit=False)
    state = {"model": torch.nn.Linear(2, 2)}
    ckpt.load_latest(state)
    ckpt.load_latest(state)
    sent = [m for m in agent.drain() if m["kind"] == "imports"]
    assert len(sent) == 1
    modules = sent[0]["modules"].split(",")
    assert "pytest" in modules and "numpy" in modules  # installed, imported here
    assert not any(m.startswith(("torch", "trainguard", "_")) for m in modules)
