"""The launcher <-> worker contract: every name and shape both sides rely on. Pure, stdlib only.

Training scripts load this module (through trainguard.worker.channel and the checkpoint
library); the node agent and the controller import it too. It never imports pydantic,
torch or launcher code, and does no I/O.

- The environment: every variable trainguard sets for a worker or reads in one (`ENV_*`,
  listed in TRAINGUARD_ENV), and torchrun's variables, which the agent sets as torchrun
  would (TORCHRUN_ENV).
- The channel: every kind of message a worker sends its agent (MessageKind), each with its
  typed, bounded fields (FIELDS; the Field type and its checks: worker/fields.py, stdlib only
  too). The agent checks each datagram with `parse_message` and drops what fails.
- The rank log line: `<ISO time read> <out|err> <text>` (stamp_lines, STAMP_PATTERN), and
  the line a rank prints where it recovered in place (RECOVERY_PATTERN).

Adding a message kind: a MessageKind member, its fields in FIELDS, a sender, and an entry in
the receiver's dispatch table (node/agent.py: liveness; controller/worker_messages.py).
"""

from __future__ import annotations

from enum import Enum
from typing import Any

from trainguard.worker.fields import (
    MAX_INT32,
    MAX_INT64,
    MAX_LIST,
    MAX_METRIC,
    MAX_NAME,
    MAX_PATH,
    MAX_PID,
    MAX_RANK,
    MAX_SECONDS,
    MAX_TEXT,
    MAX_TIME,
    ContractError,
    Field,
    checked,
    show,
)
from trainguard.worker.fields import (
    int_field as _int,
)
from trainguard.worker.fields import (
    seconds_field as _seconds,
)
from trainguard.worker.fields import (
    text_field as _text,
)

# -- the environment: trainguard's own variables ------------------------------------------
ENV_SOCKET = "TRAINGUARD_AGENT_SOCKET"  # the agent's channel, an abstract socket `@name`
ENV_MARKER = "TRAINGUARD_MARKER"  # the job's mark: finds its strays after an agent died
ENV_ATTEMPT = "TRAINGUARD_ATTEMPT"  # the attempt (as TORCHELASTIC_RESTART_COUNT)
ENV_PROCESS_START_COUNT = "TRAINGUARD_PROCESS_START_COUNT"  # starts of this rank, this one too
ENV_SCHEDULE_COUNT = "TRAINGUARD_SCHEDULE_COUNT"  # how often this rank was placed on a node
ENV_JOB_DIR = "TRAINGUARD_JOB_DIR"
ENV_CHECKPOINT_DIR = "TRAINGUARD_CHECKPOINT_DIR"  # Checkpointer()'s default location
ENV_DEAD_RANKS = "TRAINGUARD_DEAD_RANKS_FILE"  # the agent lists the ranks that died there
ENV_GRACE = "TRAINGUARD_GRACE_PERIOD_S"  # seconds between SIGTERM and SIGKILL
ENV_SAVE_ON_EXIT = "TRAINGUARD_SAVE_ON_EXIT"  # "1": save a checkpoint on the way out
ENV_FAULT = "TRAINGUARD_FAULT"  # set by a user: trainguard.testing.faults
ENV_STEP_RETRY = "TRAINGUARD_STEP_RETRY"  # "1": StepGuard re-executes a failed step
ENV_STEP_RETRY_TIMEOUT = "TRAINGUARD_STEP_RETRY_TIMEOUT_S"  # a rank's wait for the new group
ENV_IN_PROCESS = "TRAINGUARD_IN_PROCESS_RESTART"  # "1": run_resilient re-enters in place
ENV_IN_PROCESS_TIMEOUT = "TRAINGUARD_IN_PROCESS_TIMEOUT_S"  # a survivor's wait for a verdict
ENV_PG_GENERATION = "TRAINGUARD_PG_GENERATION"  # the process group generation to join
ENV_MEMORY_EVERY = "TRAINGUARD_MEMORY_EVERY"  # steps between memory snapshots; 0: none
ENV_MEMORY_DIR = "TRAINGUARD_MEMORY_DIR"  # the node agent's shared-memory region
ENV_SHM_ROOT = "TRAINGUARD_SHM_ROOT"  # the agent makes its region there (default /dev/shm)
ENV_MEMORY_PEER = "TRAINGUARD_MEMORY_PEER"  # "1": peer copies; keep the step pinned for them
ENV_AUTO_RESUME = "TRAINGUARD_AUTO_RESUME"  # hf | lightning: the site hook's framework
ENV_EVAL_BATCH_S = "TRAINGUARD_EVAL_BATCH_S"  # set by a user: an evaluation batch's allowance
TRAINGUARD_ENV = (ENV_SOCKET, ENV_MARKER, ENV_ATTEMPT, ENV_PROCESS_START_COUNT,
                  ENV_SCHEDULE_COUNT, ENV_JOB_DIR, ENV_CHECKPOINT_DIR, ENV_DEAD_RANKS,
                  ENV_GRACE, ENV_SAVE_ON_EXIT, ENV_FAULT, ENV_STEP_RETRY,
                  ENV_STEP_RETRY_TIMEOUT, ENV_IN_PROCESS, ENV_IN_PROCESS_TIMEOUT,
                  ENV_PG_GENERATION, ENV_MEMORY_EVERY, ENV_MEMORY_DIR, ENV_SHM_ROOT,
                  ENV_MEMORY_PEER, ENV_AUTO_RESUME, ENV_EVAL_BATCH_S)

