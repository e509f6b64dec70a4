"""Fault injection: the TRAINGUARD_FAULT grammar, trigger matching and what firing does."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from trainguard.testing import faults
from trainguard.testing.faults import Fault, FaultSpecError, inject, inject_loader, parse

SRC = Path(faults.__file__).resolve().parents[2]


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """A clean fault environment: rank 0, first attempt, no spec."""
    monkeypatch.delenv("TRAINGUARD_FAULT", raising=False)
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT", raising=False)
    monkeypatch.delenv("TRAINGUARD_PROCESS_START_COUNT", raising=False)
    monkeypatch.setattr(faults, "_runs", {})  # a fresh process: nothing fired yet
    return monkeypatch


# --- parse: valid specs ------------------------------------------------------------------


def test_a_single_crash_parses_with_defaults_any_rank_and_first_attempt() -> None:
    assert parse("crash@step=5") == [Fault("crash", None, step=5, rank=None, attempt=0)]


def test_all_conditions_parse_in_any_order() -> None:
    assert parse("exit:3@attempt=2,step=7,rank=1") == [Fault("exit", "3", 7, rank=1, attempt=2)]


def test_attempt_star_means_every_attempt() -> None:
    assert parse("hang@step=1,attempt=*")[0].attempt is None


def test_rank_star_means_every_rank() -> None:
    assert parse("hang@step=1,rank=*")[0].rank is None


def test_faults_separated_by_semicolons_keep_their_order() -> None:
    kinds = [f.kind for f in parse("log:boom@step=5;exit:1@step=5;slow:0.5@step=2")]
    assert kinds == ["log", "exit", "slow"]


def test_whitespace_and_empty_parts_are_ignored() -> None:
    specs = parse(" crash @ step = 3 ; ;signal:KILL@step=4;")
    assert [(f.kind, f.step) for f in specs] == [("crash", 3), ("signal", 4)]


def test_an_empty_spec_has_no_faults() -> None:
    assert parse("") == []


def test_kinds_are_case_insensitive() -> None:
    assert parse("CRASH@step=1")[0].kind == "crash"


@pytest.mark.parametrize("arg", ["KILL", "SIGKILL", "kill", "9", "SEGV", "TERM"])
def test_signals_parse_by_name_with_or_without_sig_or_by_number(arg: str) -> None:
    assert parse(f"signal:{arg}@step=1")[0].arg == arg


@pytest.mark.parametrize("kind", ["spin", "loaderhang"])
def test_spin_and_loaderhang_take_no_argument(kind: str) -> None:
    assert parse(f"{kind}@step=4,rank=1") == [Fault(kind, None, step=4, rank=1, attempt=0)]


def test_lock_takes_a_path_that_may_hold_escaped_separators() -> None:
    assert parse(r"lock:/tmp/a b\;c\@d.lock@step=2")[0] == Fault("lock", "/tmp/a b;c@d.lock", 2)


def test_the_kinds_tuple_lists_the_new_kinds() -> None:
    assert {"hang", "spin", "lock", "loaderhang", "slow"} <= set(faults.KINDS)


def test_log_text_keeps_colons_and_commas() -> None:
    fault = parse("log:RuntimeError: NCCL error: a, b@step=5")[0]
    assert fault.arg == "RuntimeError: NCCL error: a, b"
    assert fault.step == 5


def test_escaped_semicolon_and_at_sign_stay_in_the_text() -> None:
    fault = parse(r"log:a\;b \@host\\x@step=2;crash@step=3")[0]
    assert fault.arg == r"a;b @host\x"
    assert len(parse(r"log:a\;b@step=2;crash@step=3")) == 2


def test_a_backslash_before_an_ordinary_character_is_kept() -> None:
    assert parse(r"log:C:\temp\n@step=1")[0].arg == r"C:\temp\n"


# --- parse: invalid specs ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ("crash", "no trigger"),
        ("crash@rank=1", "no step"),
        ("explode@step=1", "unknown fault kind 'explode'"),
        ("crash:1@step=1", "takes no argument"),
        ("hang:5@step=1", "takes no argument"),
        ("spin:1@step=1", "takes no argument"),
        ("loaderhang:1@step=1", "takes no argument"),
        ("lock@step=1", "'lock:/tmp/trainguard.lock'"),
        ("lock:@step=1", "needs an argument"),
        ("exit@step=1", "needs an argument, e.g. 'exit:1'"),
        ("exit:abc@step=1", "exit code 'abc'"),
        ("exit:256@step=1", "0..255"),
        ("signal:NOPE@step=1", "unknown signal 'NOPE'"),
        ("signal@step=1", "'signal:KILL'"),
        ("slow:-1@step=1", "slow needs seconds >= 0"),
        ("slow:soon@step=1", "slow needs seconds >= 0"),
        ("slow:inf@step=1", "slow needs seconds >= 0"),
        ("log@step=1", "'log:TEXT'"),
        ("crash@step=x", "step='x'"),
        ("crash@step=*", "step='*'"),
        ("crash@step=1,rank=-1", "rank='-1'"),
        ("crash@step=1,attempt=first", "attempt='first'"),
        ("crash@step=1,node=2", "bad condition 'node=2'"),
        ("crash@step=1,", "bad condition ''"),
        ("crash@step=1,step=2", "'step' given twice"),
        ("log:a@b@step=1", r"write a literal '@' as '\@'"),
    ],
)
def test_invalid_specs_raise_an_error_naming_the_bad_part(spec: str, fragment: str) -> None:
    with pytest.raises(FaultSpecError) as caught:
        parse(spec)
    assert fragment in str(caught.value)


def test_fault_spec_error_is_a_value_error() -> None:
    assert issubclass(FaultSpecError, ValueError)


# --- trigger matching ---------------------------------------------------------------------


def test_a_fault_matches_only_its_step() -> None:
    fault = parse("crash@step=5")[0]
    assert fault.matches(step=5, rank=3, attempt=0)
    assert not fault.matches(step=4, rank=3, attempt=0)


def test_a_fault_with_a_rank_matches_only_that_rank() -> None:
    fault = parse("crash@step=5,rank=1")[0]
    assert fault.matches(step=5, rank=1, attempt=0)
    assert not fault.matches(step=5, rank=0, attempt=0)


def test_fault_fires_only_on_first_attempt_by_default(env: pytest.MonkeyPatch) -> None:
    env.setenv("TRAINGUARD_FAULT", "crash@step=2")
    env.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    inject(2)  # the restarted job goes past the fault
    env.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    with pytest.raises(RuntimeError, match="injected crash at step 2"):
        inject(2)


def test_a_fault_with_attempt_star_fires_on_every_attempt(env: pytest.MonkeyPatch) -> None:
    env.setenv("TRAINGUARD_FAULT", "crash@step=2,attempt=*")
    for attempt in ("0", "1", "7"):
        env.setenv("TORCHELASTIC_RESTART_COUNT", attempt)
        with pytest.raises(RuntimeError):
            inject(2)


def test_a_fault_with_an_attempt_fires_only_on_that_attempt(env: pytest.MonkeyPatch) -> None:
    env.setenv("TRAINGUARD_FAULT", "crash@step=2,attempt=1")
    inject(2)
    env.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    with pytest.raises(RuntimeError):
        inject(2)


def test_a_fault_fires_once_per_process(env: pytest.MonkeyPatch) -> None:
    # a function re-entered in place (trainguard.run_resilient) passes step 2 again
    env.setenv("TRAINGUARD_FAULT", "crash@step=2")
    with pytest.raises(RuntimeError):
        inject(2)
    inject(2)


def test_an_in_process_replacement_does_not_fire_its_attempts_fault_again(
        env: pytest.MonkeyPatch) -> None:
    env.setenv("TRAINGUARD_FAULT", "crash@step=2,attempt=1")
    env.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    env.setenv("TRAINGUARD_PROCESS_START_COUNT", "3")  # started again within attempt 1
    inject(2)
    env.setenv("TRAINGUARD_PROCESS_START_COUNT", "2")  # the attempt's first process
    with pytest.raises(RuntimeError):
        inject(2)


def test_rank_comes_from_the_rank_variable(env: pytest.MonkeyPatch) -> None:
    env.setenv("TRAINGUARD_FAULT", "crash@step=3,rank=1")
    inject(3)  # RANK unset reads as rank 0
    env.setenv("RANK", "1")
    with pytest.raises(RuntimeError):
        inject(3)


def test_inject_is_a_no_op_when_the_variable_is_unset_or_empty(env: pytest.MonkeyPatch) -> None:
    inject(1)
    env.setenv("TRAINGUARD_FAULT", "")
    inject(1)


def test_inject_reports_a_bad_spec_with_the_variable_name(env: pytest.MonkeyPatch) -> None:
    env.setenv("TRAINGUARD_FAULT", "crash@when=1")
    with pytest.raises(FaultSpecError, match="TRAINGUARD_FAULT='crash@when=1'"):
        inject(1)


def test_a_fired_fault_announces_itself_on_stderr(
    env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    env.setenv("TRAINGUARD_FAULT", "log:RuntimeError: NCCL error, rank 2@step=4,rank=2")
    env.setenv("RANK", "2")
    inject(4)
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "[trainguard.faults] injecting log at step 4 (rank 2, attempt 0)",
        "RuntimeError: NCCL error, rank 2",
    ]


def test_faults_at_the_same_step_run_in_the_order_given(
    env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    env.setenv("TRAINGUARD_FAULT", "log:first@step=5;crash@step=5;log:never@step=5")
    with pytest.raises(RuntimeError):
        inject(5)
    err = capsys.readouterr().err
    assert "first" in err
    assert "never" not in err


def test_inject_skips_loader_faults_and_inject_loader_fires_only_them(
    env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    env.setenv("TRAINGUARD_FAULT", "loaderhang@step=3;log:loop@step=3;crash@step=4")
    inject(3)  # the loop: log only, no loaderhang
    inject_loader(4)  # a loader worker: no crash
    assert capsys.readouterr().err.splitlines() == [
        "[trainguard.faults] injecting log at step 3 (rank 0, attempt 0)", "loop"]
    inject_loader(2)  # another step: nothing


def test_inject_loader_is_a_no_op_without_the_variable(env: pytest.MonkeyPatch) -> None:
    inject_loader(1)
    env.setenv("TRAINGUARD_FAULT", "crash@step=1")
    inject_loader(1)


def test_lock_goes_on_when_the_lock_is_free(env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    path = tmp_path / "sub.lock"
    env.setenv("TRAINGUARD_FAULT", f"lock:{path}@step=1")
    inject(1)
    assert path.exists()
    with path.open("a") as f:  # and left it free
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)


def test_slow_sleeps_then_continues(env: pytest.MonkeyPatch) -> None:
    env.setenv("TRAINGUARD_FAULT", "slow:0.2@step=1")
    started = time.monotonic()
    inject(1)
    assert time.monotonic() - started >= 0.2


# --- real processes -----------------------------------------------------------------------


def _run_worker(spec: str, step: int = 3) -> subprocess.CompletedProcess[str]:
    script = textwrap.dedent(
        f"""
        from trainguard.testing.faults import inject
        for step in range(1, {step + 2}):
            print(f"step {{step}}")
            inject(step)
        """
    )
    env = {**os.environ, "PYTHONPATH": str(SRC), "TRAINGUARD_FAULT": spec, "RANK": "0"}
    env.pop("TORCHELASTIC_RESTART_COUNT", None)
    return subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=30
    )


@pytest.mark.parametrize(
    ("spec", "returncode"), [("signal:KILL@step=3", -signal.SIGKILL), ("exit:7@step=3", 7)]
)
def test_a_process_killed_or_exited_by_a_fault_ends_with_that_code(
    spec: str, returncode: int
) -> None:
    result = _run_worker(spec)
    assert result.returncode == returncode
    assert result.stdout.split() == ["step", "1", "step", "2", "step", "3"]
    assert "[trainguard.faults] injecting" in result.stderr


def _start_worker(spec: str, tmp_path: Path, call: str = "inject") -> subprocess.Popen[str]:
    """A worker that calls `call(step)` for steps 1..5 and prints `done` at the end;
    its stderr goes to tmp_path/err (wait for the fault with `_wait_for_fault`)."""
    script = textwrap.dedent(
        f"""
        from trainguard.testing.faults import {call}
        for step in range(1, 6):
            print(f"step {{step}}", flush=True)
            {call}(step)
        print("done", flush=True)
        """
    )
    env = {**os.environ, "PYTHONPATH": str(SRC), "TRAINGUARD_FAULT": spec, "RANK": "1"}
    env.pop("TORCHELASTIC_RESTART_COUNT", None)
    return subprocess.Popen(
        [sys.executable, "-c", script], env=env, text=True, stdout=subprocess.PIPE,
        stderr=(tmp_path / "err").open("w"),
    )


def _wait_for_fault(tmp_path: Path, proc: subprocess.Popen[str], timeout_s: float = 20) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        err = (tmp_path / "err").read_text()
        if "[trainguard.faults] injecting" in err:
            return err
        assert proc.poll() is None, f"the worker ended early: {err}"
        time.sleep(0.02)
    raise AssertionError("the fault never fired")


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def _stop(proc: subprocess.Popen[str]) -> str:
    proc.kill()
    out, _ = proc.communicate(timeout=10)
    return out


@pytest.mark.parametrize(("kind", "busy"), [("hang", False), ("spin", True)])
def test_hang_sleeps_and_spin_burns_a_cpu_forever_on_the_matching_rank(
    kind: str, busy: bool, tmp_path: Path
) -> None:
    proc = _start_worker(f"{kind}@step=2,rank=1;crash@step=2,rank=0", tmp_path)
    try:
        err = _wait_for_fault(tmp_path, proc)
        assert f"injecting {kind} at step 2 (rank 1, attempt 0)" in err
        cpu0, t0 = _cpu_s(proc.pid), time.monotonic()
        time.sleep(1.0)
        # a spinning rank takes what the machine gives it (about a core alone, 5% of one at a
        # load of 10 on 2 CPUs): it burns 0.3 s of CPU within 30 s; a sleeping one next to
        # nothing in its second
        while busy and _cpu_s(proc.pid) - cpu0 < 0.3 and time.monotonic() - t0 < 30:
            time.sleep(0.2)
        assert proc.poll() is None  # still stuck
        used = _cpu_s(proc.pid) - cpu0
        assert used >= 0.3 if busy else used / (time.monotonic() - t0) < 0.05, used
    finally:
        out = _stop(proc)
    assert out.split() == ["step", "1", "step", "2"]


def test_lock_blocks_while_another_process_holds_it_then_goes_on(tmp_path: Path) -> None:
    path = tmp_path / "held.lock"
    with path.open("w") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)
        proc = _start_worker(f"lock:{path}@step=3", tmp_path)
        try:
            assert "injecting lock at step 3" in _wait_for_fault(tmp_path, proc)
            time.sleep(0.5)
            assert proc.poll() is None  # blocked on the lock
        except BaseException:
            _stop(proc)
            raise
        fcntl.flock(held.fileno(), fcntl.LOCK_UN)
    out, _ = proc.communicate(timeout=20)
    assert proc.returncode == 0
    assert out.split()[-3:] == ["step", "5", "done"]


def test_loaderhang_blocks_the_loader_worker_forever(tmp_path: Path) -> None:
    proc = _start_worker("loaderhang@step=2", tmp_path, call="inject_loader")
    try:
        assert "injecting loaderhang at step 2" in _wait_for_fault(tmp_path, proc)
        time.sleep(0.5)
        assert proc.poll() is None
    finally:
        out = _stop(proc)
    assert out.split() == ["step", "1", "step", "2"]


def test_a_collective_fault_fires_only_inside_the_step_and_only_n_times(
        monkeypatch: pytest.MonkeyPatch) -> None:
    assert [(f.kind, f.arg) for f in faults.parse("collective@step=5;collective:2@step=6")] == [
        ("collective", None), ("collective", "2")]
    with pytest.raises(faults.FaultSpecError, match="run count"):
        faults.parse("collective:0@step=5")
    fired: list[int] = []
    monkeypatch.setattr(faults, "_break_connections", lambda: fired.append(1) or 0)
    monkeypatch.setenv("TRAINGUARD_FAULT", "collective:2@step=3")
    monkeypatch.setenv("RANK", "0")
    faults.inject(3)  # after the step: not this kind's place
    assert fired == []
    for _ in range(4):
        faults.inject_step(3)  # the step runs 4 times: the fault fires on the first 2
    assert len(fired) == 2
