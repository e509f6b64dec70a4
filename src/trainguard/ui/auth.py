"""Who may read the dashboard. Bound to a loopback address without a token, only requests
whose Host is a loopback name pass (a web page elsewhere cannot reach it through DNS
rebinding), and only from the dashboard's own user (or root): the uid that owns the client's
end of the loopback connection, read from /proc/net/tcp{,6} (other local users would read
with the dashboard user's rights what they cannot; walk-through 32 #5): a client that is
not a loopback address and port it can look up is refused (fail closed). With a token
(required off loopback), every request carries it: `?token=`, `Authorization: Bearer`, or the
cookie set when a page was opened with `?token=`, so the page's own requests and its event
stream need nothing more."""

from __future__ import annotations

import hmac
import ipaddress
import json
import os
from urllib.parse import parse_qs

import anyio.to_thread
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from trainguard.sockowner import client_uid

COOKIE = "trainguard_ui_token"
_LOOPBACK_NAMES = ("localhost",)


def is_loopback(host: str) -> bool:
    """Whether an address or host name is this machine's loopback only."""
    host = host.strip("[]")
    if host.lower() in _LOOPBACK_NAMES or host.lower().endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def host_name(header: str) -> str:
    """The name in a Host header, without its port (`[::1]:8642` -> `::1`)."""
    if header.startswith("["):
        return header[1:].partition("]")[0]
    return header.rpartition(":")[0] if header.count(":") == 1 else header


class Guard:
    """ASGI middleware: the loopback Host check, or the token check."""

    def __init__(self, app: ASGIApp, token: str | None) -> None:
        self.app = app
        self.token = token

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        if self.token is None:
            if not is_loopback(host_name(headers.get("host", ""))):
                await _refuse(send, 403, "this dashboard answers only to a loopback Host "
                              "(127.0.0.1, localhost); start it with --token to serve others")
                return
            # off the event loop: the table's size is any local user's to grow (review of
            # walk-through 32 #9)
            uid = await anyio.to_thread.run_sync(client_uid, scope.get("client"),
                                                 scope.get("server"))
            if uid is not None and uid not in (os.geteuid(), 0):
                whose = f"uid {uid}'s" if uid >= 0 else "of a user that cannot be told"
                await _refuse(send, 403, f"this dashboard answers only its own user (uid "
                              f"{os.geteuid()}) without a token, and this connection is "
                              f"{whose}. Fix: start it with --token and hand the printed URL "
                              "to whoever may read these jobs")
                return
            await self.app(scope, receive, send)
            return
        query = parse_qs(scope.get("query_string", b"").decode("latin-1")).get("token", [])
        auth = headers.get("authorization", "")
        bearer = auth[7:].strip() if auth.lower().startswith("bearer ") else None
        cookie = _cookie(headers.get("cookie", ""))
        given = [t for t in (*query, bearer, cookie) if t]
        if not any(hmac.compare_digest(t.encode(), self.token.encode()) for t in given):
            await _refuse(send, 401, "a token is required: open the URL `trainguard ui` "
                          "printed (it ends in ?token=...), or send Authorization: Bearer "
                          "TOKEN")
            return
        if query:  # keep it for the page's own requests (fetch, EventSource)
            await self.app(scope, receive, _with_cookie(send, self.token))
        else:
            await self.app(scope, receive, send)


def _cookie(header: str) -> str | None:
    for part in header.split(";"):
        name, _, value = part.strip().partition("=")
        if name == COOKIE:
            return value
    return None


def _with_cookie(send: Send, token: str) -> Send:
    async def sending(message: Message) -> None:
        if message["type"] == "http.response.start":
            cookie = f"{COOKIE}={token}; Path=/; HttpOnly; SameSite=Strict"
            message = {**message, "headers": [*message.get("headers", []),
                                              (b"set-cookie", cookie.encode())]}
        await send(message)
    return sending


async def _refuse(send: Send, status: int, why: str) -> None:
    body = json.dumps({"error": why}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
