"""The ranks' output on the console of a controller that took a running job over.

The node agents it adopted echo `[rank R] text` to the first launcher's console (node/logs.py),
which may be gone; what they write to the rank logs (`LOG_DIR/attempt-N/rank-R.log`, on the
job's filesystem) is the same output, stamped. This thread follows those logs from the
takeover on, the attempts that come after included, and echoes them here as the agents
would: the same prefix, the same --redirects / --local-ranks-filter choices (`streams`).
"""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import Callable
from pathlib import Path

from trainguard.console import Writable
from trainguard.paths import attempt_log_dir
from trainguard.worker.contract import STAMP_PATTERN

POLL_S = 0.25
MAX_READ = 1 << 20  # a file's bytes read a poll: memory stays bounded however much it grew
_STAMP = re.compile("^" + STAMP_PATTERN)  # `<ISO time> <out|err> `
_RANK_LOG = re.compile(r"rank-(\d+)\.log")
Streams = Callable[[int], tuple[bool, bool]]  # rank -> (stdout shown, stderr shown)


class RankEcho:
    def __init__(self, log_dir: Path, attempt: int, console: Writable, streams: Streams,
                 poll_s: float = POLL_S) -> None:
        self._log_dir, self._attempt = log_dir, attempt
        self._console, self._streams, self._poll_s = console, streams, poll_s
        self._pos: dict[Path, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rank-echo", daemon=True)
        for path in self._logs(attempt):  # what was written before the takeover is not echoed
            with contextlib.suppress(OSError):
                self._pos[path] = path.stat().st_size

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        """Echo what the logs hold now, then stop."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while True:
            stopping = self._stop.is_set()
            self._echo_new()
            if stopping:
                return
            self._stop.wait(self._poll_s)

    def _logs(self, attempt: int) -> list[Path]:
        try:
            return sorted(p for p in attempt_log_dir(self._log_dir, attempt).iterdir()
                          if _RANK_LOG.fullmatch(p.name))
        except OSError:
            return []

    def _echo_new(self) -> None:
        while attempt_log_dir(self._log_dir, self._attempt + 1).is_dir():
            self._echo(self._attempt)  # the rest of an attempt before the next one's
            self._attempt += 1
        self._echo(self._attempt)

    def _echo(self, attempt: int) -> None:
        for path in self._logs(attempt):
            m = _RANK_LOG.fullmatch(path.name)
            assert m is not None
            while text := self._grown(path):  # a log that grew a lot: read on, bounded
                self._write(int(m.group(1)), text)

    def _grown(self, path: Path) -> str:
        """The whole lines added since the last read, at most MAX_READ bytes of them (a
        partial last line waits; one longer than that comes in pieces)."""
        pos = self._pos.get(path, 0)
        try:
            with open(path, "rb") as f:
                f.seek(pos)
                data = f.read(MAX_READ)
        except OSError:
            return ""
        cut = data.rfind(b"\n") + 1 or (len(data) if len(data) == MAX_READ else 0)
        self._pos[path] = pos + cut
        return data[:cut].decode("utf-8", "replace")

    def _write(self, rank: int, text: str) -> None:
        out, err = self._streams(rank)
        shown = []
        for line in text.splitlines():
            m = _STAMP.match(line)
            stream, body = (m.group(0).split()[1], line[m.end():]) if m else ("out", line)
            if out if stream == "out" else err:
                shown.append(f"[rank {rank}] {body}\n")
        if shown:
            with contextlib.suppress(OSError, ValueError):
                self._console.write("".join(shown))
                self._console.flush()
