"""The controller <-> node agent protocol: commands down, facts up.

Plain pydantic models so the same messages travel in-process (one node: the controller
calls its NodeAgent) and as JSON over the wire between nodes (`model_dump_json` /
`model_validate_json`). Pure data.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from enum import Enum
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field

from trainguard.diagnosis.findings import Finding
from trainguard.states import StopCause, WorkerState

# why the controller's hub refused a connection (NodeReport.refused; status, metrics)
REFUSALS = ("handshake", "over_budget", "forged_frame")


class _Msg(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class WorkerAssignment(_Msg):
    rank: int
    local_rank: int
    start_count: int = Field(
        description="how many times this rank's process has been started, this one included")
    schedule_count: int = Field(description="how many times this rank has been placed on a node")


class StartWorkers(_Msg):
    """Start one attempt's workers on a node, with torchrun's environment."""

    run_id: str
    attempt: int
    argv: list[str]
    env: dict[str, str] = Field(description="job-wide variables; the agent adds the per-rank ones")
    workers: list[WorkerAssignment]
    world_size: int
    group_rank: int
    group_world_size: int
    master_addr: str
    master_port: int
    max_restarts: int
    grace_s: float = Field(description="the job's grace period: an earlier attempt's workers "
                           "a start finds running get it to exit (a save on the way out)")
    log_dir: str
    job_dir: str
    checkpoint_dir: str
    cwd: str | None = None
    standby: bool = Field(False, description="keep a pre-warmed standby worker per rank of "
                          "the node for the next restart (node/standby.py)")
    prewarm_imports: list[str] = Field(default_factory=list, description="modules a standby "
                                       "imports besides torch's (--prewarm-imports)")


class StopWorkers(_Msg):
    grace_s: float
    reason: str
    dead_ranks: list[int] = Field(default_factory=list,
                                  description="ranks that failed: survivors need not wait for them")
    saving_grace_s: float | None = Field(default=None, description="while a rank saves on the "
                                         "way out, the grace period lasts up to this long "
                                         "(a confirmed hang's short grace_s: the job's own)")


class WorkerFact(_Msg):
    rank: int
    node: str | None = Field(None, description="the node the rank runs on")
    local_rank: int
    pid: int | None
    state: WorkerState
    returncode: int | None = Field(None, description="as Popen: negative = killed by that signal")
    started_at: datetime | None = None
    ended_at: datetime | None = None
    start_count: int = 1
    standby: bool = Field(False, description="started from a pre-warmed standby, not cold")
    findings: list[Finding] = Field(default_factory=list,
                                    description="what the agent's scan of the rank log found")
    error_file: dict[str, object] | None = Field(None, description="torch @record error file")
    oom_killed: bool | None = Field(
        None, description="killed while the kernel's OOM-kill count rose; None: unknown")
    second_last_step_at: datetime | None = Field(
        None, description="when the rank reached the step before its latest this attempt (a "
        "step line, trainguard.progress(step)): an error its log showed well before, it "
        "trained past")
    stopped_by: StopCause | None = Field(
        None, description="a stopped rank's: who stopped it (this launcher, or its node agent "
        "on a SIGTERM from outside)")

    @property
    def signal_number(self) -> int | None:
        return -self.returncode if self.returncode is not None and self.returncode < 0 else None


class Progress(_Msg):
    """Training steps seen on a node in the current attempt."""

    first_step: int | None = None
    first_step_at: datetime | None = None
    last_step: int | None = None
    last_step_at: datetime | None = None


class WorkerMessage(_Msg):
    """What a worker's in-script library reported (trainguard.worker.channel)."""

    kind: str
    rank: int | None
    at: datetime
    data: dict[str, Any] = Field(default_factory=dict)
    resent: bool = Field(default=False, description="sent again after a reconnect: the controller "
                         "it first went to never acknowledged it (node/outbox.py)")
    id: str | None = Field(default=None, description="a remote agent's id for a message it keeps "
                           "until acknowledged (agent pid, report seq, index): a copy of it is "
                           "recorded once")
    attempt: int | None = Field(default=None, description="the attempt of the report it was "
                                "first sent in (a kept message may come again in a later one)")


