"""What workers report through the channel -> job events and recovery-record facts.

The kinds and their fields are in trainguard.worker.contract; `WorkerMessages._handlers`
maps each kind that makes an event to its handler (progress and phase marks are liveness
signals, which the node agent takes).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from trainguard.controller.incidents import IncidentBook
from trainguard.protocol import WorkerMessage
from trainguard.records import Level, Reason, iso, rank_list, secs, size_text, utcnow
from trainguard.testing.fault_spec import never_fired
from trainguard.worker.contract import (
    ENV_FAULT,
    SOURCE_MEMORY,
    SOURCE_PEER,
    SOURCE_STORAGE,
    TRAIN_METRIC_NAMES,
    MessageKind,
    after_failed_save,
)

log = logging.getLogger(__name__)

EmitEvent = Callable[..., None]  # Recorder.event(level, reason, message, rank=, attempt=)
# is an event of the worker message with this id (node/outbox.py) in the job store already?
Recorded = Callable[[str], bool]
Handler = Callable[[WorkerMessage, dict[str, Any], int], None]
MAX_METRIC_RANKS = 64  # ranks whose train metrics are kept (the first ones that report)
MAX_SEEN_IDS = 10_000  # ids of the messages recorded by this controller, newest kept
LATE_S = 5.0  # a message sent longer ago than this keeps its own time in its event

RESUMES_KEPT = 4  # the incidents whose resume sources are kept (not one per incident)


# a checkpoint committed on another host before the job was created by less is the job's own
CLOCK_SKEW_S = 10.0


class WorkerMessages:
    def __init__(self, emit: EmitEvent, book: IncidentBook,
                 recorded: Recorded | None = None) -> None:
        self._emit_to = emit
        self._recorded = recorded
        self._seen: dict[str, None] = {}  # ids recorded by this controller (insertion order)
        self._message_id: str | None = None  # the id of the message handled now
        self._message_at: datetime | None = None  # when it was sent, if long ago
        self._current = True  # the message handled now is of the attempt being recorded
        self._book = book
        # (attempt, incident recovering) -> where its ranks loaded from (the last few: a
        # late rank's message of the incident before still finds its own)
        self._resumed_sources: dict[tuple[int, int | None], set[str]] = {}
        self.max_committed_step: int | None = None  # over the whole job
        # (step, location) of the newest commit: this launch's last, else the store's newest
        # (review 46 #3: not the highest step's, which a relaunch to another bucket keeps)
        self.newest_commit: tuple[int, str | None] | None = None
        self.committed_this_attempt: int | None = None
        # the job's creation, epoch seconds (Recorder; None in a Slurm requeue, whose job dir
        # may be new while its checkpoints are the job's own: review 47 #4)
        self.created_at: float | None = None
        # rank -> its latest {step, loss, learning_rate, at} (trainguard.log_metrics)
        self.train_metrics: dict[int, dict[str, Any]] = {}
        self.train_metrics_changed = False  # since the recorder last wrote them
        # memory snapshots' blocking not written yet: (attempt, rank, ended at, s, snapshots)
        self.snapshot_blocking: list[tuple[int, int | None, float, float, int]] = []
        self._not_exact_said: set[int] = set()  # attempts whose resume was said not exact
        self._handlers: dict[str, Handler] = {
            MessageKind.CHECKPOINT_SAVED: self._on_checkpoint_saved,
            MessageKind.CHECKPOINT_EXIT_SKIPPED: self._on_checkpoint_exit_skipped,
            MessageKind.CHECKPOINT_SAVE_SKIPPED: self._on_checkpoint_save_skipped,
            MessageKind.CHECKPOINT_SAVE_FAILED: self._on_checkpoint_save_failed,
            MessageKind.CHECKPOINT_CORRUPT: self._on_checkpoint_corrupt,
            MessageKind.LOG_WRITE_FAILED: self._on_log_write_failed,
            MessageKind.CONTROL_UNREACHABLE: self._on_control_unreachable,
            MessageKind.NO_CHECKPOINT: self._on_no_checkpoint,
            MessageKind.RESUMED: self._on_resumed,
            MessageKind.TRAIN_METRICS: self._on_train_metrics,
            MessageKind.SNAPSHOT_BLOCKING: self._on_snapshot_blocking,
            MessageKind.SNAPSHOT_TAKEN: self._on_snapshot_taken,
            MessageKind.FAULTS: self._on_faults,
            MessageKind.AUTO_RESUME_UNUSED: self._on_auto_resume_unused,
        }
        self._auto_resume_said = False
        self.fault_calls: set[str] = set()  # trainguard.testing.faults: what the ranks called
        self.faults_fired: set[int] = set()  # and which faults of TRAINGUARD_FAULT fired
        self.saw_whole_job = True  # False after a takeover or in a relaunch (review 39 #2)
        self.snapshot_taken = False  # a rank took a memory snapshot: a restart may resume there

    def knows_a_checkpoint(self) -> bool:
        """Whether the job committed a checkpoint (this launch or one before) or resumed
        from one: what a restart may resume from."""
        return self.newest_commit is not None or bool(self._resumed_sources)

    def _on_auto_resume_unused(self, m: WorkerMessage, d: dict[str, Any], attempt: int) -> None:
        """Once a launch: the rank's stderr alone was not where anyone looks (walk-through 39
        #12: the job read succeeded, nothing resumed)."""
        if not self._auto_resume_said:
            self._auto_resume_said = True
            self._emit(Level.WARNING, Reason.AUTO_RESUME_UNUSED, f"rank {m.rank}: {d['why']}",
                       rank=m.rank, attempt=attempt)

    def _on_faults(self, m: WorkerMessage, data: dict[str, Any], attempt: int) -> None:
        self.fault_calls.add(str(data["call"]))
        if data.get("fired") is not None:
            self.faults_fired.add(int(data["fired"]))

    def faults_note(self) -> str | None:
        """What a job that succeeded says of TRAINGUARD_FAULT (the launcher's environment, the
        ranks'): the faults that never fired, and why; None when all fired or it is unset.
        A script that never calls inject() ignores the variable: the job succeeded as if it
        survived a fault it never had (walk-through 35 F6)."""
        spec = os.environ.get(ENV_FAULT)
        if not spec or not self.saw_whole_job:  # a takeover did not hear what the ranks said
            return None  # before it (each says it once per process: review 39 #2)
        try:
            lines, total = never_fired(spec, self.fault_calls, self.faults_fired)
        except ValueError:  # refused at launch: not reached
            return None
        if not lines:
            return None
        return (f"{ENV_FAULT} was set, but {len(lines)} of its {total} fault(s) never fired: "
                + "; ".join(lines) + ". Fix: call trainguard.testing.faults.inject(step) "
                "after each step (inject_step inside it for `collective`, inject_loader in a "
                "data-loader worker for `loaderhang`; docs/fault-injection.md), and name a "
                "step, rank and attempt the job reaches")

    def new_attempt(self) -> None:
        self.committed_this_attempt = None

    def handle(self, messages: list[WorkerMessage], attempt: int) -> None:
        """`attempt`: the one the report is of; a message a remote agent kept (node/outbox.py)
        counts for the attempt it was first sent in, and one with an id already recorded (a
        resend after a reconnect, a reply answered again) makes no second event."""
        for m in messages:
            handler = self._handlers.get(m.kind)
            if handler is None or (m.id is not None and self._recorded_already(m)):
                continue
            self._message_id = m.id
            # a message kept while no controller watched (a takeover's replay): its event
            # keeps the time the worker sent it, not the time it is recorded
            self._message_at = m.at if (utcnow() - m.at).total_seconds() > LATE_S else None
            own = attempt if m.attempt is None else m.attempt
            self._current = own == attempt
            try:
                handler(m, m.data, own)
            except Exception:  # one bad message is dropped, never fatal to the job
                log.warning("dropped a worker message of rank %s (%s) that could not be "
                            "handled", m.rank, m.kind, exc_info=True)
            finally:
                self._message_id, self._current, self._message_at = None, True, None

    def _recorded_already(self, m: WorkerMessage) -> bool:
        """In this controller's memory, or (sent again: a controller before it may have
        recorded it and died before it acknowledged) in the job store."""
        assert m.id is not None
        if m.id in self._seen or (m.resent and self._recorded is not None
                                  and self._recorded(m.id)):
            log.info("worker message %s (%s of rank %s) is recorded already", m.id, m.kind,
                     m.rank)
            return True
        self._seen[m.id] = None
        while len(self._seen) > MAX_SEEN_IDS:
            del self._seen[next(iter(self._seen))]
        return False

    def _emit(self, level: Level, reason: Reason, message: str, *, rank: int | None = None,
              attempt: int | None = None, data: dict[str, Any] | None = None) -> None:
        """The event, with the id of the message it came from (`data.message_id`)."""
        if self._message_id is not None:
            data = {**(data or {}), "message_id": self._message_id}
        self._emit_to(level, reason, message, rank=rank, attempt=attempt, data=data,
                      at=self._message_at)

    def _on_checkpoint_saved(self, m: WorkerMessage, d: dict[str, Any], attempt: int) -> None:
        step = int(d.get("step", -1))
        if self._current:  # not a late message of an earlier attempt
            self.committed_this_attempt = max(step, self.committed_this_attempt or step)
        if self._current or self.newest_commit is None:
            self.newest_commit = (step, d.get("location"))
        self.max_committed_step = max(step, self.max_committed_step or step)
        how = (f"on the way out ({d['on_exit']})" if d.get("on_exit")
               else "by the node agent from the ranks' memory snapshots, after a worker died"
               if d.get("source") == SOURCE_MEMORY
               else "by the node agents from the ranks' memory snapshots and a buddy node's "
               "copies of the lost node's, after a node was lost"
               if d.get("source") == SOURCE_PEER
               else f"loop blocked {secs(d['blocked_s'])}" if _known(d.get("blocked_s"))
               else None)
        written = f"written in {secs(d['write_s'])}" if _known(d.get("write_s")) else None
        size = d.get("bytes")
        # what was not measured is left out
        shown = size_text(size) if isinstance(size, int | float) else None
        known = ", ".join(p for p in (how, written, shown) if p)
        missing = rank_list(d.get("missing_ranks") or [])
        gone = (f"; without the part of rank(s) {missing}, which wrote none in time (dead, "
                "or waiting for this rank in a collective)") if missing else ""
        self._emit(Level.INFO, Reason.CHECKPOINT_SAVED,
                   f"checkpoint of step {step} committed at {d.get('location')}"
                   f"{f' ({known})' if known else ''}{gone}",
                   rank=m.rank, attempt=attempt, data={
                       **{k: d[k] for k in ("step", "location", "blocked_s",
                                            "resumed_before_s", "write_s", "bytes", "on_exit",
                                            "source") if d.get(k) is not None},
                       # the sender's clock: saves a poll apart are recorded together
                       "sent_at": round(m.at.timestamp(), 3)})

    def _on_checkpoint_exit_skipped(self, m: WorkerMessage, d: dict[str, Any],
                                    attempt: int) -> None:
        self._emit(Level.INFO, Reason.CHECKPOINT_SAVE_SKIPPED,
                   f"no checkpoint on the way out after step {d.get('step')}: "
                   f"{d.get('reason')}", rank=m.rank, attempt=attempt)

    def _on_checkpoint_save_skipped(self, m: WorkerMessage, d: dict[str, Any],
                                    attempt: int) -> None:
        """A save that wrote nothing: skipped behind the save in flight (if_busy="skip"), or
        its step committed by another job (walk-through 31 #12, #3)."""
        self._emit(Level.WARNING, Reason.CHECKPOINT_SAVE_SKIPPED,
                   f"checkpoint of step {d.get('step')} skipped: {d.get('reason')}",
                   rank=m.rank, attempt=attempt)

    def _on_checkpoint_save_failed(self, m: WorkerMessage, d: dict[str, Any],
                                   attempt: int) -> None:
        if d.get("source"):  # the agent persisting the ranks' snapshots (save at breakpoint)
            self._emit(Level.WARNING, Reason.CHECKPOINT_SAVE_FAILED,
                       f"the save at breakpoint of step {d.get('step')} from {d.get('source')} "
                       f"failed: {d.get('error')}; that step is kept only in the node's "
                       f"memory, not in storage ({d.get('location')})", attempt=attempt)
            return
        n, limit = d.get("consecutive"), d.get("limit")
        then = ("a save on the way out: no save follows" if d.get("on_exit")
                else "the next save retries" if not isinstance(n, int)
                or not isinstance(limit, int)
                else after_failed_save(n, limit, " at its next step"))
        self._emit(Level.WARNING, Reason.CHECKPOINT_SAVE_FAILED,
                   f"rank {m.rank}: checkpoint of step {d.get('step')} failed ({n} in a row: "
                   f"{then}): {d.get('error')}", rank=m.rank, attempt=attempt)

    def _on_checkpoint_corrupt(self, m: WorkerMessage, d: dict[str, Any], attempt: int) -> None:
        self._emit(Level.WARNING, Reason.CHECKPOINT_CORRUPT,
                   f"checkpoint of step {d.get('step')} skipped ({d.get('status')}): "
                   f"{d.get('reason')}", rank=m.rank, attempt=attempt)

    def _on_log_write_failed(self, m: WorkerMessage, d: dict[str, Any], attempt: int) -> None:
        self._emit(Level.WARNING, Reason.LOG_WRITE_FAILED, str(d.get("error")), attempt=attempt)

    def _on_control_unreachable(self, m: WorkerMessage, d: dict[str, Any],
                                attempt: int) -> None:
        """A rank could not hand its agent the way to its inbox: no verdict reaches it, and
        what needs one is off in that process (said on its console only, before)."""
        self._emit(Level.WARNING, Reason.CONTROL_UNREACHABLE,
                   f"rank {m.rank}'s agent cannot reach its process ({d.get('error')}): off "
                   f"in that process: {d.get('off')}", rank=m.rank, attempt=attempt)

    def _on_no_checkpoint(self, m: WorkerMessage, d: dict[str, Any], attempt: int) -> None:
        if self.max_committed_step is None:
            return  # a first start: nothing to resume from is expected
        self._emit(Level.WARNING, Reason.CHECKPOINT_MISSING,
                   f"the workers found no valid checkpoint at {d.get('location')}, yet this "
                   f"job committed step {self.max_committed_step} there: the storage lost "
                   "it (a vanished bucket, a wiped directory?); training starts from scratch",
                   rank=m.rank, attempt=attempt)

    def _on_resumed(self, m: WorkerMessage, d: dict[str, Any], attempt: int) -> None:
        """One event per attempt, and one more for each other source a rank loaded from
        (the moved ranks of a pod-level move: a peer's copy; the others: their memory)."""
        step = int(d.get("step", 0))
        source = str(d.get("source") or SOURCE_STORAGE)
        if d.get("not_exact"):  # said by a trainer integration (walk-through 25), once
            if attempt not in self._not_exact_said:
                self._not_exact_said.add(attempt)
                self._emit(Level.WARNING, Reason.RESUMED, f"rank {m.rank}'s resume from step "
                           f"{step} is not exact: {d['not_exact']}", rank=m.rank,
                           attempt=attempt, data={"step": step, "exact": False})
            return
        if d.get("own_part") is False:  # said for each such rank, whatever the sources
            donor = d.get("borrowed_from")
            whose = "a fresh" if donor is None else f"rank {donor}'s"
            self._emit(Level.WARNING, Reason.RESUMED, f"rank {m.rank} resumed from the "
                       f"checkpoint of step {step} without a part of its own (a save on the "
                       "way out it wrote none in: it was dead, or blocked in a collective "
                       "waiting for the saving rank; or the world grew): "
                       f"{whose} data position and a fresh RNG, so the run goes on, not bit "
                       "for bit as an uninterrupted one (without --save-on-exit a restart "
                       "resumes from the last whole checkpoint)",
                       rank=m.rank, attempt=attempt,
                       data={"step": step, "own_part": False, "borrowed_from": donor})
        key = (attempt, self._book.recovering())
        if key not in self._resumed_sources and len(self._resumed_sources) >= RESUMES_KEPT:
            del self._resumed_sources[next(iter(self._resumed_sources))]  # the oldest
        sources = self._resumed_sources.setdefault(key, set())
        if source in sources:
            return
        first = not sources
        sources.add(source)
        self._book.resumed(step, "+".join(sorted(sources)))
        what = {SOURCE_MEMORY: f"the node's memory snapshot of step {step}",
                SOURCE_PEER: f"a peer node's copy of its memory snapshot of step {step}"}.get(
                    source, f"the checkpoint of step {step} at {d.get('location')}")
        who = "" if first else f"rank {m.rank} "
        if isinstance(d.get("skipped_step"), int) and d["skipped_step"] > step:
            what += (f" (the newer checkpoint of step {d['skipped_step']} is damaged and was "
                     "skipped: CheckpointCorrupt says why)")
        at = d.get("committed_at")
        if isinstance(at, (int, float)) and self.created_at is not None \
                and at < self.created_at - CLOCK_SKEW_S:  # (walk-through 39 #5: said Info)
            self._emit(Level.WARNING, Reason.RESUMED, f"{who}resumed from {what}, committed "
                       f"{iso(datetime.fromtimestamp(at, timezone.utc))}, before this job was "
                       "created: another run's checkpoint in the trainer's output dir (a resume "
                       "takes the newest committed one there); give the job a new output dir "
                       "to start fresh", rank=m.rank, attempt=attempt,
                       data={"step": step, "source": source, "committed_at": at})
            return
        self._emit(Level.INFO, Reason.RESUMED, f"{who}resumed from {what}", rank=m.rank,
                   attempt=attempt, data={"step": step, "source": source})

    def _on_train_metrics(self, m: WorkerMessage, d: dict[str, Any], attempt: int) -> None:
        """The rank's latest values: a metric not in the message keeps its last value; one
        sent as null (NaN, an infinity) is None."""
        if m.rank is None or (m.rank not in self.train_metrics
                              and len(self.train_metrics) >= MAX_METRIC_RANKS):
            return
        kept = self.train_metrics.get(m.rank, {})
        self.train_metrics[m.rank] = {
            "step": int(d["step"]), **{k: d[k] if k in d else kept.get(k)
                                       for k in TRAIN_METRIC_NAMES},
            "at": m.at.isoformat()}
        self.train_metrics_changed = True

    def _on_snapshot_taken(self, m: WorkerMessage, d: dict[str, Any], attempt: int) -> None:
        self.snapshot_taken = True

    def _on_snapshot_blocking(self, m: WorkerMessage, d: dict[str, Any], attempt: int) -> None:
        """What the rank's memory snapshots held its loop for since its last report: a row
        for the store (the recorder writes it with the progress; goodput books it as
        checkpoint_blocking), no event (one every few seconds)."""
        ended = d.get("ended_at")
        self.snapshot_blocking.append((
            attempt, m.rank, float(ended) if isinstance(ended, int | float) else m.at.timestamp(),
            float(d["blocked_s"]), int(d["snapshots"])))


def _known(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)