# -- the environment: torchrun's variables (set by the agent, read by the library) --------
ENV_RANK = "RANK"
ENV_LOCAL_RANK = "LOCAL_RANK"
ENV_WORLD_SIZE = "WORLD_SIZE"
ENV_LOCAL_WORLD_SIZE = "LOCAL_WORLD_SIZE"
ENV_GROUP_RANK = "GROUP_RANK"
ENV_GROUP_WORLD_SIZE = "GROUP_WORLD_SIZE"
ENV_ROLE_RANK = "ROLE_RANK"
ENV_ROLE_WORLD_SIZE = "ROLE_WORLD_SIZE"
ENV_ROLE_NAME = "ROLE_NAME"
ENV_MASTER_ADDR = "MASTER_ADDR"
ENV_MASTER_PORT = "MASTER_PORT"
ENV_RESTART_COUNT = "TORCHELASTIC_RESTART_COUNT"
ENV_MAX_RESTARTS = "TORCHELASTIC_MAX_RESTARTS"
ENV_RUN_ID = "TORCHELASTIC_RUN_ID"
ENV_USE_AGENT_STORE = "TORCHELASTIC_USE_AGENT_STORE"
ENV_ERROR_FILE = "TORCHELASTIC_ERROR_FILE"  # torch's @record writes the exception there
ENV_PYTHON_EXEC = "PYTHON_EXEC"
ENV_OMP_NUM_THREADS = "OMP_NUM_THREADS"  # 1 unless set, as torchrun
ENV_PYTHONUNBUFFERED = "PYTHONUNBUFFERED"  # 1 unless set: lines reach the log as printed
ENV_PYTHONFAULTHANDLER = "PYTHONFAULTHANDLER"  # 1 unless set: a native crash logs Python stacks
TORCHRUN_ENV = (ENV_RANK, ENV_LOCAL_RANK, ENV_WORLD_SIZE, ENV_LOCAL_WORLD_SIZE, ENV_GROUP_RANK,
                ENV_GROUP_WORLD_SIZE, ENV_ROLE_RANK, ENV_ROLE_WORLD_SIZE, ENV_ROLE_NAME,
                ENV_MASTER_ADDR, ENV_MASTER_PORT, ENV_RESTART_COUNT, ENV_MAX_RESTARTS, ENV_RUN_ID,
                ENV_USE_AGENT_STORE, ENV_ERROR_FILE, ENV_PYTHON_EXEC, ENV_OMP_NUM_THREADS,
                ENV_PYTHONUNBUFFERED, ENV_PYTHONFAULTHANDLER)


# -- the channel: message kinds and their fields -------------------------------------------
MAX_DATAGRAM_BYTES = 60_000  # a sender drops a larger message (well under the kernel's limit)


