"""The nodes' reports of a multi-node job merged into one, as the controller's loop reads it
(controller/fleet.py owns a Merger; pure bookkeeping, the fleet does the I/O).

A node pushes a report every report interval; the fleet folds the ones that arrived since
its last merge (the newest facts, every worker message and liveness interval), and a merge
takes each node's folded report once: a node without a new one contributes its last facts
without their deltas. A remote agent keeps the worker messages of a numbered report until
they are acknowledged (node/outbox.py): the acknowledgements due are those of the reports the
last merge handed to the loop, which recorded them before it asked for the next merge.
"""

from __future__ import annotations

from datetime import timedelta

from trainguard.protocol import (
    NodeReport,
    NodeUsage,
    Progress,
    RankLiveness,
    WorkerFact,
    WorkerMessage,
)
from trainguard.records import utcnow
from trainguard.states import WorkerState

# liveness times of a node whose clock is further off than this are moved onto the
# controller's clock (hang detection compares them with the controller's now)
SKEW_TOLERATED_S = 2.0

# a rank's liveness fields that hold what happened since its node's last report (not what is
# true now): summed over the reports one merge folds, dropped from a stale copy (review 51 #2:
# snapshot intervals were handed to the detector five times, or lost)
DELTAS = ("intervals", "implied_intervals")


