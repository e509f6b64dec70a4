"""The composition root: builds both sides of a job and runs it. Returns the exit code.

One node: the job dir, the store, one NodeAgent called in-process, the Controller. Several
nodes: a token, the hub, a backend, agent processes, the fleet, node recovery and the same
Controller. JOB_DIR/cluster/ holds what agents need to find and prove themselves to the
controller: `token` (0600), `controller.json` (host, port; rewritten by a restarted
controller) and `agent.json` (AgentConfig). A controller started on a job whose previous
controller died while the job ran or restarted (JobState.resumable) takes the job
over: it listens on the same port, the agents reconnect, and when every placed node reports
that attempt's workers still running, it watches them on (no restart); otherwise it stops
what is left and relaunches.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from trainguard.backends.base import Backend
from trainguard.backends.local import LocalBackend, live_agents
from trainguard.backends.orphans import OWN_JOB_KEY, SLURM_JOB_KEY
from trainguard.console import Writable, console_printer, consoles
from trainguard.controller.echo import RankEcho
from trainguard.controller.fleet import Fleet
from trainguard.controller.hub import Hub
from trainguard.controller.loop import Controller
from trainguard.controller.nodes import NodeRecovery
from trainguard.controller.peer_copies import PeerCopies
from trainguard.controller.recorder import Recorder
from trainguard.controller.shown import slot_moves
from trainguard.controller.signals import Hurrier
from trainguard.controller.store import JobStore, NodeRow
from trainguard.errors import LaunchError, StoreError, TrainguardError
from trainguard.exitcodes import ExitCode
from trainguard.launch_checks import job_lock, metrics_port_refused, prepare
from trainguard.node.agent import NodeAgent
from trainguard.node.logs import ConsoleOptions
from trainguard.paths import JobPaths
from trainguard.policy.decision import HAPolicy, History
from trainguard.policy.nodes import recent_implications
from trainguard.protocol import HURRY_FRAME, AgentConfig, report_interval
from trainguard.records import Level, Reason, utcnow
from trainguard.spec import JobSpec
from trainguard.states import JobState, NodeState
from trainguard.wire import WireError, new_token, read_token, write_token


def launch(spec: JobSpec, argv: list[str], marker: str) -> int:
    spec, paths = prepare(spec, create=True)
    with consoles() as (out, err):  # writes that never wait for the console (console.py)
        with job_lock(paths.job_dir), JobStore.create(paths.job_dir, spec.run_id) as store, \
                _failed_before_start(spec, paths, store, argv), \
                _metrics_endpoint(spec, paths, store, err):
            if spec.multi_node:
                code = launch_cluster(spec, argv, marker, paths, store, out, err)
                _job_dir_line(paths, err)
                return code
            agent = NodeAgent("node-0", out,
                              ConsoleOptions.of(spec.redirects, spec.local_ranks_filter),
                              spec.step_pattern, marker)
            recorder = Recorder(spec, paths, store, argv, on_event=console_printer(err))
            code = Controller(recorder, agent, hurry=agent.hurry).run()
        _job_dir_line(paths, err)
        return code


@contextlib.contextmanager
def _failed_before_start(spec: JobSpec, paths: JobPaths, store: JobStore,
                         argv: list[str]) -> Iterator[None]:
    """A new job whose launch fails before anything is recorded (no Slurm cluster, a metrics
    port in use) is recorded `failed`, exit 2, with the reason, so that status, ls and prune
    see an ended job; a job launched before keeps the state of its last launch."""
    try:
        yield
    except TrainguardError as e:
        with contextlib.suppress(StoreError, OSError):  # the error itself says enough
            if store.meta().get("state") is None:
                rec = Recorder(spec, paths, store, argv)  # quiet: the error is printed
                rec.begin()
                rec.end_job(JobState.FAILED, ExitCode.USAGE,
                            f"job failed before any worker started: {e}")
        raise


@contextlib.contextmanager
def _metrics_endpoint(spec: JobSpec, paths: JobPaths, store: JobStore,
                      err: Writable) -> Iterator[None]:
    """`--metrics-port`: the job's /metrics, served by this process while the job runs."""
    if spec.metrics_port is None:
        store.set_meta(metrics_url=None)
        yield
        return
    from trainguard.goodput.metrics import serve

    try:
        url, close = serve(paths.job_dir, spec.metrics_host, spec.metrics_port)
    except OSError as e:  # taken since prepare's check_metrics_port
        raise metrics_port_refused(spec, e) from None
    store.set_meta(metrics_url=url)
    err.write(f"[trainguard] metrics: {url}\n")
    try:
        yield
    finally:
        close()


