"""One node's answer to a command (Hub.call): its agent's reply, or why there is none.

No reply yet is an error once its node is given up on, by a Judge asked each round: the
hub's own (its link down past the reconnect grace, or silent past the node timeout while
another node was heard: a frozen agent) or the Fleet's (a node as `lost_now` judges it:
controller/link_loss.py), or once the call's timeout has passed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# of the nodes whose answer is still awaited, those given up on now, with why
Judge = Callable[[list[str]], dict[str, str]]


@dataclass(frozen=True)
class Reply:
    ok: bool
    body: dict[str, Any]
    error: str = ""


def reply_of(frame: dict[str, Any]) -> Reply:
    """An agent's reply frame as a Reply (a body that is not a mapping is none)."""
    body = frame.get("body")
    return Reply(bool(frame.get("ok")), body if isinstance(body, dict) else {},
                 str(frame.get("error") or ""))
