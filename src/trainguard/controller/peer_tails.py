"""Tails of memory snapshots: a lost node's newest step, not only the last one copied whole.

Whole peer copies (controller/peer_copies.py) take a round of 0.2-1 s here, so a node loss
costs the steps since the last whole round. But the ranks of a data-parallel job hold the
same model and optimizer: what differs between them is small (RNG states, counters). So,
besides the rounds, a thread asks every node every TAIL_S for its ranks' newest whole
snapshots' *tails* (node/peer.py `tails`; less often from 10 nodes on: at most
MAX_ASKS_PER_S asks a second in all): the manifest entry (step, size, layout, CRC-32)
and the bytes of the small tensors, only when there is a newer one than the last seen.

When a node is lost, `rebuild` finds the newest step T that every lost rank has a tail of
and every surviving rank holds in its own memory, and writes each lost rank's T into its
buddy's peer copies: a surviving rank's bytes of T with the lost rank's small tensors laid
over them. The buddy accepts it only when the CRC-32 of the result equals the lost rank's
own (node/peer.py `store`): bit for bit the lost rank's snapshot, or nothing. From there T
is the step last copied whole: saved to storage at once, copied to the node the ranks move
to, and every rank resumes at it. When a tensor that differs between the ranks is larger
than a tail carries, the CRC differs and the move resumes at the last whole round's step,
as without tails.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from trainguard.checkpoint.memory_format import SlotEntry, fits
from trainguard.controller.hub import Hub
from trainguard.protocol import Op

log = logging.getLogger(__name__)

TAIL_S = 0.02  # between two asks: a step's tail reaches the controller this soon after it
MAX_ASKS_PER_S = 500  # the controller's asks, all nodes together: a large job asks less often
KEEP_STEPS = 4  # tails kept per rank (a survivor holds its two newest steps, or pinned ones)
LEARN_STEPS = 3  # steps whose full tails, compared between ranks, say which tensors differ
CALL_TIMEOUT_S = 30.0


class Tails:
    def __init__(self, hub: Hub, placement: Callable[[], list[str]]) -> None:
        self.hub, self._placement = hub, placement
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._tails: dict[int, dict[int, dict[str, Any]]] = {}  # rank -> step -> tail
        self._seen: dict[int, int] = {}  # rank -> generation of its newest tail
        self._node: dict[int, str] = {}  # rank -> the node its tails came from
        # the small tensors that differ between ranks, learnt from the full tails of the
        # first LEARN_STEPS steps two ranks or more sent; from then on tails carry only them
        self._differ: set[int] = set()
        self._learnt: set[int] = set()  # the steps compared
        self.only: list[int] | None = None

    def start(self) -> None:
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="trainguard-tails",
                                            daemon=True)
            self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=CALL_TIMEOUT_S)
            self._thread = None

    def forget(self) -> None:
        """The placement changed: tails start over."""
        with self._lock:
            self._tails.clear()
            self._seen.clear()
            self._node.clear()
            self._differ, self._learnt, self.only = set(), set(), None

    def _run(self) -> None:
        while not self._stop.wait(max(TAIL_S, len(self._placement()) / MAX_ASKS_PER_S)):
            try:
                self.poll()
            except Exception:  # never the job's end: the next ask tries again
                log.exception("asking for memory snapshot tails failed")

    def poll(self) -> None:
        placement = self._placement()
        if len(placement) < 2:
            return
        up = [n for n in placement if self.hub.connected(n)]
        with self._lock:
            ask: dict[str, Any] = {"tails": {str(r): g for r, g in self._seen.items()}}
            if self.only is not None:
                ask["only"] = self.only
        replies = self.hub.call({n: (Op.PEER_TAKE, ask) for n in up}, CALL_TIMEOUT_S, 0.0)
        with self._lock:
            for node, reply in replies.items():
                if not reply.ok:
                    continue
                for r, tail in dict(reply.body.get("tails") or {}).items():
                    rank, entry = int(r), SlotEntry(**tail["entry"])
                    if entry.generation <= self._seen.get(rank, -1):
                        continue
                    self._seen[rank], self._node[rank] = entry.generation, node
                    steps = self._tails.setdefault(rank, {})
                    steps[entry.step] = tail
                    for old in sorted(steps)[:-KEEP_STEPS]:
                        del steps[old]
                    if "only" not in ask:
                        self._learn(entry.step)

    def _learn(self, step: int) -> None:
        """Compare the full tails of `step` that two ranks or more sent: a small tensor
        whose bytes differ between them is one each tail must carry."""
        full = [t[step] for t in self._tails.values() if step in t]
        if len(full) < 2 or step in self._learnt:
            return
        if len(full) < len(self._tails):
            return  # not every rank's yet
        parts = [dict((int(i), b) for i, b in t["small"]) for t in full]
        if any(p.keys() != parts[0].keys() for p in parts):
            return  # another layout on some rank: no comparison
        self._differ |= {i for i in parts[0] if len({p[i] for p in parts}) > 1}
        self._learnt.add(step)
        if len(self._learnt) >= LEARN_STEPS:
            self.only = sorted(self._differ)
            log.debug("tails carry the small tensors %s (they differ between ranks)",
                      self.only)

    def rebuild(self, buddies: dict[str, str], newer_than: int | None
                ) -> tuple[int, dict[str, list[int]]] | None:
        """Lost nodes' ranks' newest step T (> `newer_than`), written as peer copies on each
        lost node's buddy (`buddies`: lost node -> buddy), from a surviving rank's own
        snapshot of T and the lost rank's tail. (T, the ranks of every node placed: the
        lost ones' from their tails, the others' from what they hold), or None when there
        is no such step or one rank's could not be rebuilt."""
        with self._lock:
            lost_ranks = {r: n for r, n in self._node.items() if n in buddies}
            tails = {r: dict(self._tails.get(r, {})) for r in lost_ranks}
        if not lost_ranks or not all(tails.values()) or \
                not all(self.hub.connected(b) for b in buddies.values()):
            return None
        survivors = [n for n in self._placement() if n not in buddies and self.hub.connected(n)]
        held = self._held(survivors)
        if not held:
            return None
        common = set.intersection(*[set(t) for t in tails.values()],
                                  *[set(e) for e in held.values()])
        for step in sorted((s for s in common if newer_than is None or s > newer_than),
                           reverse=True):
            plan = self._plan(sorted(lost_ranks), tails, held, step)
            if plan is None:
                continue
            for rank, (node, source) in plan.items():
                to = buddies[lost_ranks[rank]]
                if not self._write(node, source, to, rank, tails[rank][step], step):
                    log.info("rank %s's snapshot of step %s could not be rebuilt on %s",
                             rank, step, to)
                    return None
            log.info("rebuilt the memory snapshots of step %s of rank(s) %s on %s from the "
                     "survivors' snapshots and the ranks' tails", step, sorted(lost_ranks),
                     ", ".join(sorted(set(buddies.values()))))
            ranks: dict[str, list[int]] = {}
            for r, n in [*lost_ranks.items(), *((r, n) for n, r in held)]:
                ranks.setdefault(n, []).append(r)
            return step, {n: sorted(rs) for n, rs in ranks.items()}
        return None

    def _held(self, nodes: list[str]) -> dict[tuple[str, int], dict[int, SlotEntry]] | None:
        """(node, rank) -> step -> entry of each surviving rank's whole snapshots."""
        replies = self.hub.call({n: (Op.PEER_TAKE, {"entries": True}) for n in nodes},
                                CALL_TIMEOUT_S, 0.0)
        if any(not r.ok for r in replies.values()):
            return None
        return {(n, int(rank)): {int(e["step"]): SlotEntry(**e) for e in entries}
                for n, r in replies.items()
                for rank, entries in dict(r.body.get("entries") or {}).items()}

    @staticmethod
    def _plan(lost_ranks: list[int], tails: dict[int, dict[int, dict[str, Any]]],
              held: dict[tuple[str, int], dict[int, SlotEntry]], step: int
              ) -> dict[int, tuple[str, int]] | None:
        """For each lost rank, a surviving (node, rank) whose snapshot of `step` has its
        layout; None when one has none."""
        plan: dict[int, tuple[str, int]] = {}
        for rank in lost_ranks:
            want = SlotEntry(**tails[rank][step]["entry"])
            fit = [k for k, steps in sorted(held.items())
                   if step in steps and fits(want, steps[step])]
            if not fit:
                return None
            plan[rank] = fit[0]
        return plan

    def _write(self, node: str, source: int, to: str, rank: int, tail: dict[str, Any],
               step: int) -> bool:
        """Copy `source`'s snapshot of `step` from `node` into `to`'s peer copies as
        `rank`'s, chunk by chunk, the tail's small tensors laid over it with the last
        chunk (`to` checks the CRC-32 of the whole against the tail's)."""
        offset, generation = 0, None
        while True:
            reply = self.hub.call({node: (Op.PEER_TAKE, {
                "peer": False, "rank": source, "step": step, "offset": offset})},
                CALL_TIMEOUT_S, 0.0)[node]
            chunk = reply.body if reply.ok else {}
            if "rank" not in chunk or generation not in (None, chunk["entry"]["generation"]):
                return False
            generation = chunk["entry"]["generation"]
            last = offset + int(chunk["length"]) >= int(chunk["total"])
            body = {**chunk, "rank": rank, "entry": tail["entry"], "peer": True,
                    "origin": node, **({"patch": tail["small"]} if last else {})}
            stored = self.hub.call({to: (Op.PEER_STORE, body)}, CALL_TIMEOUT_S, 0.0)[to]
            if not stored.ok:
                log.debug("rebuilding rank %s on %s: %s", rank, to, stored.error)
                return False
            if stored.body.get("whole"):
                return True
            if last:
                return False
            offset += int(chunk["length"])
