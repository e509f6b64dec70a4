"""The controller <-> node agent handshake (wire.py's frames, at most MAX_HANDSHAKE_FRAME,
all of it within HANDSHAKE_TIMEOUT_S), initiated by the agent (it connects; it reconnects
after a blip):

    controller -> {"type": "challenge", "nonce": HEX, "version": WIRE_VERSION}
    agent      -> {"type": "hello", "node": NAME, "mac": M("hello", HEX, NAME),
                   "nonce": HEX2, "version": WIRE_VERSION, "addr": its address, ...}
    controller -> {"type": "welcome", "mac": M("welcome", HEX2, NAME)}
                  | {"type": "denied", "why": TEXT} (then closes; the agent retries)
                  | {"type": "denied", "superseded": true, "mac": M("superseded", HEX2, NAME)}

M(...) = HMAC-SHA256(token, the JSON list of its arguments): each purpose signs only its own
kind of message, and nonces are exactly 32 hex digits, so no peer can make the other side
sign a session key (walk-through 32). Both sides prove they know the job's token, which
never travels; an agent ends only on a denial that proves it too. The connection's key is
M("session", HEX, HEX2, NAME). A peer of another WIRE_VERSION is refused at the handshake
with both versions named.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import secrets
import socket
import time
from typing import Any, TypeGuard

from trainguard.wire import Conn, WireError, keepalive

WIRE_VERSION = 3  # 1: frames after the handshake carried no MAC; 2: handshake MACs of "a|b"
NONCE_HEX = 32
MAX_HANDSHAKE_FRAME = 256 << 10
HANDSHAKE_TIMEOUT_S = 10.0  # the whole handshake, however slowly the bytes come


class Superseded(WireError):
    """The controller has another agent for this node: this one must end."""


def _keyed(token: str, purpose: str, *fields: str) -> bytes:
    """HMAC-SHA256 under the token of one JSON list: the purpose first, then the fields.
    Each purpose signs only its own kind of message, and no field can pose as two (walk-
    through 32: with "nonce|node" for a hello and "session|cn|an|node" for a key, a peer that
    chose the challenge "session|N|X" got an agent to sign a session key)."""
    msg = json.dumps([purpose, *fields], separators=(",", ":")).encode()
    return hmac.new(token.encode(), msg, hashlib.sha256).digest()


def mac(token: str, purpose: str, nonce: str, node: str) -> str:
    """A handshake proof: purpose "hello" (the agent's), "welcome" (the controller's) or
    "superseded" (the controller's denial that ends an agent)."""
    return _keyed(token, purpose, nonce, node).hex()


def check_mac(token: str, purpose: str, nonce: str, node: str, got: object) -> bool:
    return (isinstance(got, str) and got.isascii()  # compare_digest refuses other text
            and hmac.compare_digest(mac(token, purpose, nonce, node), got))


def session_key(token: str, controller_nonce: str, agent_nonce: str, node: str) -> bytes:
    return _keyed(token, "session", controller_nonce, agent_nonce, node)


def is_nonce(value: object) -> TypeGuard[str]:
    """A nonce as both sides make them (secrets.token_hex(16)): 32 lower-case hex digits."""
    return (isinstance(value, str) and len(value) == NONCE_HEX
            and all(c in "0123456789abcdef" for c in value))


def connect(host: str, port: int, token: str, node: str, hello: dict[str, Any],
            timeout: float = 5.0) -> Conn:
    """Connect to the controller, pass its challenge and check that it knows the job's
    token too; WireError when refused or when the peer is not the job's controller."""
    try:
        sock = socket.create_connection((host, port), timeout=timeout)
    except OSError as e:
        raise WireError(f"cannot reach the controller at {host}:{port}: {e}") from e
    keepalive(sock)
    conn = Conn(sock)
    own_nonce = secrets.token_hex(16)
    deadline = time.monotonic() + HANDSHAKE_TIMEOUT_S
    try:
        challenge = conn.recv(timeout, MAX_HANDSHAKE_FRAME, deadline)
        nonce = challenge.get("nonce")
        if challenge.get("type") != "challenge" or not is_nonce(nonce):
            raise WireError(f"{host}:{port} is not a trainguard controller")
        if challenge.get("version") != WIRE_VERSION:
            raise WireError(f"{host}:{port} speaks wire version "
                            f"{spoken(challenge.get('version', 1))}, this agent {WIRE_VERSION}: "
                            "run one trainguard on every node")
        conn.send({"addr": sock.getsockname()[0], **hello, "type": "hello", "node": node,
                   "mac": mac(token, "hello", nonce, node), "nonce": own_nonce,
                   "version": WIRE_VERSION})
        answer = conn.recv(timeout, MAX_HANDSHAKE_FRAME, deadline)
    except (TimeoutError, WireError) as e:
        conn.close()
        raise WireError(f"handshake with {host}:{port} failed: {e}") from e
    if answer.get("type") != "welcome":
        conn.close()
        why = f"the controller refused node {node}: {answer.get('why', answer)}"
        # only the job's controller may end an agent: its denial proves the token too (one
        # that does not is someone on the controller's address: retried, never obeyed)
        if answer.get("superseded") and check_mac(token, "superseded", own_nonce, node,
                                                  answer.get("mac")):
            raise Superseded(why)
        raise WireError(why)
    if not check_mac(token, "welcome", own_nonce, node, answer.get("mac")):
        conn.close()
        raise WireError(f"{host}:{port} does not know the job token: not this job's "
                        "controller (another process may have taken its port)")
    conn.secure(session_key(token, nonce, own_nonce, node), controller_side=False)
    return conn


def accept(conn: Conn, token: str, timeout: float | None = None) -> dict[str, Any]:
    """The controller's side of the handshake: the agent's hello (its "challenge" key: the
    nonce sent), or WireError. The whole hello must come within `timeout` (default
    HANDSHAKE_TIMEOUT_S). The caller answers with welcome(...) or deny(...)."""
    timeout = HANDSHAKE_TIMEOUT_S if timeout is None else timeout
    nonce = secrets.token_hex(16)
    deadline = time.monotonic() + timeout
    try:
        conn.send({"type": "challenge", "nonce": nonce, "version": WIRE_VERSION})
        hello = conn.recv(timeout, MAX_HANDSHAKE_FRAME, deadline)
    except (TimeoutError, WireError) as e:  # a TimeoutError has no text of its own
        why = str(e) or f"nothing within {timeout:g}s"
        raise WireError(f"{conn.peer} did not say hello: {why}") from e
    node = hello.get("node")
    if hello.get("type") != "hello" or not isinstance(node, str) or not node:
        raise WireError(f"{conn.peer} sent no node name")
    if hello.get("version") != WIRE_VERSION:
        why = (f"agent speaks wire version {spoken(hello.get('version', 1))}, the "
               f"controller {WIRE_VERSION}: run one trainguard on every node")
        deny(conn, why)
        raise WireError(f"{conn.peer} (node {node!r}): {why}")
    if not check_mac(token, "hello", nonce, node, hello.get("mac")):
        deny(conn, "wrong job token")
        raise WireError(f"{conn.peer} (node {node!r}) does not know the job token")
    if not is_nonce(hello.get("nonce")):
        raise WireError(f"{conn.peer} (node {node!r}) sent no nonce of {NONCE_HEX} hex digits")
    return {**hello, "challenge": nonce}


def welcome(conn: Conn, token: str, hello: dict[str, Any]) -> None:
    """The controller's proof that it knows the token too, answering the agent's nonce;
    every frame after it is authenticated."""
    node = str(hello["node"])
    conn.send({"type": "welcome", "mac": mac(token, "welcome", str(hello["nonce"]), node)})
    conn.secure(session_key(token, str(hello["challenge"]), str(hello["nonce"]), node),
                controller_side=True)


def deny(conn: Conn, why: str) -> None:
    """Refuse a peer (it may retry); it closes then."""
    with contextlib.suppress(WireError):
        conn.send({"type": "denied", "why": why})


def supersede(conn: Conn, token: str, hello: dict[str, Any], why: str) -> None:
    """Tell an agent whose hello proved the token that another agent serves its node: it
    stops its workers and ends. The denial proves the token (an agent obeys no other)."""
    with contextlib.suppress(WireError):
        conn.send({"type": "denied", "why": why, "superseded": True,
                   "mac": mac(token, "superseded", str(hello["nonce"]), str(hello["node"]))})


def spoken(version: object) -> str:
    """A peer's wire version as it came: a version of the wrong type (the string "3") says
    so, not "version 3, the controller 3" (walk-through 36 #5)."""
    return str(version) if type(version) is int else f"{version!r} (not an integer)"

