"""Whose process holds the far end of a loopback TCP connection: the kernel's socket tables
(/proc/net/tcp, /proc/net/tcp6) name each socket's owner. The dashboard answers only its own
user without a token, and the controller gives its own user's loopback connections (the
local backend's agents) room in the handshake that strangers cannot fill (walk-through 32
#2, #5)."""

from __future__ import annotations

import ipaddress
import socket
import struct
from pathlib import Path

TCP_TABLES = (Path("/proc/net/tcp"), Path("/proc/net/tcp6"))


def client_uid(client: object, server: object,
               tables: tuple[Path, ...] = TCP_TABLES) -> int | None:
    """The uid owning the client's end of a loopback TCP connection to `server`: -1 when
    the tables are readable but do not have it, or when the client is not a loopback
    address and port (it cannot be told: refused, fail closed); None only when the tables
    are not there (not Linux: the Host check alone)."""
    want = _loopback_pair(client, server)
    found = False
    for table in tables:
        try:
            lines = table.read_text().splitlines()[1:]
        except OSError:
            continue
        found = True
        if want is None:
            continue
        for line in lines:
            f = line.split()
            if len(f) > 7 and _endpoint(f[1]) == want[0] and _endpoint(f[2]) == want[1]:
                return int(f[7])
    return -1 if found else None


_Addr = tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, int]


def _loopback_pair(client: object, server: object) -> tuple[_Addr, _Addr] | None:
    """(client, server) as addresses and ports when the client is a loopback address and
    both are (address, port) pairs; None otherwise."""
    if not (isinstance(client, list | tuple) and isinstance(server, list | tuple)
            and len(client) == 2 and len(server) == 2):
        return None
    try:
        ends = ((_v4(ipaddress.ip_address(str(client[0]))), int(client[1])),
                (_v4(ipaddress.ip_address(str(server[0]))), int(server[1])))
    except ValueError:
        return None
    return ends if ends[0][0].is_loopback else None


def _endpoint(field: str) -> tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, int] | None:
    """`0100007F:1F90` (the kernel's host-order words) as (127.0.0.1, 8080); a v4-mapped v6
    address as its v4."""
    addr, _, port = field.partition(":")
    try:
        packed = b"".join(struct.pack("=I", int(addr[i:i + 8], 16))
                          for i in range(0, len(addr), 8))
        ip = ipaddress.ip_address(socket.inet_ntop(
            socket.AF_INET if len(packed) == 4 else socket.AF_INET6, packed))
        return _v4(ip), int(port, 16)
    except (ValueError, OSError, struct.error):
        return None


def _v4(ip: ipaddress.IPv4Address | ipaddress.IPv6Address,
        ) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """A v4-mapped v6 address (a dual-stack socket's view) as the v4 one."""
    return ip.ipv4_mapped or ip if isinstance(ip, ipaddress.IPv6Address) else ip
