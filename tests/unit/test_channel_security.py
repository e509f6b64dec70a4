"""Another user cannot take a rank's place on its control channel (walk-through 32 #4): the
rank listened on an abstract name derived from its agent's public socket name, so a process
of another user could bind it first; the rank then could not listen (in-process restart and
step re-execution silently off) and the agent's verdicts went to the squatter. Now the rank's
inbox is one end of a socket pair whose other end it hands to its agent over the worker
channel (SCM_RIGHTS); the agent keeps only ends handed over by, and made by, this job's
processes (SCM_CREDENTIALS, SO_PEERCRED). Real sockets and a real process of another user."""

from __future__ import annotations

import array
import json
import os
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator

import pytest

from trainguard.node.channel import ChannelServer
from trainguard.worker import control
from trainguard.worker.channel import HAND_OVER
from trainguard.worker.contract import ControlKind, control_socket

RESTART = {"kind": "restart", "generation": 2, "master_addr": "127.0.0.1", "master_port": 29501}
# binds an abstract name (as another user when run as root), says so, then prints what it got
SQUAT = """
import os, socket, sys
if os.getuid() == 0:
    os.setgid(65534); os.setuid(65534)
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind("\\0" + sys.argv[1][1:])
print("bound", flush=True)
s.settimeout(float(sys.argv[2]))
try:
    print("got", s.recv(65536).decode(), flush=True)
except OSError:
    print("nothing", flush=True)
"""


@pytest.fixture
def agent(monkeypatch: pytest.MonkeyPatch) -> Iterator[ChannelServer]:
    """A real agent channel, and this process as its rank 1."""
    server = ChannelServer(f"@tg-test-{uuid.uuid4().hex[:8]}")
    monkeypatch.setenv("TRAINGUARD_AGENT_SOCKET", server.name)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setattr(control, "_inbox", None)
    monkeypatch.setattr(control, "_failed", False)
    yield server
    if control._inbox is not None:
        control._inbox.close()
    server.close()


def test_a_name_taken_first_by_another_user_neither_stops_the_rank_nor_gets_its_verdicts(
        agent: ChannelServer) -> None:
    name = control_socket(agent.name, 1)  # the name the rank listened on, public
    squatter = subprocess.Popen([sys.executable, "-c", SQUAT, name, "2"],
                                stdout=subprocess.PIPE, text=True)
    try:
        assert squatter.stdout is not None and squatter.stdout.readline() == "bound\n"
        box = control.inbox()
        assert box is not None  # the rank still hears its agent
        assert agent.tell([1], RESTART) == 1
        got = box.wait(lambda v: True, 5.0)
        assert got is not None and got["kind"] == ControlKind.RESTART
        out, _ = squatter.communicate(timeout=30)
        assert out == "nothing\n"  # the squatter got no verdict
    finally:
        squatter.kill()
        squatter.wait()


def test_a_dead_ranks_inbox_gets_nothing_until_its_next_process_hands_one_over(
        agent: ChannelServer) -> None:
    name = control_socket(agent.name, 1)
    first = control.Inbox(name)
    first.close()  # the rank died
    assert agent.tell([1], RESTART) == 0
    second = control.Inbox(name)  # its replacement
    try:
        assert agent.tell([1], RESTART) == 1
        assert second.wait(lambda v: True, 5.0) is not None
    finally:
        second.close()


def hand_over(agent: ChannelServer, name: str, fd: int) -> None:
    data = json.dumps({"kind": HAND_OVER, "name": name, "pid": os.getpid()}).encode()
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                            array.array("i", [fd]).tobytes())], 0, "\0" + agent.name[1:])


def test_hand_overs_the_agent_refuses_leave_no_fd_open(agent: ChannelServer) -> None:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(30):  # of a name that is none of this agent's ranks'
        hand_over(agent, "@somebody-else-rank-1", theirs.fileno())
    with open(os.devnull) as f:  # a file, not a socket
        hand_over(agent, control_socket(agent.name, 1), f.fileno())
        agent.drain()
    assert len(os.listdir("/proc/self/fd")) == before
    assert agent.tell([1], RESTART) == 0 and agent.dropped == 31
    ours.close()
    theirs.close()


def test_a_hand_over_by_another_user_is_refused(agent: ChannelServer) -> None:
    if os.getuid() != 0:
        pytest.skip("needs root to send as another user")
    send = ("import array, json, os, socket, sys; os.setuid(65534); a, b = socket.socketpair("
            "socket.AF_UNIX, socket.SOCK_DGRAM); s = socket.socket(socket.AF_UNIX, "
            "socket.SOCK_DGRAM); s.sendmsg([json.dumps({'kind': sys.argv[3], 'name': "
            "sys.argv[2]}).encode()], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("
            "'i', [b.fileno()]).tobytes())], 0, '\\0' + sys.argv[1][1:])")
    subprocess.run([sys.executable, "-c", send, agent.name, control_socket(agent.name, 1),
                    HAND_OVER], check=True, timeout=30)
    assert agent.tell([1], RESTART) == 0 and agent.dropped == 1


def test_a_rank_its_agent_does_not_hear_says_so(monkeypatch: pytest.MonkeyPatch,
                                                capfd: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("TRAINGUARD_AGENT_SOCKET", f"@tg-test-gone-{uuid.uuid4().hex[:8]}")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setattr(control, "_inbox", None)
    monkeypatch.setattr(control, "_failed", False)
    assert control.inbox() is None
    err = capfd.readouterr().err
    assert "rank 1: WARNING: cannot hand the agent a way to reach this process" in err
    assert "in-process restart are off" in err
