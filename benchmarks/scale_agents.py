"""One controller, many node agents: `python benchmarks/scale_agents.py [--agents 2000]`.

Simulated agents (real TCP sockets on loopback, the real HMAC handshake and authenticated
frames, a NodeReport of `--ranks` workers every `--report-interval` and a beat every second,
as node/main.py sends them) run in `--procs` helper processes against one real Hub and
Fleet in this process, whose watch loop polls the fleet and asks which nodes are lost, as
the controller's does. Printed: time until every agent is connected, this process's CPU per
second and memory at the report rate, how long one disconnected node and one silent node
take to count as lost (`--trials` of each), and a full disruption (every link cut at once:
nodes counted lost, drained), with the machine's load average before and after (the figures
are this process's share of the machine). The helper processes run at `--agents-nice` (10):
they stand for 2,000 other machines, and at the controller's own priority they would take
the CPU it has on a head node of its own. Standard library, psutil and trainguard only.
"""

from __future__ import annotations

import argparse
import os
import resource
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import psutil

from trainguard.controller.fleet import Fleet
from trainguard.controller.hub import Hub
from trainguard.handshake import connect
from trainguard.policy.nodes import lost_isolation
from trainguard.protocol import NodeReport, Progress, RankLiveness, WorkerFact, report_interval
from trainguard.states import NodeState, WorkerState
from trainguard.wire import Conn, WireError, new_token

NODE_TIMEOUT_S, GRACE_S = 10.0, 3.0
MARK_STEP = 10**9


def node_report(name: str, ranks: int) -> dict[str, Any]:
    now = datetime.now(timezone.utc)
    return NodeReport(
        node=name, attempt=0, at=now,
        workers=[WorkerFact(rank=r, node=name, local_rank=r, pid=10_000 + r,
                            state=WorkerState.RUNNING, started_at=now) for r in range(ranks)],
        progress=Progress(first_step=1, first_step_at=now, last_step=100, last_step_at=now),
        liveness=[RankLiveness(rank=r, intervals=[0.1]) for r in range(ranks)],
    ).model_dump(mode="json")


# -- the simulated agents (helper processes) -------------------------------------------------

def run_agents(port: int, token: str, names: list[str], interval: float, ranks: int) -> None:
    """Connect each agent (retrying), then push reports and beats until the parent goes."""
    parent = os.getppid()
    conns: list[Conn] = []
    for name in names:
        for _ in range(600):
            try:
                conns.append(connect("127.0.0.1", port, token, name, {"agent_pid": os.getpid()},
                                     timeout=10))
                break
            except WireError:
                time.sleep(0.05)
    sel = selectors.DefaultSelector()
    for c in conns:
        sel.register(c.sock, selectors.EVENT_READ)
    bodies = [{"type": "report", "body": node_report(n, ranks)} for n in names]
    next_report = next_beat = time.monotonic()
    while os.getppid() == parent:
        now = time.monotonic()
        if now >= next_report:
            at = datetime.now(timezone.utc).isoformat()  # stamped when sent, as agents do
            for c, body in zip(conns, bodies, strict=False):
                body["body"]["at"] = at
                _send(c, body)
            next_report = max(next_report + interval, now)
        if now >= next_beat:
            for c in conns:
                _send(c, {"type": "beat", "at": time.time()})
            next_beat = now + 1.0
        for key, _ in sel.select(max(min(next_report, next_beat) - time.monotonic(), 0)):
            if not key.fileobj.recv(65536):  # type: ignore[union-attr]
                sel.unregister(key.fileobj)


def _send(conn: Conn, msg: dict[str, Any]) -> None:
    try:
        conn.send(msg)
    except WireError as e:  # the controller fell behind by SEND_TIMEOUT_S: say so, go on
        print(f"agent: {e}", file=sys.stderr)


# -- the controller side -------------------------------------------------------------------

@dataclass
class Handle:
    node: str
    pid: int | None = None

    def ended(self) -> bool:
        return False

    def kill(self) -> None:
        return None


@dataclass
class Backend:
    names: list[str]
    name: str = "bench"
    drained: int = 0

    def node_names(self) -> list[str]:
        return list(self.names)

    def start_agent(self, node: str, argv: list[str]) -> Handle:
        return Handle(node)

    def adopt_agent(self, node: str, pid: int | None) -> Handle:
        return Handle(node, pid)

    def bad_nodes(self) -> dict[str, str]:
        return {}

    def isolate(self, node: str, reason: str) -> str:
        self.drained += 1
        return "drained"

    def close(self) -> None:
        return None


