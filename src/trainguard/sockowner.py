"""Whose process holds the far end of a loopback TCP connection: the kernel's socket tables
(/proc/net/tcp, /proc/net/tcp6) name each socket's owner. The dashboard answers only its own
user without a token, and the controller gives its own user's loopback connections (the
local backend's agents) room in the handshake that strangers cannot fill (walk-through 32
#2, #5)."""

from __future__ import annotations

import ipaddress
import struct
from pathlib import Path

TCP_TABLES = (Path("/proc/net/tcp"), Path("/proc/net/tcp6"))


def client_uid(client: object, server: object,
               tables: tuple[Path, ...] = TCP_TABLES) -> int | None:
    """The uid owning the client's end of a loopback TCP connection to `server`: -1 when
    the tables are readable but do not have it, or when the client is not a loopback
    address and port (it cannot be told: refused, fail closed); None only when the tables
    are not there (not Linux: the Host check alone). The row is found by its two addresses
    as the kernel spells them (C string search), and only that row is split: any local user
    can grow the table (TIME_WAIT rows cost nothing to make), and a Python parse of every
    row took 267 ms a request at 25,000 rows (review of walk-through 32 #9)."""
    needles = _needles(client, server)
    found = False
    for table in tables:
        try:
            text = table.read_text()
        except OSError:
            continue
        found = True
        for needle in needles:
            at = text.find(needle)
            if at >= 0:
                end = text.find("\n", at)
                row = text[at:end if end >= 0 else None].split()  # ":", the ends, .., uid
                return int(row[7]) if len(row) > 7 and row[7].isdigit() else -1
    return -1 if found else None


def _needles(client: object, server: object) -> list[str]:
    """`: LOCAL REMOTE ` as a row of /proc/net/tcp{,6} spells the client's end of its
    connection to `server` (v4, v6 and v4-mapped spellings); none when the client is not a
    loopback address and port, or either is no (address, port) pair."""
    if not (isinstance(client, list | tuple) and isinstance(server, list | tuple)
            and len(client) == 2 and len(server) == 2):
        return []
    try:
        ends = [(ipaddress.ip_address(str(a)), int(port)) for a, port in (client, server)]
    except ValueError:
        return []
    (cip, cport), (sip, sport) = ends
    if not _v4(cip).is_loopback or not (0 <= cport < 65536 and 0 <= sport < 65536):
        return []
    return [f": {c}:{cport:04X} {s}:{sport:04X} "
            for c, s in zip(_spellings(cip), _spellings(sip), strict=True)]


def _spellings(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> list[str]:
    """An address as /proc/net/tcp (v4) and /proc/net/tcp6 (v4-mapped) spell it, in that
    order; a v6 one (not v4-mapped) twice as tcp6 does: the kernel's host-order words."""
    v4 = _v4(ip)
    v6 = ipaddress.IPv6Address(f"::ffff:{v4}") if isinstance(v4, ipaddress.IPv4Address) \
        else v4
    return [_hex(v4.packed), _hex(v6.packed)]


def _hex(packed: bytes) -> str:
    return "".join(f"{w:08X}" for (w,) in struct.iter_unpack("=I", packed))


def _v4(ip: ipaddress.IPv4Address | ipaddress.IPv6Address,
        ) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """A v4-mapped v6 address (a dual-stack socket's view) as the v4 one."""
    return ip.ipv4_mapped or ip if isinstance(ip, ipaddress.IPv6Address) else ip
