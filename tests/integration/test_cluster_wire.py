"""The controller <-> agent wire with a real agent process over real TCP: the handshake
refuses a wrong token, an agent reconnects after a blip and follows a restarted controller
to its new port, a command is answered once, and an agent without a controller ends."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from trainguard.controller.hub import Hub
from trainguard.handshake import WIRE_VERSION, connect
from trainguard.protocol import AgentConfig, Op
from trainguard.spec import DEFAULT_STEP_PATTERN
from trainguard.wire import Conn, WireError, new_token, write_token


def write_config(d: Path, port: int, token: str, orphan_s: float = 60) -> Path:
    write_token(d / "token", token)
    (d / "controller.json").write_text(json.dumps({"host": "127.0.0.1", "port": port}))
    cfg = AgentConfig.model_validate({
        "run_id": "wire", "controller_file": str(d / "controller.json"),
        "token_file": str(d / "token"), "step_pattern": DEFAULT_STEP_PATTERN,
        "marker": "wiretest", "orphan_timeout_s": orphan_s, "report_interval_s": 0.25})
    path = d / "agent.json"
    path.write_text(cfg.model_dump_json())
    return path


def start_agent(config: Path, node: str = "n0") -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "trainguard.node.main", "--config",
                             str(config), "--node", node], stderr=subprocess.PIPE)


@pytest.fixture
def hub_and_agent(tmp_path: Path) -> Iterator[tuple[Hub, subprocess.Popen[bytes], Path]]:
    token = new_token()
    hub = Hub(token, "127.0.0.1")
    config = write_config(tmp_path, hub.port, token)
    agent = start_agent(config)
    try:
        assert hub.wait_connected(["n0"], 30) == []
        yield hub, agent, tmp_path
    finally:
        agent.kill()
        agent.wait()
        hub.close()


def test_a_connection_without_the_job_token_is_refused(tmp_path: Path) -> None:
    hub = Hub(new_token(), "127.0.0.1")
    try:
        with pytest.raises(WireError, match="refused node n9: wrong job token"):
            connect("127.0.0.1", hub.port, new_token(), "n9", {})
        assert "n9" not in hub.links or not hub.connected("n9")
    finally:
        hub.close()


def test_an_agent_refuses_a_peer_that_does_not_know_the_job_token(tmp_path: Path) -> None:
    """A process that took a dead controller's port gets no command run: the welcome must
    prove the token too."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def impostor() -> None:
        sock, _ = listener.accept()
        conn = Conn(sock)
        conn.send({"type": "challenge", "nonce": "0" * 32, "version": WIRE_VERSION})
        conn.recv(5)
        conn.send({"type": "welcome", "mac": "0" * 64})
        time.sleep(1)
        conn.close()

    t = threading.Thread(target=impostor, daemon=True)
    t.start()
    try:
        with pytest.raises(WireError, match="does not know the job token"):
            connect("127.0.0.1", port, new_token(), "n0", {})
    finally:
        t.join(5)
        listener.close()


def test_an_agent_reports_and_beats_and_answers_commands(
        hub_and_agent: tuple[Hub, subprocess.Popen[bytes], Path]) -> None:
    hub, agent, _ = hub_and_agent
    time.sleep(1.2)
    assert hub.take_reports("n0")  # pushed every report interval
    assert hub.silent_for("n0") < 2.0  # beats every 0.25 s; a loaded machine stalls a second
    link = hub.links["n0"]
    assert link.agent_pid == agent.pid and link.addr == "127.0.0.1"
    reply = hub.call({"n0": (Op.PORT, {})}, 10, 3)["n0"]
    assert reply.ok and 0 < reply.body["port"] < 65536
    bad = hub.call({"n0": ("no-such-op", {})}, 10, 3)["n0"]
    assert not bad.ok and "unknown op" in bad.error and agent.poll() is None


def test_an_agent_reconnects_after_a_blip(
        hub_and_agent: tuple[Hub, subprocess.Popen[bytes], Path]) -> None:
    hub, agent, _ = hub_and_agent
    first = hub.links["n0"].generation
    hub.forget("n0")  # the controller's side of the connection drops
    deadline = time.monotonic() + 10
    while hub.links["n0"].generation == first and time.monotonic() < deadline:
        time.sleep(0.05)
    assert hub.links["n0"].generation == first + 1 and hub.connected("n0")
    assert hub.call({"n0": (Op.PORT, {})}, 10, 3)["n0"].ok
    assert agent.poll() is None


def test_an_agent_follows_a_restarted_controller_to_its_new_port(
        hub_and_agent: tuple[Hub, subprocess.Popen[bytes], Path]) -> None:
    hub, _, d = hub_and_agent
    token = (d / "token").read_text()
    hub.close()
    hub2 = Hub(token, "127.0.0.1")
    try:
        (d / "controller.json").write_text(json.dumps({"host": "127.0.0.1",
                                                      "port": hub2.port}))
        assert hub2.wait_connected(["n0"], 15) == []
        report = hub2.links["n0"].hello_report
        assert report is not None and report.node == "n0"
    finally:
        hub2.close()


def test_a_command_to_a_node_that_stays_away_fails_after_the_grace(
        hub_and_agent: tuple[Hub, subprocess.Popen[bytes], Path]) -> None:
    hub, agent, _ = hub_and_agent
    agent.kill()
    agent.wait()
    t = time.monotonic()
    reply = hub.call({"n0": (Op.PORT, {})}, 30, 1.0)["n0"]
    assert not reply.ok and "unreachable" in reply.error
    assert time.monotonic() - t < 5


def test_an_agent_without_a_controller_ends_after_the_orphan_timeout(tmp_path: Path) -> None:
    hub = Hub(new_token(), "127.0.0.1")
    port = hub.port
    hub.close()  # nobody listens there any more
    agent = start_agent(write_config(tmp_path, port, new_token(), orphan_s=1.0))
    _, err = agent.communicate(timeout=30)
    assert agent.returncode == 3, err
    assert b"no controller for 1s" in err


def test_a_second_agent_for_a_node_is_told_to_end_and_a_replacement_is_welcome(
        hub_and_agent: tuple[Hub, subprocess.Popen[bytes], Path]) -> None:
    """Two agents for one node would each run the commands meant for it: the one that
    serves the node stays, a newcomer ends (exit 4); once the first is gone, a new one is
    welcome."""
    hub, first, d = hub_and_agent
    second = start_agent(d / "agent.json")
    _, err = second.communicate(timeout=30)
    assert second.returncode == 4, err
    assert b"serves node n0" in err
    assert hub.links["n0"].agent_pid == first.pid and hub.connected("n0")
    first.kill()
    first.wait()
    third = start_agent(d / "agent.json")
    try:
        deadline = time.monotonic() + 15
        while hub.links["n0"].agent_pid != third.pid and time.monotonic() < deadline:
            time.sleep(0.05)
        assert hub.links["n0"].agent_pid == third.pid and hub.connected("n0")
    finally:
        third.kill()
        third.wait()