def _job_dir_line(paths: JobPaths, err: Writable) -> None:
    err.write(f"[trainguard] job dir: {paths.job_dir}  (trainguard recovery {paths.job_dir})\n")


log = logging.getLogger(__name__)

BRING_UP_TIMEOUT_S = 120.0
ADOPT_TIMEOUT_S = 20.0
# the stored states a dead controller's job is taken over from (JobState.resumable says why)
_RESUMABLE = frozenset(s.value for s in JobState if s.resumable)


def launch_cluster(spec: JobSpec, argv: list[str], marker: str, paths: JobPaths,
                   store: JobStore, out: Writable, err: Writable) -> int:
    cdir = paths.job_dir / "cluster"
    cdir.mkdir(mode=0o700, parents=True, exist_ok=True)
    if cdir.stat().st_uid != os.geteuid():  # its owner could swap controller.json
        raise LaunchError(f"{cdir} belongs to uid {cdir.stat().st_uid}, not to you. Fix: "
                          "remove it, or use a job dir of your own")
    cdir.chmod(0o700)  # what agents read to find their controller: nobody else's to change
    meta = store.meta()
    resumable = meta.get("state") in _RESUMABLE and \
        isinstance(meta.get("controller_port"), int) and (cdir / "token").exists()
    try:
        token = read_token(cdir / "token") if resumable else new_token()
    except WireError as e:  # damaged, or readable by others: a message, not a traceback
        raise LaunchError(f"{e} (or remove {cdir / 'token'}: the running attempt is then "
                          "not taken over)") from e
    if not resumable:
        write_token(cdir / "token", token)
    host = spec.controller_host or ("127.0.0.1" if spec.backend == "local"
                                    else socket.gethostname())
    # bound where agents connect from: loopback for virtual nodes, else the given address
    # (every interface when none is given: the nodes' addresses are not known in advance)
    bind = spec.controller_host or ("127.0.0.1" if spec.backend == "local" else "0.0.0.0")
    port = int(meta["controller_port"]) if resumable else 0
    try:
        hub = Hub(token, bind, port)
    except OSError as e:  # (walk-through 36 #1: a traceback; the CLI checks the address first)
        raise LaunchError(f"the controller cannot listen on {bind}:{port}: {e}. Fix: give "
                          "--controller-host an address of this machine, or free the port "
                          "(a relaunch listens where the last launch did)") from e
    (cdir / "controller.json").write_text(json.dumps({"host": host, "port": hub.port}))
    (cdir / "controller.json").chmod(0o600)  # agents follow only a file nobody else may change
    cfg = AgentConfig.model_validate({
        "run_id": spec.run_id, "controller_file": str(cdir / "controller.json"),
        "token_file": str(cdir / "token"), "step_pattern": spec.step_pattern,
        "marker": marker, "redirects": spec.redirects, "ranks_filter": spec.local_ranks_filter,
        "report_interval_s": report_interval(spec.nnodes + spec.spare_nodes,
                                             spec.monitor_interval),
        "grace_s": spec.grace_period_s})
    (cdir / "agent.json").write_text(cfg.model_dump_json(indent=1))
    agent_argv = [sys.executable, "-m", "trainguard.node.main", "--config",
                  str(cdir / "agent.json")]
    backend = make_backend(spec, cdir, meta.get(OWN_JOB_KEY) if resumable else None)
    rec = Recorder(spec, paths, store, argv, on_event=console_printer(err))
    fleet = Fleet(hub, backend, spec.nnodes, spec.nproc_per_node, spec.node_timeout_s,
                  spec.reconnect_grace_s, publish=lambda f: _publish(store, f))
    fleet.acks_held = rec.writes.unwritten  # a message is acknowledged once its event is written
    if spec.memory_every:  # each node's memory snapshots copied to the next node
        fleet.peer = PeerCopies(hub, lambda: list(fleet.placement))
    fleet.moves = slot_moves(meta)  # schedule counts keep growing across launches
    # a relaunch's nodes start with the implications a repeat offender is counted by (the
    # job's last hour): status showed 0 where one more fault isolated the node (walk-through 26)
    for name, n in recent_implications(History.from_meta(meta), time.time(),
                                       HAPolicy.from_spec(spec)).items():
        if name in fleet.nodes:
            fleet.nodes[name].times_implicated = n
    store.set_meta(controller_port=hub.port, controller_host=host, nnodes=spec.nnodes,
                   spare_nodes=spec.spare_nodes, backend=backend.name,
                   **{OWN_JOB_KEY: getattr(backend, "owned_job", None),
                      SLURM_JOB_KEY: getattr(backend, "job_id", None)})
    adopt = False
    if resumable:  # (walk-through 26: 20 s without a word while the agents were awaited)
        why_not = _agents_gone(store)
        if why_not is None:
            err.write(f"[trainguard] {time.strftime('%H:%M:%S')} attempt "
                      f"{meta.get('attempt')} of this job may still run without a controller: "
                      f"waiting up to {ADOPT_TIMEOUT_S:g}s for its node agents to reconnect, "
                      f"to take it over (if it cannot, up to {KEPT_WAIT_S:g}s more to record "
                      "what they kept)\n")
            why_not = _adopt(fleet, store, int(meta.get("attempt") or 0), rec)
        else:
            _give_up_adoption(fleet, rec, why_not)
        adopt = why_not is None
        if not adopt:
            rec.event(Level.WARNING, Reason.CONTROLLER_RESTARTED,
                      f"a new controller cannot take the running attempt over ({why_not}): "
                      "its workers are stopped and the job is launched again")
    try:
        if not adopt:
            _bring_up(fleet, rec, agent_argv, cdir)
    except LaunchError as e:
        rec.begin()
        code = rec.end_job(JobState.FAILED, ExitCode.FAILED, f"job failed: {e}")
        fleet.close(grace_s=0)
        return code
    nodes = NodeRecovery(rec, fleet)
    hurry = Hurrier(lambda: hub.send_all({"type": HURRY_FRAME}))  # a second Ctrl-C
    echo = _echo_ranks(spec, paths, int(meta.get("attempt") or 0), out) if adopt else None
    try:
        return Controller(rec, fleet, nodes, adopt=adopt, hurry=hurry).run()
    finally:
        if echo is not None:
            echo.close()


