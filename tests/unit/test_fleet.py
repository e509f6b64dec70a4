"""The fleet's own logic with fakes of its I/O (hub, backend): per-slot commands, merged
reports, loss detection, placement and schedule counts."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import trainguard.controller.fleet as fleet_module
from trainguard.controller.disruption import Disruption
from trainguard.controller.fleet import START_TIMEOUT_S, Fleet
from trainguard.controller.link_loss import excused
from trainguard.controller.links import LinkState
from trainguard.controller.nodes import NodeRecovery, placement_text
from trainguard.controller.replies import Judge, Reply
from trainguard.errors import LaunchError
from trainguard.policy.nodes import lost_isolation
from trainguard.protocol import (
    NodeReport,
    Op,
    Progress,
    RankLiveness,
    StartWorkers,
    WorkerAssignment,
    WorkerFact,
    WorkerMessage,
)
from trainguard.states import NodeState, WorkerState

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


@dataclass
class FakeLink:
    addr: str
    host: str = ""


@dataclass
class FakeHub:
    connected_nodes: set[str]
    links: dict[str, FakeLink] = field(default_factory=dict)
    reports: dict[str, list[NodeReport]] = field(default_factory=dict)
    calls: list[dict[str, tuple[str, dict[str, Any]]]] = field(default_factory=list)
    frames: list[dict[str, dict[str, Any]]] = field(default_factory=list)
    disconnected: dict[str, float] = field(default_factory=dict)
    silent: dict[str, float] = field(default_factory=dict)
    timeouts: list[float] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)  # a node's agent answers this

    def refusals(self) -> dict[str, int]:
        return {"handshake": 0, "over_budget": 0, "forged_frame": 0}

    def connected(self, name: str) -> bool:
        return name in self.connected_nodes

    def disconnected_for(self, name: str) -> float:
        return self.disconnected.get(name, 0.0)

    def silent_for(self, name: str) -> float:
        return self.silent.get(name, 0.1)

    def take_reports(self, name: str, then: NodeReport | None = None) -> list[NodeReport]:
        return [*self.reports.pop(name, []), *([] if then is None else [then])]

    def take_all_reports(self) -> dict[str, list[NodeReport]]:
        out, self.reports = self.reports, {}
        return out

    def links_now(self) -> dict[str, LinkState]:
        return {n: LinkState(self.connected(n), self.silent_for(n), self.disconnected_for(n))
                for n in self.links}

    def wait(self, timeout: float) -> None:
        return None

    def forget(self, name: str) -> None:
        self.connected_nodes.discard(name)

    def send_each(self, frames: dict[str, dict[str, Any]]) -> None:
        self.frames.append(frames)

    def call(self, calls: dict[str, tuple[str, dict[str, Any]]], timeout: float,
             lost_after_s: float = 0.0, silent_after_s: float | None = None,
             judge: Judge | None = None) -> dict[str, Reply]:
        """As Hub.call: a connected node answers; one given up on (by `judge`, asked each
        round, or else down past `lost_after_s`) answers why; the rest time out. Two rounds,
        `between_rounds` run after the first."""
        self.calls.append(calls)
        self.timeouts.append(timeout)
        out: dict[str, Reply] = {}
        for round_ in range(2):
            awaited = [n for n in calls if n not in out]
            given = judge(awaited) if judge is not None else {
                n: f"node {n} is unreachable" for n in awaited
                if self.disconnected_for(n) > lost_after_s}
            for name in awaited:
                if name in given:
                    out[name] = Reply(False, {}, given[name])
                elif self.connected(name):
                    out[name] = self.answer(name, *calls[name])
            if round_ == 0:
                self.between_rounds()
        return {n: out.get(n, Reply(False, {}, f"node {n} did not answer within "
                                               f"{timeout:.0f}s")) for n in calls}

    def between_rounds(self) -> None:
        return None

    def answer(self, name: str, op: str, body: dict[str, Any]) -> Reply:
        if name in self.errors:
            return Reply(False, {}, self.errors[name], answered=True)
        if op != Op.START:
            return Reply(True, {}, answered=True)
        cmd = StartWorkers.model_validate(body)
        return Reply(True, report(name, cmd.attempt, [w.rank for w in cmd.workers])
                     .model_dump(mode="json"), answered=True)


@dataclass
class FakeHandle:
    node: str
    dead: bool = False
    killed: bool = False
    waited: bool | None = None
    why: str = "its agent process ended"

    @property
    def pid(self) -> int | None:
        return 1

    def ended(self) -> bool:
        return self.dead

    def why_ended(self) -> str:
        return self.why

    def cancelled(self) -> str | None:
        return None

    def kill(self, wait: bool = True) -> None:
        self.killed, self.waited = True, wait


@dataclass
class FakeBackend:
    names: list[str]
    bad: dict[str, str] = field(default_factory=dict)
    name: str = "local"

    def node_names(self) -> list[str]:
        return list(self.names)

    def start_agent(self, node: str, argv: list[str]) -> FakeHandle:
        return FakeHandle(node)

    def adopt_agent(self, node: str, pid: int | None) -> FakeHandle:
        return FakeHandle(node)

    def bad_nodes(self) -> dict[str, str]:
        return dict(self.bad)

    def isolate(self, node: str, reason: str) -> str:
        return "kept out"

    def close(self) -> None:
        return None


def report(node: str, attempt: int | None, ranks: list[int], last: int | None = None,
           messages: int = 0, intervals: tuple[float, ...] = (),
           implied: tuple[float, ...] = ()) -> NodeReport:
    return NodeReport(
        node=node, attempt=attempt, at=T0,
        workers=[WorkerFact(rank=r, node=node, local_rank=r % 2, pid=100 + r,
                            state=WorkerState.RUNNING) for r in ranks],
        progress=Progress(first_step=1 if last else None, first_step_at=T0 if last else None,
                          last_step=last, last_step_at=T0 if last else None),
        messages=[WorkerMessage(kind="progress", rank=ranks[0], at=T0) for _ in range(messages)],
        liveness=[RankLiveness(rank=r, intervals=list(intervals),
                               implied_intervals=list(implied)) for r in ranks])


def fleet(names: tuple[str, ...] = ("a", "b", "c")) -> tuple[Fleet, FakeHub, FakeBackend]:
    hub = FakeHub(set(names), {n: FakeLink(f"10.0.0.{i}") for i, n in enumerate(names)})
    backend = FakeBackend(list(names))
    f = Fleet(hub, backend, nnodes=2, nproc_per_node=2, node_timeout_s=10,  # type: ignore[arg-type]
              reconnect_grace_s=3, publish=lambda _: None)
    f.start_agents(["agent"])
    f.place(["a", "b"])
    return f, hub, backend


def start_cmd(attempt: int = 0) -> StartWorkers:
    return StartWorkers(
        run_id="r", attempt=attempt, argv=["x"], env={}, world_size=4, group_rank=0,
        group_world_size=2, master_addr="10.0.0.0", master_port=1, max_restarts=0, grace_s=1,
        log_dir="/l", job_dir="/j", checkpoint_dir="/c",
        workers=[WorkerAssignment(rank=r, local_rank=r % 2, start_count=1, schedule_count=1)
                 for r in range(4)])


def test_placement_states_and_spares() -> None:
    f, _, _ = fleet()
    healthy, spare = NodeState.HEALTHY, NodeState.SPARE
    assert [f.nodes[n].state for n in "abc"] == [healthy, healthy, spare]
    assert f.spares() == ("c",)


def test_each_slot_gets_its_ranks_its_group_rank_and_the_schedule_count_of_its_moves() -> None:
    f, hub, _ = fleet()
    f.mark("b", NodeState.LOST, "gone")
    f.place(["a", "c"], moved=(1,))
    f.start_workers(start_cmd())
    sent = {n: StartWorkers.model_validate(body) for n, (_, body) in hub.calls[-1].items()}
    assert sorted(sent) == ["a", "c"]
    assert [w.rank for w in sent["a"].workers] == [0, 1] and sent["a"].group_rank == 0
    assert [w.rank for w in sent["c"].workers] == [2, 3] and sent["c"].group_rank == 1
    assert [w.schedule_count for w in sent["c"].workers] == [2, 2]
    assert [w.schedule_count for w in sent["a"].workers] == [1, 1]


def test_reports_merge_into_one_with_every_message_and_interval() -> None:
    f, hub, _ = fleet()
    f.start_workers(start_cmd())
    hub.reports["a"] = [report("a", 0, [0, 1], last=5, messages=1, intervals=(0.1,)),
                        report("a", 0, [0, 1], last=7, messages=2, intervals=(0.2,))]
    hub.reports["b"] = [report("b", 0, [2, 3], last=6, messages=1)]
    merged = f.poll()
    assert [w.rank for w in merged.workers] == [0, 1, 2, 3]
    assert [w.node for w in merged.workers] == ["a", "a", "b", "b"]
    assert merged.progress.last_step == 7 and merged.progress.first_step == 1
    assert len(merged.messages) == 4  # none lost, none twice
    assert {lv.rank: lv.intervals for lv in merged.liveness}[0] == [0.1, 0.2]
    again = f.poll()  # facts kept, deltas taken once
    assert len(again.workers) == 4 and again.messages == []
    assert all(lv.intervals == [] for lv in again.liveness)


def test_snapshot_intervals_merge_as_deltas_too() -> None:
    """Review 51 #2: a memory snapshot's interval was kept only from the last report a merge
    folded, and handed to the detector again with every stale copy (5 times a snapshot in a
    real 2-node run)."""
    f, hub, _ = fleet()
    f.start_workers(start_cmd())
    hub.reports["a"] = [report("a", 0, [0, 1], implied=(10.0,)),
                        report("a", 0, [0, 1], implied=(11.0,))]
    merged = f.poll()
    assert {lv.rank: lv.implied_intervals for lv in merged.liveness}[0] == [10.0, 11.0]
    assert all(lv.implied_intervals == [] for lv in f.poll().liveness)


def test_a_report_of_another_attempt_is_ignored() -> None:
    f, hub, _ = fleet()
    f.start_workers(start_cmd(attempt=1))
    hub.reports["a"] = [report("a", 0, [0, 1], last=99)]
    assert f.poll().progress.last_step is None


def test_loss_is_seen_from_the_process_the_connection_the_silence_and_the_engine() -> None:
    f, hub, backend = fleet()
    assert f.lost_now() == {}
    handle = f.nodes["b"].handle
    assert isinstance(handle, FakeHandle)
    handle.dead = True
    assert "agent process ended" in f.lost_now()["b"]
    handle.dead = False
    hub.disconnected["b"] = 2.0
    assert f.lost_now() == {}  # a blip, within the grace
    hub.disconnected["b"] = 4.0
    assert "disconnected for over 3s" in f.lost_now()["b"]
    hub.disconnected["b"] = 0.0
    hub.silent["a"] = 11.0
    assert "silent for over 10s" in f.lost_now()["a"]
    hub.silent["a"] = 0.1
    backend.bad["b"] = "down*"
    assert f.lost_now() == {"b": "Slurm reports it down*"}


def test_a_lost_nodes_running_workers_read_failed_in_the_merged_report() -> None:
    f, hub, _ = fleet()
    f.start_workers(start_cmd())
    handle = f.nodes["b"].handle
    assert isinstance(handle, FakeHandle)
    handle.dead = True
    merged = f.poll()
    assert merged.lost_nodes == ["b"]
    assert {w.rank: w.state for w in merged.workers} == {
        0: WorkerState.RUNNING, 1: WorkerState.RUNNING, 2: WorkerState.FAILED,
        3: WorkerState.FAILED}
    f.mark("b", NodeState.LOST, "gone")
    assert handle.killed and "b" not in hub.connected_nodes and f.spares() == ("c",)
    # marked lost, it is no longer lost *now*: the merges after (the stop of the rest, a
    # queue that times out) still read its workers failed, not running (walk-through 21: a
    # failed job's status showed the lost node's rank `running`)
    later = f.poll()
    assert later.lost_nodes == [] and {w.rank: w.state for w in later.workers} == {
        0: WorkerState.RUNNING, 1: WorkerState.RUNNING, 2: WorkerState.FAILED,
        3: WorkerState.FAILED}


def test_a_node_whose_agent_ended_is_not_sent_a_start_and_is_lost_at_once() -> None:
    """Walk-through 26 (F13): a node whose agent died during a restart's backoff was sent
    the start and given the 3 s reconnect grace ('unreachable'); its process had ended."""
    f, hub, _ = fleet()
    handle = f.nodes["b"].handle
    assert isinstance(handle, FakeHandle)
    handle.dead = True
    merged = f.start_workers(start_cmd(attempt=1))
    assert sorted(hub.calls[-1]) == ["a"]  # only the live node is asked
    assert [w.rank for w in merged.workers if w.state == WorkerState.RUNNING] == [0, 1]
    assert f.lost_now() == {"b": "its agent process ended"}


def test_a_node_whose_slurm_step_ended_while_its_agent_runs_is_lost_and_told_to_end() -> None:
    """Walk-through 36 #11: slurmd died, Slurm declared the node failed and its srun ended
    here while the agent ran on, connected: the NodeLost said "its agent process ended",
    and no one ended that agent (nor, at the job's end, its workers)."""
    f, hub, _ = fleet()
    handle = f.nodes["b"].handle
    assert isinstance(handle, FakeHandle)
    handle.dead, handle.why = True, "its agent's Slurm step ended (srun: Node failure on b)"
    assert f.lost_now() == {"b": "its agent's Slurm step ended (srun: Node failure on b)"}
    f.mark("b", NodeState.LOST, f.lost_now()["b"])
    assert hub.calls[-1] == {"b": (Op.EXIT, {"grace_s": 5.0})}  # its link was up
    hub.calls.clear()
    hub.connected_nodes.discard("c")
    f.mark("c", NodeState.LOST, "gone")  # a lost node whose link is down: killed, not told
    handle_c = f.nodes["c"].handle
    assert hub.calls == [] and isinstance(handle_c, FakeHandle) and handle_c.killed
    assert handle_c.waited is False  # the recovery does not wait on it (walk-through 42 #4)
    hub.connected_nodes.add("b")  # it reconnected (an old agent): the job's end ends it
    for node in f.nodes.values():
        assert isinstance(node.handle, FakeHandle)
        node.handle.dead = True  # (end_agents waits for live handles to end)
    f.end_agents(grace_s=0)
    assert hub.calls[-1] == {n: (Op.EXIT, {"grace_s": 0}) for n in ("a", "b")}


def test_a_spares_reports_are_taken_and_dropped_so_they_never_pile_up() -> None:
    f, hub, _ = fleet()
    f.start_workers(start_cmd())
    hub.reports["c"] = [report("c", None, [9]) for _ in range(3)]
    merged = f.poll()
    assert "c" not in hub.reports and all(w.node != "c" for w in merged.workers)


def test_a_node_whose_clock_is_off_has_its_liveness_times_moved_onto_the_controllers() -> None:
    from datetime import timedelta

    from trainguard.records import utcnow

    f, hub, _ = fleet()
    f.start_workers(start_cmd())
    behind = utcnow() - timedelta(seconds=30)  # node b's clock is 30 s behind
    r = report("b", 0, [2, 3])
    r = r.model_copy(update={"at": behind, "liveness": [
        RankLiveness(rank=2, last_progress_at=behind - timedelta(seconds=1))]})
    hub.reports["b"] = [r]
    hub.reports["a"] = [report("a", 0, [0, 1]).model_copy(update={"at": utcnow()})]
    merged = f.poll()
    lv = next(x for x in merged.liveness if x.rank == 2)
    assert lv.last_progress_at is not None
    assert abs((utcnow() - lv.last_progress_at).total_seconds() - 1) < 1  # 1 s ago, our clock


def test_every_node_silent_at_once_is_a_stalled_controller_not_a_lost_cluster() -> None:
    f, hub, _ = fleet()
    hub.silent.update({"a": 30.0, "b": 30.0, "c": 30.0})
    assert f.lost_now() == {}
    hub.silent["c"] = 0.2  # the spare is heard: a and b really are silent
    assert set(f.lost_now()) == {"a", "b"}


def test_every_link_down_at_once_is_a_full_disruption_no_node_is_lost_until_the_wait() -> None:
    """A controller-side outage (its network, every connection reset) must not make every
    node LOST and drained: Kubernetes' node controller stops evicting in a full
    disruption. After the wait they count as lost, but none is drained."""
    f, hub, _ = fleet()
    f.disruption.wait_s = 0.3
    events: list[tuple[str, str, str]] = []  # the controller's events (walk-through 42 #13:
    rec = SimpleNamespace(event=lambda level, reason, text, **kw: events.append(  # a log line)
        (level.value, reason.value, text)))
    NodeRecovery(rec, f)  # type: ignore[arg-type]  # it wires the fleet's disruption to events
    hub.connected_nodes.clear()
    hub.disconnected.update({"a": 5.0, "b": 5.0, "c": 5.0})
    assert f.lost_now() == {} and f.disruption.since is not None
    assert f.lost_now() == {}  # said once
    assert events == [("Warning", "LinksDown", "every node's link is down at once (a full "
                       "disruption): this controller's side is suspect; no node counts as lost "
                       "for 0.3s, and none is drained")]
    time.sleep(0.35)
    lost = f.lost_now()
    assert set(lost) == {"a", "b"} and "every node's link went down at once" in lost["a"]
    assert not lost_isolation("a", lost["a"], f.disruption.suspect("a")).drain
    hub.connected_nodes.update({"a", "b", "c"})  # the links come back
    hub.disconnected.clear()
    assert f.lost_now() == {} and f.disruption.since is None
    assert [e[:2] for e in events] == [("Warning", "LinksDown"), ("Info", "LinksRestored")]
    assert events[1][2].startswith("the full disruption is over after 0."), events[1]


def test_one_link_down_while_another_is_up_is_that_nodes_loss() -> None:
    f, hub, _ = fleet()
    f.disruption.wait_s = 100.0
    hub.connected_nodes.discard("a")
    hub.disconnected["a"] = 5.0
    assert set(f.lost_now()) == {"a"} and f.disruption.since is None
    assert lost_isolation("a", "x", f.disruption.suspect("a")).drain


@dataclass
class Clock:
    t: float = 1000.0

    def __call__(self) -> float:
        return self.t


def six_nodes_four_cut(down_s: float) -> tuple[Fleet, FakeHub, Clock]:
    """A fleet of six placed on n2, n3, in a full disruption of n0..n3 cut `down_s` ago."""
    names = tuple(f"n{i}" for i in range(6))
    f, hub, _ = fleet(names)
    f.place(["n2", "n3"])
    clock = Clock()
    f.disruption = Disruption(100.0, clock=clock)
    for n in names[:4]:
        hub.connected_nodes.discard(n)
        hub.disconnected[n] = hub.silent[n] = down_s  # unheard since the cut
    assert f.lost_now() == {} and f.disruption.since is not None
    return f, hub, clock


def back(hub: FakeHub, *names: str) -> None:
    hub.connected_nodes.update(names)
    hub.disconnected.update(dict.fromkeys(names, 0.0))
    hub.silent.update(dict.fromkeys(names, 0.1))


def test_most_links_of_a_big_fleet_down_is_a_full_disruption_too() -> None:
    """Thousands of links are not all seen to drop at one instant."""
    f, hub, clock = six_nodes_four_cut(5.0)
    back(hub, "n0", "n1")
    # 2 of 6 down: no longer a disruption, but n2, n3 were cut in it: their reconnect grace
    # counts from its end (walk-through 36 #10)
    assert f.lost_now() == {} and f.disruption.since is None
    clock.t += 3.5  # the grace (3 s) since the end
    lost = f.lost_now()
    assert set(lost) == {"n2", "n3"} and "every node's link went down at once" in lost["n2"]
    assert not lost_isolation("n2", lost["n2"], f.disruption.suspect("n2")).drain


def test_a_command_right_after_a_full_disruption_gives_a_cut_link_its_grace_from_the_end(
) -> None:
    """Review 40 #5 / 41 #1: a restart's start_workers 1 s after a 25 s outage ended took a
    node still reconnecting for unreachable, or for silent past the node timeout (both
    counted from the cut), and lost it (drained, or the job failed when every placed node
    was reconnecting). A command that places ranks judges a node as lost_now does: not
    before the disruption's wait during it, the grace from its end after."""
    f, hub, clock = six_nodes_four_cut(25.0)
    waited = f._call({"n2": (Op.PORT, {})}, 30, placing=True)["n2"]
    assert waited.error == "node n2 did not answer within 30s"  # not given up on: waited
    back(hub, "n0", "n1")
    assert f.lost_now() == {}  # the disruption ends now
    clock.t += 1.0
    hub.disconnected.update({"n2": 26.0, "n3": 26.0})
    hub.silent.update({"n2": 26.0, "n3": 26.0})
    hub.between_rounds = lambda: back(hub, "n2", "n3")  # type: ignore[method-assign]
    f.start_workers(start_cmd())  # they come back during the call, and answer
    assert f.lost_now() == {}, "a node still reconnecting was taken for lost"


def test_a_link_cut_in_a_full_disruption_is_given_up_on_past_the_grace_from_its_end(
) -> None:
    f, hub, clock = six_nodes_four_cut(25.0)
    back(hub, "n0", "n1")
    assert f.lost_now() == {}  # the disruption ends now
    clock.t += 3.5
    hub.disconnected.update({"n2": 28.5, "n3": 28.5})
    why = f._call({"n2": (Op.PORT, {})}, 30, placing=True)["n2"].error
    assert why == "its agent has been disconnected for over 3s (every node's link went down " \
                  "at once)"
    assert not lost_isolation("n2", why, f.disruption.suspect("n2")).drain


def test_a_restart_s_rendezvous_in_a_full_disruption_waits_out_what_is_left_of_it() -> None:
    """Review 41 #8: 90 s into the 120 s wait a restart's rendezvous gave up after its 30 s
    and the job ended; it now waits what is left of the wait too. Review 42 #2: slot 0's
    node given up on by its link is a node loss (the ladder's), not the job's end: a
    rendezvous with no answer in time still is (a LaunchError)."""
    f, hub, clock = six_nodes_four_cut(25.0)
    clock.t += 90.0
    f.rendezvous("10.0.0.2", None)
    assert hub.timeouts[-1] == 40.0 and f.disruption.wait_left() == 10.0  # of its 100 s
    f._broken.clear()  # (the fake's rounds end in its timeout: a silent agent's node loss)
    clock.t += 11.0  # the wait is over: n2 is lost by its link
    assert f.rendezvous("10.0.0.2", None) == ("10.0.0.2", fleet_module.FALLBACK_PORT)
    lost = f.lost_now()
    assert set(lost) == {"n2", "n3"} and excused(lost["n2"], False)
    f._broken.clear()  # (a new placement would have moved its ranks)
    hub.errors["n2"] = "no free port"  # its agent's own answer: the start fails
    back(hub, "n2")
    with pytest.raises(LaunchError, match="cannot offer a rendezvous port: no free port"):
        f.rendezvous("10.0.0.2", None)


def test_a_stop_requested_ends_a_placing_command_s_wait_for_a_disruption() -> None:
    f = six_nodes_four_cut(25.0)[0]
    f.stop_requested = lambda: True
    why = f._call({"n2": (Op.PORT, {})}, 30, placing=True)["n2"].error
    assert why == "its agent has been disconnected for over 3s", why


def test_a_stop_in_a_full_disruption_gives_up_on_a_cut_node_at_once() -> None:
    """Review 41 #2: with the disruption's allowance a stop (a user's, Slurm's time limit)
    waited its whole timeout (grace + 60 s) for nodes it cannot reach; their agents stop
    their workers themselves after the orphan timeout."""
    f = six_nodes_four_cut(25.0)[0]
    why = f._call({"n2": (Op.STOP, {})}, 75)["n2"].error
    assert why.startswith("its agent has been disconnected for over 3s"), why


def test_an_agent_ending_during_a_call_answers_with_its_end() -> None:
    """Review 41 #2: `agent_ended` was asked once, before the call: an agent whose process
    ended during it was waited on to the timeout."""
    f, hub, _ = fleet()
    hub.connected_nodes.discard("a")  # its link still up as far as the hub knows: not given
    handle = f.nodes["a"].handle
    assert isinstance(handle, FakeHandle)
    hub.between_rounds = lambda: setattr(handle, "dead", True)  # type: ignore[method-assign]
    assert f._call({"a": (Op.STOP, {})}, 75)["a"].error == "its agent process ended"


def test_most_of_a_big_fleet_silent_at_once_is_this_controller_behind() -> None:
    """A controller that reads thousands of links and falls behind sees most of them
    silent: that is not their loss."""
    names = tuple(f"n{i}" for i in range(6))
    f, hub, _ = fleet(names)
    f.place(["n0", "n1"])
    hub.silent.update({n: 30.0 for n in names[:4]})
    assert f.lost_now() == {}
    hub.silent.update({"n2": 0.1, "n3": 0.1})  # 4 of 6 heard: n0 and n1 are silent
    assert set(f.lost_now()) == {"n0", "n1"}


def test_a_node_lost_while_poll_waits_for_its_next_merge_is_reported_without_waiting(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Merges are rate-limited (O(ranks): one a second at 4,000 nodes); the loss check is
    not (O(nodes)): a node lost meanwhile is reported at the next loss check, not at the
    merge after (issue 16: loss noticed within the grace or timeout + 1 s at scale). The
    merge is made due a minute on, so a loaded machine's slow loss check cannot pass for
    the wait (a bound of 0.5 s under a 1 s merge failed CI once at 0.505 s)."""
    monkeypatch.setattr(fleet_module, "MERGE_S_PER_NODE", 60.0 / 4002)
    f, hub, _ = fleet(("a", "b", *(f"n{i}" for i in range(4000))))
    assert f.poll(wait_s=0.01).lost_nodes == []
    hub.connected_nodes.discard("b")
    hub.disconnected["b"] = 3.5  # past the 3 s grace
    t = time.monotonic()
    assert f.poll(wait_s=0.01).lost_nodes == ["b"]
    assert time.monotonic() - t < 30.0  # the next merge was due 60 s after the first


def test_in_a_full_disruption_a_cut_link_s_silence_does_not_count_before_the_wait() -> None:
    """Every link cut at once: the links last heard longest ago pass the node timeout while
    most are still 'heard' lately; their silence is the cut, which waits for the disruption
    wait like the cut itself (2,000 agents: 639 nodes lost as silent 5 s before it ended)."""
    names = tuple(f"n{i}" for i in range(6))
    f, hub, _ = fleet(names)
    f.place(list(names))
    f.disruption.wait_s = 100.0
    for n in names:
        hub.connected_nodes.discard(n)
        hub.disconnected[n] = 9.0
    hub.silent.update({n: 9.5 for n in names})
    hub.silent.update({"n0": 30.0, "n1": 30.0})  # heard last before the others
    assert f.lost_now() == {} and f.disruption.since is not None


def test_the_messages_of_a_merged_report_are_acknowledged_when_the_loop_asks_again() -> None:
    """node/outbox.py keeps them until then: a controller killed between the merge and the
    loop's record of it leaves them to be sent again to the one that takes over."""
    f, hub, _ = fleet()
    f.start_workers(start_cmd())
    saved = report("a", 0, [0, 1]).model_copy(update={"seq": 4, "epoch": 5, "messages": [
        WorkerMessage(kind="checkpoint_saved", rank=0, at=T0, data={"step": 10})]})
    hub.reports = {"a": [saved], "b": [report("b", 0, [2, 3])]}
    merged = f.poll()
    assert [m.kind for m in merged.messages] == ["checkpoint_saved"]
    assert hub.frames == []  # handed to the loop, not recorded yet
    hub.reports = {"a": [report("a", 0, [0, 1])]}
    f.poll()
    assert hub.frames == [{"a": {"type": "ack", "seq": 4, "epoch": 5}}]
    f.poll()
    assert len(hub.frames) == 1  # each acknowledgement once


def test_a_message_kept_across_a_new_attempt_is_merged_then_acknowledged() -> None:
    f, hub, _ = fleet()
    f.start_workers(start_cmd())
    kept = WorkerMessage(kind="checkpoint_saved", rank=0, at=T0, id="5-2-0", attempt=0)
    hub.reports = {"a": [report("a", 0, [0, 1]).model_copy(
        update={"seq": 2, "epoch": 5, "messages": [kept]})]}
    f.merger.fold("a", hub.take_all_reports()["a"])  # folded, then a new attempt starts
    started = f.start_workers(start_cmd(attempt=1))
    assert [m.id for m in started.messages] == ["5-2-0"]
    f.poll()
    assert hub.frames == [{"a": {"type": "ack", "seq": 2, "epoch": 5}}]


def test_a_kept_message_in_a_report_of_an_earlier_attempt_is_merged_not_dropped() -> None:
    """A checkpoint attempt 0 committed, told in a report that came after attempt 1 began
    (or sent again after a reconnect): its message says its attempt (node/outbox.py)."""
    f, hub, _ = fleet()
    f.start_workers(start_cmd(attempt=1))
    old = report("a", 0, [0, 1]).model_copy(update={"seq": 7, "epoch": 5, "messages": [
        WorkerMessage(kind="checkpoint_saved", rank=0, at=T0, data={"step": 10}, id="5-7-0",
                      attempt=0),
        WorkerMessage(kind="progress", rank=0, at=T0)]})
    hub.reports = {"a": [old]}
    merged = f.poll()
    assert merged.attempt == 1 and [m.id for m in merged.messages] == ["5-7-0"]
    f.poll()
    assert hub.frames == [{"a": {"type": "ack", "seq": 7, "epoch": 5}}]


def test_no_acknowledgement_while_the_recorder_holds_unwritten_events() -> None:
    f, hub, _ = fleet()
    held = [True]
    f.acks_held = lambda: held[0]
    f.start_workers(start_cmd())
    hub.reports = {"a": [report("a", 0, [0, 1]).model_copy(update={"seq": 3, "epoch": 5})]}
    f.poll()
    hub.reports = {"a": [report("a", 0, [0, 1]).model_copy(update={"seq": 4, "epoch": 5})]}
    f.poll()
    f.poll()
    assert hub.frames == []  # the store takes no writes: nothing is acknowledged
    held[0] = False
    f.poll()
    assert hub.frames == [{"a": {"type": "ack", "seq": 4, "epoch": 5}}]


def test_the_worker_messages_each_node_refused_add_up_and_a_new_agent_s_count_adds_on() -> None:
    """(security.md W3's leftover) The agents' channels' refusals were in their logs only.
    A node's count only grows while its agent lives; one that falls is a new agent's."""
    f, hub, _ = fleet()
    f.start_workers(start_cmd())
    hub.reports["a"] = [report("a", 0, [0, 1], last=5).model_copy(update={"messages_refused": 3})]
    hub.reports["b"] = [report("b", 0, [2, 3], last=5).model_copy(update={"messages_refused": 2})]
    assert f.poll().messages_refused == 5
    assert f.poll().messages_refused == 5  # no new reports: still counted
    hub.reports["a"] = [report("a", 0, [0, 1], last=6).model_copy(update={"messages_refused": 1})]
    assert f.poll().messages_refused == 3 + 1 + 2  # a's new agent refused one more


def test_a_node_s_new_agent_adds_its_refusals_to_the_old_one_s_whatever_its_count() -> None:
    """Review of walk-through 33 #5: a new agent whose first count was not below the old
    one's overwrote it (5 then 7 read 7, not 12); the reports' epoch says which agent."""
    f, hub, _ = fleet()
    f.start_workers(start_cmd())
    old = report("a", 0, [0, 1], last=5).model_copy(update={"messages_refused": 5, "epoch": 1})
    hub.reports["a"] = [old]
    assert f.poll().messages_refused == 5
    new = report("a", 0, [0, 1], last=6).model_copy(update={"messages_refused": 7, "epoch": 2})
    hub.reports["a"] = [new]
    assert f.poll().messages_refused == 12


def test_links_still_reconnecting_when_a_full_disruption_ends_get_their_grace_from_its_end(
        ) -> None:
    """Walk-through 36 #10: every link cut for 25 s; the spare's agent reconnected first, and
    at that instant every other link, down 25 s, was past the 3 s grace: both placed nodes
    were lost, their agents and ranks killed, and the job queued, then failed."""
    f, hub, _ = fleet()
    clock = Clock()
    f.disruption = Disruption(fleet_module.DISRUPTION_WAIT_S, clock=clock)
    hub.connected_nodes.clear()
    hub.disconnected.update({"a": 25.0, "b": 25.0, "c": 25.0})
    hub.silent.update({"a": 25.0, "b": 25.0, "c": 25.0})
    assert f.lost_now() == {} and f.disruption.since is not None
    hub.connected_nodes.add("c")  # the spare is back first
    hub.disconnected["c"], hub.silent["c"] = 0.0, 0.0
    assert f.lost_now() == {} and f.disruption.since is None  # a and b: still reconnecting
    hub.connected_nodes.add("a")  # a is back; b stays down past the grace from the end
    hub.disconnected["a"], hub.silent["a"] = 0.0, 0.0
    clock.t += 3.5
    lost = f.lost_now()
    assert set(lost) == {"b"} and "every node's link went down at once" in lost["b"], lost
    assert not lost_isolation("b", lost["b"], f.disruption.suspect("b")).drain
    assert f.disruption.suspect("b") and not f.disruption.suspect("a")



def test_a_node_lost_by_its_agent_s_end_right_after_a_disruption_is_drained(
        tmp_path: Path) -> None:
    """Review 40 #4: within the grace after a full disruption ended, a node whose agent
    ended (or Slurm failed) was not drained and its NodeLost blamed the disruption."""
    from trainguard.controller.nodes import NodeRecovery
    from trainguard.controller.recorder import Recorder
    from trainguard.controller.store import JobStore
    from trainguard.paths import JobPaths
    from trainguard.spec_build import build_spec

    f, hub, backend = fleet()
    drained: list[str] = []
    backend.isolate = lambda node, reason: drained.append(node) or "drained"  # type: ignore[method-assign]
    hub.connected_nodes.clear()
    hub.disconnected.update({"a": 25.0, "b": 25.0, "c": 25.0})
    f.lost_now()  # a full disruption
    hub.connected_nodes.update({"a", "c"})
    hub.disconnected.update({"a": 0.0, "c": 0.0})
    assert f.lost_now() == {} and f.disruption.suspect("b")  # b: still reconnecting
    f.nodes["b"].handle.dead = True  # type: ignore[union-attr]  # then its agent ends
    lost = f.lost_now()
    assert lost == {"b": "its agent process ended"}, lost
    spec = build_spec(None, {"entrypoint": "train.py", "run_id": "r", "nnodes": 2})
    paths = JobPaths(tmp_path / "job", tmp_path / "job" / "logs", tmp_path / "job" / "ck")
    paths.make()
    rec = Recorder(spec, paths, JobStore.create(paths.job_dir, "r"), ["train.py"])
    NodeRecovery(rec, f).lost(0, lost)
    assert drained == ["b"]


def test_a_lost_spare_is_drained_as_a_lost_training_node_is(tmp_path: Path) -> None:
    """Walk-through 42 #10: `NodeLost: spare node n3 was lost: ...; it is no longer a spare`
    left n3 in the cluster's pool, while a lost training node was drained."""
    from trainguard.controller.nodes import NodeRecovery
    from trainguard.controller.recorder import Recorder
    from trainguard.controller.store import JobStore
    from trainguard.paths import JobPaths
    from trainguard.spec_build import build_spec

    f, hub, backend = fleet()
    drained: list[str] = []
    backend.isolate = lambda node, reason: drained.append(node) or "drained"  # type: ignore[method-assign]
    spec = build_spec(None, {"entrypoint": "train.py", "run_id": "r", "nnodes": 2})
    paths = JobPaths(tmp_path / "job", tmp_path / "job" / "logs", str(tmp_path / "job" / "ck"))
    paths.make()
    with JobStore.create(paths.job_dir, "r") as store:
        rec = Recorder(spec, paths, store, ["train.py"])
        NodeRecovery(rec, f)
        f.start_workers(start_cmd())
        (spare,) = f.spares()
        hub.connected_nodes.discard(spare)
        hub.disconnected[spare] = 25.0
        f.poll()
        said = [e.message for _, e in store.events() if e.reason == "NodeLost"]
    assert drained == [spare] and said and said[0].endswith("no longer a spare; drained"), said


def test_two_nodes_lost_at_once_the_first_move_s_placement_marks_the_second() -> None:
    """Walk-through 36 #10: a and b lost in one round; the first decision moves a's ranks to
    the spare and its event's placement still holds b: said as lost, its move is next."""
    assert placement_text(["c", "b"], {"a", "b"}) == "0:c, 1:b (lost too)"
    assert placement_text(["c", "b"], set()) == "0:c, 1:b"


def test_a_spare_is_judged_as_a_placed_node_is() -> None:
    """Review 41 #3: the spares' loss was a third copy of the link rules (no silence, no
    disruption wait of its own): a spare whose agent froze stayed a spare; one cut in a
    full disruption waits for it like the placed nodes."""
    f, hub, _ = fleet()
    gone: list[tuple[str, str]] = []
    f.on_spare_lost = lambda name, why: gone.append((name, why))
    hub.silent["c"] = 10.5  # the spare's agent froze; a and b are heard
    f.poll()
    assert gone == [("c", "its agent has been silent for over 10s")]
    f, hub, _ = fleet()
    f.on_spare_lost = lambda name, why: gone.append((name, why))
    hub.connected_nodes.clear()  # every link cut: a full disruption
    hub.disconnected.update(dict.fromkeys("abc", 30.0))
    hub.silent.update(dict.fromkeys("abc", 30.0))
    f.poll()
    assert len(gone) == 1 and f.nodes["c"].state == NodeState.SPARE
    f, _, backend = fleet()  # and Slurm's verdict counts for a spare too
    f.on_spare_lost = lambda name, why: gone.append((name, why))
    backend.bad["c"] = "down*"
    f.poll()
    assert gone[-1] == ("c", "Slurm reports it down*") and f.nodes["c"].state == NodeState.LOST


def test_the_same_answer_from_every_node_not_cut_is_the_job_s_not_theirs() -> None:
    """Review 42 #3: one node cut, the others answering the start with the same error (a bad
    argv: the job's): the answering nodes were marked broken and drained, and the ladder
    moved their ranks to spares that failed the same way; it is the start's failure."""
    f, hub, _ = fleet(("a", "b", "c", "d"))
    f.place(["a", "b", "c"])
    hub.connected_nodes.discard("c")
    hub.disconnected["c"] = 10.0
    hub.errors.update(dict.fromkeys("ab", "FileNotFoundError: [Errno 2] No such file: 'x'"))
    with pytest.raises(LaunchError, match=r"a: FileNotFoundError.*b: FileNotFoundError"):
        f.start_workers(start_cmd())


def test_a_placing_command_gives_up_at_once_on_a_node_slurm_reports_down() -> None:
    """Review 42 #4: a command's judge had no Slurm verdict: in a full disruption a start
    waited out the disruption for a node lost_now already called lost."""
    f, _, _ = six_nodes_four_cut(25.0)
    backend = f.backend
    assert isinstance(backend, FakeBackend)
    backend.bad["n2"] = "down*"
    why = f._call({"n2": (Op.PORT, {})}, 30, placing=True)["n2"].error
    assert why == "Slurm reports it down*" and f.lost_now()["n2"] == why


def test_a_start_s_give_up_in_a_disruption_stays_excused_when_the_node_comes_back() -> None:
    """Review 42 #9: the start gave n2 up by its link 3.5 s after a disruption ended (not
    drained: the disruption is suspect); n2 came back before the loss was handled, was no
    longer the disruption's, and was drained."""
    f, hub, clock = six_nodes_four_cut(25.0)
    back(hub, "n0", "n1")
    assert f.lost_now() == {}  # the disruption ends now
    clock.t += 3.5
    hub.disconnected.update({"n2": 28.5, "n3": 28.5})
    f.start_workers(start_cmd())
    back(hub, "n2", "n3")  # back right after
    why = f.lost_now()["n2"]
    assert not f.disruption.suspect("n2") and excused(why, f.disruption.suspect("n2"))
    assert not lost_isolation("n2", why, excused(why, False)).drain
    assert not excused("its agent process ended", True)


def test_a_start_with_one_node_cut_and_one_lost_otherwise_is_two_node_losses() -> None:
    """Review 43 #1: a node given up on without an answer (its agent ended, Slurm's verdict,
    already broken) was counted as if its agent had answered: with one node cut and one
    whose agent ended, the start raised LaunchError and the job failed, where both are
    node losses for the ladder."""
    f, hub, _ = fleet(("a", "b", "c"))
    hub.connected_nodes.discard("a")
    hub.disconnected["a"] = 10.0
    handle = f.nodes["b"].handle
    assert isinstance(handle, FakeHandle)
    handle.dead = True
    f.start_workers(start_cmd())
    assert set(f.lost_now()) == {"a", "b"}


def test_a_start_waits_for_the_stale_workers_grace_period_too() -> None:
    """Review 44 #4: an agent stops an earlier attempt's workers it still runs with the
    job's grace period before it answers a START; the start waited 120 s whatever the grace,
    and a node whose stale rank saved on its way out for longer was lost and drained."""
    f, hub, _ = fleet()
    f.start_workers(start_cmd().model_copy(update={"grace_s": 600.0}))
    assert hub.timeouts[-1] >= 600.0 + START_TIMEOUT_S, hub.timeouts


def test_a_stop_during_the_pre_check_s_wait_for_a_spare_stops_the_job(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Review 44 #3: a stop requested while b failed its pre-check and the job waited for a
    spare ended the wait at once, and the job as JobFailed ("no spare took their place
    within 600s", exit 1), the stop unrecorded; it stops, and no worker starts."""
    import signal

    from trainguard.controller.loop import Controller
    from trainguard.controller.nodes import NodeRecovery
    from trainguard.controller.recorder import Recorder
    from trainguard.controller.store import JobStore
    from trainguard.paths import JobPaths
    from trainguard.policy.decision import Incident, IncidentKind
    from trainguard.policy.precheck import PrecheckReport
    from trainguard.records import Event, utcnow
    from trainguard.spec_build import build_spec

    spec = build_spec(None, {"entrypoint": "train.py", "run_id": "t", "nproc_per_node": 2,
                             "nnodes": 2, "queue_timeout_s": 600, "master_port": 29511})
    paths = JobPaths(tmp_path / "job", tmp_path / "job" / "logs", str(tmp_path / "ck"))
    paths.make()
    seen: list[Event] = []

    def on_event(e: Event) -> None:
        seen.append(e)
        if e.reason == "Queuing":  # the stop lands while the job waits for a spare
            signal.raise_signal(signal.SIGTERM)

    store = JobStore.create(paths.job_dir, "t")
    rec = Recorder(spec, paths, store, ["x"], on_event=on_event)
    f, hub, _ = fleet(("a", "b"))
    recovery = NodeRecovery(rec, f)
    monkeypatch.setattr(f, "close", lambda grace_s=0.0: None)  # (fake agents never end)

    def precheck_incident(attempt: int) -> Incident:
        bad = PrecheckReport.model_validate({"node": "b", "host": "", "at": utcnow(), "checks": [
            {"name": "disk", "ok": False, "detail": "full", "fix": "free it"}]})
        placement, spares = recovery.snapshot()
        return Incident(IncidentKind.PRECHECK_FAILED, failing=(bad,), checked=2,
                        placement=placement, spares=spares)

    monkeypatch.setattr(recovery, "precheck_incident", precheck_incident)
    code = Controller(rec, f, nodes=recovery).run()  # type: ignore[arg-type]
    try:
        assert code == 128 + signal.SIGTERM, [e.message for e in seen][-3:]
        assert [e.reason for e in seen][-2:] == ["StopRequested", "JobStopped"]
        assert seen[-1].message == ("stopped by SIGTERM while waiting for nodes: no worker "
                                    "was running")
        assert not any(c for c in hub.calls if any(op == "start" for op, _ in c.values()))
    finally:
        store.close()
    # review 45 #5: a stop come before the pre-check skips it (it waited up to 300 s for it,
    # then isolated the failing node and queued, before the stop was acted on)
    store = JobStore.create(tmp_path / "job2", "t2")
    rec = Recorder(spec, JobPaths(tmp_path / "job2", tmp_path / "job2" / "logs",
                                  str(tmp_path / "ck2")), store, ["x"])
    f, hub, _ = fleet(("a", "b"))
    monkeypatch.setattr(f, "close", lambda grace_s=0.0: None)
    recovery = NodeRecovery(rec, f)
    checked: list[int] = []
    monkeypatch.setattr(recovery, "precheck_incident", checked.append)
    begin = rec.begin

    def begin_then_stop() -> Any:
        out = begin()
        signal.raise_signal(signal.SIGTERM)
        return out

    monkeypatch.setattr(rec, "begin", begin_then_stop)
    try:
        code = Controller(rec, f, nodes=recovery).run()  # type: ignore[arg-type]
        assert code == 128 + signal.SIGTERM and checked == [], checked
    finally:
        store.close()


def test_a_stop_while_the_nodes_check_themselves_ends_the_pre_check_and_isolates_none(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Review 46 #4: Ctrl-C while the pre-check ran (up to 300 s) waited for every node's
    answer, then judged the unanswered ones failed, isolated them (a drain on Slurm) and
    queued for spares before the stop was acted on. A stop ends the pre-check: no node is
    judged by it, and the job stops."""
    import signal

    from trainguard.controller.loop import Controller
    from trainguard.controller.nodes import NodeRecovery
    from trainguard.controller.recorder import Recorder
    from trainguard.controller.store import JobStore
    from trainguard.paths import JobPaths
    from trainguard.records import Event
    from trainguard.spec_build import build_spec

    spec = build_spec(None, {"entrypoint": "train.py", "run_id": "t", "nproc_per_node": 2,
                             "nnodes": 2, "master_port": 29512})
    paths = JobPaths(tmp_path / "job", tmp_path / "job" / "logs", str(tmp_path / "ck"))
    paths.make()
    seen: list[Event] = []
    store = JobStore.create(paths.job_dir, "t")
    rec = Recorder(spec, paths, store, ["x"], on_event=seen.append)
    f, hub, _ = fleet(("a", "b"))
    monkeypatch.setattr(f, "close", lambda grace_s=0.0: None)
    real_call = hub.call

    def call(calls: dict[str, tuple[str, dict[str, Any]]], timeout: float,
             lost_after_s: float = 0.0, silent_after_s: float | None = None,
             judge: Judge | None = None) -> dict[str, Reply]:
        if not any(op == Op.PRECHECK for op, _ in calls.values()):
            return real_call(calls, timeout, lost_after_s, silent_after_s, judge)
        hub.calls.append(calls)
        assert judge is None or judge(list(calls)) == {}  # every node checks itself
        signal.raise_signal(signal.SIGTERM)  # the stop lands meanwhile
        given = {} if judge is None else judge(list(calls))
        return {n: Reply(False, {}, given.get(n) or f"node {n} did not answer within "
                         f"{timeout:.0f}s") for n in calls}

    monkeypatch.setattr(hub, "call", call)
    try:
        code = Controller(rec, f, nodes=NodeRecovery(rec, f)).run()  # type: ignore[arg-type]
        reasons = [e.reason for e in seen]
        assert code == 128 + signal.SIGTERM, reasons
        assert any(op == Op.PRECHECK for c in hub.calls for op, _ in c.values())
        assert not {"PrecheckFailed", "NodeIsolated", "Queuing"} & set(reasons), reasons
        assert reasons[-2:] == ["StopRequested", "JobStopped"], reasons
        assert [f.nodes[n].state for n in ("a", "b")] == [NodeState.HEALTHY] * 2
    finally:
        store.close()


def test_a_node_whose_agent_got_sigterm_leaves_the_job_undrained_and_all_of_them_end_it(
        ) -> None:
    """controller/ending_nodes.py (review 53 #2): the node is leaving, not at fault."""
    from trainguard.controller.ending_nodes import WHY, every_one_ending

    assert not lost_isolation("a", WHY).drain
    assert lost_isolation("a", "its agent process ended").drain
    assert every_one_ending(["a", "b"], {"a": WHY, "b": WHY})
    assert not every_one_ending(["a", "b"], {"a": WHY})  # b trains on: a leaves alone
    assert not every_one_ending(["a", "b"], {"a": WHY, "b": "its agent process ended"})
    assert not every_one_ending([], {})


def test_the_polls_that_wait_for_the_other_nodes_sigterm_are_seen_and_the_last_one_kept(
        ) -> None:
    """Review 54 #4: ending_nodes' polls were only recorded (the resume agreement and the
    in-process bookkeeping never saw them) and the report it ended on was dropped."""
    from trainguard.controller.ending_nodes import WHY, ending_nodes

    f, hub, _ = fleet()
    f.start_workers(start_cmd(0))
    hub.reports = {"a": [report("a", 0, [0, 1]).model_copy(update={"terminating": True})],
                   "b": [report("b", 0, [2, 3], last=4)]}
    first = f.poll()
    assert first.terminating_nodes == ["a"]
    seen: list[NodeReport] = []

    def see(r: NodeReport) -> None:  # b's agent gets its SIGTERM a moment after a's
        seen.append(r)
        if len(seen) == 1:
            hub.reports["b"] = [report("b", 0, [2, 3], last=5).model_copy(
                update={"terminating": True})]

    assert ending_nodes(f, first, see) == {"a": WHY, "b": WHY}
    assert len(seen) == 2 and seen[-1].terminating_nodes == ["a", "b"]
    assert seen[-1].progress.last_step == 5


def test_a_node_lost_while_the_others_may_say_sigterm_leaves_the_job_with_them(
        tmp_path: Path) -> None:
    """Review 55 #4: a's agent got SIGTERM; during the settle b's link went down for good.
    The loss was merged as it stood before the settle: b stayed placed, the next attempt
    started on it, and a second pod reschedule followed."""
    from trainguard.controller.ending_nodes import WHY
    from trainguard.controller.loop import Controller
    from trainguard.controller.nodes import NodeRecovery
    from trainguard.controller.recorder import Recorder
    from trainguard.controller.store import JobStore
    from trainguard.paths import JobPaths
    from trainguard.spec_build import build_spec

    spec = build_spec(None, {"entrypoint": "train.py", "run_id": "t", "nproc_per_node": 2,
                             "nnodes": 2, "master_port": 29513})
    paths = JobPaths(tmp_path / "job", tmp_path / "job" / "logs", str(tmp_path / "ck"))
    paths.make()
    with JobStore.create(paths.job_dir, "t") as store:
        rec = Recorder(spec, paths, store, ["x"])
        f, hub, _ = fleet(("a", "b", "c", "d"))
        f.start_workers(start_cmd(0))
        hub.reports = {"a": [report("a", 0, [0, 1]).model_copy(update={"terminating": True})],
                       "b": [report("b", 0, [2, 3])]}
        first = f.poll()
        assert first.terminating_nodes == ["a"] and first.lost_nodes == []
        hub.disconnected["b"] = 60.0  # b's link is down past the reconnect grace
        hub.connected_nodes.discard("b")
        ctrl = Controller(rec, f, nodes=NodeRecovery(rec, f))  # type: ignore[arg-type]
        out = ctrl._leaving(first, f.lost)
        assert out.lost is not None and set(out.lost) == {"a", "b"}, out.lost
        assert out.lost["a"] == WHY and out.lost["b"] != WHY