class MessageKind(str, Enum):
    """What a worker tells its agent; the agent forges LOG_WRITE_FAILED itself."""

    PROGRESS = "progress"  # trainguard.progress(step)
    PHASE = "phase"  # trainguard.phase(...) began or ended
    CHECKPOINT_SAVED = "checkpoint_saved"  # rank 0, once a save is committed
    CHECKPOINT_SAVE_FAILED = "checkpoint_save_failed"
    CHECKPOINT_EXIT_SKIPPED = "checkpoint_exit_skipped"  # no save on the way out, and why
    CHECKPOINT_SAVE_SKIPPED = "checkpoint_save_skipped"  # rank 0: a save wrote nothing, and why
    CHECKPOINT_CORRUPT = "checkpoint_corrupt"  # rank 0: a checkpoint skipped while loading
    NO_CHECKPOINT = "no_checkpoint"  # rank 0: nothing valid to load
    RESUMED = "resumed"  # every rank, once it loaded a checkpoint
    STEP_FAILED = "step_failed"  # StepGuard: a step failed; the rank waits for a verdict
    STEP_REEXECUTED = "step_reexecuted"  # StepGuard: the step ran again and every rank agreed
    RESILIENT = "resilient"  # run_resilient: this rank (re-)entered the training function
    RESTART_WAITING = "restart_waiting"  # run_resilient: the function raised; waits a verdict
    MEMORY_STEPS = "memory_steps"  # load_latest: the memory snapshots this rank can load
    SNAPSHOT_BLOCKING = "snapshot_blocking"  # rank 0, every few s: the loop's wait on snapshots
    SNAPSHOT_TAKEN = "snapshot_taken"  # every rank: a memory snapshot of a step (liveness only)
    IMPORTS = "imports"  # load_latest, once: the installed packages this process imported
    TRAIN_METRICS = "train_metrics"  # trainguard.log_metrics: the loss, the learning rate
    LOG_WRITE_FAILED = "log_write_failed"  # the agent: a rank log could not be written
    CONTROL_UNREACHABLE = "control_unreachable"  # the agent cannot reach this rank: what is off
    AUTO_RESUME_UNUSED = "auto_resume_unused"  # the site hook: the script loads the other
    # framework's Trainer, which --auto-resume does not patch (walk-through 39 #12)
    FAULTS = "faults"  # trainguard.testing.faults: a call that read TRAINGUARD_FAULT, or a fault
    # fired (the controller says which faults of the variable never fired: walk-through 35 F6)

    def __str__(self) -> str:  # the value, as StrEnum (f-strings, %s)
        return str.__str__(self)


class PhaseState(str, Enum):
    BEGIN, END = "begin", "end"

    def __str__(self) -> str:
        return str.__str__(self)


# where a RESUMED's state came from; a CHECKPOINT_SAVED from memory: the agent persisted it
SOURCE_MEMORY = "memory"  # the ranks' memory snapshots (the node's shared memory)
SOURCE_STORAGE = "storage"  # the checkpoint location
SOURCE_PEER = "peer"  # a buddy node's copy of the rank's memory snapshot (a pod-level move)
# phases that mean the attempt is ending: a rank's on-exit save (checkpoint/exit_save.py), and
# its interpreter's exit once the script returned or raised (worker/progress.py)
EXIT_SAVE_PHASE, EXITING_PHASE = "checkpoint on the way out", "interpreter exit"
# the Checkpointer's blocking part of a save or load, on every rank (its own hang allowance)
CHECKPOINT_PHASE = "checkpoint"

AGENT_ONLY = frozenset({MessageKind.LOG_WRITE_FAILED})  # a datagram of these kinds is dropped

TRAIN_METRIC_NAMES = ("loss", "learning_rate")  # each absent: not logged; null: NaN or inf
_METRIC = Field(float, nullable=True, low=-MAX_METRIC, high=MAX_METRIC)
_STEP = _int(-MAX_INT64 - 1, MAX_INT64, required=True)

# set by channel.send on every message; each may be absent (None: RANK unset)
ENVELOPE: dict[str, Field] = {
    "rank": _int(0, MAX_RANK, nullable=True),
    "pid": _int(1, MAX_PID),
    "at": Field(float, low=0.0, high=MAX_TIME),
}

