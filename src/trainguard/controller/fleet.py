"""The job's nodes as one agent: the controller's AgentAPI for a multi-node job.

The fleet keeps the placement (slot = group rank -> node), splits each attempt's command
per slot, fans commands out through the hub, merges the nodes' reports into one, and says
which placed nodes are lost: the agent's process (or Slurm step) ended, its connection has
been down longer than the reconnect grace, or it has been silent past the node timeout.
Every link down at once (of four or more nodes: most) is a "full disruption" (Kubernetes'
word): this controller's side (its network, a stall) is suspect, so links count as lost only
after DISRUPTION_WAIT_S, such nodes are not drained, and the links still down when it ends
get their grace from its end (controller/disruption.py). Node states: states.NodeState.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from trainguard.backends.base import AGENT_ENDED, AgentHandle, Backend
from trainguard.controller.disruption import Disruption
from trainguard.controller.hub import Hub
from trainguard.controller.link_loss import LINK_LOST, Patience, given_up
from trainguard.controller.merger import Merger
from trainguard.controller.peer_copies import PeerCopies
from trainguard.controller.replies import Reply
from trainguard.errors import LaunchError
from trainguard.protocol import (
    ACK_FRAME,
    DumpStacks,
    NodeReport,
    Op,
    RestartRanks,
    StackDump,
    StartWorkers,
    StopWorkers,
    Tell,
)
from trainguard.states import AGENT_TERMINATED, NodeState

log = logging.getLogger(__name__)

START_TIMEOUT_S = 120.0
FALLBACK_PORT = 29500  # torchrun's: an attempt whose rank 0's node was lost at its rendezvous
MIN_POLL_S = 0.05  # poll(wait_s) merges the nodes' reports at most this often, and at
MERGE_S_PER_NODE = 0.00025  # most every 0.5 s at 2,000 nodes (a merge is O(ranks))
DISRUPTION_WAIT_S = 120.0  # every link down at once: how long before any counts as lost


@dataclass
class Node:
    name: str
    state: NodeState
    handle: AgentHandle | None = None
    reason: str | None = None
    times_implicated: int = 0


class Fleet:
    def __init__(self, hub: Hub, backend: Backend, nnodes: int, nproc_per_node: int,
                 node_timeout_s: float, reconnect_grace_s: float,
                 publish: Callable[[Fleet], None]) -> None:
        self.hub, self.backend = hub, backend
        self.nnodes, self.k = nnodes, nproc_per_node
        self.node_timeout_s, self.grace_s = node_timeout_s, reconnect_grace_s
        self._publish = publish
        self.nodes: dict[str, Node] = {n: Node(n, NodeState.SPARE) for n in backend.node_names()}
        self.placement: list[str] = []
        self.moves: dict[int, int] = {}  # slot -> times its ranks moved to another node
        self.merger = Merger()  # the nodes' reports into one
        # whether the recorder holds events the store has not taken yet (StoreWrites.unwritten):
        # the worker messages they came from are not acknowledged meanwhile
        self.acks_held: Callable[[], bool] = lambda: False
        # a spare node found gone (its agent ended or cut off): the controller records it
        self.on_spare_lost: Callable[[str, str], None] = lambda name, why: None
        # the controller's: a stop requested ends a placing command's wait for a disruption
        self.stop_requested: Callable[[], bool] = lambda: False
        self._broken: dict[str, str] = {}  # placed nodes that failed a command: why
        self.lost: dict[str, str] = {}  # lost placed nodes with why, as of the last report
        self.peer: PeerCopies | None = None  # memory snapshots copied to a buddy node
        self._started: list[str] = []  # the placement the last attempt started on
        self.disruption = Disruption(DISRUPTION_WAIT_S)  # every link down at once
        self._polled_at = 0.0

    # -- nodes ----------------------------------------------------------------------------

    def start_agents(self, argv: list[str], names: list[str] | None = None) -> None:
        for name in names or list(self.nodes):
            self.nodes[name].handle = self.backend.start_agent(name, argv)

    def ready(self, name: str) -> bool:
        """In the job, its agent's process alive, connected and heard from lately."""
        n = self.nodes[name]
        return (n.state.usable and n.handle is not None and not n.handle.ended()
                and self.hub.connected(name) and self.hub.silent_for(name) <= self.node_timeout_s)

    def _in_job(self) -> list[str]:
        """Placed nodes not given up: commands go to them even while they reconnect (the
        hub resends after a blip; one gone for good answers with an error)."""
        return [n for n in self.placement if self.nodes[n].state.usable]

    def spares(self) -> tuple[str, ...]:
        return tuple(n for n in self.nodes if n not in self.placement and self.ready(n))

    def place(self, placement: list[str], moved: tuple[int, ...] = ()) -> None:
        for s in moved:
            self.moves[s] = self.moves.get(s, 0) + 1
        self.placement = list(placement)  # published with the moves (the store keeps both)
        for name, node in self.nodes.items():
            if node.state.out:
                continue
            node.state = NodeState.HEALTHY if name in self.placement else NodeState.SPARE
        self.publish()

    def mark(self, name: str, state: NodeState, reason: str | None) -> None:
        node = self.nodes[name]
        node.state, node.reason = state, reason
        self._broken.pop(name, None)
        if state.out:
            self._end_agent(node)
            self.merger.forget(name)
            self.hub.forget(name)
        self.publish()

    def _end_agent(self, node: Node) -> None:
        """What is left of a node out of the job must not rejoin the old world: a lost one's
        agent is killed, and an agent whose link is still up is told to end (an isolated
        one's; a lost one's whose srun ended on Slurm's node failure: walk-through 36 #11)."""
        lost = node.state == NodeState.LOST
        if lost and node.handle is not None:  # nothing to kill once its process (or srun)
            node.handle.kill(wait=False)  # ended; the recovery does not wait on it
        if self.hub.connected(node.name):  # not _call: a handle's end is not its agent's
            self.hub.call({node.name: (Op.EXIT, {"grace_s": 5.0})}, 30,
                          0.0 if lost else self.grace_s,  # a killed agent's hangup: at once
                          self.node_timeout_s)

    def _call(self, calls: dict[str, tuple[Op, dict[str, Any]]], timeout: float,
              placing: bool = False) -> dict[str, Reply]:
        """The hub's call, each node given up on as the judge (`_given_up`) says, asked at
        most every Hub.JUDGE_S: its agent ended (answered at once, with why, not
        "unreachable" after the grace: walk-through 26 F13; also one ending during the call:
        review 41 #2), its link down past the reconnect grace or silent past the node timeout
        while others are heard. `placing` (the rendezvous, a start): a link cut in a full
        disruption as the disruption counts it, none before its wait (review 40 #5, review
        41 #1); else (a stop, a tell, a stack dump) the link as it is: a cut node's workers
        are stopped by the next attempt's start when its agent is back (review 42 #1)."""
        out = {n: Reply(False, {}, self.why_ended(n)) for n in calls if self.agent_ended(n)}
        rest = {n: c for n, c in calls.items() if n not in out}  # (saves the sends)
        if rest:
            patience = Patience.PLACING if placing else Patience.NONE
            out.update(self.hub.call(rest, timeout, judge=partial(self._given_up, patience)))
        return out

    def _given_up(self, patience: Patience, names: list[str]) -> dict[str, str]:
        """One judge for a poll's losses, a spare's and a command's give-ups: its agent
        ended or it failed a command, its link, Slurm's verdict (link_loss.given_up)."""
        waits = patience == Patience.WAIT or (patience == Patience.PLACING
                                              and not self.stop_requested())
        return given_up(names, self.hub.links_now(), self.grace_s, self.node_timeout_s,
                        ended=self._ended, heard_from=self.nodes, live=self._live(),
                        disruption=self.disruption if waits else None,
                        reported=self.backend.bad_nodes())

    def _ended(self, name: str) -> str | None:
        return self._broken.get(name) or (self.why_ended(name) if self.agent_ended(name)
                                          else None)

    def _live(self) -> list[str]:
        return [n for n, node in self.nodes.items() if not node.state.out]

    def agent_ended(self, name: str) -> bool:
        """Whether `name`'s agent process (or the Slurm step running it) has ended."""
        node = self.nodes.get(name)
        return node is not None and node.handle is not None and node.handle.ended()

    def why_ended(self, name: str) -> str:
        """Why `name` is lost once its agent_ended, in its backend's words."""
        h = self.nodes[name].handle
        return h.why_ended() if h is not None else AGENT_ENDED

    def publish(self) -> None:
        self._publish(self)

    def lost_now(self) -> dict[str, str]:
        """Placed nodes that are gone now, with why (controller/link_loss.py)."""
        return self._given_up(Patience.WAIT,
                              [n for n in self.placement if not self.nodes[n].state.out])

    def silent_s(self) -> dict[str, float]:
        """Each placed node's seconds since its agent's last frame: a rank whose node is
        silent has progress nobody could report (hang detection says so)."""
        links = self.hub.links_now()
        return {n: links[n].silent_s for n in self.placement if n in links}

    def heard_ago(self, names: list[str]) -> float:
        """Seconds since the earliest last frame of `names`: a lost node's first sign (its
        silence, its link's end, its agent's death all start after its last frame)."""
        links = self.hub.links_now()
        ago = [links[n].silent_s for n in names if n in links]
        return max((a for a in ago if a != float("inf")), default=0.0)

    def _spares_gone(self) -> dict[str, str]:
        """Spare nodes lost as a placed node would be (its agent ended, its link down past
        the grace or silent past the node timeout; a full disruption waited for): no longer
        spares, so status and a reschedule see it (one judge: link_loss.given_up)."""
        spares = [n for n, node in self.nodes.items()
                  if n not in self.placement and node.state == NodeState.SPARE]
        ending = {n: f"{AGENT_TERMINATED} (a spare)" for n in spares if n in self.merger.ending}
        return {**(self._given_up(Patience.WAIT, spares) if spares else {}), **ending}

    def settle(self) -> dict[str, str]:
        """Lost placed nodes, after waiting out the reconnect grace of any disconnected one
        (a worker failure can be the first sign of a peer node's loss)."""
        deadline = time.monotonic() + self.grace_s + 0.5
        while time.monotonic() < deadline:
            lost = self.lost_now()
            waiting = [n for n in self.placement if n not in lost and self.nodes[n].state.usable
                       and self.hub.disconnected_for(n) > 0]
            if not waiting:
                return lost
            time.sleep(0.1)
        return self.lost_now()

    # -- AgentAPI -------------------------------------------------------------------------

    def rendezvous(self, addr: str, preferred_port: int | None) -> tuple[str, int]:
        first = self.placement[0]
        link = self.hub.links.get(first)
        host = link.addr if link is not None and link.addr else addr
        if preferred_port:
            return host, preferred_port
        reply = self._call({first: (Op.PORT, {})}, 30 + self.disruption.wait_left(), True)[first]
        if not reply.ok and not reply.answered:  # given up on (its link, its agent's end,
            self._broken.setdefault(first, reply.error)  # Slurm), or silent: a node loss,
            return host, FALLBACK_PORT  # the ladder's (review 42 #2: it ended the job)
        if not reply.ok:
            raise LaunchError(f"node {first} cannot offer a rendezvous port: {reply.error}")
        return host, int(reply.body["port"])

    def start_workers(self, cmd: StartWorkers) -> NodeReport:
        self.merger.new_attempt(cmd.attempt)
        if self.peer is not None:  # a moved slot's ranks find their snapshots on the new node
            for old, new in zip(self._started, self.placement, strict=False):
                if old != new:
                    self.peer.restore(old, new)
            self.peer.start()
        self._started = list(self.placement)
        calls = {}
        for slot, name in enumerate(self.placement):
            workers = [a.model_copy(update={"schedule_count": a.schedule_count
                                            + self.moves.get(slot, 0)})
                       for a in cmd.workers if a.rank // self.k == slot]
            node_cmd = cmd.model_copy(update={"workers": workers, "group_rank": slot})
            calls[name] = (Op.START, node_cmd.model_dump(mode="json"))
        # (an agent stops an earlier attempt's workers it still runs first, with cmd.grace_s)
        replies = self._call(calls, START_TIMEOUT_S + cmd.grace_s + self.disruption.wait_left(),
                             True)
        failed = {n: r.error for n, r in replies.items() if not r.ok}
        refused = {n: e for n, e in failed.items() if replies[n].answered}  # by its agent
        if refused and len(refused) == sum(r.answered for r in replies.values()):  # by all
            raise LaunchError("; ".join(f"{n}: {e}" for n, e in refused.items()))  # the job's
        for name, error in failed.items():  # one node's own trouble: it is lost (an ended
            if not self.agent_ended(name):  # agent is, by lost_now itself, with its reason)
                self._broken[name] = (error if error.startswith(LINK_LOST)  # maybe excused
                                      else f"it could not start its workers ({error})")
        self._take(replies)
        self._prepare_spares(cmd)
        return self._merged()

    def _prepare_spares(self, cmd: StartWorkers) -> None:
        """Spares keep standby workers ready for one node's ranks: a pod-level move starts
        the lost node's ranks there warm."""
        spares = self.spares()
        if not spares or not cmd.standby:
            return
        template = cmd.model_copy(update={"workers": cmd.workers[:self.k], "group_rank": 0})
        body = template.model_dump(mode="json")
        for name, reply in self._call({n: (Op.PREPARE, body) for n in spares}, 30).items():
            if not reply.ok:
                log.info("spare %s keeps no standby workers: %s", name, reply.error)

    def poll(self, wait_s: float = 0.0) -> NodeReport:
        if wait_s > 0:  # woken by any frame: thousands of nodes send thousands a second,
            self.hub.wait(wait_s)  # so a merge of every node's facts is rate-limited
            every = max(MIN_POLL_S, MERGE_S_PER_NODE * len(self.nodes))
            while time.monotonic() < self._polled_at + every:  # a merge is O(ranks), a loss
                time.sleep(MIN_POLL_S)  # check O(nodes): a node newly lost ends the wait
                if not set(self.lost_now()) <= set(self.lost):
                    break
        self._polled_at = time.monotonic()
        for name, why in self._spares_gone().items():
            self.mark(name, NodeState.LOST, why)
            self.on_spare_lost(name, why)
        placed = set(self.placement)
        for name, reports in self.hub.take_all_reports().items():
            if name in placed:
                self.merger.fold(name, reports)
            else:  # a spare's reports say it is alive, and its usage
                self.merger.note_usage(name, reports)
        return self._merged()

    def stop_workers(self, cmd: StopWorkers,
                     meanwhile: Callable[[NodeReport], None] | None = None) -> NodeReport:
        live = self._in_job()
        body = cmd.model_dump(mode="json")
        calls = {n: (Op.STOP, body) for n in live}
        replies = (self._call(calls, cmd.grace_s + 60) if meanwhile is None
                   else self._call_polling(calls, cmd.grace_s + 60, meanwhile))
        self._take(replies)
        return self._merged()

    def _call_polling(self, calls: dict[str, tuple[Op, dict[str, Any]]], timeout: float,
                      meanwhile: Callable[[NodeReport], None]) -> dict[str, Reply]:
        """_call from a thread while this one hands `meanwhile` a merge of the reports the
        agents push each second (a stop's grace period: ranks that ignore SIGTERM train on,
        and their progress is recorded as it comes; walk-through 30)."""
        done: list[dict[str, Reply]] = []
        t = threading.Thread(target=lambda: done.append(self._call(calls, timeout)),
                             name="trainguard-call", daemon=True)
        t.start()
        while t.is_alive():
            t.join(1.0)
            if t.is_alive():
                meanwhile(self.poll())
        if not done:  # its traceback is in the log (threading.excepthook)
            raise LaunchError("the call to the node agents failed: see the traceback above")
        return done[0]

    def dump_stacks(self, cmd: DumpStacks) -> list[StackDump]:
        live = self._in_job()
        replies = self._call({n: (Op.DUMP, cmd.model_dump(mode="json")) for n in live},
                             cmd.timeout_s + 30)
        return [StackDump.model_validate(d) for r in replies.values() if r.ok
                for d in r.body.get("dumps", [])]

    def tell(self, cmd: Tell) -> int:
        live = self._in_job()
        replies = self._call({n: (Op.TELL, cmd.model_dump(mode="json")) for n in live},
                             10.0)
        return sum(int(r.body.get("told", 0)) for r in replies.values() if r.ok)

    def restart_ranks(self, cmd: RestartRanks) -> int:
        raise LaunchError("in-process restart runs on one node only for now: a multi-node "
                          "job restarts its ranks as processes")

    def adopt_attempt(self, attempt: int) -> None:
        """A restarted controller watches `attempt` on: the agents' hello reports are its
        first facts."""
        self.merger.new_attempt(attempt)

    def end_agents(self, grace_s: float = 15.0) -> None:
        """Tell every connected agent to stop its workers and end (one whose handle ended
        too: a Slurm step's end leaves its agent running); kill what does not."""
        live = [n for n in self.nodes if self.hub.connected(n)]
        self.hub.call({n: (Op.EXIT, {"grace_s": grace_s}) for n in live}, grace_s + 30,
                      self.grace_s, self.node_timeout_s)
        deadline = time.monotonic() + 10
        for node in self.nodes.values():
            h = node.handle
            while h is not None and not h.ended() and time.monotonic() < deadline:
                time.sleep(0.05)
            if h is not None and not h.ended():
                h.kill()

    def close(self, grace_s: float = 15.0) -> None:
        if self.peer is not None:
            self.peer.close()
        self.end_agents(grace_s)
        self.backend.close()
        self.hub.close()

    # -- reports --------------------------------------------------------------------------

    def _take(self, replies: dict[str, Reply]) -> None:
        """A command's reply reports, after the reports pushed before it (none lost)."""
        for name, r in replies.items():
            if r.ok and "node" in r.body:
                reply = NodeReport.model_validate(r.body)
                self.merger.fold(name, self.hub.take_reports(name, then=reply))

    def _merged(self) -> NodeReport:
        """The merge the loop reads; first the acknowledgements of the last one's messages
        (the loop recorded them before it called again)."""
        due = {} if self.acks_held() else self.merger.acks_due()
        if due:
            self.hub.send_each({n: {"type": ACK_FRAME, "seq": seq, "epoch": epoch}
                                for n, (epoch, seq) in due.items()})
        lost = self.lost = self.lost_now()
        usable = {n for n, node in self.nodes.items() if node.state.usable}
        return self.merger.merged(self.placement, lost, usable).model_copy(
            update={"refused": self.hub.refusals()})
