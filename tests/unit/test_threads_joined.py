"""Background threads are stored by their owner and joined in its close(): none outlives it."""

from __future__ import annotations

import io
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from trainguard.backends import slurm, slurm_cli
from trainguard.controller.hub import Hub
from trainguard.handshake import connect
from trainguard.node import agent as agent_mod
from trainguard.node.agent import NodeAgent
from trainguard.node.logs import ConsoleOptions
from trainguard.spec import DEFAULT_STEP_PATTERN
from trainguard.wire import new_token


def alive(names: set[str], before: set[threading.Thread]) -> list[str]:
    """The threads of these names started since `before` and still alive."""
    return sorted(t.name for t in threading.enumerate() if t not in before and t.name in names)


@pytest.fixture
def before() -> Iterator[set[threading.Thread]]:
    yield set(threading.enumerate())


def wait_for(cond: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_the_hubs_accept_thread_and_every_reader_end_with_close(
        before: set[threading.Thread]) -> None:
    token = new_token()
    hub = Hub(token, "127.0.0.1")
    agent = connect("127.0.0.1", hub.port, token, "n0", {})  # a reader on a live link
    stuck = socket.create_connection(("127.0.0.1", hub.port))  # a reader in its handshake
    try:
        assert hub.wait_connected(["n0"], 10) == []
        # the live link is read by the one link reader; the stuck one has its handshake's
        wait_for(lambda: len(alive({"trainguard-link"}, before)) == 1)
        assert alive({"trainguard-hub", "trainguard-links"}, before) == [
            "trainguard-hub", "trainguard-links"]
        hub.close()
        assert alive({"trainguard-hub", "trainguard-link", "trainguard-links"}, before) == []
    finally:
        agent.close()
        stuck.close()


def test_the_slurm_state_reader_ends_with_close(
        before: set[threading.Thread], monkeypatch: pytest.MonkeyPatch) -> None:
    reads = threading.Event()

    def node_states(**_: object) -> dict[str, str]:
        reads.set()
        time.sleep(0.2)  # close() comes while sinfo runs
        return {"n1": "idle"}

    monkeypatch.setattr(slurm_cli, "available", lambda: True)
    monkeypatch.setattr(slurm_cli, "expand_nodelist", lambda nodelist: ["n1"])
    monkeypatch.setattr(slurm_cli, "node_states", node_states)
    monkeypatch.setattr(slurm, "STATES_EVERY_S", 0.01)
    monkeypatch.setenv("SLURM_JOB_ID", "41")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "n1")
    backend = slurm.SlurmBackend(1, "run", Path("/nonexistent"))
    assert reads.wait(10)
    assert alive({"trainguard-sinfo"}, before) == ["trainguard-sinfo"]
    backend.close()
    assert alive({"trainguard-sinfo"}, before) == []


def test_the_agents_rules_preloader_is_joined_by_close(
        before: set[threading.Thread], monkeypatch: pytest.MonkeyPatch) -> None:
    closing = threading.Event()

    def slow_rules() -> None:  # still loading when close() ends everything else
        closing.wait(10)
        time.sleep(0.2)

    monkeypatch.setattr(agent_mod, "default_trigger", slow_rules)
    monkeypatch.setattr(agent_mod.procs, "become_subreaper", lambda: False)  # not pytest
    agent = NodeAgent("n0", io.StringIO(), ConsoleOptions({}), DEFAULT_STEP_PATTERN,
                      f"threads-{time.monotonic_ns()}")
    assert alive({"trainguard-rules"}, before) == ["trainguard-rules"]
    close_channel = agent._channel.close  # the last thing close() closes

    def channel_closed() -> None:
        close_channel()
        closing.set()

    monkeypatch.setattr(agent._channel, "close", channel_closed)
    agent.close()
    assert alive({"trainguard-rules"}, before) == []