class Merger:
    def __init__(self) -> None:
        self.attempt: int | None = None
        self._latest: dict[str, NodeReport] = {}  # reports not merged yet (with their deltas)
        self._stale: dict[str, NodeReport] = {}  # the last merged facts, deltas taken
        self.usage: dict[str, NodeUsage] = {}  # each node's latest, spares' too (status)
        self.ending: set[str] = set()  # nodes whose agent got SIGTERM (node/term.py)
        # node -> datagrams its worker channel refused: (counted by its agents before the
        # current one, the current one's latest count, its agent process's epoch when a report
        # said it). Kept for a node lost or gone.
        self._refused: dict[str, tuple[int, int, int | None]] = {}
        # node -> (epoch, seq) of the newest numbered report folded, merged (node/outbox.py)
        self._folded_seq: dict[str, tuple[int | None, int]] = {}
        self._merged_seq: dict[str, tuple[int | None, int]] = {}
        # node -> kept messages of reports of another attempt (node/outbox.py), to merge
        self._late: dict[str, list[WorkerMessage]] = {}

    def new_attempt(self, attempt: int) -> None:
        """Facts of an earlier attempt are no longer merged (reports of it are dropped, but
        not the messages kept until acknowledged: they say which attempt they are of)."""
        for name, r in self._latest.items():
            self._late.setdefault(name, []).extend(m for m in r.messages if m.attempt is not None)
        self.attempt = attempt
        self._latest, self._stale = {}, {}

    def forget(self, name: str) -> None:
        """A node out of the job: its report not merged yet is dropped."""
        self._latest.pop(name, None)
        self._late.pop(name, None)
        self._folded_seq.pop(name, None)

    def acks_due(self) -> dict[str, tuple[int | None, int]]:
        """node -> the newest numbered report the last merge handed on: recorded by now
        (the loop records a merged report before it asks for the next one). Taken once."""
        due, self._merged_seq = self._merged_seq, {}
        return due

    def note_usage(self, name: str, reports: list[NodeReport]) -> None:
        """The node's latest usage and count of refused worker messages (spares' too), and
        whether its agent got SIGTERM (`ending`: a spare's too; review 54 #1)."""
        if any(r.terminating for r in reports):
            self.ending.add(name)
        for r in reports:  # a new agent (another epoch, or a count that fell) counts anew
            before, latest, epoch = self._refused.get(name, (0, 0, None))
            new = (r.epoch is not None and epoch is not None and r.epoch != epoch) or \
                r.messages_refused < latest
            self._refused[name] = (before + latest if new else before, r.messages_refused,
                                   r.epoch if r.epoch is not None else epoch)
        for r in reversed(reports):
            if r.usage:
                self.usage[name] = r.usage[-1]
                return

    def fold(self, name: str, reports: list[NodeReport]) -> None:
        """Several pushed reports into one: the newest facts, every message and interval.
        Of a report of another attempt only the messages kept until acknowledged (a
        checkpoint an earlier attempt committed, told late) are kept: they carry their own
        attempt."""
        self.note_usage(name, reports)
        numbered = [(r.epoch, r.seq) for r in reports if r.seq is not None]
        if numbered:  # the newest: a node's new agent process counts from 1 again
            self._folded_seq[name] = numbered[-1]
        self._late.setdefault(name, []).extend(
            m for r in reports if r.attempt != self.attempt for m in r.messages
            if m.attempt is not None)
        reports = [r for r in reports if r.attempt == self.attempt]
        if not reports:
            return
        prev = self._latest.get(name)
        messages = [*(prev.messages if prev else []), *(m for r in reports for m in r.messages)]
        deltas: dict[tuple[int, str], list[float]] = {}  # (rank, field): what each report adds
        for r in ([prev] if prev else []) + reports:
            for lv in r.liveness:
                for f in DELTAS:
                    deltas.setdefault((lv.rank, f), []).extend(getattr(lv, f))
        last = reports[-1]
        skew = utcnow() - last.at  # the node's clock behind ours (+ a little transit)
        shift = skew if abs(skew.total_seconds()) > SKEW_TOLERATED_S else timedelta(0)
        if prev is None and len(reports) == 1 and not shift:  # the usual case: no copies
            self._latest[name] = last
            return
        liveness = [_on_our_clock(lv, shift).model_copy(
                        update={f: deltas.get((lv.rank, f), []) for f in DELTAS})
                    for lv in last.liveness]
        self._latest[name] = last.model_copy(update={"messages": messages,
                                                     "liveness": liveness})

    def merged(self, placement: list[str], lost: dict[str, str],
               usable: set[str]) -> NodeReport:
        """One report of the placed nodes; the running workers of a node lost now or marked
        out before (lost, isolated) read as failed: their end was never reported.
        `usable`: the nodes in the job or spare, not lost or isolated (their usage is shown)."""
        now = utcnow()
        workers: list[WorkerFact] = []
        messages: list[WorkerMessage] = []
        liveness: list[RankLiveness] = []
        firsts, lasts = [], []
        persisting = False
        for name in placement:
            r = self._latest.pop(name, None)
            messages.extend(self._late.pop(name, []))
            if name in self._folded_seq:  # its numbered messages are in this merge
                self._merged_seq[name] = self._folded_seq.pop(name)
            if r is not None:  # only a new report is stripped of its deltas: O(new reports)
                self._stale[name] = r.model_copy(update={"messages": [], "liveness": [
                    lv.model_copy(update={f: [] for f in DELTAS}) for lv in r.liveness]})
            elif (r := self._stale.get(name)) is None:
                continue
            gone = name in lost or name not in usable  # lost now, or marked out before
            for w in r.workers:
                if gone and not w.state.ended:
                    w = w.model_copy(update={"state": WorkerState.FAILED, "ended_at": now})
                workers.append(w)
            messages.extend(r.messages)
            liveness.extend(r.liveness)
            persisting = persisting or r.persisting
            p = r.progress
            if p.first_step is not None:
                firsts.append((p.first_step_at or now, p.first_step))
            if p.last_step is not None:
                lasts.append((p.last_step, p.last_step_at))
        progress = Progress(
            first_step=min(firsts)[1] if firsts else None,
            first_step_at=min(firsts)[0] if firsts else None,
            last_step=max(lasts, key=lambda x: x[0])[0] if lasts else None,
            last_step_at=max(lasts, key=lambda x: x[0])[1] if lasts else None)
        return NodeReport(node="cluster", attempt=self.attempt,
                          workers=sorted(workers, key=lambda w: w.rank), progress=progress,
                          at=now, messages=messages, liveness=liveness,
                          lost_nodes=sorted(lost), persisting=persisting,
                          terminating_nodes=[n for n in placement if n in self.ending
                                             and n not in lost and n in usable],
                          messages_refused=sum(b + n for b, n, _ in self._refused.values()),
                          usage=[u for n, u in sorted(self.usage.items())
                                 if n in usable and n not in lost])


def _on_our_clock(lv: RankLiveness, shift: timedelta) -> RankLiveness:
    if not shift:
        return lv
    moved = {k: getattr(lv, k) + shift for k in ("last_progress_at", "phase_since",
                                                  "last_output_at", "sampled_at", "implied_at")
             if getattr(lv, k) is not None}
    return lv.model_copy(update=moved)