class RankLiveness(_Msg):
    """What a node knows of one running rank's liveness (node/liveness.py gathers it,
    hang/detector.py judges it)."""

    rank: int
    last_step: int | None = None
    last_progress_at: datetime | None = Field(
        None, description="the latest progress: a step line, trainguard.progress(), a save")
    intervals: list[float] = Field(default_factory=list,
                                   description="seconds between progress events since the last "
                                   "report (the job's step cadence)")
    phase: str | None = Field(None, description="a phase the script marked (trainguard.phase)")
    phase_since: datetime | None = None
    phase_timeout_s: float | None = None
    last_output_at: datetime | None = Field(None, description="the rank's last line of output")
    unread_step_line: str | None = Field(None, description="a line of the rank's that counts "
                                         "up like steps but that --step-pattern does not read")
    unread_step_pattern: str | None = Field(None, description="a --step-pattern that reads it")
    cpu_s: float | None = Field(None, description="CPU time of the rank's process tree so far")
    io_bytes: int | None = Field(None, description="bytes read + written by its process tree")
    reads: int | None = Field(None, description="read calls of the rank's own process so far "
                              "(every thread's; its data loader's batches arrive as reads)")
    accel_util: int | None = Field(None, description="utilisation (%) of the accelerator of "
                                   "its local rank, when one can be read (NVML, npu-smi)")
    sampled_at: datetime | None = Field(None, description="when cpu/io/accel were sampled")
    # progress implied by its memory snapshots, apart from the above (node/liveness.py)
    implied_step: int | None = Field(None, description="the step of its last memory snapshot")
    implied_at: datetime | None = Field(None, description="when that snapshot was taken")
    implied_intervals: list[float] = Field(default_factory=list, description="seconds between "
                                           "its snapshots since the last report")


class FrameMsg(_Msg):
    name: str
    filename: str
    line: int | None = None
    native: bool = False


class ThreadMsg(_Msg):
    thread_id: int
    name: str | None = None
    idle: bool | None = None
    owns_gil: bool | None = None
    frames: list[FrameMsg] = Field(default_factory=list, description="innermost first")


class StackDump(_Msg):
    """One rank's Python stacks (py-spy), as the node agent took them."""

    rank: int
    pid: int | None
    threads: list[ThreadMsg] = Field(default_factory=list)
    error: str | None = None
    files: list[str] = Field(default_factory=list, description="where the dumps were saved")
    exited: bool = Field(False, description="the process had ended (gone or not yet reaped) "
                         "when its stack was taken")
    stopped: bool = Field(False, description="the process was stopped (state T: SIGSTOP, "
                          "Ctrl-Z, a debugger) before its stack was taken")


class DumpStacks(_Msg):
    """Take every running rank's stack now (a hang is suspected or confirmed), saving them in
    `out_dir`."""

    out_dir: str
    timeout_s: float = 10.0
    native: bool = Field(default=True, description="native frames too (slower): what a "
                         "confirmed hang's evidence needs; a look at whether a stack moves "
                         "does not")
    ranks: list[int] | None = Field(default=None, description="only these ranks (None: every "
                                    "running rank)")


class Tell(_Msg):
    """A control message (worker.contract.ControlKind and its fields) for running ranks,
    out of band: StepGuard's verdicts, run_resilient's, load_latest's resume step."""

    control: dict[str, Any]
    ranks: list[int] | None = None  # None: every running rank of the node


class RestartRanks(_Msg):
    """In-process restart: kill and start again only `ranks` (the dead or hung), and tell
    every other running rank to leave its training function, join the process group
    `generation` at master_addr:master_port and re-enter (worker/resilient.py)."""

    ranks: list[int]
    generation: int
    master_addr: str
    master_port: int
    reason: str = ""


class NodeUsage(_Msg):
    """A node's memory held for fast recovery (node/usage.py), shown by `trainguard status`."""

    node: str
    standby_ready: int = Field(0, description="standby workers waiting for a rank, their "
                               "imports done")
    standby_warming: int = Field(0, description="standby workers still importing")
    standby_rss_bytes: int = Field(0, description="their resident memory, all together "
                                   "(ready and warming)")
    shm_bytes: int = Field(0, description="/dev/shm held by the job's snapshot region: its "
                           "own ranks' slots and manifests")
    shm_peer_bytes: int = Field(0, description="of which the copies kept for a neighbour "
                                "node's ranks (peer copies)")


class NodeReport(_Msg):
    node: str
    attempt: int | None
    workers: list[WorkerFact]
    progress: Progress
    at: datetime
    messages: list[WorkerMessage] = Field(default_factory=list,
                                          description="worker messages since the last report")
    liveness: list[RankLiveness] = Field(default_factory=list,
                                         description="per running rank, for hang detection")
    lost_nodes: list[str] = Field(default_factory=list,
                                  description="nodes of the placement whose agent was lost "
                                  "(multi-node: silent, disconnected or its process ended)")
    usage: list[NodeUsage] = Field(default_factory=list, description="per node (an agent: "
                                   "its own; the fleet: every node's, spares too)")
    refused: dict[str, int] = Field(default_factory=dict, description="the fleet's: connections "
                                    "the controller's hub refused so far, by why")
    messages_refused: int = Field(default=0, description="datagrams the worker channel refused "
                                  "so far (a stranger's, malformed, out of bounds): an agent's "
                                  "own; the fleet's: every node's")
    terminating: bool = Field(default=False, description="the agent got SIGTERM (node/term.py): "
                              "its workers are stopped, the node leaves the job")
    terminating_nodes: list[str] = Field(default_factory=list, description="the fleet's: placed "
                                         "nodes whose agent got SIGTERM")
    persisting: bool = Field(default=False, description="the agent is saving the ranks' memory "
                             "snapshots to storage (a save at breakpoint) now")
    seq: int | None = Field(default=None, description="a remote agent's number for a report whose "
                            "messages it keeps until the controller acknowledges them")
    epoch: int | None = Field(default=None, description="with `seq`: which agent process "
                              "numbered it (its pid; a new agent for the node counts from 1)")


