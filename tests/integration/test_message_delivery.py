"""A worker message is not lost with a controller that dies before recording it: a real
agent process keeps what its controller did not acknowledge and sends it again, marked
resent, to the next controller (node/outbox.py); what was acknowledged is not sent again."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from tests.integration.test_cluster_wire import start_agent, write_config
from trainguard.controller.hub import Hub
from trainguard.protocol import (
    ACK_FRAME,
    NodeReport,
    Op,
    StartWorkers,
    StopWorkers,
    WorkerAssignment,
    WorkerMessage,
)
from trainguard.wire import new_token

WORKER = """
import pathlib, sys, time
from trainguard.worker.channel import send
from trainguard.worker.contract import MessageKind
go = pathlib.Path(sys.argv[1])
send(MessageKind.CHECKPOINT_SAVED, step=10, location="/ck/10")
while not go.exists():
    time.sleep(0.05)
send(MessageKind.CHECKPOINT_SAVED, step=20, location="/ck/20")
time.sleep(120)
"""


def start(d: Path) -> StartWorkers:
    return StartWorkers(
        run_id="wire", attempt=0, argv=[sys.executable, "-c", WORKER, str(d / "go")], env={},
        workers=[WorkerAssignment(rank=0, local_rank=0, start_count=1, schedule_count=1)],
        world_size=1, group_rank=0, group_world_size=1, master_addr="127.0.0.1", standby=False,
        master_port=29999, max_restarts=0, grace_s=1, log_dir=str(d / "logs"), job_dir=str(d),
        checkpoint_dir=str(d / "ck"))


def saves_until(hub: Hub, found: Callable[[list[tuple[NodeReport, WorkerMessage]]], bool],
                timeout: float = 30, first: tuple[NodeReport, ...] = ()
                ) -> list[tuple[NodeReport, WorkerMessage]]:
    """Every checkpoint message the agent sent (`first`: in a command's reply, then pushed),
    until `found` says enough."""
    got: list[tuple[NodeReport, WorkerMessage]] = []
    deadline = time.monotonic() + timeout
    reports = list(first)
    while time.monotonic() < deadline:
        reports += hub.take_reports("n0")
        got += [(r, m) for r in reports for m in r.messages if m.kind == "checkpoint_saved"]
        reports = []
        if found(got):
            return got
        hub.wait(0.2)
    raise AssertionError(f"not found in {timeout}s: {[(r.seq, m) for r, m in got]}")


def steps(got: list[tuple[NodeReport, WorkerMessage]]) -> list[tuple[int, bool]]:
    return [(m.data["step"], m.resent) for _, m in got]


def test_a_message_a_dead_controller_never_acknowledged_reaches_the_next_one(
        tmp_path: Path) -> None:
    token = new_token()
    hub = Hub(token, "127.0.0.1")
    agent = start_agent(write_config(tmp_path, hub.port, token))
    hub2 = None
    try:
        assert hub.wait_connected(["n0"], 30) == []
        reply = hub.call({"n0": (Op.START, start(tmp_path).model_dump(mode="json"))}, 60, 5)
        assert reply["n0"].ok, reply["n0"].error
        got = saves_until(hub, lambda g: len(g) >= 1,
                          first=(NodeReport.model_validate(reply["n0"].body),))
        assert steps(got) == [(10, False)] and got[0][0].seq is not None
        hub.send_each({"n0": {"type": ACK_FRAME, "seq": got[0][0].seq,  # step 10 recorded
                              "epoch": got[0][0].epoch}})
        time.sleep(2.0)  # the acknowledgement reaches the agent before step 20 is sent (it
        # reads frames between reports, 0.25 s apart; generous for a loaded machine)
        (tmp_path / "go").touch()
        got = saves_until(hub, lambda g: len(g) >= 1)
        assert steps(got) == [(20, False)] and got[0][0].epoch == agent.pid
        # an acknowledgement meant for another agent process of the node is ignored
        hub.send_each({"n0": {"type": ACK_FRAME, "seq": got[0][0].seq, "epoch": 1}})
        time.sleep(1.0)
        hub.close()  # the controller dies with step 20 read, not recorded, not acknowledged
        hub2 = Hub(token, "127.0.0.1")
        (tmp_path / "controller.json").write_text(json.dumps({"host": "127.0.0.1",
                                                              "port": hub2.port}))
        assert hub2.wait_connected(["n0"], 30) == []
        got = saves_until(hub2, lambda g: len(g) >= 1)
        assert steps(got) == [(20, True)]  # step 10, acknowledged, is not sent again
        assert got[0][1].id is not None and got[0][1].attempt == 0  # what makes it once
        hub2.send_each({"n0": {"type": ACK_FRAME, "seq": got[0][0].seq,
                               "epoch": got[0][0].epoch}})
        time.sleep(0.5)
        hub2.forget("n0")  # a blip: nothing left to send again
        deadline = time.monotonic() + 15
        while not hub2.connected("n0") and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(1.0)
        assert [m for r in hub2.take_reports("n0") for m in r.messages
                if m.kind == "checkpoint_saved"] == []
        stop = StopWorkers(grace_s=2, reason="test").model_dump(mode="json")
        assert hub2.call({"n0": (Op.STOP, stop)}, 30, 5)["n0"].ok
    finally:
        agent.kill()
        agent.wait()
        hub.close()
        if hub2 is not None:
            hub2.close()
        subprocess.run(["pkill", "-f", str(tmp_path / "go")], check=False)
