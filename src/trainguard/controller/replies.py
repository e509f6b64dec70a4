"""One node's answer to a command (Hub.call): its agent's reply, or why there is none.

No reply yet is an error once its node is given up on, by a Judge (asked at most every
Hub.JUDGE_S and at the call's deadline): the hub's own (its link down past the reconnect
grace, or silent past the node timeout while another node was heard: a frozen agent) or
the Fleet's (a node as `lost_now` judges it: controller/link_loss.py), or once the call's
timeout has passed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from trainguard.controller.links import LinkState

# of the nodes whose answer is still awaited, those given up on now, with why
Judge = Callable[[list[str]], dict[str, str]]


@dataclass(frozen=True)
class Reply:
    ok: bool
    body: dict[str, Any]
    error: str = ""
    answered: bool = False  # the agent's own answer (else: given up on, or no answer in time)


def reply_of(frame: dict[str, Any]) -> Reply:
    """An agent's reply frame as a Reply (a body that is not a mapping is none)."""
    body = frame.get("body")
    return Reply(bool(frame.get("ok")), body if isinstance(body, dict) else {},
                 str(frame.get("error") or ""), answered=True)


def plain_judge(links_now: Callable[[], Mapping[str, LinkState]], lost_after_s: float,
                silent_after_s: float | None) -> Judge:
    """The hub's own judgement (a command of no fleet's: an agent told to end, a pre-check,
    a peer copy): a node whose link has been down longer than `lost_after_s` (or that never
    connected) is unreachable; one unheard longer than `silent_after_s` while another node
    was heard within it is silent (every node silent: this controller behind)."""
    def judge(names: list[str]) -> dict[str, str]:
        links = links_now()
        heard = silent_after_s is not None and any(
            link.silent_s <= silent_after_s for link in links.values())
        out = {}
        for name in names:
            link = links.get(name)
            if link is None or link.disconnected_s > lost_after_s:
                out[name] = f"node {name} is unreachable"
            elif heard and link.silent_s > (silent_after_s or 0):
                out[name] = f"node {name} has been silent for over {silent_after_s:g}s"
        return out
    return judge
