"""The fresh rendezvous port of each attempt, picked where no other process will take it.

A port the kernel hands out for `bind(addr, 0)` comes from the ephemeral range
(/proc/sys/net/ipv4/ip_local_port_range), the range every outgoing connection and every
other `bind(0)` on the machine also draws from. Rank 0 binds the store seconds after the
port was picked (the interpreter and torch start first): on a busy machine another process
can take that port in between, and the attempt fails with EADDRINUSE (seen in CI: a job whose
first attempt died of a port conflict before its ranks trained a step). A port below the
ephemeral range is handed out by no one: it is taken only by a process that names it, and
the pick checks that none has.
"""

from __future__ import annotations

import random
import socket
from collections.abc import Callable
from pathlib import Path

RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LINUX_DEFAULT = (32768, 60999)  # the kernel's default ephemeral range
FLOOR = 20000  # below: the ports well-known services listen on (8080, 9090, 6379, ...)
MIN_SPAN = 1000  # fewer ports than this outside the ephemeral range: let the kernel pick
TRIES = 64


def ephemeral_range(path: Path = RANGE_FILE) -> tuple[int, int]:
    """The kernel's ephemeral port range; Linux's default where it cannot be read."""
    try:
        low, high = (int(p) for p in path.read_text().split())
    except (OSError, ValueError):
        return LINUX_DEFAULT
    return (low, high) if 0 < low <= high <= 65535 else LINUX_DEFAULT


def quiet_ports(ephemeral: tuple[int, int]) -> range | None:
    """The ports no process is handed without naming them: from FLOOR up to the ephemeral
    range, else above it; None when neither holds MIN_SPAN ports."""
    low, high = ephemeral
    below, above = range(FLOOR, low), range(max(high + 1, FLOOR), 65536)
    best = max(below, above, key=len)
    return best if len(best) >= MIN_SPAN else None


def pick_port(ephemeral: tuple[int, int], is_free: Callable[[int], bool],
              rng: random.Random, fallback: Callable[[], int]) -> int:
    """A free port outside the ephemeral range, at random (two launchers on one machine
    rarely try the same one, and each checks); `fallback()` (the kernel's pick) when the
    range leaves no room or TRIES picks were all taken."""
    ports = quiet_ports(ephemeral)
    if ports is not None:
        for _ in range(TRIES):
            port = ports[rng.randrange(len(ports))]
            if is_free(port):
                return port
    return fallback()


def _bindable(addr: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((addr, port))
        except OSError:
            return False
    return True


def _kernel_port(addr: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((addr, 0))
        return int(s.getsockname()[1])


def free_port(addr: str) -> int:
    """A port nobody listens on right now at `addr` and no one is handed by the kernel
    (each attempt gets a fresh one)."""
    return pick_port(ephemeral_range(), lambda p: _bindable(addr, p), random.SystemRandom(),
                     lambda: _kernel_port(addr))