class LocalAgent:
    """Agents in this process (node-0, node-1, ...), to cut or silence one on cue."""

    def __init__(self, port: int, token: str, name: str, interval: float, ranks: int) -> None:
        self.name = name
        self.conn = connect("127.0.0.1", port, token, name, {"agent_pid": os.getpid()})
        self.body = {"type": "report", "body": node_report(name, ranks)}
        self.silent = threading.Event()
        self.last_sent = time.monotonic()
        self.interval = interval
        self.thread = threading.Thread(target=self._push, daemon=True)
        self.thread.start()

    def _push(self) -> None:
        """A report every interval and a beat every second, as node/main.py sends them."""
        next_report = time.monotonic() + self.interval
        while not self.silent.wait(1.0):
            try:
                self.conn.send({"type": "beat", "at": time.time()})
                if time.monotonic() >= next_report:
                    self.body["body"]["at"] = datetime.now(timezone.utc).isoformat()
                    self.conn.send(self.body)
                    next_report += self.interval
                self.last_sent = time.monotonic()
            except WireError:
                return


class _Capture:
    """Stands for a socket: keeps what Conn.send would have sent."""

    def __init__(self) -> None:
        self.frames: list[bytes] = []

    def sendall(self, data: bytes) -> None:
        self.frames.append(data)


