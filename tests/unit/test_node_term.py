"""node/term.py: a SIGTERM to the node agent is a flag, acted on once."""

from __future__ import annotations

import os
import signal

from trainguard.node.term import Termination


def test_a_sigterm_is_only_recorded_and_acted_on_once() -> None:
    t = Termination(grace_s=20.0)
    assert not t.fresh() and not t.at_signal
    before = signal.getsignal(signal.SIGTERM)
    try:
        t.install()
        os.kill(os.getpid(), signal.SIGTERM)  # the process lives: only a flag is set
        os.kill(os.getpid(), signal.SIGTERM)
    finally:
        signal.signal(signal.SIGTERM, before)
    assert t.at_signal and t.fresh() and not t.fresh()  # the workers are stopped once
    assert t.grace_s == 20.0 and not t.ended
