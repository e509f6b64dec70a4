"""Every rank's Python stacks, taken at once with py-spy and saved; never raises.

Per rank, `py-spy dump --pid PID --json --native` (the native frames show what the thread
is blocked in: time.sleep, flock, a c10d wait); if that fails, plain `--json`, then
`--json --nonblocking` (no pause of the process). py-spy stops the process for the few
milliseconds of the dump (about 0.5 s with --native on a process that loaded torch, most of
it reading symbols). The native frames are inside the JSON, so one call per rank gives both
the structured stack and the text dump (`render_text`).

Files: `OUT/rank-R.json` (py-spy's JSON as it came) and `OUT/rank-R.txt` (readable, or why
there is no stack).
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from trainguard.hang.stacks import RankStack, main_thread, parse_pyspy_json, render_text
from trainguard.protocol import FrameMsg, StackDump, ThreadMsg

log = logging.getLogger(__name__)

NOT_INSTALLED = "py-spy is not installed: pip install py-spy"
NO_PTRACE = ("ptrace not permitted: run as root or give CAP_SYS_PTRACE / "
             "kernel.yama.ptrace_scope=0")
_NATIVE_SHARE = 0.6  # of timeout_s for the --native try, leaving time for the plain one
_MAX_PARALLEL = 64


def find_pyspy() -> str | None:
    """py-spy next to this Python (the virtual environment's bin), else on PATH."""
    local = Path(sys.executable).parent / "py-spy"
    if local.is_file() and os.access(local, os.X_OK):
        return str(local)
    return shutil.which("py-spy")


@dataclass(frozen=True)
class _Try:
    flags: tuple[str, ...]
    out: str | None
    error: str | None
    fatal: bool  # no other way of calling py-spy can help
    seconds: float


def _proc_state(pid: int) -> str | None:
    """The process's state letter (R, S, D, Z...), None when it is not there."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rpartition(")")[2].split()[0] if ")" in stat else "?"


def _gone(pid: int) -> str | None:
    if pid <= 0:
        return f"no process (pid {pid})"
    if not Path("/proc/self").exists():
        return None  # not Linux: let py-spy say it
    state = _proc_state(pid)
    if state is None:
        return f"process {pid} is not running"
    if state in ("Z", "X"):
        return f"process {pid} has exited (not yet reaped)"
    return None


def _ended(pid: int) -> bool:
    """Whether the process has ended (gone, or a zombie not yet reaped), as far as Linux's
    /proc says now; False where that cannot be known."""
    if pid <= 0 or not Path("/proc/self").exists():
        return False
    return _proc_state(pid) in (None, "Z", "X")


def _short(stderr: str) -> str:
    """py-spy's error without its Rust backtrace, on one line."""
    lines = []
    for ln in stderr.splitlines():
        if ln.strip().startswith("Stack backtrace"):
            break
        if ln.strip():
            lines.append(ln.strip())
    return " ".join(lines)[:500] or "no message"


def _explain(pid: int, stderr: str, rc: int) -> tuple[str, bool]:
    """(the error, whether it is fatal) for a failed py-spy call."""
    msg = _short(stderr)
    gone = _gone(pid)
    if gone:
        return gone, True
    low = msg.lower()
    if "permission denied" in low or "operation not permitted" in low:
        return f"{NO_PTRACE} (py-spy: {msg})", True
    if "failed to find python version" in low:
        return f"process {pid} does not look like a Python process (py-spy: {msg})", True
    return f"py-spy failed (exit {rc}): {msg}", False


def _run(exe: str, pid: int, flags: tuple[str, ...], timeout: float) -> _Try:
    cmd = [exe, "dump", "--pid", str(pid), "--json", *flags]
    env = {**os.environ, "RUST_BACKTRACE": "0"}
    t0 = time.monotonic()

    def done(out: str | None, error: str | None, fatal: bool = False) -> _Try:
        return _Try(flags, out, error, fatal, time.monotonic() - t0)

    try:
        p = subprocess.run(cmd, capture_output=True, text=True, errors="replace", env=env,
                           stdin=subprocess.DEVNULL, timeout=timeout, check=False)
    except FileNotFoundError:
        return done(None, f"py-spy not found at {exe}", True)
    except PermissionError:
        return done(None, f"py-spy at {exe} cannot be run (permission denied)", True)
    except subprocess.TimeoutExpired:
        return done(None, f"py-spy {' '.join(flags) or 'dump'} timed out after {timeout:.1f}s")
    except OSError as e:
        return done(None, f"py-spy at {exe} could not start: {e}", True)
    if p.returncode == 0 and p.stdout.strip():
        return done(p.stdout, None)
    error, fatal = _explain(pid, p.stderr or p.stdout, p.returncode)
    return done(None, error, fatal)


def _dump_one(exe: str | None, rank: int, pid: int, timeout_s: float, native: bool
              ) -> tuple[RankStack, _Try | None, list[_Try]]:
    """(the stack, the try that worked, the tries that failed)."""
    if exe is None:
        return RankStack(rank, pid, (), NOT_INSTALLED), None, []
    gone = _gone(pid)
    if gone:
        return RankStack(rank, pid, (), gone), None, []
    deadline = time.monotonic() + timeout_s
    tries: list[tuple[str, ...]] = [("--native",), (), ("--nonblocking",)]
    failed: list[_Try] = []
    for flags in tries if native else tries[1:]:
        left = deadline - time.monotonic()
        if left <= 0.05:
            break
        if flags == ("--native",):
            left = max(min(left, timeout_s * _NATIVE_SHARE), 0.05)
        t = _run(exe, pid, flags, left)
        if t.out is not None:
            try:
                threads = parse_pyspy_json(t.out)
            except ValueError as e:
                t = _Try(flags, None, str(e), False, t.seconds)
            else:
                rs = RankStack(rank, pid, tuple(threads))
                main = main_thread(rs)  # first, for readers that lose the os thread ids
                if main is not None:
                    rs = RankStack(rank, pid, (main, *(x for x in threads if x is not main)))
                return rs, t, failed
        failed.append(t)
        if t.fatal:
            break
    if not failed:
        return RankStack(rank, pid, (), f"py-spy timed out after {timeout_s:.1f}s"), None, []
    return RankStack(rank, pid, (), failed[-1].error), None, failed


def _save(out_dir: Path, rs: RankStack, ok: _Try | None, failed: list[_Try]) -> None:
    head = []
    if ok is not None:
        head.append(f"# py-spy dump --pid {rs.pid} --json {' '.join(ok.flags)}".rstrip()
                    + f"  ({ok.seconds:.2f}s)")
    head += [f"# tried {' '.join(t.flags) or 'plain'}: {t.error}" for t in failed]
    text = "\n".join(head) + ("\n" if head else "") + render_text(rs)
    try:
        if ok is not None and ok.out is not None:
            (out_dir / f"rank-{rs.rank}.json").write_text(ok.out, encoding="utf-8")
        (out_dir / f"rank-{rs.rank}.txt").write_text(text, encoding="utf-8")
    except OSError as e:
        log.warning("cannot save rank %d's stack under %s: %s", rs.rank, out_dir, e)


def dump_stacks(pids: dict[int, int], out_dir: Path, timeout_s: float = 10.0,
                native: bool = True, pyspy: str | None = None) -> dict[int, RankStack]:
    """rank -> its stacks, all ranks at once, each within `timeout_s`; saved under out_dir.

    `pyspy`: the executable (default: find_pyspy()). Nothing raises: a missing py-spy, a
    process gone, no ptrace permission or a timeout become RankStack.error.
    """
    exe = pyspy if pyspy is not None else find_pyspy()
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        log.warning("cannot create %s for the stack dumps: %s", out_dir, e)
    if not pids:
        return {}
    t0 = time.monotonic()
    with ThreadPoolExecutor(min(len(pids), _MAX_PARALLEL), "stack-dump") as pool:
        futures = {rank: pool.submit(_dump_one, exe, rank, pid, timeout_s, native)
                   for rank, pid in sorted(pids.items())}
    found: dict[int, RankStack] = {}
    for rank, fut in futures.items():
        try:
            rs, ok, failed = fut.result()
        except Exception as e:  # a bug here must not cost the verdict
            log.exception("stack dump of rank %d failed", rank)
            rs, ok, failed = RankStack(rank, pids[rank], (), f"stack dump failed: {e}"), None, []
        _save(out_dir, rs, ok, failed)
        found[rank] = rs
    log.info("stacks of %d rank(s) taken in %.2fs (%d failed) into %s", len(found),
             time.monotonic() - t0, sum(1 for r in found.values() if r.error), out_dir)
    return found


def dump_stack_messages(pids: dict[int, int], out_dir: Path, timeout_s: float,
                        native: bool = True) -> list[StackDump]:
    """dump_stacks, as the protocol's StackDump messages (one per rank)."""
    stopped = {rank for rank, pid in pids.items() if pid > 0 and _proc_state(pid) == "T"}
    # (py-spy may stop them itself)
    found = dump_stacks(pids, out_dir, timeout_s=timeout_s, native=native)
    return [StackDump(
        rank=rank, pid=rs.pid, error=rs.error, exited=_ended(rs.pid), stopped=rank in stopped,
        files=[str(p) for p in sorted(out_dir.glob(f"rank-{rank}.*"))],
        threads=[ThreadMsg(thread_id=t.thread_id, name=t.name, idle=t.idle,
                           owns_gil=t.owns_gil,
                           frames=[FrameMsg(name=f.name, filename=f.filename, line=f.line,
                                            native=f.native) for f in t.frames])
                 for t in rs.threads])
        for rank, rs in sorted(found.items())]
