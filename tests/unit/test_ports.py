"""The rendezvous port: picked outside the kernel's ephemeral range, free, at random."""

from __future__ import annotations

import random
import socket
from pathlib import Path

from trainguard.node.ports import (
    FLOOR,
    LINUX_DEFAULT,
    ephemeral_range,
    free_port,
    pick_port,
    quiet_ports,
)


def never() -> int:
    raise AssertionError("the kernel's pick was not needed")


def test_the_pick_lies_below_the_ephemeral_range_and_varies() -> None:
    rng = random.Random(7)
    got = {pick_port((32768, 60999), lambda p: True, rng, never) for _ in range(50)}
    assert all(FLOOR <= p < 32768 for p in got)
    assert len(got) > 40  # two launchers on one machine rarely try the same port


def test_taken_ports_are_skipped() -> None:
    tried: list[int] = []

    def free(p: int) -> bool:
        tried.append(p)
        return len(tried) == 3

    port = pick_port((32768, 60999), free, random.Random(1), never)
    assert port == tried[-1] and len(tried) == 3


def test_all_taken_or_no_room_falls_back_to_the_kernels_pick() -> None:
    assert pick_port((32768, 60999), lambda p: False, random.Random(1), lambda: 41000) == 41000
    # the ephemeral range covers (nearly) every port above FLOOR: no quiet room
    assert quiet_ports((FLOOR + 10, 65000)) is None
    assert pick_port((FLOOR + 10, 65000), lambda p: True, random.Random(1), lambda: 5) == 5


def test_room_above_a_low_ephemeral_range_is_used() -> None:
    ports = quiet_ports((10000, 40000))
    assert ports == range(40001, 65536)


def test_the_range_file_is_read_and_a_bad_one_means_linuxs_default(tmp_path: Path) -> None:
    f = tmp_path / "ip_local_port_range"
    f.write_text("40000\t50000\n")
    assert ephemeral_range(f) == (40000, 50000)
    for bad in ("", "x y", "50000 40000", "1 2 3"):
        f.write_text(bad)
        assert ephemeral_range(f) == LINUX_DEFAULT
    assert ephemeral_range(tmp_path / "absent") == LINUX_DEFAULT


def test_a_real_pick_is_bindable_and_outside_this_machines_ephemeral_range() -> None:
    low, high = ephemeral_range()
    for _ in range(5):
        port = free_port("127.0.0.1")
        assert not low <= port <= high
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))
