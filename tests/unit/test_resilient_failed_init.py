"""worker/resilient._tear_down after an init_process_group that failed (review 37 #2): the
failed init took the name "0" from torch's group counter and never became the default group,
so nothing reset the counter; the process re-entered with its next default group named "1"
beside a fresh replacement's "0", and gloo's rendezvous keys differed: every rank waited in
init_process_group for peers that never came (4 ranks, `collective` fault,
--operator-reexecution: the re-formed group's rendezvous timed out with rank 3 blocked)."""

from __future__ import annotations

import socket
from datetime import timedelta

import pytest
import torch.distributed as dist

from trainguard.worker import resilient


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_failed_init_leaves_the_next_default_group_named_as_in_a_fresh_process() -> None:
    assert not dist.is_initialized() and dist.get_pg_count() == 0
    store = dist.TCPStore("127.0.0.1", _free_port(), 2, is_master=True,
                          wait_for_workers=False, timeout=timedelta(seconds=1))
    with pytest.raises(Exception, match=r"[Tt]ime"):  # rank 1 never comes
        dist.init_process_group("gloo", store=store, rank=0, world_size=2,
                                timeout=timedelta(seconds=1))
    assert not dist.is_initialized() and dist.get_pg_count() == 1  # torch's own state
    resilient._tear_down()
    assert dist.get_pg_count() == 0  # the next init_process_group is named "0" again
