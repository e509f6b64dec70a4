"""What the loop passes between its parts (controller/loop.py): how an attempt's watch
ended (Outcome) and the ladder's decision as carried out so far (Next)."""

from __future__ import annotations

from dataclasses import dataclass

from trainguard.controller.hang_evidence import HangConfirmation
from trainguard.policy.decision import Decision
from trainguard.protocol import NodeReport


@dataclass
class Outcome:
    """How an attempt's watch ended: a signal, a confirmed hang, lost nodes, every group
    broken, or (none of them) its ranks' exits in `report`."""

    report: NodeReport
    signal: int | None = None
    hang: HangConfirmation | None = None
    lost: dict[str, str] | None = None  # multi-node: placed nodes lost, with why
    broken: str | None = None  # every rank's group broke, every process lives: the error


@dataclass(frozen=True)
class Next:
    """The ladder's decision after an incident, carried out as far as it goes before the
    next attempt; a GIVE_UP comes with the JobFailed text and the culprit rank."""

    decision: Decision
    failure: str = ""
    rank: int | None = None
    node_level: bool = False  # nodes were (or would have been) waited for
    outside: list[str] | None = None  # every placed node's agent got SIGTERM: these nodes
