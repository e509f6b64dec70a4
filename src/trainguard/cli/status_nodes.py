"""What `trainguard status` says of the nodes' side besides the ranks: the memory each node
holds for fast recovery (standbys, /dev/shm) and what was refused at the job's doors (the
controller's hub: connections; each agent's worker channel: datagrams), as recorded by the
launcher with its reports (docs/cli.md, docs/security.md)."""

from __future__ import annotations

from typing import Any

from rich.console import Console

from trainguard.cli.fmt import size_text

_USAGE_KEYS = ("standby_ready", "standby_warming", "standby_rss_bytes", "shm_bytes",
               "shm_peer_bytes")
_REFUSED = {"handshake": "failed handshake(s)", "over_budget": "over the handshake budget",
            "forged_frame": "link(s) ended by a forged frame"}


def usage(recorded: Any) -> list[dict[str, Any]]:
    """Per node, the standbys ready and their memory, the job's /dev/shm bytes (the peer
    copies among them), as the agents last reported them (none once the job ended, or
    was lost: `status_doc`)."""
    if not isinstance(recorded, dict):
        return []
    return [{"node": node, **{k: int(u.get(k) or 0) for k in _USAGE_KEYS}}
            for node, u in sorted(recorded.items()) if isinstance(u, dict)]


def refused(meta: dict[str, Any]) -> dict[str, Any]:
    """`connections_refused` (by why) and `worker_messages_refused` of the status document."""
    conns = meta.get("connections_refused")
    msgs = meta.get("worker_messages_refused")
    return {"connections_refused": {k: int(v) for k, v in (conns or {}).items()}
            if isinstance(conns, dict) else {},
            "worker_messages_refused": msgs if isinstance(msgs, int) else 0}


def print_nodes(console: Console, doc: dict[str, Any]) -> None:
    """The status lines of the node usage and of what was refused."""
    for u in doc["node_usage"]:
        peer = f" (peer copies {size_text(u['shm_peer_bytes'])})" if u["shm_peer_bytes"] else ""
        warming = f" ({u['standby_warming']} still importing)" if u["standby_warming"] else ""
        console.print(f"fast recovery on {u['node']}: {u['standby_ready']} standby worker(s) "
                      f"ready{warming}, {size_text(u['standby_rss_bytes'])} resident; /dev/shm "
                      f"{size_text(u['shm_bytes'])}{peer}", highlight=False, markup=False)
    if any(doc["connections_refused"].values()):
        console.print("connections refused: " + ", ".join(
            f"{n} {_REFUSED.get(k, k)}" for k, n in doc["connections_refused"].items() if n)
            + " (docs/security.md)", highlight=False, markup=False)
    if doc["worker_messages_refused"]:
        console.print(f"worker messages refused: {doc['worker_messages_refused']} (a "
                      "stranger's, malformed or out of bounds; docs/security.md)",
                      highlight=False, markup=False)