FIELDS: dict[MessageKind, dict[str, Field]] = {
    MessageKind.PROGRESS: {"step": _STEP},
    MessageKind.PHASE: {
        "name": _text(MAX_NAME, required=True),
        "state": Field(PhaseState, required=True),
        "timeout_s": Field(float, nullable=True, low=1e-9, high=MAX_SECONDS),  # None: default
        "depth": _int(1, MAX_INT32),  # 1: the outermost phase open in the sending thread
        "seq": _int(0, MAX_INT64),  # per process; the same on a phase's begin and end
        "ok": Field(bool),  # on an end: False when left by an exception
    },
    MessageKind.CHECKPOINT_SAVED: {
        "step": _STEP,
        "location": _text(MAX_PATH),
        "bytes": _int(0, MAX_INT64, nullable=True),
        "write_s": _seconds(),
        "blocked_s": _seconds(),  # the training loop waited this long for the save, and
        "resumed_before_s": _seconds(),  # went on this long before the commit
        "on_exit": _text(MAX_TEXT, nullable=True),  # why it was saved on the way out
        "missing_ranks": Field(list, max_len=MAX_LIST),  # dead ranks whose part is missing
        "source": Field(str, max_len=MAX_NAME),  # SOURCE_MEMORY: by the agent
    },
    MessageKind.CHECKPOINT_SAVE_FAILED: {
        "step": _STEP,
        "error": _text(MAX_TEXT, required=True),
        "consecutive": _int(0, MAX_INT64), "limit": _int(1, MAX_INT64),  # limit in a row: raise
        "location": _text(MAX_PATH),
        "on_exit": _text(MAX_TEXT, nullable=True),  # a save on the way out: none follows
        "source": Field(str, max_len=MAX_NAME),  # SOURCE_MEMORY/PEER: the agent's persist
    },
    MessageKind.CHECKPOINT_EXIT_SKIPPED: {"step": _STEP, "reason": _text(MAX_TEXT, True)},
    MessageKind.CHECKPOINT_SAVE_SKIPPED: {"step": _STEP, "reason": _text(MAX_TEXT, True),
                                          "location": _text(MAX_PATH)},
    MessageKind.CHECKPOINT_CORRUPT: {"step": _STEP, "status": _text(MAX_NAME, required=True),
                                     "reason": _text(MAX_TEXT, required=True),
                                     "location": _text(MAX_PATH)},
    MessageKind.NO_CHECKPOINT: {"location": _text(MAX_PATH, required=True)},
    # source: SOURCE_*; own_part False: no part of its own (dead at the save): a donor's data
    MessageKind.RESUMED: {"step": _STEP, "location": _text(MAX_PATH),
                          "source": Field(str, max_len=MAX_NAME), "own_part": Field(bool),
                          "borrowed_from": _int(0, MAX_INT32, nullable=True),
                          "not_exact": _text(MAX_TEXT),  # why this resume is not exact
                          # when the checkpoint was committed (a trainer integration's marker)
                          "committed_at": Field(float, low=0.0, high=MAX_TIME),
                          # the newest committed step skipped as damaged (CheckpointCorrupt)
                          "skipped_step": _int(-MAX_INT64 - 1, MAX_INT64)},
    MessageKind.LOG_WRITE_FAILED: {"error": _text(MAX_TEXT, required=True)},
    MessageKind.AUTO_RESUME_UNUSED: {"why": _text(MAX_TEXT, required=True)},
    MessageKind.CONTROL_UNREACHABLE: {"off": _text(MAX_TEXT, required=True),
                                      "error": _text(MAX_TEXT, required=True)},
    MessageKind.STEP_FAILED: {
        "step": _STEP,
        "generation": _int(0, MAX_INT32, required=True),  # the process group's generation
        "error": _text(MAX_TEXT, required=True),
    },
    MessageKind.STEP_REEXECUTED: {
        "step": _STEP,
        "generation": _int(0, MAX_INT32, required=True),  # the group it succeeded on
        "retry_s": _seconds(),  # from the failure to the re-executed step's end
    },
    MessageKind.RESILIENT: {
        "generation": _int(0, MAX_INT32, required=True),  # the group it is about to join
        "restart_s": _seconds(),  # a re-entry: from the verdict to the new entry
    },
    MessageKind.MEMORY_STEPS: {
        "steps": Field(list, max_len=16, low=0, high=MAX_INT64),  # snapshots it can load
        "storage_step": _int(0, MAX_INT64, nullable=True),  # newest valid in storage
        "attempt": _int(0, MAX_INT32, required=True),
        "generation": _int(0, MAX_INT32, required=True),
    },
    # the memory snapshots since the rank's last report (checkpoint/snapshot_timing.py)
    MessageKind.SNAPSHOT_BLOCKING: {
        "blocked_s": Field(float, required=True, low=0.0, high=MAX_SECONDS),  # summed
        "snapshots": _int(1, MAX_INT64, required=True),  # how many
        "step": _int(-MAX_INT64 - 1, MAX_INT64, nullable=True),  # the last one's
        "ended_at": Field(float, nullable=True, low=0.0, high=MAX_TIME),  # it returned (Unix)
    },
    # a step the rank reached as its memory snapshot says: progress for a rank that reports
    # no steps of its own, kept apart from reported ones (node/liveness.py)
    MessageKind.SNAPSHOT_TAKEN: {"step": _STEP},
    MessageKind.IMPORTS: {"modules": _text(MAX_TEXT, required=True)},  # comma-separated
    MessageKind.TRAIN_METRICS: {"step": _STEP, **{k: _METRIC for k in TRAIN_METRIC_NAMES}},
    MessageKind.FAULTS: {
        "call": _text(MAX_NAME, required=True),  # which function: inject, inject_step, ...
        "fired": _int(0, MAX_INT32, nullable=True),  # the fault's index in the variable
    },
    MessageKind.RESTART_WAITING: {
        "generation": _int(0, MAX_INT32, required=True),  # the group that failed under it
        "error": _text(MAX_TEXT, required=True),
        "failed_at": Field(float, low=0.0, high=MAX_TIME),  # when it raised (Unix time)
    },
}


