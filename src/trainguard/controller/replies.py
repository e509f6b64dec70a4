"""One node's answer to a command (Hub.call): its agent's reply, or why there is none, judged
at one instant: pure, so the hub does the sending and the waiting only.

No reply yet means an error when the node's link has been down past its allowance (the
reconnect grace, or longer for a link cut in a full disruption: controller/disruption.py),
when it has been silent past `silent_after_s` while another node was heard (a frozen agent;
every node silent is this controller behind), or when the call's timeout has passed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any


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


def allowances(lost_after_s: float | Mapping[str, float], names: Iterable[str]) -> dict[str, float]:
    """Each node's allowance of link downtime: one for all, or each node's."""
    if isinstance(lost_after_s, Mapping):
        return {n: lost_after_s.get(n, 0.0) for n in names}
    return dict.fromkeys(names, lost_after_s)


def no_reply(name: str, *, gone: bool, silent: bool, silent_after_s: float | None,
             late: bool, timeout: float) -> Reply | None:
    """The error answer of `name`, which has not replied yet, or None to wait on. `gone`: its
    link down past its allowance; `silent`: unheard past `silent_after_s` while another node
    was heard; `late`: the call's timeout has passed."""
    if gone:
        return Reply(False, {}, f"node {name} is unreachable")
    if silent:
        return Reply(False, {}, f"node {name} has been silent for over {silent_after_s:g}s")
    if late:
        return Reply(False, {}, f"node {name} did not answer within {timeout:.0f}s")
    return None