def parse_cost(ranks: int, n: int = 2000) -> tuple[float, float]:
    """CPU seconds the reader spends on one beat and on one report (MAC, JSON, validation),
    without sockets: what one Python thread can take."""
    listener = socket.create_server(("127.0.0.1", 0))
    with listener, socket.create_connection(listener.getsockname()) as a:
        b, _ = listener.accept()
        tx, rx = Conn(a), Conn(b)
        key = b"k" * 32
        tx.secure(key, controller_side=False)
        rx.secure(key, controller_side=True)
        out = _Capture()
        tx.sock = out  # type: ignore[assignment]
        for _ in range(n):
            tx.send({"type": "beat", "at": time.time()})
        beats, out.frames = out.frames, []
        for _ in range(n // 4):
            tx.send({"type": "report", "body": node_report("node-0", ranks)})
        t = time.process_time()
        for f in beats:
            rx.feed(f)
        beat = (time.process_time() - t) / len(beats)
        t = time.process_time()
        for f in out.frames:
            for m in rx.feed(f):
                NodeReport.model_validate(m["body"])
        report = (time.process_time() - t) / len(out.frames)
        b.close()
        return beat, report


def cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def watch_until(fleet: Fleet, done: Any, limit_s: float) -> tuple[float, dict[str, str]]:
    """Run the controller's watch loop until done(lost) or limit_s: the seconds it took,
    and the lost nodes then."""
    t0, lost = time.monotonic(), {}
    while time.monotonic() - t0 < limit_s:
        fleet.poll(0.1)
        lost = fleet.lost_now()
        if done(lost):
            break
    return time.monotonic() - t0, lost


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--agents", type=int, default=2000)
    p.add_argument("--procs", type=int, default=8, help="helper processes for the agents")
    p.add_argument("--ranks", type=int, default=8, help="workers per simulated node")
    p.add_argument("--report-interval", type=float,
                   help="default: what the launcher gives agents (protocol.report_interval)")
    p.add_argument("--seconds", type=float, default=15.0, help="steady-state measurement")
    p.add_argument("--disruption-wait", type=float, default=15.0)
    p.add_argument("--trials", type=int, default=1,
                   help="nodes disconnected, and nodes silenced, one after the other")
    p.add_argument("--agents-nice", type=int, default=10,
                   help="the helper processes' niceness (0: compete with the controller)")
    p.add_argument("--worker", nargs=4, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.report_interval is None:
        a.report_interval = report_interval(a.agents, 0.25)
    if a.worker:
        port, token, first, count = a.worker
        mine = [f"node-{i}" for i in range(int(first), int(first) + int(count))]
        run_agents(int(port), token, mine, a.report_interval, a.ranks)
        return 0
    token = new_token()
    hub = Hub(token, "127.0.0.1")
    names = [f"node-{i}" for i in range(a.agents)]
    backend = Backend(names)
    fleet = Fleet(hub, backend, a.agents, a.ranks, NODE_TIMEOUT_S, GRACE_S,  # type: ignore[arg-type]
                  lambda _: None)
    fleet.start_agents([])
    fleet.place(names)
    fleet.adopt_attempt(0)
    fleet.disruption.wait_s = a.disruption_wait
    rows: list[tuple[str, str]] = [("load average (1 min) before", load())]
    t0 = time.monotonic()
    own = 2 * a.trials + 1  # a node cut and a node silenced per trial, and a probe
    local = [LocalAgent(hub.port, token, n, a.report_interval, a.ranks) for n in names[:own]]
    rest = a.agents - own
    per = -(-rest // a.procs)
    # the agents stand for other machines: at --agents-nice they leave this process (the
    # controller under test) the CPU a head node of its own would give it
    procs = [subprocess.Popen(["nice", "-n", str(a.agents_nice), sys.executable, __file__,
                               "--worker", str(hub.port), token,
                               str(own + i * per), str(min(per, rest - i * per)),
                               "--report-interval", str(a.report_interval),
                               "--ranks", str(a.ranks)])
             for i in range(a.procs) if rest - i * per > 0]
    missing = hub.wait_connected(names, 300)
    rows.append(("agents connected", f"{a.agents - len(missing)} of {a.agents} in "
                                     f"{time.monotonic() - t0:.1f} s"))
    _, early = watch_until(fleet, bool, 3.0)  # warm up: nothing is lost
    if early:
        rows.append(("lost while warming up", f"{len(early)}: {next(iter(early.values()))}"))
    c0, w0, loop0 = cpu_s(), time.monotonic(), time.thread_time()
    watch_until(fleet, lambda _: False, a.seconds)
    wall = time.monotonic() - w0
    cpu, loop = (cpu_s() - c0) / wall, (time.thread_time() - loop0) / wall
    rate = a.agents / a.report_interval
    rows.append(("controller CPU at the report rate",
                 f"{cpu:.2f} cores ({rate:,.0f} reports/s (every {a.report_interval:g} s) + "
                 f"{a.agents:,} beats/s, {a.ranks} ranks each); its loop thread (fold, "
                 f"merge, loss check) {loop:.2f} cores"))
    probe = local[-1]  # a report with a step no other node reached: when is it merged?
    mark = node_report(probe.name, a.ranks)
    mark["progress"]["last_step"] = MARK_STEP
    probe.body = {"type": "report", "body": mark}  # its next reports too
    sent = time.monotonic()
    probe.conn.send(probe.body)
    while (fleet.poll(0.1).progress.last_step or 0) < MARK_STEP:
        if time.monotonic() - sent > 60:
            break
    rows.append(("a report's way through (read, parse, merge)",
                 f"{time.monotonic() - sent:.2f} s"))
    beat, report = parse_cost(a.ranks)
    rows.append(("parsing alone (MAC, JSON, validation)",
                 f"{beat * 1e6:.0f} us a beat, {report * 1e6:.0f} us a report: "
                 f"{a.agents * beat + rate * report:.2f} cores at this rate"))
    rss = psutil.Process().memory_info().rss / 2**20
    rows.append(("controller memory (RSS)", f"{rss:,.0f} MiB, {threading.active_count():,} "
                                            f"threads, {len(os.listdir('/proc/self/fd')):,} fds"))
    for i in range(a.trials):
        cut, hushed = local[2 * i], local[2 * i + 1]
        cut.conn.close()  # one node's link drops
        took, lost = watch_until(fleet, lambda lost, n=cut.name: n in lost, 60)
        down = hub.disconnected_for(cut.name)  # since the hub saw the hangup
        rows.append(("one node disconnected -> lost",
                     f"{took:.1f} s (reconnect grace {GRACE_S:g} s; hangup seen after "
                     f"{took - down:.2f} s, verdict {down - GRACE_S:.2f} s after the grace; "
                     f"{len(lost)} lost: {lost.get(cut.name)})"))
        fleet.mark(cut.name, NodeState.LOST, "bench")
        hushed.silent.set()  # one node goes silent, its link open
        took, lost = watch_until(fleet, lambda lost, n=hushed.name: n in lost, 60)
        since, quiet = time.monotonic() - hushed.last_sent, hub.silent_for(hushed.name)
        rows.append(("one node silent -> lost",
                     f"{since:.1f} s after its last frame (node timeout {NODE_TIMEOUT_S:g} s;"
                     f" frame seen after {since - quiet:.2f} s, verdict "
                     f"{quiet - NODE_TIMEOUT_S:.2f} s after the timeout; {len(lost)} lost: "
                     f"{lost.get(hushed.name)})"))
        fleet.mark(hushed.name, NodeState.LOST, "bench")
    for pr in procs:  # every link cut at once
        pr.send_signal(signal.SIGKILL)
    for pr in procs:
        pr.wait()
    held, lost = watch_until(fleet, lambda now: bool(now), a.disruption_wait + 10)
    drained = sum(lost_isolation(n, w, fleet.disruption.suspect(n)).drain
                  for n, w in lost.items())
    rows.append(("full disruption (every link cut)",
                 f"no node lost for {held:.1f} s (wait {a.disruption_wait:g} s), then "
                 f"{len(lost):,} lost, {drained} drained; "
                 f"{next(iter(lost.values()), '')}"))
    hub.close()
    rows.append(("load average (1 min) after", load()))
    width = max(len(k) for k, _ in rows)
    print(f"\n{'measure':<{width}}  value\n{'-' * width}  {'-' * 40}")
    for k, v in rows:
        print(f"{k:<{width}}  {v}")
    print(f"\n{os.cpu_count()} CPUs; {platform_line()}")
    return 0


def load() -> str:
    return f"{os.getloadavg()[0]:.2f} ({os.cpu_count()} CPUs)"


def platform_line() -> str:
    import platform

    return f"Python {platform.python_version()}, {platform.platform(terse=True)}"


if __name__ == "__main__":
    sys.exit(main())