# -- the control channel: the agent's verdicts to a rank (worker/control.py) -------------------
class ControlKind(str, Enum):
    """What a rank's agent tells it: StepGuard's verdict on a failed step, run_resilient's
    on an in-process restart."""

    REFORM = "reform"  # re-form the process group at master_addr:master_port, re-run the step
    REFORM_GO = "reform_go"  # every running rank got the REFORM: join the new group now
    GIVE_UP = "give_up"  # no re-execution: the rank raises the step's error (the next rung)
    RESTART = "restart"  # leave the training function, join the group at the address, re-enter
    NO_RESTART = "no_restart"  # no in-process restart: the rank raises (a process restart)
    RESUME_FROM = "resume_from"  # load_latest: the memory snapshot every rank resumes from
    DRAIN = "drain"  # a stop was asked for: save a checkpoint at the next step end, then exit

    def __str__(self) -> str:
        return str.__str__(self)


CONTROL_FIELDS: dict[ControlKind, dict[str, Field]] = {
    ControlKind.REFORM: {"step": _STEP, "generation": _int(1, MAX_INT32, required=True),
                         "master_addr": _text(MAX_NAME, required=True),
                         "master_port": _int(1, 65_535, required=True)},
    ControlKind.REFORM_GO: {"step": _STEP, "generation": _int(1, MAX_INT32, required=True)},
    ControlKind.GIVE_UP: {"step": _STEP, "reason": _text(MAX_TEXT, required=True)},
    ControlKind.RESTART: {
        "generation": _int(1, MAX_INT32, required=True),
        "master_addr": _text(MAX_NAME, required=True),
        "master_port": _int(1, 65_535, required=True),
    },
    ControlKind.NO_RESTART: {
        "generation": _int(0, MAX_INT32, required=True),  # the group it is about
        "reason": _text(MAX_TEXT, required=True),
    },
    ControlKind.RESUME_FROM: {
        "attempt": _int(0, MAX_INT32, required=True),
        "generation": _int(0, MAX_INT32, required=True),
        "step": _int(0, MAX_INT64, nullable=True),  # None: from storage
    },
    ControlKind.DRAIN: {"reason": _text(MAX_TEXT, required=True)},
}


