"""A hung rank whose process is stopped (SIGSTOP, Ctrl-Z, a debugger): the agent sees its
state T before it takes the stack, and the hang's culprit says so (walk-through 10: it read
'Rank 1 is blocked outside Python code')."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from trainguard.controller.hang_evidence import stopped_culprit
from trainguard.hang.stacks import HangCulprit
from trainguard.node.stacks import _proc_state, dump_stack_messages
from trainguard.protocol import StackDump


def test_a_stopped_process_is_marked_stopped_when_its_stack_is_taken(tmp_path: Path) -> None:
    running = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    stopped = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        stopped.send_signal(signal.SIGSTOP)
        deadline = time.monotonic() + 10  # the signal takes effect a moment later
        while _proc_state(stopped.pid) != "T" and time.monotonic() < deadline:
            time.sleep(0.01)
        dumps = dump_stack_messages({0: running.pid, 1: stopped.pid}, tmp_path, timeout_s=10)
        assert {d.rank: d.stopped for d in dumps} == {0: False, 1: True}
    finally:
        for p in (running, stopped):
            p.kill()
            p.wait()


def test_the_stopped_rank_is_the_culprit_whatever_its_stack_shows() -> None:
    named = HangCulprit(0, "Rank 0 is blocked outside Python code", {0: "blocked", 1: "sleep"},
                        "/w/train.py:9 in main", 0.6)
    dumps = [StackDump(rank=0, pid=10), StackDump(rank=1, pid=11, stopped=True)]
    c = stopped_culprit(named, dumps)
    assert c.rank == 1 and c.by_rank[1] == "state_t" and c.frame is None
    assert c.reason.endswith("until SIGCONT (`kill -CONT 11`)"), c.reason  # its pid, said
    assert c.reason.startswith("Rank 1's process is stopped (state T: SIGSTOP"), c.reason
    assert "SIGCONT" in c.reason and c.confidence >= 0.9
    assert stopped_culprit(named, [StackDump(rank=0, pid=10)]) is named  # none stopped


def test_a_stopped_rank_s_wake_up_command_is_dropped_once_a_rung_replaced_it() -> None:
    """Walk-through 40 #9: recovery and report still advised `kill -CONT 23723` after the
    restart had killed and replaced that pid; a hang left running keeps the command."""
    from datetime import datetime, timezone

    from trainguard.controller.hang_evidence import HangConfirmation, hang_fault
    from trainguard.goodput.report import _culprit
    from trainguard.hang.detector import HangState, HangVerdict
    from trainguard.protocol import Progress

    c = stopped_culprit(HangCulprit(0, "blocked", {0: "blocked"}, None, 0.6),
                        [StackDump(rank=0, pid=10, stopped=True), StackDump(rank=1, pid=11,
                                                                            stopped=True)])
    now = datetime(2026, 12, 7, tzinfo=timezone.utc)
    hang = HangConfirmation(HangVerdict(HangState.CONFIRMED), c, now, Path("/nonexistent"))
    restarted = hang_fault(hang, now, Progress()).reason
    left = hang_fault(hang, now, Progress(), replaced=False).reason
    assert left == c.reason and "(`kill -CONT 10 11`)" in left, left
    assert restarted.endswith("until SIGCONT (pid 10 11 at the confirmation)"), restarted
    confirmed = {"culprit": {"reason": c.reason}}
    assert _culprit(confirmed, "process_restart") == restarted
    assert _culprit(confirmed, "none") == c.reason and _culprit({}, "none") is None


def test_diagnose_of_a_stopped_rank_says_where_it_waits_and_to_send_sigcont() -> None:
    """Walk-through 11: `culprit: rank 1, raised at train_ddp.py:271` (nothing raised) and the
    generic hang advice for a SIGSTOPped rank."""
    from trainguard.cli.diagnose import _verdict_lines
    from trainguard.diagnosis.hung import hang_diagnosis

    data = {"idle_s": 9.0, "basis": "floor 8s", "culprit": {
        "rank": 1, "reason": "Rank 1's process is stopped (state T: SIGSTOP, Ctrl-Z or a "
        "debugger): nothing runs until SIGCONT (`kill -CONT PID`)",
        "by_rank": {"0": "collective", "1": "state_t"}, "frame": "/w/train.py:271 in main",
        "confidence": 0.9}}
    d = hang_diagnosis(data, {})
    assert "kill -CONT" in d.advice and d.culprit.frame == "/w/train.py:271 in main"
    assert d.fault_domain.value == "infrastructure"  # stopped from outside (walk-through 24)
    data["culprit"]["reason"] = "Rank 1's process is stopped ...: `kill -CONT 4321`"
    assert "`kill -CONT 4321`" in hang_diagnosis(data, {}).advice  # its pid, said
    text = "\n".join(_verdict_lines(d))
    assert "waiting at /w/train.py:271 in main" in text and "raised at" not in text, text
    # walk-through 39 #13: a gloo job's hang read NCCL's category with nothing said
    from trainguard.diagnosis.attempt import diagnosis_message

    assert diagnosis_message(d).startswith(
        "nccl_timeout_or_hang [no progress: the category covers a hang with any collective "
        "library or none] (infrastructure, ")
    assert "nccl_timeout_or_hang (hang) [no progress: " in text


def test_a_stopped_worker_is_stopped_by_sigterm_without_waiting_for_the_grace_period() -> None:
    """SIGTERM stays pending on a stopped process: SIGCONT after it lets it act on it now
    (walk-through 24: a SIGSTOPped rank cost the whole 15 s grace period, then SIGKILL)."""
    from trainguard.node.procs import spawn, stop_groups

    code = ("import signal, sys, time\n"
            "signal.signal(signal.SIGTERM, lambda *a: sys.exit(7))\n"
            "print('ready', flush=True)\ntime.sleep(60)\n")
    p = spawn([sys.executable, "-c", code], env={}, cwd=None)
    assert p.stdout is not None and p.stdout.readline() == b"ready\n"
    p.send_signal(signal.SIGSTOP)
    deadline = time.monotonic() + 10
    while _proc_state(p.pid) != "T" and time.monotonic() < deadline:
        time.sleep(0.01)
    started = time.monotonic()
    stop_groups([p], grace_s=30)
    assert time.monotonic() - started < 10
    assert p.returncode == 7  # its own SIGTERM handler ran: a graceful exit, not SIGKILL


def test_the_grace_period_goes_on_while_a_rank_saves_on_its_way_out() -> None:
    """Review of walk-through 33 #9: a confirmed hang's ranks get 3 s, but a rank that reaches
    its save on the way out (a rank frozen mid-step, continued by the stop) gets the job's
    grace period while it saves; a rank that does not is SIGKILLed at the short deadline."""
    from trainguard.node.procs import spawn, stop_groups

    code = ("import signal, sys, time\n"
            "signal.signal(signal.SIGTERM, lambda *a: (time.sleep(2), sys.exit(7)))\n"
            "print('ready', flush=True)\ntime.sleep(60)\n")  # a 2 s save after SIGTERM
    for saving, want in ((True, 7), (False, -signal.SIGKILL)):
        p = spawn([sys.executable, "-c", code], env={}, cwd=None)
        assert p.stdout is not None and p.stdout.readline() == b"ready\n"
        stop_groups([p], grace_s=0.5, longer=(30.0, lambda s=saving: s))  # type: ignore[misc]
        assert p.returncode == want, (saving, p.returncode)
