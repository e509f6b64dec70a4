"""Real parts for checkpoint tests: a moto S3 server on loopback, the worker->agent channel.

- `s3_server` (session): one S3 server shared by the tests that do not kill it.
- `s3_location` (function): a fresh bucket on it and the `s3://bucket/prefix` to save to.
- `private_s3` (function): a server of the test's own, to kill and restart (`S3Server`).
- `agent_channel` (function): the abstract Unix socket the library sends its events to.
- `where` (function, local disk and S3): a location and its storage options.
- `step_state(step)`: what a training run holds at a step, a deterministic function of it.
"""

from __future__ import annotations

import http.client
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch

from trainguard.checkpoint import Checkpointer, ResumableSampler
from trainguard.node import ports
from trainguard.worker.channel import ENV_SOCKET

MOTO_SERVER = shutil.which("moto_server", path=str(Path(sys.executable).parent))


def http_answers(port: int, timeout_s: float = 1.0) -> bool:
    """Whether an HTTP server on 127.0.0.1:`port` answers a GET (the moto server is up)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s)
    try:
        conn.request("GET", "/")
        conn.getresponse().read()
        return True
    except OSError:
        return False
    finally:
        conn.close()


class S3Server:
    """`moto_server` on 127.0.0.1 in a process of its own. Its state is in memory: a
    restarted server is empty (every bucket vanished)."""

    def __init__(self, port: int | None = None) -> None:
        if MOTO_SERVER is None:
            pytest.skip(f"moto_server is not installed next to {sys.executable} "
                        "(pip install 'moto[server]')")
        self.port = port or ports.free_port("127.0.0.1")
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def options(self, **config: Any) -> dict[str, Any]:
        """fsspec storage options for this server (`config`: botocore Config arguments)."""
        opts: dict[str, Any] = {"client_kwargs": {"endpoint_url": self.url},
                                "key": "x", "secret": "x"}
        if config:
            opts["config_kwargs"] = config
        return opts

    def start(self, timeout_s: float = 30.0) -> S3Server:
        assert MOTO_SERVER is not None
        self.proc = subprocess.Popen(
            [MOTO_SERVER, "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while not self._answers():
            if self.proc.poll() is not None:
                raise RuntimeError(f"moto_server on port {self.port} exited with "
                                   f"{self.proc.returncode} before answering")
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"moto_server on port {self.port} did not answer "
                                   f"within {timeout_s:g}s")
            time.sleep(0.05)
        return self

    def _answers(self) -> bool:
        return http_answers(self.port)

    def kill(self) -> None:
        """SIGKILL: the storage dies, whatever it was doing."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait(timeout=30)

    def restart(self) -> S3Server:
        """A new, empty server on the same port."""
        self.kill()
        return self.start()

    def new_bucket(self) -> str:
        return self.new_bucket_named(f"ck-{uuid.uuid4().hex[:12]}")

    def new_bucket_named(self, name: str) -> str:
        import fsspec

        fsspec.filesystem("s3", skip_instance_cache=True, **self.options()).mkdir(name)
        return name


@pytest.fixture(scope="session")
def s3_server() -> Iterator[str]:
    """The endpoint URL of an S3 server shared by the whole session."""
    server = S3Server().start()
    try:
        yield server.url
    finally:
        server.kill()


@dataclass(frozen=True)
class S3Location:
    url: str  # s3://bucket/prefix
    bucket: str
    storage_options: dict[str, Any]

    def fs(self) -> Any:
        import fsspec

        return fsspec.filesystem("s3", **self.storage_options)

    def key(self, rel: str) -> str:
        """bucket/prefix/rel, as s3fs names an object."""
        return f"{self.url.removeprefix('s3://')}/{rel}"


@pytest.fixture
def s3_location(s3_server: str) -> S3Location:
    """A fresh bucket on the shared server, and the location of checkpoints in it."""
    server = S3Server(port=int(s3_server.rsplit(":", 1)[1]))
    bucket = server.new_bucket()
    return S3Location(f"s3://{bucket}/run", bucket, server.options())


@pytest.fixture
def private_s3() -> Iterator[S3Server]:
    """A started server of this test's own, to kill mid-save; stopped at the end."""
    server = S3Server().start()
    try:
        yield server
    finally:
        server.kill()


@dataclass
class AgentChannel:
    """The receiving end of the worker->agent channel (JSON datagrams)."""

    sock: socket.socket
    received: list[dict[str, Any]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stop: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        # read all the time, as the agent must: the kernel queues only ~10 datagrams
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        while not self._stop.wait(0.002):
            self.drain()

    def close(self) -> None:
        self._stop.set()
        with self._lock:
            self.sock.close()

    def drain(self) -> list[dict[str, Any]]:
        """Every message that arrived so far (kept in `received` too)."""
        with self._lock:
            while True:
                try:
                    data = self.sock.recv(65536)
                except (BlockingIOError, OSError):
                    return self.received
                self.received.append(json.loads(data))

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [m for m in self.drain() if m["kind"] == kind]

    def wait_for(self, kind: str, timeout_s: float = 30.0, **fields: Any) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while True:
            for m in self.of_kind(kind):
                if all(m.get(k) == v for k, v in fields.items()):
                    return m
            if time.monotonic() > deadline:
                raise AssertionError(f"no {kind!r} message with {fields} within "
                                     f"{timeout_s:g}s; received: {self.received}")
            time.sleep(0.01)


@pytest.fixture
def agent_channel(monkeypatch: pytest.MonkeyPatch) -> Iterator[AgentChannel]:
    """Stands in for the node agent: TRAINGUARD_AGENT_SOCKET names a socket bound here."""
    name = f"trainguard-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind("\0" + name)
    sock.setblocking(False)
    monkeypatch.setenv(ENV_SOCKET, "@" + name)
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    channel = AgentChannel(sock)
    try:
        yield channel
    finally:
        channel.close()


@pytest.fixture
def keep_rng() -> Iterator[None]:
    """`load_latest` restores the saved RNG states into this process: put ours back."""
    py, tr = random.getstate(), torch.get_rng_state()
    np = sys.modules.get("numpy")
    npstate = np.random.get_state() if np is not None else None
    try:
        yield
    finally:
        random.setstate(py)
        torch.set_rng_state(tr)
        if np is not None and npstate is not None:
            np.random.set_state(npstate)


@pytest.fixture
def no_agent(monkeypatch: pytest.MonkeyPatch) -> None:
    """No launcher around: the library's messages go nowhere."""
    monkeypatch.delenv(ENV_SOCKET, raising=False)
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)