def control_socket(agent_socket: str, rank: int, kind: ControlKind | None = None) -> str:
    """The name of a rank's inbox for its agent's verdicts (a socket pair's end handed over,
    worker/control.py; no socket binds it); DRAIN: its own, of a process that drains."""
    return f"{agent_socket}-rank-{rank}" + ("-drain" if kind == ControlKind.DRAIN else "")


def parse_control(raw: object) -> dict[str, Any]:
    """A decoded control datagram, checked: `kind` (a ControlKind) and its fields."""
    if not isinstance(raw, dict):
        raise ContractError(f"not a JSON object: {show(raw)}")
    try:
        kind = ControlKind(raw.get("kind"))
    except ValueError:
        raise ContractError(f"unknown control kind {show(raw.get('kind'))}") from None
    return {"kind": kind, **checked(kind.value, CONTROL_FIELDS[kind], raw)}


def validate(kind: str, fields: dict[str, Any]) -> dict[str, Any]:
    """`fields` of a `kind` message, checked: the ones the contract names, in their order; the
    fields it does not name are left out (a newer sender may add some). An unknown kind, a
    missing required field or a value of the wrong type or out of bounds raises ContractError."""
    try:
        k = MessageKind(kind)
    except ValueError:
        raise ContractError(f"unknown message kind {show(kind)}") from None
    return checked(k.value, FIELDS[k], fields)


def parse_message(raw: object) -> dict[str, Any]:
    """A decoded datagram, checked: `kind` (a MessageKind), the envelope (rank, pid, at; each
    may be absent) and the kind's fields. Raises ContractError for anything else, including
    the kinds only the agent may forge."""
    if not isinstance(raw, dict):
        raise ContractError(f"not a JSON object: {show(raw)}")
    kind = raw.get("kind")
    if not isinstance(kind, str):
        raise ContractError(f"no kind: {show(raw)}")
    if kind in AGENT_ONLY:
        raise ContractError(f"{kind!r} is the agent's own kind; a worker cannot send it")
    fields = validate(kind, raw)
    out: dict[str, Any] = {"kind": MessageKind(kind)}
    for name, f in ENVELOPE.items():
        if name in raw:
            why = f.problem(raw[name])
            if why is not None:
                raise ContractError(f"{kind}: {name} {why}")
            out[name] = raw[name]
    out.update(fields)
    return out


# -- the rank log line ------------------------------------------------------------------------
STREAMS = ("out", "err")
# `<ISO time read> <out|err> `, group 1 the time (as datetime.isoformat writes it)
STAMP_PATTERN = (r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:[+-]\d\d:\d\d|Z)?) "
                 rf"(?:{'|'.join(STREAMS)}) ")


# the line a rank prints where it recovered in place (worker/step.py, worker/resilient.py:
# `[trainguard.WHO] rank R: ...`, control.say): what it logged before is a failure it got past
# (diagnosis/survived.py). Group 1 the rank, group 2 the kind: "step N re-executed" (the step
# ran again on every rank: proof itself), "restarting in place" (a survivor) or "started in
# place of a failed process" (a replacement): those two once the rank stepped after them.
RECOVERY_PATTERN = (r"\[trainguard\.(?:step|resilient)\] rank (\d{1,7}): "
                    r"(step \d+ re-executed|restarting in place"
                    r"|started in place of a failed process) on process group generation \d+")


def after_failed_save(n: int, limit: int, stops: str = "") -> str:
    """What follows the n-th failed checkpoint save in a row of `limit`: the rank's log line
    (checkpoint/save_report.py) and the controller's CheckpointSaveFailed event say the same
    (walk-through 35 F8); `stops` ends the sentence of the save that stops the rank."""
    return (f"the rank stops with a CheckpointError{stops}" if n >= limit
            else f"the next save retries; {limit} in a row stop the rank")


def stamp_lines(stamp: str, stream: str, texts: list[str]) -> list[str]:
    """Rank log lines: `stamp` is the ISO time the agent read them, `stream` out or err."""
    return [f"{stamp} {stream} {t}" for t in texts]
