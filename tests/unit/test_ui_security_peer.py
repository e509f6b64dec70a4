"""Walk-through 32 #5 (the way in): a loopback dashboard without a token answered every local
user, who read through it, with the dashboard user's rights, what they could not. Now it
answers only its own user (and root), by the uid that owns the client's end of the loopback
connection (/proc/net/tcp): a real server in a thread, a request from this process and one
from another uid."""

from __future__ import annotations

import os
import socket
import struct
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import uvicorn

from tests.unit.test_ui_api import make_job
from trainguard.sockowner import client_uid
from trainguard.ui.app import create_app
from trainguard.ui.catalog import Catalog
from trainguard.ui.server import bind

NOBODY = 65534


def _hex(ip: str, port: int) -> str:
    return f"{struct.unpack('=I', socket.inet_aton(ip))[0]:08X}:{port:04X}"


def test_the_client_uid_is_read_from_the_kernels_table(tmp_path: Path) -> None:
    table = tmp_path / "tcp"
    head = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid\n"
    row = "   {n}: {local} {remote} 01 00000000:00000000 00:00000000 00000000  {uid}  0 1\n"
    table.write_text(head + row.format(n=0, local=_hex("127.0.0.1", 8642),
                                       remote=_hex("127.0.0.1", 40000), uid=1000)
                      + row.format(n=1, local=_hex("127.0.0.1", 40000),
                                   remote=_hex("127.0.0.1", 8642), uid=1001))
    server = ("127.0.0.1", 8642)
    assert client_uid(("127.0.0.1", 40000), server, (table,)) == 1001  # the client's end
    assert client_uid(["::ffff:127.0.0.1", 40000], server, (table,)) == 1001
    assert client_uid(("127.0.0.1", 40001), server, (table,)) == -1  # not there: refused
    assert client_uid(("testclient", 50000), server, (table,)) is None  # no socket at all
    assert client_uid(("127.0.0.1", 40000), server, (tmp_path / "none",)) is None


@pytest.fixture
def server(tmp_path: Path) -> Iterator[str]:
    make_job(tmp_path / "job").close()
    sock = bind("127.0.0.1", 0)
    srv = uvicorn.Server(uvicorn.Config(create_app(Catalog([tmp_path / "job"])),
                                        log_level="warning", lifespan="off"))
    thread = threading.Thread(target=srv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not srv.started:
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        srv.should_exit = True
        thread.join(10)
        sock.close()


def test_the_dashboards_own_user_is_answered(server: str) -> None:
    assert httpx.get(f"{server}/api/jobs", timeout=10).status_code == 200


@pytest.mark.skipif(os.geteuid() != 0 or not Path("/usr/bin/python3").exists(),
                    reason="needs root to connect as another uid")
def test_another_local_user_is_refused_without_a_token(server: str) -> None:
    code = ("import urllib.request, urllib.error, sys\n"
            f"try: urllib.request.urlopen('{server}/api/jobs', timeout=10)\n"
            "except urllib.error.HTTPError as e: print(e.code, e.read().decode())\n"
            "else: print(200)\n")
    out = subprocess.run(["/usr/bin/python3", "-c", code], capture_output=True, text=True,
                         timeout=30, user=NOBODY, group=NOBODY, cwd="/", check=False,
                         env={"PATH": "/usr/bin:/bin"})
    assert out.stdout.startswith("403"), (out.stdout, out.stderr)
    assert f"uid {NOBODY}'s" in out.stdout and "--token" in out.stdout