@dataclass(frozen=True)
class Where:
    """A checkpoint location on one backend, with what it takes to reach it."""

    backend: str  # "local" or "s3"
    url: str
    storage_options: dict[str, Any] | None

    def checkpointer(self, **kwargs: Any) -> Checkpointer:
        return Checkpointer(self.url, storage_options=self.storage_options, **kwargs)


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.s3)])
def where(request: pytest.FixtureRequest, tmp_path: Path) -> Where:
    """A fresh location on local disk, then on the S3 server."""
    if request.param == "local":
        return Where("local", str(tmp_path / "ckpt"), None)
    loc: S3Location = request.getfixturevalue("s3_location")
    return Where("s3", loc.url, loc.storage_options)


# -- the deterministic state of a step ------------------------------------------------------

SAMPLES = 1000


class Weights:
    """A model stand-in: named tensors behind state_dict() / load_state_dict()."""

    def __init__(self, tensors: dict[str, torch.Tensor] | None = None) -> None:
        self.tensors = dict(tensors or {})

    def state_dict(self) -> dict[str, torch.Tensor]:
        return dict(self.tensors)

    def load_state_dict(self, state_dict: dict[str, torch.Tensor]) -> None:
        self.tensors = dict(state_dict)


def sampler_at(step: int) -> ResumableSampler:
    sampler = ResumableSampler(SAMPLES, seed=3, rank=0, world_size=1)
    sampler.load_state_dict({**sampler.state_dict(), "epoch": step // SAMPLES,
                             "position": step % SAMPLES})
    return sampler


def step_state(step: int, attempt: int = 0, mib: float = 0) -> dict[str, Any]:
    """About 1.3 MiB (plus `mib` in one more tensor): model, data position and plain data, all
    a function of (step, attempt), so a loaded checkpoint can be checked bit for bit."""
    g = torch.Generator().manual_seed(step + 1_000_003 * attempt)
    tensors = {
        "dense.weight": torch.randn(256, 512, generator=g),
        "dense.bias": torch.randn(512, generator=g).to(torch.bfloat16),
        "embed": torch.randint(-(2**62), 2**62, (32 * 1024,), generator=g, dtype=torch.int64),
        "mask": torch.rand(4096, generator=g) > 0.5,
        "adam.exp_avg": torch.randn(128, 512, generator=g, dtype=torch.float64),
    }
    if mib:
        tensors["big"] = torch.randn(int(mib * 2**18), generator=g)
    progress = {"step": step, "attempt": attempt, "tag": f"step {step}",
                "losses": [step / k for k in (1, 3, 7)], "even": step % 2 == 0, "none": None}
    return {"model": Weights(tensors), "sampler": sampler_at(step), "progress": progress}


def fresh_state() -> dict[str, Any]:
    """What a restarted run builds before `load_latest`."""
    return {"model": Weights(), "sampler": ResumableSampler(SAMPLES, seed=3, rank=0,
                                                            world_size=1), "progress": None}


def state_diff(state: dict[str, Any], expected: dict[str, Any]) -> list[str]:
    """How a loaded state differs from the expected one (empty: bit for bit the same)."""
    diffs = []
    got, want = state["model"].tensors, expected["model"].tensors
    if set(got) != set(want):
        diffs.append(f"tensors {sorted(got)} != {sorted(want)}")
    for name in sorted(set(got) & set(want)):
        a, b = got[name], want[name]
        if a.dtype != b.dtype or a.shape != b.shape or not torch.equal(a, b):
            diffs.append(f"tensor {name} differs")
    if state["sampler"].state_dict() != expected["sampler"].state_dict():
        diffs.append(f"sampler {state['sampler'].state_dict()}")
    if state["progress"] != expected["progress"]:
        diffs.append(f"progress {state['progress']} != {expected['progress']}")
    return diffs


def assert_state_is_step(state: dict[str, Any], step: int, attempt: int = 0) -> None:
    diffs = state_diff(state, step_state(step, attempt))
    assert not diffs, f"loaded step {step} differs from what was saved: {diffs}"


def seed_rngs(step: int) -> None:
    """Seed every RNG the checkpoint saves, so a loaded RNG state names its step."""
    random.seed(step)
    torch.manual_seed(step)
    np = sys.modules.get("numpy")
    if np is not None:
        np.random.seed(step)


def rngs_are_seeded(step: int) -> bool:
    return (random.getstate() == random.Random(step).getstate()
            and torch.equal(torch.get_rng_state(),
                            torch.Generator().manual_seed(step).get_state()))
