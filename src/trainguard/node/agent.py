"""The node agent: owns one node's worker processes and reports facts; decides nothing.

Commands (protocol.StartWorkers / StopWorkers) come from the controller; NodeReport goes back
(in-process or as JSON). Worker lifecycle: STARTING -> RUNNING -> SUCCEEDED | FAILED | STOPPED."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

from trainguard.console import Writable
from trainguard.diagnosis.sources import default_trigger
from trainguard.errors import LaunchError
from trainguard.node import ports, procs
from trainguard.node.channel import ChannelServer, JobProcesses
from trainguard.node.env import worker_env
from trainguard.node.facts import Worker, log_errors, oom_kill_count, worker_fact, worker_message
from trainguard.node.liveness import LivenessBook
from trainguard.node.logs import ConsoleOptions, LogRouter
from trainguard.node.memory import MemoryRegion
from trainguard.node.reentry import ReEntry
from trainguard.node.standby import StandbyPool
from trainguard.node.usage import UsageMeter
from trainguard.paths import attempt_log_dir, rank_log_path
from trainguard.protocol import (
    DumpStacks,
    NodeReport,
    Progress,
    RestartRanks,
    StackDump,
    StartWorkers,
    StopWorkers,
    Tell,
    WorkerAssignment,
    WorkerFact,
    WorkerMessage,
)
from trainguard.records import utcnow
from trainguard.states import StopCause, WorkerState, ended_state
from trainguard.worker.contract import (
    ENV_DEAD_RANKS,
    ENV_PG_GENERATION,
    ENV_SOCKET,
    ControlKind,
    MessageKind,
    parse_control,
)
from trainguard.worker.fields import ContractError

log = logging.getLogger(__name__)

PRELOAD_JOIN_S = 30.0  # close(): the rules take about a second to load; never hang on them


class NodeAgent:
    """Supervises the local ranks of one node."""

    def __init__(self, node: str, console: Writable, console_opts: ConsoleOptions,
                 step_pattern: str, marker: str) -> None:
        self.node = node
        self._console, self._console_opts = console, console_opts
        self._step_pattern, self._marker = step_pattern, marker
        self._workers: list[Worker] = []
        self._router: LogRouter | None = None
        self._attempt: int | None = None
        self._start: StartWorkers | None = None  # the attempt's command (in-process restarts)
        self._progress = Progress()
        self._progress_lock = threading.Lock()
        self._oom_base: int | None = None
        self._dead_file: Path | None = None
        self._job_dir: Path | None = None
        self._liveness = LivenessBook()
        self._strays_reaped = 0.0
        self._hurried = False  # hurry(): the grace period is over
        self.draining: StopCause | None = None  # who drains; OUTSIDE: got SIGTERM, leaving
        procs.become_subreaper()
        # the failure rules (YAML, RE2) load in the background now, not on the recovery path
        self._preloader = threading.Thread(target=default_trigger, name="trainguard-rules",
                                           daemon=True)  # ends by itself; joined in close()
        self._preloader.start()
        self._guardian = procs.Guardian(marker)
        self._standby = StandbyPool(self._guardian)
        self.memory = MemoryRegion(marker, node, self._guardian)  # memory snapshots' region
        self._usage = UsageMeter(node, self._standby.pids, self._standby.warm, self.memory.held)
        self._prepared_at: datetime | None = None  # a spare told to keep standbys ready
        self._reentry = ReEntry()  # after an in-process restart: whose steps count
        self._channel = ChannelServer(  # only this job's processes may send
            f"@trainguard-{marker}-{node}-{os.getpid()}", JobProcesses(self._guardian.groups),
            on_message=self._reentry.seen)

    # -- commands -------------------------------------------------------------------------

    def start_workers(self, cmd: StartWorkers) -> NodeReport:
        """Start this node's workers of `cmd.attempt` (refused once it got SIGTERM: review 54
        #1); an earlier attempt's still running are stopped first (its stop missed: 42 #1)."""
        if self.draining == StopCause.OUTSIDE:
            raise LaunchError("this node's agent got SIGTERM: it is leaving the job")
        if any(not w.state.ended for w in self._workers):
            if self._attempt is not None and cmd.attempt <= self._attempt:
                raise LaunchError(f"start_workers of attempt {cmd.attempt} while its workers "
                                  "still run")
            log.warning("attempt %d starts while workers of attempt %d still run (their stop "
                        "did not reach this node): stopping them first", cmd.attempt, self._attempt)
            self.stop_workers(StopWorkers(grace_s=cmd.grace_s, reason="a newer attempt"))
        self._attempt, self._start = cmd.attempt, cmd
        self._hurried, self.draining = False, None  # a Ctrl-C ends only the stop it came in
        self._job_dir = Path(cmd.job_dir)
        self._oom_base = oom_kill_count()
        self._dead_file = self._dead_ranks_file(cmd)
        with self._progress_lock:
            self._progress = Progress()
        self._reentry.clear()
        router = LogRouter(self._console, self._step_pattern, self._on_progress)
        self._workers, log_dir = [], Path(cmd.log_dir)
        for a in cmd.workers:  # (one by one: a failed spawn stops those before it)
            self._workers.append(self._spawn(cmd, a, router, log_dir))
        self._router = router
        self._reset_liveness()
        router.start()
        a = cmd.workers[0]  # the standbys' environment: any rank's, per-rank variables aside
        self._standby.configure(len(cmd.workers) if cmd.standby else 0, cmd.argv,
                                self._env(cmd, a, ""), cmd.cwd or os.getcwd(),
                                cmd.prewarm_imports)
        return self.poll()

    def prepare(self, cmd: StartWorkers) -> None:
        """A spare: keep standbys ready for such workers (a pod-level move brings them)."""
        if any(not w.state.ended for w in self._workers) or not cmd.workers:
            return
        self._prepared_at = utcnow()
        self._standby.configure(len(cmd.workers) if cmd.standby else 0, cmd.argv,
                                self._env(cmd, cmd.workers[0], ""), cmd.cwd or os.getcwd(),
                                cmd.prewarm_imports)

    def _dead_ranks_file(self, cmd: StartWorkers) -> Path:
        return attempt_log_dir(Path(cmd.log_dir), cmd.attempt) / "dead-ranks.json"

    def _spawn(self, cmd: StartWorkers, a: WorkerAssignment, router: LogRouter,
               log_dir: Path) -> Worker:
        err_file = rank_log_path(log_dir, cmd.attempt, a.rank).with_suffix(".error.json")
        err_file.parent.mkdir(parents=True, exist_ok=True)
        err_file.unlink(missing_ok=True)
        env = self._env(cmd, a, str(err_file))
        try:
            proc = self._standby.take(cmd.argv, env, cmd.cwd or os.getcwd())
            standby = proc is not None
            proc = proc or procs.spawn(cmd.argv, env, cmd.cwd)
        except OSError as e:
            self.stop_workers(StopWorkers(grace_s=0, reason="launch failed"))
            raise LaunchError(f"cannot start {cmd.argv[0]!r}: {e.strerror or e}. Fix: check "
                              "the script path, -m / --no-python and the file's permissions"
                              ) from e
        self._guardian.watch(proc.pid)
        assert proc.stdout is not None and proc.stderr is not None
        try:
            router.add(a.rank, rank_log_path(log_dir, cmd.attempt, a.rank), proc.stdout,
                       proc.stderr, self._console_opts.streams(a.rank, a.local_rank))
        except BaseException:  # not a worker of ours yet: never left running (walk-through
            procs.stop_groups([proc], 0.0)  # 27: a rank spawned as the launcher crashed
            self._guardian.forget(proc.pid)  # trained on alone, orphaned, 12 minutes on)
            raise
        log.debug("started rank %s as pid %s%s", a.rank, proc.pid,
                  " (a standby)" if standby else "")
        return Worker(a, proc, utcnow(), err_file,
                       log=rank_log_path(log_dir, cmd.attempt, a.rank), standby=standby)

    def _env(self, cmd: StartWorkers, a: WorkerAssignment, error_file: str) -> dict[str, str]:
        env = worker_env(cmd, a, error_file, self._marker)
        env[ENV_SOCKET] = self._channel.name
        env[ENV_DEAD_RANKS] = str(self._dead_ranks_file(cmd))
        env.update(self.memory.env(cmd.env))
        return env

    def poll(self, wait_s: float = 0.0) -> NodeReport:
        """Facts now; with wait_s, first wait up to that long for a worker to exit."""
        running = [w.proc for w in self._workers if not w.state.ended]
        if wait_s > 0 and running:
            procs.wait_any_exit(running, wait_s)
        self._update_states()
        if time.monotonic() - self._strays_reaped > 1.0:
            self._strays_reaped = time.monotonic()
            procs.reap_strays({w.proc.pid for w in self._workers} | {self._guardian.pid})
        if self._router is not None and all(w.state.ended for w in self._workers):
            self._router.join(timeout=0.5)  # their last lines, before the facts go up
        since = self._progress.first_step_at or (None if self._workers else self._prepared_at)
        self._standby.maintain(None if since is None else (utcnow() - since).total_seconds())
        return self._report()

    def snapshot(self) -> NodeReport:
        """The workers' facts and the progress now, taking nothing: the worker messages and
        liveness deltas stay for the next poll (a report that may never be delivered)."""
        self._update_states()
        with self._progress_lock:
            progress = self._progress
        return NodeReport(node=self.node, attempt=self._attempt, workers=self._facts(),
                          progress=progress, at=utcnow())

    def _update_states(self) -> None:
        now = utcnow()
        for w in self._workers:
            rc = procs.exit_status(w.proc.pid) if not w.state.ended else None
            if rc is not None:  # RUNNING -> SUCCEEDED | STOPPED (drained) | FAILED (unreaped)
                w.state = ended_state(rc, self.draining)
                w.ended_at, w.returncode = now, rc
                w.stopped_by = self.draining if w.state == WorkerState.STOPPED else None
                if rc == -signal.SIGKILL:
                    w.oom_killed = self._oom_rose()
                if rc != 0 and self._start is not None:  # save at breakpoint
                    self._persist_memory(self._start, w.assignment)
        self.memory.reap()

    def _persist_memory(self, cmd: StartWorkers, a: WorkerAssignment) -> None:
        if len(cmd.workers) == cmd.world_size:  # every rank's snapshot is on this node
            self.memory.persist(self._env(cmd, a, ""), cmd, self._progress.last_step,
                                 self._dead_ranks_file(cmd).with_name("persist.log"))

    def persist_part(self, step: int, ranks: dict[int, str], token: str, source: str) -> bool:
        """Save at breakpoint after a node loss: write `ranks`' snapshots of `step`, each from
        its directory (this node's region or the copies it keeps for the lost node), as
        this node's part of the save `token` (the node with rank 0 commits)."""
        cmd = self._start
        if cmd is None:
            return False
        spread = [*(f"--rank={r}={d}" for r, d in sorted(ranks.items())),
                  f"--token={token}", f"--source={source}"]
        return self.memory.persist(self._env(cmd, cmd.workers[0], ""), cmd, step,
                                   self._dead_ranks_file(cmd).with_name("persist.log"), spread)

    def stop_workers(self, cmd: StopWorkers, meanwhile: Callable[[NodeReport], None] | None = None,
                     cut_short: Callable[[], bool] = lambda: False,
                     by: StopCause = StopCause.LAUNCHER) -> NodeReport:
        """Stop every worker: SIGTERM, `cmd.grace_s`, SIGKILL; the grace period ends early on
        hurry() or once `cut_short()` (a node agent's link brought the controller's hurry);
        each second of it a report goes to `meanwhile` (ranks may train on: walk-through 30).
        Each rank stopped ends when its process did, stopped `by` whom."""
        early = self.poll().messages  # kept: a rank may have said something just before
        if cmd.dead_ranks and self._dead_file is not None:
            with contextlib.suppress(OSError):
                self._dead_file.write_text(json.dumps(cmd.dead_ranks))
        running = [w for w in self._workers if not w.state.ended]
        exited = procs.stop_groups([w.proc for w in self._workers], cmd.grace_s, self._marker,
                          cut_short=lambda: self._hurried or cut_short(),
                          meanwhile=lambda: meanwhile(self._report()) if meanwhile else None,
                          longer=(cmd.saving_grace_s, self._liveness.saving_on_exit)
                          if cmd.saving_grace_s else None)
        for w in running:  # RUNNING -> STOPPED, each at its own exit (review 53 #3)
            w.state, w.returncode, w.stopped_by = WorkerState.STOPPED, w.proc.returncode, by
            w.ended_at = exited.get(w.proc.pid) or utcnow()
        self._channel.drain(keep=True)  # their last datagrams, while they are admitted
        for w in self._workers:
            self._guardian.forget(w.proc.pid)
        if self._router is not None:
            self._router.close(timeout=2.0)
        report = self._report()
        return report.model_copy(update={"messages": [*early, *report.messages]})

    def rendezvous(self, addr: str, preferred_port: int | None) -> tuple[str, int]:
        """Rank 0's store address for the next attempt: `addr`, a fresh port unless given."""
        return addr, preferred_port or ports.free_port(addr)

    def hurry(self) -> None:
        """End a stop's grace period (a second Ctrl-C): SIGKILL what is left. A flag only."""
        self._hurried = True

    def tell(self, cmd: Tell) -> int:
        """A control message to the running ranks `cmd.ranks` (all: None); how many."""
        try:
            parse_control(cmd.control)
        except ContractError as e:
            raise LaunchError(f"not a control message: {e}") from e
        if cmd.control.get("kind") == ControlKind.DRAIN.value and self.draining is None:
            self.draining = StopCause.LAUNCHER
        running = [w.assignment.rank for w in self._workers if not w.state.ended]
        return self._channel.tell([r for r in running if cmd.ranks is None or r in cmd.ranks],
                                  cmd.control)

    def restart_ranks(self, cmd: RestartRanks) -> int:
        """In-process restart: kill `cmd.ranks` (dead already, or hung: a gloo peer cannot be
        aborted, only killed), tell every other running rank to re-enter its training
        function on the new group, then start only `cmd.ranks` again; how many were told."""
        if self._start is None or self._router is None:
            raise LaunchError("restart_ranks before start_workers")
        old = [w for w in self._workers if w.assignment.rank in cmd.ranks]
        if len(old) != len(set(cmd.ranks)):
            raise LaunchError(f"restart_ranks: rank(s) {cmd.ranks} are not all on this node")
        live = [w for w in old if not w.state.ended]
        procs.stop_groups([w.proc for w in live], 0.0)  # SIGKILL now; no marker: peers live on
        self._update_states()
        for w in old:
            self._guardian.forget(w.proc.pid)
        survivors = [w.assignment.rank for w in self._workers
                     if not w.state.ended and w.assignment.rank not in cmd.ranks]
        told = self._channel.tell(survivors, {
            "kind": ControlKind.RESTART.value, "generation": cmd.generation,
            "master_addr": cmd.master_addr, "master_port": cmd.master_port})
        with self._progress_lock:  # the first step in the new generation ends the incident
            self._progress = Progress()
        self._reentry.expect([w.assignment.rank for w in self._workers], cmd.generation)
        start = self._start.model_copy(update={
            "master_addr": cmd.master_addr, "master_port": cmd.master_port,
            "env": {**self._start.env, ENV_PG_GENERATION: str(cmd.generation)}})
        log_dir = Path(start.log_dir)
        for w in old:
            a = w.assignment.model_copy(update={"start_count": w.assignment.start_count + 1})
            new = self._spawn(start, a, self._router, log_dir)
            self._workers[self._workers.index(w)] = new
            log.info("rank %d restarted in-process as pid %d (%s)", a.rank, new.proc.pid,
                     cmd.reason)
        self._reset_liveness()  # every rank starts its function again: a first step anew
        return told

    def _reset_liveness(self) -> None:
        running = [w for w in self._workers if not w.state.ended]
        self._liveness.reset({w.assignment.rank: w.proc.pid for w in running},
                             {w.assignment.rank: w.assignment.local_rank for w in running})

    def dump_stacks(self, cmd: DumpStacks) -> list[StackDump]:
        """Every running rank's Python stacks (py-spy), saved under cmd.out_dir."""
        from trainguard.node.stacks import dump_stack_messages

        pids = {w.assignment.rank: w.proc.pid for w in self._workers if not w.state.ended
                and (cmd.ranks is None or w.assignment.rank in cmd.ranks)}
        return dump_stack_messages(pids, Path(cmd.out_dir), cmd.timeout_s, cmd.native)

    def close(self) -> None:
        if any(not w.state.ended for w in self._workers):
            self.stop_workers(StopWorkers(grace_s=0, reason="agent closing"))
        self._standby.close()
        self.memory.close()
        self._guardian.close()
        self._channel.close()
        self._preloader.join(PRELOAD_JOIN_S)

    # -- facts ----------------------------------------------------------------------------

    def _oom_rose(self) -> bool | None:
        now = oom_kill_count()
        return None if now is None or self._oom_base is None else now > self._oom_base

    def _on_progress(self, rank: int, step: int, at: datetime, line: bool = True) -> None:
        if line and self._reentry.reports_itself(rank):
            return  # its own progress decides: a log line's number is not a step
        if not self._reentry.counts(rank):  # a survivor's step of the old group
            self._liveness.progress(rank, step, at)
            return
        with self._progress_lock:
            p = self._progress
            if p.first_step is None:
                p = p.model_copy(update={"first_step": step, "first_step_at": at})
            if p.last_step is None or step > p.last_step:  # the same step again (a frozen
                p = p.model_copy(update={"last_step": step, "last_step_at": at})  # rank's exit)
            self._progress = p
        self._liveness.progress(rank, step, at)

    def _report(self) -> NodeReport:
        messages = [worker_message(m) for m in self._channel.drain()]
        for m in messages:
            self._liveness_message(m)
        self._liveness.sample()
        with self._progress_lock:
            progress = self._progress
        running = {w.assignment.rank for w in self._workers if not w.state.ended}
        router = self._router
        return NodeReport(node=self.node, attempt=self._attempt, workers=self._facts(),
                          progress=progress, at=utcnow(), messages=messages + log_errors(router),
                          messages_refused=self._channel.dropped,
                          terminating=self.draining == StopCause.OUTSIDE,
                          liveness=self._liveness.report(
                              running, router.last_output() if router else {},
                              router.unread_steps() if router else {}),
                          usage=[self._usage.now()], persisting=self.memory.persisting())

    def _facts(self) -> list[WorkerFact]:
        return [worker_fact(self.node, w, self._router, self._job_dir,
                            self._liveness.second_last_step_at(w.assignment.rank))
                for w in self._workers]

    def _liveness_message(self, m: WorkerMessage) -> None:
        """trainguard.progress / trainguard.phase / a checkpoint save: liveness signals (the
        fields as worker.contract checked them); every message goes on to the controller."""
        if m.rank is None:
            return
        if m.kind == MessageKind.PROGRESS:
            self._on_progress(m.rank, int(m.data["step"]), m.at, line=False)
        elif m.kind == MessageKind.SNAPSHOT_TAKEN:
            self._liveness.implied(m.rank, int(m.data["step"]), m.at)
        elif m.kind == MessageKind.IMPORTS:
            self._standby.learn(m.data["modules"].split(","))
        else:  # a phase, a checkpoint saved
            self._liveness.message(m.rank, m)
