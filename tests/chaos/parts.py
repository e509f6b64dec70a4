"""The real parts a chaos run breaks: tmpfs mounts, an S3 server, the job's processes.

- `Tmpfs`: a real tmpfs of a given size, filled with a ballast file and freed again.
- `S3`: `moto.server` on loopback whose request log is read as it is written, so a kill can
  land while a checkpoint's files are being PUT (mid-save). moto keeps objects in memory
  only; a real S3 keeps what it committed through an outage, so `restart` copies the bucket
  just before the kill and puts the copy back into the new server.
- `tagged`: every process that carries the run's tag in its environment (the launcher gets
  it, and every agent, worker and standby inherits it): the orphans left after the job.
- `Digests`: the `--digest-log` files of examples/train_ddp.py (one line per rank per step).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from tests.checkpoint.conftest import http_answers
from trainguard.node import ports

TAG = "TG_CHAOS_RUN"  # the environment variable every process of the job inherits


class Tmpfs:
    """A tmpfs mounted at `path` (root only), and a ballast file that fills it up."""

    def __init__(self, path: Path, size_mb: int) -> None:
        self.path, self.size_mb = path, size_mb
        path.mkdir(parents=True, exist_ok=True)
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs",
                            str(path)], capture_output=True, text=True, check=False)
        if r.returncode != 0:
            raise RuntimeError(f"cannot mount a tmpfs at {path} (needs root): "
                               f"{r.stderr.strip()}")
        self.ballast = path / ".chaos-ballast"

    def fill(self) -> int:
        """Write zeros until the file system is full (ENOSPC); returns the bytes written."""
        written = 0
        chunk = b"\0" * (1 << 20)
        with open(self.ballast, "wb", buffering=0) as f:
            while True:
                try:
                    written += f.write(chunk)
                except OSError:
                    break
            with contextlib.suppress(OSError):  # the last few KiB, so that nothing fits
                while f.write(b"\0" * 4096):
                    written += 4096
        return written

    def free(self) -> None:
        self.ballast.unlink(missing_ok=True)

    def entries(self) -> list[str]:
        return sorted(p.name for p in self.path.iterdir() if p != self.ballast)

    def unmount(self) -> None:
        subprocess.run(["umount", "-l", str(self.path)], check=False, capture_output=True)


PUT = re.compile(r'"PUT /([^/ ]+)/(\S+) HTTP')


@dataclass
class S3:
    """moto's S3 server in a process of its own, its request log read line by line."""

    bucket: str
    port: int = field(default_factory=lambda: ports.free_port("127.0.0.1"))
    proc: subprocess.Popen[str] | None = None
    puts: list[tuple[float, str]] = field(default_factory=list)  # (time, key) of each PUT
    _armed: threading.Event = field(default_factory=threading.Event)
    _killed_on: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        """What a process needs to reach it through fsspec/s3fs (botocore reads these)."""
        return {"AWS_ENDPOINT_URL": self.url, "AWS_ACCESS_KEY_ID": "chaos",
                "AWS_SECRET_ACCESS_KEY": "chaos", "AWS_DEFAULT_REGION": "us-east-1"}

    def fs(self) -> Any:
        import fsspec

        return fsspec.filesystem("s3", skip_instance_cache=True, key="chaos", secret="chaos",
                                 client_kwargs={"endpoint_url": self.url})

    def start(self, timeout_s: float = 60.0) -> None:
        env = {k: v for k, v in os.environ.items() if k != TAG}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env,
            start_new_session=True)
        threading.Thread(target=self._read_log, args=(self.proc,), daemon=True).start()
        deadline = time.monotonic() + timeout_s
        while not http_answers(self.port, 2.0):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"moto server on port {self.port} did not start")
            time.sleep(0.1)


    def _read_log(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            m = PUT.search(line)
            if not m or m.group(1) != self.bucket:
                continue
            key = m.group(2)
            self.puts.append((time.time(), key))
            # a file of a checkpoint (not its manifest, not `latest`): a save is under way
            if self._armed.is_set() and "/step-" in key and not key.endswith("manifest.json"):
                self._armed.clear()
                proc.send_signal(signal.SIGKILL)
                self._killed_on.append(key)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait(timeout=30)

    def snapshot(self) -> dict[str, bytes]:
        """Every object of the bucket (an object deleted while we read is left out)."""
        fs, out = self.fs(), {}
        for key in fs.find(self.bucket):
            with contextlib.suppress(FileNotFoundError):
                out[key] = fs.cat_file(key)
        return out

    def restore(self, objects: dict[str, bytes]) -> None:
        fs = self.fs()
        with contextlib.suppress(FileExistsError):
            fs.mkdir(self.bucket)
        for key, data in objects.items():
            fs.pipe_file(key, data)

    def kill_mid_save(self, timeout_s: float) -> str | None:
        """Copy the bucket, then SIGKILL the server at the next PUT of a checkpoint file.
        Returns that key, or None when no save began within `timeout_s` (then it is killed
        anyway)."""
        self._killed_on.clear()
        self._armed.set()
        deadline = time.monotonic() + timeout_s
        while not self._killed_on and time.monotonic() < deadline:
            time.sleep(0.005)
        self._armed.clear()
        self.kill()
        return self._killed_on[0] if self._killed_on else None

    def committed_steps(self, prefix: str) -> list[int]:
        """Steps with a manifest under bucket/prefix (read off the running server)."""
        fs = self.fs()
        try:
            keys = fs.find(f"{self.bucket}/{prefix}")
        except OSError:
            return []
        return sorted(int(m.group(1)) for k in keys
                      if (m := re.search(r"step-0*(\d+)/manifest\.json$", k)))


def tagged(tag: str) -> list[psutil.Process]:
    """Live processes (not zombies) whose environment carries TAG=tag."""
    found = []
    for p in psutil.process_iter(["pid", "status"]):
        if p.pid == os.getpid() or p.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        try:
            if p.environ().get(TAG) == tag:
                found.append(p)
        except (psutil.Error, OSError):
            continue
    return found


def describe(procs: list[psutil.Process]) -> list[str]:
    out = []
    for p in procs:
        try:
            out.append(f"{p.pid} {' '.join(p.cmdline())[:160]}")
        except psutil.Error:
            out.append(f"{p.pid} (gone)")
    return out


@dataclass(frozen=True)
class Line:
    at: float
    pid: int
    kind: str  # start (the state a process began from) | step (after that step)
    step: int
    digest: str


class Digests:
    """The per-rank digest files one run wrote (examples/train_ddp.py --digest-log DIR)."""

    def __init__(self, path: Path, ranks: int) -> None:
        self.path, self.ranks = path, ranks
        path.mkdir(parents=True, exist_ok=True)

    def lines(self, rank: int) -> list[Line]:
        try:
            text = (self.path / f"rank-{rank}.txt").read_text()
        except FileNotFoundError:
            return []
        out = []
        for raw in text.splitlines():
            parts = raw.split()
            if len(parts) == 5:
                out.append(Line(float(parts[0]), int(parts[1]), parts[2], int(parts[3]),
                                parts[4]))
        return out

    def current_pid(self, rank: int) -> int | None:
        """The pid of the process that last wrote for this rank, if it still runs."""
        lines = self.lines(rank)
        if lines and psutil.pid_exists(lines[-1].pid):
            return lines[-1].pid
        return None

    def max_step(self, rank: int = 0, since: float = 0.0) -> int:
        return max((ln.step for ln in self.lines(rank) if ln.at >= since), default=0)

    def by_step(self, rank: int = 0) -> dict[int, str]:
        """step -> digest (the reference: each step once)."""
        return {ln.step: ln.digest for ln in self.lines(rank)}
