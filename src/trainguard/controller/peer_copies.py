"""Peer copies of memory snapshots between nodes (a multi-node job with --memory-every).

A background thread copies, round after round, one step of every rank's memory snapshots
to the rank's buddy node (the next node of the placement), over the agent links:

1. each placed node lists its ranks' whole snapshots (Op.PEER_TAKE with `list`);
2. the round's step S is the newest one every rank of the job holds;
3. every node pins S and the last step copied whole, P (Op.PEER_PIN): its ranks keep both
   in two more slots while they go on snapshotting (TRAINGUARD_MEMORY_PEER), so the
   survivors of a node loss hold the step whose copies are whole: S once its round ended,
   P until then (a rank may overwrite S before the pin reaches it; the round then fails);
4. each rank's snapshot of S goes to the buddy chunk by chunk (Op.PEER_TAKE on the node,
   Op.PEER_STORE on the buddy), each chunk checked, the copy's CRC-32 checked when whole.

A round is as long as its copies take: a larger state is copied less often, and a node
loss costs the steps since the last whole round. When a pod-level move starts a lost
node's ranks on another node, `restore` first copies their snapshots of S from the lost
node's buddy into the new node's region, where the workers find them as their own
(`origin`: the buddy), and every rank resumes at S (checkpoint/memory_tier.py agrees on
it). When the node and its buddy are both gone, the job resumes from storage.

Save at breakpoint: as soon as a node is lost, `persist` has every surviving node write S
to storage (the lost node's ranks from its buddy's copies), so S outlives a move whose
target node fails as well.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Collection
from typing import Any

from trainguard.checkpoint.memory_format import agreed_step
from trainguard.controller.hub import Hub
from trainguard.controller.peer_tails import Tails
from trainguard.protocol import Op
from trainguard.worker.contract import SOURCE_PEER

log = logging.getLogger(__name__)

ROUND_S = 0.2  # between rounds when there was nothing new to copy
CALL_TIMEOUT_S = 30.0  # a chunk is 16 MiB: seconds at worst; a node gone answers at once


class PeerCopies:
    def __init__(self, hub: Hub, placement: Callable[[], list[str]]) -> None:
        self.hub, self._placement = hub, placement
        self._lock = threading.Lock()  # one copy at a time: rounds and restores
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.step: int | None = None  # the step whose copies are whole on every buddy
        self._buddy: dict[str, str] = {}  # node -> the node keeping its copies, as of `step`
        self._ranks: dict[str, list[int]] = {}  # node -> its ranks, as of `step`
        self.tails = Tails(hub, placement)  # each rank's newest step, beyond the rounds

    def start(self) -> None:
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="trainguard-peer",
                                            daemon=True)
            self._thread.start()
        self.tails.start()

    def close(self) -> None:
        self.tails.close()
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=CALL_TIMEOUT_S)
            self._thread = None

    def _run(self) -> None:
        while not self._stop.is_set():
            copied = False
            try:
                with self._lock:
                    copied = self._round()
            except Exception:  # never the job's end: the next round tries again
                log.exception("peer copy round failed")
            if not copied:
                self._stop.wait(ROUND_S)

    def _round(self) -> bool:
        t0 = time.monotonic()
        placement = self._placement()
        if len(placement) < 2 or not all(self.hub.connected(n) for n in placement):
            return False
        bodies = self._call_all({n: (Op.PEER_TAKE, {"list": True}) for n in placement})
        if bodies is None:
            return False
        listed = {n: {int(r): [int(s) for s in steps]
                      for r, steps in dict(bodies[n].get("steps") or {}).items()}
                  for n in placement}
        step = agreed_step([s for ranks in listed.values() for s in ranks.values()])
        if step is None or (self.step is not None and step <= self.step):
            return False
        # from now on every rank keeps `step` and the last step copied whole, until the next
        # round (a node still saving a pinned step to storage after a node loss refuses: it
        # keeps that one until it is done)
        keep = sorted({step} | ({self.step} if self.step is not None else set()))
        pinned = self._call_all({n: (Op.PEER_PIN, {"steps": keep}) for n in placement})
        if pinned is None or any(b.get("refused") for b in pinned.values()):
            return False
        buddy = {n: placement[(i + 1) % len(placement)] for i, n in enumerate(placement)}
        for j in range(max(len(r) for r in listed.values())):  # the nodes in parallel
            jobs = [(n, False, buddy[n], True, sorted(listed[n])[j]) for n in placement
                    if j < len(listed[n])]
            if not self._copy(jobs, step):
                return False  # overwritten before the pin, or a node went: next round
        self.step = step
        self._buddy, self._ranks = buddy, {n: sorted(listed[n]) for n in placement}
        log.debug("peer copies of step %s whole in %.3f s", step, time.monotonic() - t0)
        return True

    def restore(self, lost: str, to: str) -> list[int]:
        """Before a pod-level move starts `lost`'s ranks on `to`: copy the snapshots its
        buddy keeps for it into `to`'s own places. The ranks restored."""
        with self._lock:
            buddy, step = self._buddy.get(lost), self.step
            if buddy is None or step is None or not self.hub.connected(buddy):
                return []
            restored = [r for r in self._ranks.get(lost, [])
                        if self._copy([(buddy, True, to, False, r)], step)]
            self.step = None  # the placement changed: rounds start over
            self.tails.forget()
            log.info("restored the memory snapshots of rank(s) %s (step %s) from %s onto %s",
                     restored, step, buddy, to)
            return restored

    def newest(self, lost: Collection[str]) -> int | None:
        """After `lost` nodes went: make the lost ranks' newest step whose tails the
        controller has (peer_tails.py) the step copied whole, when it is newer than the
        last round's: rebuilt on each lost node's buddy and pinned on every node. The step
        copied whole now."""
        with self._lock:
            placement = self._placement()
            buddies = {n: self._buddy.get(n) or placement[(placement.index(n) + 1)
                                                          % len(placement)]
                       for n in lost if n in placement}
            if not buddies or len(placement) < 2:
                return self.step
            got = self.tails.rebuild(buddies, self.step)
            if got is None:
                return self.step
            step, ranks = got
            # the survivors' workers are stopped next; until then they keep it
            self._call_all({n: (Op.PEER_PIN, {"steps": [step]}) for n in ranks
                            if n not in buddies})
            self.step, self._ranks = step, ranks
            self._buddy = {**self._buddy, **buddies}
            return step

    def persist(self, lost: Collection[str]) -> list[str]:
        """Save at breakpoint after `lost` nodes went: the last step copied, S, goes to
        storage from memory before the move, so it outlives a move whose target fails too.
        Every surviving node writes its own ranks' S (pinned), the lost nodes' buddies
        their copies of the lost ranks' S, under one save token; the node with rank 0
        commits and reports CHECKPOINT_SAVED (source `peer`). The nodes that started
        their part; [] when a lost node's copies are gone too (its buddy was lost):
        storage's last checkpoint is all there is then."""
        with self._lock:
            step = self.step
            parts: dict[str, dict[str, bool]] = {}  # node -> {rank: from its peer copies}
            for node, ranks in self._ranks.items():
                holder = self._buddy.get(node) if node in lost else node
                if step is None or holder is None or holder in lost:
                    log.info("no save at breakpoint of %s: %s", ", ".join(sorted(lost)),
                             "no snapshot was copied yet" if step is None else
                             f"its copies were on {holder}, lost too")
                    return []
                parts.setdefault(holder, {}).update({str(r): node in lost for r in ranks})
            token = f"peer-{step}-{uuid.uuid4().hex[:12]}"
            replies = self.hub.call({n: (Op.PEER_PERSIST, {
                "step": step, "token": token, "source": SOURCE_PEER, "ranks": ranks})
                for n, ranks in parts.items()}, CALL_TIMEOUT_S, 0.0)
            started = sorted(n for n, r in replies.items() if r.ok and r.body.get("started"))
            log.info("save at breakpoint of step %s after the loss of %s: started on %s of %s",
                     step, ", ".join(sorted(lost)), started, sorted(parts))
            return started

    def _copy(self, jobs: list[tuple[str, bool, str, bool, int]], step: int) -> bool:
        """Copy rank snapshots of `step` chunk by chunk, each (source, from its peer copies,
        target, into its peer copies, rank) of `jobs` with its own source and target (one
        command per node at a time); True once every one is whole at its target."""
        offsets = {src: 0 for src, *_ in jobs}
        generation: dict[str, int] = {}
        pending = list(jobs)
        while pending:
            chunks = self._call_all({src: (Op.PEER_TAKE, {
                "peer": src_peer, "rank": rank, "step": step, "offset": offsets[src]})
                for src, src_peer, _, _, rank in pending})
            if chunks is None or any("rank" not in c for c in chunks.values()):
                return False
            for src, c in chunks.items():
                if generation.setdefault(src, int(c["entry"]["generation"])) != \
                        int(c["entry"]["generation"]):
                    return False  # another snapshot of the step under way: not one copy
            stored = self._call_all({dst: (Op.PEER_STORE, {**chunks[src], "peer": dst_peer,
                                                           "origin": src})
                                     for src, _, dst, dst_peer, _ in pending})
            if stored is None:
                return False
            left = []
            for job in pending:
                src, dst = job[0], job[2]
                if not stored[dst].get("whole"):
                    offsets[src] += int(chunks[src]["length"])
                    if offsets[src] >= int(chunks[src]["total"]):
                        return False
                    left.append(job)
            pending = left
        return True

    def _call_all(self, calls: dict[str, tuple[Op, dict[str, Any]]]
                  ) -> dict[str, dict[str, Any]] | None:
        """Every node's reply body, or None when one failed."""
        # lost_after_s 0: a node that disconnected is no source or target of copies
        replies = self.hub.call(calls, CALL_TIMEOUT_S, 0.0)
        bad = {n: r.error for n, r in replies.items() if not r.ok}
        if bad:
            log.debug("peer copy calls failed: %s", bad)
            return None
        return {n: r.body for n, r in replies.items()}