def _echo_ranks(spec: JobSpec, paths: JobPaths, attempt: int, out: Writable) -> RankEcho:
    """The adopted agents echo the ranks to the first launcher's console: this one echoes
    them from the rank logs, as its own agents would have (controller/echo.py)."""
    shown = ConsoleOptions.of(spec.redirects, spec.local_ranks_filter)
    echo = RankEcho(paths.log_dir, attempt, out,
                    lambda rank: shown.streams(rank, rank % spec.nproc_per_node))
    echo.start()
    return echo


def make_backend(spec: JobSpec, cdir: Path, own_job: object = None) -> Backend:
    total = spec.nnodes + spec.spare_nodes
    if spec.backend == "slurm":
        from trainguard.backends.slurm import SlurmBackend

        slurm: Backend = SlurmBackend(total, spec.run_id, cdir,
                                      own_job if isinstance(own_job, str) else None,
                                      wait_s=spec.queue_timeout_s)
        return slurm
    return LocalBackend(total, cdir)


def _bring_up(fleet: Fleet, rec: Recorder, agent_argv: list[str], log_dir: Path) -> None:
    """Start an agent on every node not lost or isolated; place the first nnodes that
    connect."""
    names = [n for n, node in fleet.nodes.items() if node.state.usable]
    fleet.start_agents(agent_argv, names)
    missing = fleet.hub.wait_connected(names, BRING_UP_TIMEOUT_S)
    for name in names:
        if name in missing:
            fleet.mark(name, NodeState.LOST,
                       f"its agent did not connect within {BRING_UP_TIMEOUT_S:g}s")
            continue
        link = fleet.hub.links[name]
        rec.event(Level.INFO, Reason.NODE_READY,
                  f"node {name}: agent pid {link.agent_pid} on {link.host} connected",
                  node=name)
    ready = [n for n in names if n not in missing]
    if len(ready) < fleet.nnodes:
        raise LaunchError(f"only {len(ready)} of {len(names)} usable node agents connected "
                          f"({', '.join(missing) or 'none missing'}); the job needs "
                          f"{fleet.nnodes}. Fix: read {log_dir}/<node>.agent.log, or add "
                          "nodes (--spare-nodes, a larger allocation)")
    fleet.place(ready[:fleet.nnodes])


# how long a controller that cannot take over waits for each agent's first report, which
# carries what the agent kept for a controller (several report intervals: 0.25-2 s)
KEPT_WAIT_S = 10.0


