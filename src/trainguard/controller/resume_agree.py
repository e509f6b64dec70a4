"""The ranks' agreement on the memory snapshot to resume from (checkpoint/memory_tier.py).

Every rank's load_latest sends the steps it holds in memory and the newest valid step it
sees in storage (MEMORY_STEPS, for its attempt and process group generation) and waits;
once every rank of the job has asked, each gets the same answer (RESUME_FROM): the newest
step all hold in memory when no rank sees a newer one in storage, else none (storage). A
rank asking again (its report resent) gets the answer again.
"""

from __future__ import annotations

import logging

from trainguard.checkpoint.memory_format import memory_resume_step
from trainguard.errors import LaunchError
from trainguard.protocol import AgentAPI, NodeReport, Tell
from trainguard.worker.contract import ControlKind, MessageKind

log = logging.getLogger(__name__)

Round = tuple[int, int]  # (attempt, process group generation)


class ResumeAgreement:
    def __init__(self, agent: AgentAPI, world_size: int) -> None:
        self.agent, self.world_size = agent, world_size
        self._asked: dict[Round, dict[int, tuple[list[int], int | None]]] = {}
        self._answered: dict[Round, int | None] = {}

    def observe(self, report: NodeReport) -> None:
        for m in report.messages:
            if m.kind != MessageKind.MEMORY_STEPS or m.rank is None:
                continue
            key = (int(m.data["attempt"]), int(m.data["generation"]))
            if key in self._answered:
                self._answer(key, [m.rank])
                continue
            storage = m.data.get("storage_step")
            asked = self._asked.setdefault(key, {})
            asked[m.rank] = ([int(s) for s in m.data.get("steps") or []],
                             int(storage) if storage is not None else None)
            if len(asked) >= self.world_size:
                lists = [asked[r] for r in sorted(asked)]
                self._answered[key] = memory_resume_step([s for s, _ in lists],
                                                         [st for _, st in lists])
                del self._asked[key]
                log.info("attempt %s generation %s resumes from %s", key[0], key[1],
                         f"memory step {self._answered[key]}" if self._answered[key] is not None
                         else "storage")
                self._answer(key, None)

    def _answer(self, key: Round, ranks: list[int] | None) -> None:
        control = {"kind": ControlKind.RESUME_FROM.value, "attempt": key[0],
                   "generation": key[1], "step": self._answered[key]}
        try:
            self.agent.tell(Tell(ranks=ranks, control=control))
        except (LaunchError, OSError) as e:  # the ranks ask again every second
            log.warning("could not hand out the resume step: %s", e)

    def new_attempt(self, attempt: int) -> None:
        """Rounds of older attempts will never complete."""
        self._asked = {k: v for k, v in self._asked.items() if k[0] >= attempt}
