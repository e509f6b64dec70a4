"""One node's agent process in a multi-node job: `python -m trainguard.node.main`, started by
a backend (launch.py builds its command line), never by hand.

It owns the node's workers through agent.NodeAgent and serves the controller over the wire:
it connects (and reconnects after a blip, re-reading where the controller is), pushes a
NodeReport every report interval (and each second of a stop's grace period, which holds the
serve loop) and a beat every second (also while a command runs), and executes commands. The
worker messages it sends up are kept until the controller acknowledges them, and sent again
after a reconnect (node/outbox.py). A command is identified by its id: a command resent
after a reconnect is answered from memory, never run twice. Without a controller for
`orphan_timeout_s` it stops its workers and ends: a node never trains on for a job nobody
watches.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import socket
import sys
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainguard.console import Writable, consoles
from trainguard.exitcodes import ExitCode
from trainguard.handshake import Superseded, connect
from trainguard.node import peer
from trainguard.node.agent import NodeAgent
from trainguard.node.logs import ConsoleOptions
from trainguard.node.outbox import Outbox
from trainguard.node.ports import free_port
from trainguard.node.term import EXIT_TERMINATED, Termination
from trainguard.protocol import (
    ACK_FRAME,
    HURRY_FRAME,
    AgentConfig,
    DumpStacks,
    NodeReport,
    Op,
    StartWorkers,
    StopWorkers,
    Tell,
)
from trainguard.states import StopCause
from trainguard.wire import Conn, FrameRejected, WireError, read_token

log = logging.getLogger("trainguard.node.agent")

_KEEP_REPLIES = 64


def controller_address(path: Path) -> tuple[str, int] | str:
    """Where the controller listens, or why that cannot be read: a file that another user
    owns or may change is not followed (they would point the agent at a controller of
    theirs: walk-through 32 #8)."""
    try:
        st, dst = path.stat(), path.parent.stat()
        if st.st_uid != os.geteuid() or dst.st_uid != os.geteuid() or \
                (st.st_mode | dst.st_mode) & 0o022:
            return (f"{path} (or its dir) is not this agent's user's alone (owner uid "
                    f"{st.st_uid}, mode {st.st_mode & 0o777:o}; dir owner uid {dst.st_uid}, "
                    f"mode {dst.st_mode & 0o777:o}): not following it")
        doc = json.loads(path.read_text(encoding="utf-8"))
        return str(doc["host"]), int(doc["port"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"cannot read the controller's address from {path} ({e})"


RETRY_FIRST_S, RETRY_MAX_S = 0.2, 2.0  # reconnect backoff: 0.2, 0.4, ... 2 s, with jitter


def retry_wait(tries: int) -> float:
    """The wait before reconnect try `tries` + 1: doubling from RETRY_FIRST_S up to
    RETRY_MAX_S, ±25% at random so a thousand agents do not knock at once."""
    wait: float = min(RETRY_FIRST_S * 2.0 ** min(tries, 16), RETRY_MAX_S)
    return wait * random.uniform(0.75, 1.25)


class AgentRunner:
    def __init__(self, agent: NodeAgent, cfg: AgentConfig, node: str) -> None:
        self.agent, self.cfg, self.node = agent, cfg, node
        self._token = read_token(Path(cfg.token_file))
        self._done: OrderedDict[str, dict[str, Any]] = OrderedDict()
        # while a STOP command runs its grace period, the link is read for a HURRY_FRAME;
        # other frames read then wait here, a link that broke then ends after the stop
        self._conn: Conn | None = None
        self._held: deque[dict[str, Any]] = deque()
        self._broke: WireError | None = None
        self._exit = False
        self._import_cache: dict[Any, Any] = {}
        self._complained = -1e9
        self._superseded = False
        self._outbox = Outbox()  # worker messages sent up and not acknowledged yet
        self.term = Termination(cfg.grace_s)  # a SIGTERM: the cluster ending this step

    def run(self) -> int:
        orphan_since: float | None = None
        tries = 0
        while not self._exit:
            conn = self._connect()
            if conn is None and self._superseded:
                return ExitCode.SUPERSEDED
            if conn is None and self._terminated(connected=False):
                return EXIT_TERMINATED
            if conn is None:
                orphan_since = orphan_since or time.monotonic()
                if time.monotonic() - orphan_since > self.cfg.orphan_timeout_s:
                    log.error("no controller for %.0fs: stopping the workers and ending",
                              self.cfg.orphan_timeout_s)
                    self.agent.stop_workers(StopWorkers(grace_s=15, reason="orphaned"))
                    return ExitCode.ORPHANED
                time.sleep(retry_wait(tries))
                tries += 1
                continue
            orphan_since, tries = None, 0
            self._serve(conn)
            conn.close()
        return EXIT_TERMINATED if self.term.ended else ExitCode.SUCCESS

    def _connect(self) -> Conn | None:
        addr = controller_address(Path(self.cfg.controller_file))
        if isinstance(addr, str):
            self._complain(addr)
            return None
        report = self.agent.snapshot()  # the messages wait for a connection that holds
        hello: dict[str, Any] = {"host": socket.gethostname(), "agent_pid": os.getpid(),
                                 "report": report.model_dump(mode="json")}
        if self.cfg.node_addr:
            hello["addr"] = self.cfg.node_addr
        try:
            conn = connect(addr[0], addr[1], self._token, self.node, hello)
        except Superseded as e:  # a newer agent serves this node: this one ends
            log.error("%s: stopping the workers and ending", e)
            self.agent.stop_workers(StopWorkers(grace_s=15, reason="superseded"))
            self._superseded = True
            return None
        except WireError as e:
            self._complain(str(e))
            return None
        log.info("connected to the controller at %s:%d", *addr)
        return conn

    def _complain(self, why: str) -> None:
        """Why the agent cannot reach its controller, at most every 30 s."""
        if time.monotonic() - self._complained > 30:
            self._complained = time.monotonic()
            log.warning("%s (retrying; controller address in %s)", why,
                        self.cfg.controller_file)

    def _serve(self, conn: Conn) -> None:
        stop = threading.Event()
        beat = threading.Thread(target=self._beat, args=(conn, stop), daemon=True,
                                name="trainguard-beat")
        beat.start()
        next_report = 0.0
        self._conn, self._held, self._broke = conn, deque(), None
        self._outbox.reconnected()
        try:
            while not self._exit and not stop.is_set():
                wait = max(next_report - time.monotonic(), 0.0)
                try:
                    msg: dict[str, Any] | None = (self._held.popleft() if self._held
                                                  else conn.recv(wait))
                except TimeoutError:
                    msg = None
                if msg is not None and msg["type"] == "cmd":
                    conn.send(self._command(msg))
                elif msg is not None and msg["type"] == HURRY_FRAME:  # before its STOP came
                    self.agent.hurry()
                elif msg is not None and msg["type"] == ACK_FRAME and \
                        isinstance(msg.get("seq"), int):
                    self._outbox.acknowledged(msg["seq"], msg.get("epoch"))
                if self._broke is not None:
                    raise self._broke
                if self._terminated(connected=True):
                    break
                if time.monotonic() >= next_report and not self._exit:
                    report = self._outbox.number(self.agent.poll())
                    conn.send({"type": "report", "body": report.model_dump(mode="json")})
                    next_report = time.monotonic() + self.cfg.report_interval_s
        except FrameRejected as e:  # injected, replayed or relayed: the link is not trusted
            log.warning("refused a forged frame from the controller's address: %s "
                        "(reconnecting with a fresh handshake)", e)
        except WireError as e:
            log.warning("lost the controller: %s (reconnecting)", e)
        finally:
            stop.set()
            self._conn = None

    def _terminated(self, connected: bool) -> bool:
        """After a SIGTERM (node/term.py): stop the workers with the job's grace period,
        once; True when this agent is to end (no controller to serve)."""
        if self.term.fresh():
            log.warning("got SIGTERM (the cluster ending this step?): stopping the workers "
                        "(grace period %gs)", self.term.grace_s)
            self.agent.draining = StopCause.OUTSIDE  # 143 a stop; reported: the node leaves
            report = self.agent.stop_workers(
                StopWorkers(grace_s=self.term.grace_s, reason="the agent got SIGTERM"),
                meanwhile=self._report_stopping if connected else None,
                cut_short=self._hurried if connected else lambda: False, by=StopCause.OUTSIDE)
            if connected:  # its messages (a save's commit) go up, kept till acknowledged
                self._report_stopping(report)
            else:  # kept for a controller that connects (none will, mostly: it ends)
                self._outbox.number(report)
        if self.term.at_signal and not connected:
            self._exit = self.term.ended = True
        return self.term.ended

    def _beat(self, conn: Conn, stop: threading.Event) -> None:
        while not stop.wait(self.cfg.heartbeat_s):
            try:
                conn.send({"type": "beat", "at": time.time()})
            except WireError:
                stop.set()

    def _command(self, msg: dict[str, Any]) -> dict[str, Any]:
        cid = msg.get("id")
        if not isinstance(cid, str):
            return {"type": "reply", "id": cid, "ok": False, "error": "no command id"}
        if cid in self._done:  # resent after a reconnect: answered, not run again
            return self._done[cid]
        try:
            body = self._run_op(str(msg.get("op")), msg.get("body") or {})
            reply = {"type": "reply", "id": cid, "ok": True, "body": body}
        except Exception as e:  # the controller gets the error, the agent stays up
            log.exception("command %s failed", msg.get("op"))
            reply = {"type": "reply", "id": cid, "ok": False,
                     "error": f"{type(e).__name__}: {e}"}
        self._done[cid] = reply
        while len(self._done) > _KEEP_REPLIES:
            self._done.popitem(last=False)
        return reply

    def _run_op(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        try:
            op = Op(name)
        except ValueError:
            raise ValueError(f"unknown op {name!r}") from None
        handlers: dict[Op, Callable[[dict[str, Any]], dict[str, Any]]] = {
            Op.START: self._op_start, Op.STOP: self._op_stop, Op.DUMP: self._op_dump,
            Op.PORT: self._op_port, Op.PRECHECK: self._op_precheck, Op.EXIT: self._op_exit,
            Op.TELL: self._op_tell, Op.PREPARE: self._op_prepare,
            Op.PEER_TAKE: self._op_peer_take, Op.PEER_STORE: self._op_peer_store,
            Op.PEER_PIN: self._op_peer_pin, Op.PEER_PERSIST: self._op_peer_persist}
        return handlers[op](body)

    def _op_start(self, body: dict[str, Any]) -> dict[str, Any]:
        return self._outbox.number(self.agent.start_workers(
            StartWorkers.model_validate(body))).model_dump(mode="json")

    def _op_stop(self, body: dict[str, Any]) -> dict[str, Any]:
        return self._outbox.number(self.agent.stop_workers(
            StopWorkers.model_validate(body), meanwhile=self._report_stopping,
            cut_short=self._hurried)).model_dump(mode="json")

    def _report_stopping(self, report: NodeReport) -> None:
        """A report during a stop's grace period, as the serve loop (which waits for this
        stop) would send: ranks that ignore SIGTERM train on, and status shows it."""
        conn = self._conn
        if conn is None or self._broke is not None:
            return
        try:
            conn.send({"type": "report",
                       "body": self._outbox.number(report).model_dump(mode="json")})
        except WireError as e:  # a lost link: the serve loop's, after this stop
            self._broke = e

    def _hurried(self) -> bool:
        """Polled through a stop's grace period: did the controller send a HURRY_FRAME (a
        second Ctrl-C)? The serve loop, which would read it, waits for this stop."""
        conn = self._conn
        if conn is None or self._broke is not None:
            return False
        try:
            msg = conn.recv(0)
        except TimeoutError:
            return False
        except WireError as e:  # a forged frame or a lost link: the serve loop's, after this
            self._broke = e
            return False
        if msg.get("type") == HURRY_FRAME:
            return True
        self._held.append(msg)
        return False

    def _op_dump(self, body: dict[str, Any]) -> dict[str, Any]:
        dumps = self.agent.dump_stacks(DumpStacks.model_validate(body))
        return {"dumps": [d.model_dump(mode="json") for d in dumps]}

    def _op_tell(self, body: dict[str, Any]) -> dict[str, Any]:
        return {"told": self.agent.tell(Tell.model_validate(body))}

    def _op_prepare(self, body: dict[str, Any]) -> dict[str, Any]:
        self.agent.prepare(StartWorkers.model_validate(body))
        return {}

    def _op_peer_take(self, body: dict[str, Any]) -> dict[str, Any]:
        region = self.agent.memory.path
        if body.get("list"):
            return {"steps": peer.steps(region)}
        if body.get("entries"):
            return {"entries": peer.entries(region)}
        if "tails" in body:
            have = {int(r): int(g) for r, g in dict(body["tails"] or {}).items()}
            only = body.get("only")
            return {"tails": peer.tails(region, have, None if only is None
                                        else [int(i) for i in only])}
        step = body.get("step")
        chunk = peer.take(region, bool(body.get("peer")), int(body["rank"]),
                          None if step is None else int(step), int(body.get("offset") or 0))
        return chunk or {}

    def _op_peer_pin(self, body: dict[str, Any]) -> dict[str, Any]:
        if self.agent.memory.persisting():  # a pinned step is being saved: keep it
            return {"refused": "persisting the pinned snapshots"}
        peer.pin(self.agent.memory.path, [int(s) for s in body["steps"]])
        return {}

    def _op_peer_persist(self, body: dict[str, Any]) -> dict[str, Any]:
        region = self.agent.memory.path
        ranks = {int(r): str(peer.where(region, bool(p)))
                 for r, p in dict(body["ranks"]).items()}
        return {"started": self.agent.persist_part(int(body["step"]), ranks,
                                                   str(body["token"]), str(body["source"]))}

    def _op_peer_store(self, body: dict[str, Any]) -> dict[str, Any]:
        whole = peer.store(self.agent.memory.path, bool(body.get("peer")), body,
                           str(body.get("origin") or ""))
        return {"whole": whole}

    def _op_port(self, body: dict[str, Any]) -> dict[str, Any]:
        return {"port": free_port("")}

    def _op_precheck(self, body: dict[str, Any]) -> dict[str, Any]:
        from trainguard.node.precheck import run_precheck
        from trainguard.policy.precheck import PrecheckConfig

        report = run_precheck(PrecheckConfig.model_validate(body), self.node,
                              import_cache=self._import_cache)
        return report.model_dump(mode="json")

    def _op_exit(self, body: dict[str, Any]) -> dict[str, Any]:
        self.agent.stop_workers(StopWorkers(grace_s=float(body.get("grace_s", 15)),
                                            reason="the job ended"))
        self._exit = True
        return {}


def node_name(given: str | None) -> str:
    return given or os.environ.get("SLURMD_NODENAME") or socket.gethostname()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="trainguard agent",
                                description="a node agent of a multi-node job (started by "
                                            "the job's backend, not by hand)")
    p.add_argument("--config", type=Path, required=True, help="JOB_DIR/cluster/agent.json")
    p.add_argument("--node", help="this node's name (default: $SLURMD_NODENAME or hostname)")
    ns = p.parse_args(argv)
    with consoles() as (out, err):  # writes that never wait for the console (console.py)
        logging.basicConfig(level=logging.INFO, stream=err, force=True,
                            format="[trainguard-agent %(asctime)s] %(levelname)s %(message)s")
        return _serve_node(ns, out)


def _serve_node(ns: argparse.Namespace, out: Writable) -> int:
    try:
        cfg = AgentConfig.model_validate_json(ns.config.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        print(f"trainguard agent: error: cannot read {ns.config}: {e}", file=sys.stderr)
        return ExitCode.USAGE
    node = node_name(ns.node)
    agent = NodeAgent(node, out, ConsoleOptions.of(cfg.redirects, cfg.ranks_filter),
                      cfg.step_pattern, f"{cfg.marker}-{node}")
    try:
        runner = AgentRunner(agent, cfg, node)
        runner.term.install()
        return runner.run()
    except WireError as e:
        print(f"trainguard agent: error: {e}", file=sys.stderr)
        return ExitCode.USAGE
    finally:
        agent.close()


if __name__ == "__main__":
    sys.exit(main())