def _adopt(fleet: Fleet, store: JobStore, attempt: int, rec: Recorder) -> str | None:
    """Take over from a dead controller when every placed node's workers still run; None
    when taken over, else why not."""
    rows = {r.name: r for r in store.nodes()}
    placement = sorted((r for r in rows.values() if r.slot is not None),
                       key=lambda r: r.slot or 0)
    for name, node in fleet.nodes.items():
        row = rows.get(name)
        if row is not None:
            node.state, node.reason = row.state, row.reason
            node.times_implicated = row.times_implicated
            node.handle = fleet.backend.adopt_agent(name, row.agent_pid)
    names = [r.name for r in placement]
    live = [n for n, node in fleet.nodes.items() if node.state.usable]
    missing = fleet.hub.wait_connected(live, ADOPT_TIMEOUT_S)  # connected: kept ones read
    if len(names) != fleet.nnodes:
        return _give_up_adoption(fleet, rec, f"the store places {len(names)} node(s), not "
                                             f"{fleet.nnodes}")
    for name in names:
        report = fleet.hub.links[name].hello_report if name in fleet.hub.links else None
        if name in missing or report is None:
            why = f"node {name} did not reconnect within {ADOPT_TIMEOUT_S:g}s"
        elif report.attempt != attempt or not report.workers:
            why = f"node {name} runs no workers of attempt {attempt}"
        elif any(w.state.ended for w in report.workers):
            why = f"workers of node {name} ended while no controller watched"
        else:
            continue
        return _give_up_adoption(fleet, rec, why)
    for name in missing:
        fleet.mark(name, NodeState.LOST, "its agent did not reconnect to the restarted controller")
    fleet.placement = names
    fleet.adopt_attempt(attempt)
    fleet.publish()
    return None


def _agents_gone(store: JobStore) -> str | None:
    """Why no takeover can be waited for: on the local backend, none of the recorded node
    agents runs any more (`trainguard stop` ended them); None: they may reconnect."""
    rows = [r for r in store.nodes() if r.agent_pid is not None]
    if not rows or any(r.backend != LocalBackend.name for r in rows) or live_agents(rows):
        return None
    return "none of its node agents runs any more"


def _give_up_adoption(fleet: Fleet, rec: Recorder, why: str) -> str:
    """The running attempt cannot be taken over: end the old agents; a fresh start follows.
    What they kept for a controller (node/outbox.py: a checkpoint committed while none
    watched, sent again on reconnecting) is recorded first, under its own attempt."""
    _record_kept(fleet, rec)
    fleet.end_agents()
    for node in fleet.nodes.values():  # every node starts afresh, as on any relaunch (a
        node.state, node.reason = NodeState.SPARE, None  # lost spare stayed out: walk-through 26)
    return why


def _publish(store: JobStore, fleet: Fleet) -> None:
    store.put_nodes(node_rows(fleet), replace=True)
    store.set_meta(slot_moves=json.dumps(fleet.moves))


def node_rows(fleet: Fleet) -> list[NodeRow]:
    now = utcnow()
    rows = []
    for name, node in fleet.nodes.items():
        link = fleet.hub.links.get(name)
        pid = link.agent_pid if link is not None and link.agent_pid else (
            node.handle.pid if node.handle is not None else None)
        rows.append(NodeRow(
            name=name, host=link.host if link is not None and link.host else "",
            state=node.state, agent_pid=pid,
            slot=fleet.placement.index(name) if name in fleet.placement else None,
            reason=node.reason, updated_at=now, backend=fleet.backend.name,
            times_implicated=node.times_implicated))
    return rows


def _record_kept(fleet: Fleet, rec: Recorder) -> None:
    """Each connected agent's first report after its hello (the hello holds no messages:
    they wait for a connection that holds; the next report sends them, with the kept ones
    again), waited for up to KEPT_WAIT_S, its kept messages recorded."""
    waiting = {n for n in fleet.nodes if fleet.hub.connected(n)}
    deadline = time.monotonic() + KEPT_WAIT_S
    while True:
        for name in sorted(waiting):
            hello = fleet.hub.links[name].hello_report
            for report in fleet.hub.take_reports(name):
                rec.messages.handle([m for m in report.messages if m.id is not None],
                                    report.attempt or 0)
                if report is not hello:
                    waiting.discard(name)
        if not waiting or time.monotonic() > deadline:
            return
        fleet.hub.wait(0.2)
