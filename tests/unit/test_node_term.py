"""node/term.py: a SIGTERM to the node agent (the cluster ending its step)."""

from __future__ import annotations

import os
import signal
import time

from trainguard.node.term import TERM_SLACK_S, Termination


def test_the_agent_ends_its_workers_itself_only_without_a_controller_or_past_the_grace(
        ) -> None:
    t = Termination(grace_s=20.0)
    assert not t.fresh() and not t.due(connected=False) and t.grace_left() == 0.0
    before = signal.getsignal(signal.SIGTERM)
    try:
        t.install()
        os.kill(os.getpid(), signal.SIGTERM)  # the process lives: only a flag is set
        first = t.at
        os.kill(os.getpid(), signal.SIGTERM)
    finally:
        signal.signal(signal.SIGTERM, before)
    assert first is not None and t.at == first  # the first signal's time is kept
    assert t.fresh() and not t.fresh()  # said once
    assert t.due(connected=False)  # no controller to stop the workers: the agent does
    assert not t.due(connected=True)  # the controller stops them, within the grace period
    assert 19.0 < t.grace_left() <= 20.0
    t.at = time.monotonic() - (20.0 + TERM_SLACK_S + 1)
    assert t.due(connected=True) and t.grace_left() == 0.0  # it did not: the agent does
