"""A pre-warmed standby worker: `python -u -m trainguard.worker.standby [--ready-fd=N] [MODULE...]`.

The node agent spawns it (never forks it: a fork after torch used its OpenMP pool hangs the
child, pytorch/pytorch#41197) with the job's worker environment, ahead of need. It imports
MODULE... (torch, torch.distributed, DDP's `_dynamo`, DCP...) with its output thrown away,
says so (one byte on fd N of `--ready-fd`, which it then closes), then
waits for one line on stdin: the assignment, `{"argv": [...], "env": {...}, "cwd": ...}`
where argv is what follows the interpreter and its flags (`script.py ARGS` or `-m MODULE
ARGS`). Then it becomes that worker as a fresh `python -u` would be: the environment replaced,
the working directory, stdin on /dev/null, `sys.argv`, `sys.path[0]`, the script run as
`__main__`, the exit code (an uncaught exception prints its traceback from the script's
frame and exits 1; KeyboardInterrupt ends by SIGINT). Its pid, its session and its
stdout/stderr pipes (the rank's log) are the ones the agent spawned it with. If the agent
closes stdin without an assignment, it exits 0.

While it imports and waits it runs at a lower CPU priority (WARM_NICE more), so its imports
never take the CPU from the node's training ranks, when it can raise the priority back once
assigned (as root, or RLIMIT_NICE allows); the worker then runs at the priority it was
started with, every thread of it.

Standard library only; imports nothing else before the assignment except MODULE...
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import os
import resource
import runpy
import signal
import sys
import types
import zipfile
from types import TracebackType
from typing import Any

_HERE = {os.path.realpath(__file__), os.path.realpath(runpy.__file__)}
WARM_NICE = 10  # added to the nice value while importing and waiting


def lower_priority() -> int | None:
    """Lower this process's CPU priority by WARM_NICE when it may raise it back later; the
    nice value to go back to, or None (left as it was)."""
    try:
        before = os.getpriority(os.PRIO_PROCESS, 0)
        soft = resource.getrlimit(resource.RLIMIT_NICE)[0]
        # raising the priority back to `before` needs CAP_SYS_NICE or 20 - RLIMIT_NICE <= it
        if os.geteuid() != 0 and soft != resource.RLIM_INFINITY and 20 - soft > before:
            return None
        os.setpriority(os.PRIO_PROCESS, 0, min(before + WARM_NICE, 19))
    except OSError:
        return None
    return before


def restore_priority(nice: int | None, pid: int | str = "self") -> None:
    """Every thread of `pid` back at `nice` (a thread made during the imports kept the lower
    one); the agent raises a standby it took while still importing with it too."""
    if nice is None:
        return
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return
    for tid in tids:
        with contextlib.suppress(OSError, ValueError):
            os.setpriority(os.PRIO_PROCESS, int(tid), nice)


def warm(modules: list[str]) -> None:
    """Import `modules`, printing nothing (a failed import is left to the script)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    saved = os.dup(1), os.dup(2)
    try:
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        for name in modules:
            with contextlib.suppress(BaseException):
                importlib.import_module(name)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, devnull):
            os.close(fd)


READY_FD = "--ready-fd="


def say_ready(fd: int | None) -> None:
    """One byte to the agent on the fd it gave (the pool counts this standby warm)."""
    if fd is not None:
        with contextlib.suppress(OSError):
            os.write(fd, b"1")
        with contextlib.suppress(OSError):
            os.close(fd)


def become(job: dict[str, Any]) -> None:
    """Take the assignment's environment, directory and stdin, as a fresh process has them."""
    os.environ.clear()
    os.environ.update({str(k): str(v) for k, v in job["env"].items()})
    os.chdir(str(job["cwd"]))
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)


def run(argv: list[str]) -> None:
    """Run `script ARGS` or `-m MODULE ARGS` as `__main__`, as the interpreter would: the
    script's `__file__` absolute, `sys.argv` as given, `sys.orig_argv` the command line a cold
    `python -u` had (walk-through 28: a relative `__file__` broke a script that changes
    directory and then reads a file next to itself, after every restart, and only there)."""
    sys.orig_argv = [sys.executable, "-u", *argv]
    if argv[:1] == ["-m"]:
        sys.argv = [argv[1], *argv[2:]]  # runpy puts the module's path in argv[0]
        sys.path[0] = os.getcwd()
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = list(argv)
        sys.path[0] = os.path.dirname(os.path.realpath(argv[0]))
        path = os.path.abspath(argv[0])
        if not os.path.isfile(path) or zipfile.is_zipfile(path):  # a directory or a zip
            runpy.run_path(argv[0], run_name="__main__")  # with a __main__.py
            return
        # as the interpreter runs a script: compiled under its absolute path (tracebacks,
        # `__file__`), sys.argv[0] as given (runpy.run_path would set both to one name)
        with io.open_code(path) as f:
            code = compile(f.read(), path, "exec")
        main = types.ModuleType("__main__")
        main.__dict__.update(__file__=path, __cached__=None, __loader__=None,
                             __package__=None, __spec__=None)
        sys.modules["__main__"] = main
        exec(code, main.__dict__)


def _script_frames(tb: TracebackType | None) -> TracebackType | None:
    """The traceback from the script's first frame on (this module's and runpy's left out)."""
    while tb is not None and (tb.tb_frame.f_code.co_filename.startswith("<frozen runpy")
                              or os.path.realpath(tb.tb_frame.f_code.co_filename) in _HERE):
        tb = tb.tb_next
    return tb


def main() -> None:
    nice = lower_priority()
    args = sys.argv[1:]
    fd = int(args.pop(0)[len(READY_FD):]) if args[:1] and args[0].startswith(READY_FD) else None
    warm(args)
    say_ready(fd)
    line = sys.stdin.buffer.readline()
    if not line.strip():
        sys.exit(0)  # the agent let this standby go unused
    restore_priority(nice)
    job = json.loads(line)
    become(job)
    try:
        run(list(job["argv"]))
    except SystemExit:
        raise
    except BaseException as e:
        tb = _script_frames(e.__traceback__)
        sys.excepthook(type(e), e.with_traceback(tb), tb)
        sys.stderr.flush()
        if isinstance(e, KeyboardInterrupt):  # as CPython: end by the signal itself
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        sys.exit(1)


if __name__ == "__main__":
    main()
