"""Launchers' and shells' exit notices in a log line: the rank and the exit code they report
(`exitcode: -9`, `task 3: Killed`, `died with <Signals.SIGSEGV: 11>`). Pure."""

from __future__ import annotations

import re

_N = r"\d{1,9}(?!\d)"  # a rank or exit code: int() of a 5000-digit run would raise
# (a word every such notice has, looked for first: most hit lines are none; the notice; kind)
_EXIT_PATTERNS: tuple[tuple[str, re.Pattern[str], str], ...] = (
    ("exitcode", re.compile(rf"failed \(exitcode: (?P<code>-?{_N})\) local_rank: (?P<rank>{_N})"),
     ""),
    # torch >= 2.2 words it "failed (exitcode: -9) for binary located at ... with local_rank: 0"
    ("exitcode", re.compile(rf"failed \(exitcode: (?P<code>-?{_N})\) for binary located at "
                            rf".{{0,500}}? with local_rank: (?P<rank>{_N})"), ""),
    # torchrun's root-cause block, also when a paste ran its fields together ("rank2 (local
    # rank: 2)exitcode: -9 (pid: 36071)")
    ("exitcode", re.compile(rf"(?:^|\s|\))exitcode\s*:\s*(?P<code>-?{_N})"), ""),
    ("terminated with", re.compile(
        rf"process (?P<rank>{_N}) terminated with signal (?P<sig>SIG[A-Z]+)"), ""),
    ("terminated with", re.compile(
        rf"process (?P<rank>{_N}) terminated with exit code (?P<code>-?{_N})"), ""),
    ("task ", re.compile(rf"task (?P<rank>{_N}): (?P<word>Killed|Segmentation fault|Bus error"
                         r"|Aborted|Terminated)"), ""),
    ("task ", re.compile(rf"task (?P<rank>{_N}): Exited with exit code (?P<code>{_N})"), ""),
    ("exits with", re.compile(rf"exits with return code = (?P<code>-?{_N})"), ""),
    # Paddle's launcher (paddle.distributed.launch): "Container rank 0 status failed cmd
    # ['python', '-u', 'tools/train.py', ...] code -9 log ./debug/workerlog.0"
    ("status failed cmd", re.compile(rf"[Cc]ontainer rank (?P<rank>{_N}) status failed cmd "
                                     rf"\[.{{0,4000}}?\] code (?P<code>-?{_N})\b"), ""),
    ("died with", re.compile(r"died with <Signals\.(?P<sig>SIG[A-Z]+): \d+>"), ""),
    ("received by", re.compile(r"Signal \d+ \((?P<sig>SIG[A-Z]+)\) received by PID"), ""),
    ("WTERMSIG", re.compile(rf"WTERMSIG (?P<code>{_N})\b"), "negate"),
    # mpirun/mpiexec (Open MPI): "process rank 7 with PID 0 on node h exited on signal 9"
    ("exited on signal", re.compile(rf"process rank (?P<rank>{_N}) with PID \S+ on node \S+ "
                                    rf"exited on signal (?P<code>{_N})\b"), "negate"),
    # a shell's job notice: "slurm_script: line 9:  4727 Killed"
    ("line ", re.compile(r"\bline \d+:\s+\d+ (?P<word>Killed|Segmentation fault|Bus error"
                         r"|Aborted|Terminated)\b"), ""),
    # zsh's job notice: "zsh: abort      python train.py", "zsh: segmentation fault  python ..."
    ("zsh: ", re.compile(r"(?:^|\s)zsh: (?P<word>abort|killed|segmentation fault|bus error"
                         r"|terminated)\s+\S"), ""),
    # ... and its notice of a job it ran ("[1]    47124 abort      python train.py")
    ("] ", re.compile(r"^\[\d{1,4}\] +[+-]? *\d{1,9} (?P<word>abort|killed|segmentation fault"
                      r"|bus error|terminated) +\S"), ""),
    ("non-zero exit", re.compile(rf"returned non-zero exit status (?P<code>-{_N}|1[3-5]\d)\b"),
     ""),
    # Windows: a process's exit code is an NTSTATUS ("Process finished with exit code
    # -1073741795 (0xC000001D)"); the crash ones are read as the POSIX signal they stand for
    ("exit code", re.compile(r"exit code (?P<code>-?\d{10}|0x[0-9A-Fa-f]{8})\b"), "ntstatus"),
    # ... as Go's os/exec words it ("llama runner process has terminated: exit status
    # 0xc0000409": a fail fast, an abort)
    ("exit status", re.compile(r"exit status (?P<code>0x[0-9A-Fa-f]{8})\b"), "ntstatus"),
    # ... and as subprocess's CalledProcessError words it there, unsigned ("returned non-zero
    # exit status 3221225477": 0xC0000005, an access violation)
    ("non-zero exit", re.compile(r"returned non-zero exit status (?P<code>\d{10})\b"),
     "ntstatus"),
)
# access violation, illegal instruction, stack overflow, fail fast (abort), divide by zero
_NTSTATUS = {0xC0000005: -11, 0xC000001D: -4, 0xC00000FD: -11, 0xC0000409: -6, 0xC0000094: -8}
_SIGNALS = {"SIGHUP": 1, "SIGINT": 2, "SIGILL": 4, "SIGABRT": 6, "SIGBUS": 7, "SIGFPE": 8,
            "SIGKILL": 9, "SIGSEGV": 11, "SIGTERM": 15}
_WORDS = {"Killed": -9, "Segmentation fault": -11, "Bus error": -7, "Aborted": -6,
          "Terminated": -15, "abort": -6, "killed": -9, "segmentation fault": -11,
          "bus error": -7, "terminated": -15}

def exit_code(text: str) -> tuple[int | None, int | None]:
    """(rank or None, returncode) from a launcher's or shell's exit notice, if the line is one."""
    for word, rx, kind in _EXIT_PATTERNS:
        m = rx.search(text) if word in text else None
        if m is None:
            continue
        g = m.groupdict()
        rank = int(g["rank"]) if g.get("rank") is not None else None
        if g.get("sig"):
            code = -_SIGNALS.get(g["sig"], 0) or None
        elif g.get("word"):
            code = _WORDS[g["word"]]
        elif kind == "ntstatus":
            code = _NTSTATUS.get(int(g["code"], 0) & 0xFFFFFFFF)
            if code is None:
                continue
        else:
            code = int(g["code"])
            if kind == "negate":  # a signal number: report it as Popen does (-N)
                code = -code
        return rank, code
    return None, None
