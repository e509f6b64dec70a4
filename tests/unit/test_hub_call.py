"""Hub.call's waiting: the judge is asked at most every JUDGE_S, not at each reply (review 42
#5: at 2,000 nodes each reply ran an O(nodes) judge under the hub's lock, and a fan-out took
2.5-3x as long, the link reader blocked meanwhile)."""

from __future__ import annotations

import threading
import time

from trainguard.controller.hub import Hub
from trainguard.controller.links import NodeLink
from trainguard.protocol import Op
from trainguard.wire import new_token


def test_replies_spread_over_half_a_second_ask_the_judge_a_few_times() -> None:
    hub = Hub(new_token(), "127.0.0.1")
    names = [f"n{i}" for i in range(200)]
    try:
        links = {n: NodeLink(n) for n in names}
        hub.links.update(links)
        asked: list[int] = []

        def judge(awaited: list[str]) -> dict[str, str]:
            asked.append(len(awaited))
            return {}

        def answer() -> None:
            while len(hub._pending) < len(names):
                time.sleep(0.001)
            for cid, (name, _) in list(hub._pending.items()):
                hub._frame(links[name], {"type": "reply", "id": cid, "ok": True, "body": {}})
                time.sleep(0.0025)

        t = threading.Thread(target=answer)
        t.start()
        out = hub.call(dict.fromkeys(names, (Op.PORT, {})), 10, 0.0, judge=judge)
        t.join()
        assert all(r.ok for r in out.values()) and len(out) == len(names)
        assert 1 <= len(asked) <= 8, asked  # every 0.2 s of about 0.5 s, not ~200 times
    finally:
        hub.close()
