"""The live /metrics endpoint (`--metrics-port`): a bounded HTTP server in the controller.

The controller process also runs the hub and the job's loop, so the endpoint must not let a
client (any local user can reach 127.0.0.1) grow it (walk-through 32 #7: prometheus-client's
start_http_server took a thread and an fd per open connection, with no timeout and no cap):

- at most MAX_CONNECTIONS connections at once (a thread each); one more is closed at once,
  counted in `refused` and logged at most every WARN_EVERY_S;
- each connection has REQUEST_DEADLINE_S in all to send its request and take the answer
  (a socket timeout per read, and the serve loop shuts down whatever is past its deadline:
  a client that sends a byte every few seconds is cut too); HTTP/1.0, one request each;
- scrapes run one at a time, and one scrape's answer serves the requests of the next
  CACHE_S. Each opens the job's store read-only and closes it before the answer is
  written (a client gone by then costs nothing more). One at a time matters beyond CPU:
  SQLite keeps the fd of a closed connection open while another connection of the same
  process (the controller's writer) holds a lock on the file, and reuses it at the next
  open: many scrapes at once left as many fds on trainguard.db for the life of the job.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import socketserver
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import CollectorRegistry

log = logging.getLogger(__name__)

MAX_CONNECTIONS = 16  # Prometheus scrapes over one; a few people with curl fit beside it
REQUEST_DEADLINE_S = 10.0  # from the accept to the last byte of the answer
CACHE_S = 1.0  # one scrape answers every request of the next second
WARN_EVERY_S = 60.0


class _Handler(BaseHTTPRequestHandler):
    server: MetricsServer
    protocol_version = "HTTP/1.0"  # one request per connection

    def setup(self) -> None:
        super().setup()
        self.connection.settimeout(self.server.deadline_s)  # each read; the loop: the whole

    def do_GET(self) -> None:  # http.server's name
        if self.server.expired(self.request):  # cut at its deadline mid-request
            return
        if urlsplit(self.path).path not in ("/metrics", "/"):
            self.send_error(404, "only /metrics is served here")
            return
        try:
            body, content_type = self.server.scrape(self.headers.get("Accept"))
        except Exception as e:  # a store being written or gone: 503
            self.send_error(503, f"cannot read the job's store: {e}"[:500])
            return
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        """No line per request on the job's console."""


class MetricsServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 64  # connections waiting for their accept (5: a burst waits 1 s)
    block_on_close = False  # server_close does not wait for a stuck client's thread

    def __init__(self, registry: CollectorRegistry, host: str, port: int,
                 max_connections: int | None = None, deadline_s: float | None = None,
                 cache_s: float | None = None) -> None:
        self.address_family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        self.registry = registry
        self.max_connections = MAX_CONNECTIONS if max_connections is None else max_connections
        self.deadline_s = REQUEST_DEADLINE_S if deadline_s is None else deadline_s
        self.cache_s = CACHE_S if cache_s is None else cache_s
        self.refused = 0  # connections closed at once: MAX_CONNECTIONS were open
        self._warned = 0.0
        self._open: dict[socket.socket, float] = {}  # connection -> its deadline
        self._cut: set[socket.socket] = set()  # shut down at their deadline
        self._lock = threading.Lock()
        self._scraping = threading.Lock()
        self._cached: tuple[float, str, bytes] | None = None  # (when, content type, body)
        super().__init__((host, port), _Handler)

    def server_bind(self) -> None:
        """As HTTPServer's, without its reverse DNS look-up of the host (getfqdn)."""
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = str(self.server_address[0]), \
            int(self.server_address[1])

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._lock:
            full = len(self._open) >= self.max_connections
            if not full:
                self._open[request] = time.monotonic() + self.deadline_s
        if full:
            self.refused += 1
            if time.monotonic() - self._warned > WARN_EVERY_S:
                self._warned = time.monotonic()
                log.warning("metrics endpoint: %d connection(s) refused so far: %d were "
                            "open (the most it serves at once)", self.refused,
                            self.max_connections)
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self._lock:
            self._open.pop(request, None)
            self._cut.discard(request)
        super().shutdown_request(request)

    def service_actions(self) -> None:
        """Each turn of the serve loop (every poll interval): cut connections past their
        deadline (their thread's read or write returns, and the thread ends)."""
        now = time.monotonic()
        with self._lock:
            late = [r for r, deadline in self._open.items() if deadline < now
                    and r not in self._cut]
            self._cut.update(late)
        for r in late:
            with contextlib.suppress(OSError):
                r.shutdown(socket.SHUT_RDWR)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client gone mid-answer (a broken pipe, a reset): a debug line, not a traceback
        on the job's console."""
        log.debug("metrics endpoint: a request from %s failed", client_address, exc_info=True)

    def expired(self, request: Any) -> bool:
        with self._lock:
            return request in self._cut

    def scrape(self, accept: str | None) -> tuple[bytes, str]:
        """The exposition in the format `accept` asks for: one scrape at a time, reused for
        `cache_s`."""
        encoder, content_type = choose_encoder(accept or "")
        with self._scraping:
            hit = self._cached
            if hit is not None and hit[1] == content_type and \
                    time.monotonic() - hit[0] < self.cache_s:
                return hit[2], content_type
            body = encoder(self.registry)
            self._cached = (time.monotonic(), content_type, body)
            return body, content_type


def serve_registry(registry: CollectorRegistry, host: str, port: int,
                   **limits: Any) -> tuple[str, Callable[[], None], MetricsServer]:
    """Serve `registry` from a thread of this process: its URL, a closer, the server."""
    server = MetricsServer(registry, host, port, **limits)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.25},
                              name="trainguard-metrics", daemon=True)
    thread.start()
    url = f"http://{f'[{host}]' if ':' in host else host}:{server.server_port}/metrics"

    def close() -> None:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
        with server._lock:  # the connections still open: their threads end with them
            left = list(server._open)
        for r in left:
            with contextlib.suppress(OSError):
                r.shutdown(socket.SHUT_RDWR)

    return url, close, server