class AgentAPI(Protocol):
    """What the controller needs from a node, wherever the node is."""

    def start_workers(self, cmd: StartWorkers) -> NodeReport: ...
    def poll(self, wait_s: float = 0.0) -> NodeReport: ...
    def stop_workers(self, cmd: StopWorkers,
                     meanwhile: Callable[[NodeReport], None] | None = None) -> NodeReport:
        """SIGTERM, the grace period, SIGKILL; each second of the grace period `meanwhile`
        gets a report (ranks that ignore SIGTERM train on)."""
    def dump_stacks(self, cmd: DumpStacks) -> list[StackDump]: ...
    def tell(self, cmd: Tell) -> int: ...
    def restart_ranks(self, cmd: RestartRanks) -> int: ...
    def rendezvous(self, addr: str, preferred_port: int | None) -> tuple[str, int]: ...
    def close(self) -> None: ...


# -- node agent processes (multi-node) ----------------------------------------


class Op(str, Enum):
    """The commands a node agent serves (the wire's `op`): body in -> body out."""

    START = "start"  # StartWorkers -> NodeReport
    STOP = "stop"  # StopWorkers -> NodeReport
    DUMP = "dump"  # DumpStacks -> {"dumps": [StackDump]}
    PORT = "port"  # {} -> {"port": int}: a port free on this node now (the rendezvous)
    PRECHECK = "precheck"  # PrecheckConfig -> PrecheckReport
    EXIT = "exit"  # {"grace_s": float} -> {}: stop the workers and end the agent
    TELL = "tell"  # Tell -> {"told": int}: how many running ranks were told
    PREPARE = "prepare"  # StartWorkers -> {}: a spare keeps standbys ready for such workers
    # peer copies of memory snapshots (node/peer.py, controller/peer_copies.py)
    # {list} -> {"steps"} | {entries} -> {"entries"} | {tails: {rank: generation}} ->
    # {"tails"} | {peer, rank, step, offset} -> a chunk
    PEER_TAKE = "peer_take"
    PEER_STORE = "peer_store"  # a chunk + {peer, origin} -> {"whole": bool}
    PEER_PIN = "peer_pin"  # {steps} -> {}: every rank of the node keeps those steps
    # {step, token, source, ranks: {rank: from the peer copies}} -> {"started": bool}: save
    # at breakpoint after a node loss, this node's part (checkpoint/persist.py --rank)
    PEER_PERSIST = "peer_persist"


# a frame the controller sends, not a command: a second Ctrl-C came, so the node agent ends
# the grace period of the stop under way (its STOP command) and SIGKILLs what is left
HURRY_FRAME = "hurry"
# a frame the controller sends, not a command: {"type": ACK_FRAME, "seq": N, "epoch": E}, the
# messages of the reports up to seq N of the agent process E are recorded (node/outbox.py
# keeps them until then; another agent process of the node ignores it)
ACK_FRAME = "ack"


# how long a save at breakpoint under way (the agent persisting the memory snapshots) may go
# on once the job ends: the agent's close waits so long, and so does a job that gives up,
# to record its CheckpointSaved or CheckpointSaveFailed before JobFailed
PERSIST_WAIT_S = 120.0
REPORTS_PER_S = 250.0  # every agent's NodeReports together: the controller's budget


def report_interval(nodes: int, monitor_interval_s: float) -> float:
    """How often each agent pushes its NodeReport: the monitor interval (at least 0.25 s),
    slower past REPORTS_PER_S / 4 nodes so the controller parses at most REPORTS_PER_S
    reports a second (2,000 nodes: every 8 s). Loss detection does not wait on reports:
    beats, disconnects and the node timeout decide it."""
    return max(monitor_interval_s, 0.25, nodes / REPORTS_PER_S)


class AgentConfig(BaseModel):
    """Written by the controller to JOB_DIR/cluster/agent.json; read by every agent."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    run_id: str
    controller_file: str = Field(description="JSON {host, port} of the controller; re-read "
                                 "before each reconnect (a restarted controller may move)")
    token_file: str
    step_pattern: str
    marker: str
    redirects: dict[int, int] = Field(default_factory=dict)
    ranks_filter: list[int] | None = None
    report_interval_s: float = Field(0.25, gt=0, description="NodeReport pushes")
    heartbeat_s: float = Field(1.0, gt=0, description="beats, also while a command runs")
    orphan_timeout_s: float = Field(600.0, gt=0, description="without a controller this long, "
                                    "the agent stops its workers and ends")
    grace_s: float = Field(15.0, ge=0, description="the job's grace period: the workers get it "
                           "when a SIGTERM of the agent's own (the cluster ending its step) "
                           "makes it stop them itself (node/term.py)")
    node_addr: str | None = Field(None, description="the address other nodes reach this one "
                                  "at (default: the one its controller connection uses)")
