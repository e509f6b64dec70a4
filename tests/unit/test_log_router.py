"""The log router reads real pipes of real processes (node/logs.py)."""

from __future__ import annotations

import io
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

from trainguard.node.logs import LogRouter
from trainguard.presets import DEFAULT_STEP_PATTERN


def spawn(text: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", f"print({text!r})"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def test_a_rank_added_after_every_pipe_ended_is_still_read(tmp_path: Path) -> None:
    """Walk-through 27: every rank failed (a full checkpoint disk), the reader ended with the
    last pipe, and the in-process restart's add() crashed the launcher on the closed
    selector ('I/O operation on closed epoll object')."""
    seen: list[tuple[int, int]] = []

    def on_progress(rank: int, step: int, at: datetime) -> None:
        seen.append((rank, step))

    router = LogRouter(io.StringIO(), DEFAULT_STEP_PATTERN, on_progress)
    first = spawn("step 1")
    assert first.stdout is not None and first.stderr is not None
    router.add(0, tmp_path / "rank-0.log", first.stdout, first.stderr, (False, False))
    router.start()
    first.wait()
    router.join(timeout=10)  # every pipe at end of file: the reader ended
    again = spawn("step 2")
    assert again.stdout is not None and again.stderr is not None
    router.add(0, tmp_path / "rank-0.log", again.stdout, again.stderr, (False, False))
    again.wait()
    deadline = time.monotonic() + 10
    while (0, 2) not in seen and time.monotonic() < deadline:
        time.sleep(0.05)
    router.close(timeout=5)
    assert seen == [(0, 1), (0, 2)]
    text = (tmp_path / "rank-0.log").read_text()
    assert "step 1" in text and "step 2" in text


def test_a_ranks_own_step_format_is_noticed_and_a_pattern_named(tmp_path: Path) -> None:
    """Walk-through 28: a torchrun script's `it N | loss X` lines, read by no pattern."""
    router = LogRouter(io.StringIO(), DEFAULT_STEP_PATTERN, lambda *a: None)
    proc = spawn("\n".join(f"it {k} | loss {1 / k:.4f}" for k in range(1, 8)))
    assert proc.stdout is not None and proc.stderr is not None
    router.add(1, tmp_path / "rank-1.log", proc.stdout, proc.stderr, (False, False))
    router.start()
    proc.wait()
    router.join(timeout=10)
    line, pattern = router.unread_steps()[1]
    assert line.startswith("it 4 | loss") and pattern == r"\bit\W{0,3}(\d+)"
    read = LogRouter(io.StringIO(), DEFAULT_STEP_PATTERN, lambda *a: None)
    again = spawn("\n".join(f"step {k} loss 0.5" for k in range(1, 8)))  # read as steps
    assert again.stdout is not None and again.stderr is not None
    read.add(0, tmp_path / "rank-0.log", again.stdout, again.stderr, (False, False))
    read.start()
    again.wait()
    read.join(timeout=10)
    assert read.unread_steps() == {}


BAR = " 45%|#####     | 135/300 [00:01<00:02, 150.00it/s]"


def test_a_ranks_bars_are_not_its_steps_once_a_labelled_line_gave_them(tmp_path: Path) -> None:
    """Walk-through 33 #6: an evaluation's tqdm bar (`135/300`) in a job that prints `step N`
    lines made its last step 300: 280 steps "lost" and "done again" for a 40-step job. A rank
    whose only steps are a bar (HF Trainer, Lightning) keeps them."""
    seen: list[tuple[int, int]] = []
    router = LogRouter(io.StringIO(), DEFAULT_STEP_PATTERN,
                       lambda rank, step, at: seen.append((rank, step)))
    script = ("import sys, time\n"
              "for line in sys.argv[1:]:\n"
              "    print(line, flush=True); time.sleep(0.05)\n")
    procs = [subprocess.Popen([sys.executable, "-c", script, *lines], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE)
             for lines in (["step 20 loss 0.5", BAR, "step 21 loss 0.5"], [BAR])]
    for rank, proc in enumerate(procs):
        assert proc.stdout is not None and proc.stderr is not None
        router.add(rank, tmp_path / f"rank-{rank}.log", proc.stdout, proc.stderr, (False, False))
    router.start()
    for proc in procs:
        proc.wait()
    router.join(timeout=10)
    router.close(timeout=5)
    assert sorted(seen) == [(0, 20), (0, 21), (1, 135)]
