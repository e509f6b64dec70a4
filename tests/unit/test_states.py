"""The lifecycles of trainguard.states: complete tables, stored values, and no bare state
strings elsewhere in the package (checked on the source with `ast`)."""

from __future__ import annotations

import ast
import os
import signal
import socket
import subprocess
import sys
from enum import Enum
from pathlib import Path
from typing import Any

import pytest

from trainguard.controller.shown import shown_state
from trainguard.exitcodes import ExitCode
from trainguard.states import (
    JOB_TRANSITIONS,
    NODE_TRANSITIONS,
    TRANSITIONS,
    WORKER_TRANSITIONS,
    JobState,
    NodeState,
    StopCause,
    WorkerState,
    ended_state,
)

PKG_DIR = Path(__file__).resolve().parents[2] / "src" / "trainguard"
LIFECYCLES = [JobState, NodeState, WorkerState]


# -- the tables ---------------------------------------------------------------------------


@pytest.mark.parametrize("states", LIFECYCLES, ids=lambda s: s.__name__)
def test_every_state_has_an_entry_and_leads_only_to_states_of_its_lifecycle(
        states: type[Enum]) -> None:
    table = TRANSITIONS[states]
    assert set(table) == set(states)
    for state, following in table.items():
        assert all(isinstance(s, states) for s in following), state
        assert state not in following, f"{state} lists itself"


def test_the_tables_are_the_named_ones() -> None:
    named = {JobState: JOB_TRANSITIONS, NodeState: NODE_TRANSITIONS,
             WorkerState: WORKER_TRANSITIONS}
    assert dict(TRANSITIONS) == named
    assert JobState.RUNNING.next_states is JOB_TRANSITIONS[JobState.RUNNING]


@pytest.mark.parametrize("states", LIFECYCLES, ids=lambda s: s.__name__)
def test_every_state_is_reached_from_the_first_one(states: type[Enum]) -> None:
    table = TRANSITIONS[states]
    first = next(iter(states))
    seen, todo = {first}, [first]
    while todo:
        for s in table[todo.pop()]:
            if s not in seen:
                seen.add(s)
                todo.append(s)
    assert seen == set(states)


def test_terminal_states_have_no_successors() -> None:
    assert {s for s in JobState if s.ended} == {
        JobState.SUCCEEDED, JobState.FAILED, JobState.STOPPED, JobState.LOST}
    assert {s for s in NodeState if s.out} == {NodeState.LOST, NodeState.ISOLATED}
    assert {s for s in WorkerState if s.ended} == {
        WorkerState.SUCCEEDED, WorkerState.FAILED, WorkerState.STOPPED}
    for states in LIFECYCLES:
        for s in states:
            terminal = not TRANSITIONS[states][s]
            assert terminal == (s.out if isinstance(s, NodeState) else s.ended), s


def test_job_groups() -> None:
    active = {JobState.PENDING, JobState.RUNNING, JobState.RESTARTING, JobState.QUEUING}
    assert {s for s in JobState if s.active} == active
    assert all(s.active != s.ended for s in JobState)
    # a dead controller is taken over from these (launch.py); no attempt runs in the others
    assert {s for s in JobState if s.resumable} == {JobState.RUNNING, JobState.RESTARTING}
    assert JobState.SUCCEEDED in JobState.RUNNING.next_states
    assert not any(JobState.SUCCEEDED in s.next_states for s in JobState
                   if s != JobState.RUNNING)  # only a running attempt succeeds
    assert all(JobState.LOST in s.next_states for s in active)


def test_node_groups() -> None:
    assert {s for s in NodeState if s.usable} == {NodeState.HEALTHY, NodeState.SPARE}
    assert all(s.usable != s.out for s in NodeState)


def test_values_are_the_stored_strings() -> None:
    """The store (SQLite) and the JSON documents hold these: never change one."""
    assert {s.name: s.value for s in JobState} == {
        "PENDING": "pending", "RUNNING": "running", "RESTARTING": "restarting",
        "QUEUING": "queuing", "SUCCEEDED": "succeeded", "FAILED": "failed",
        "STOPPED": "stopped", "LOST": "lost"}
    assert {s.name: s.value for s in NodeState} == {
        "HEALTHY": "healthy", "SPARE": "spare", "LOST": "lost", "ISOLATED": "isolated"}
    assert {s.name: s.value for s in WorkerState} == {
        "STARTING": "starting", "RUNNING": "running", "SUCCEEDED": "succeeded",
        "FAILED": "failed", "STOPPED": "stopped"}
    for states in LIFECYCLES:
        assert all(isinstance(s, str) and s == s.value for s in states)


# -- no bare state strings ----------------------------------------------------------------

STATE_VALUES = frozenset(s.value for states in LIFECYCLES for s in states)


def _literals(node: ast.AST | None) -> list[ast.Constant]:
    """The state string constants `node` is, or holds as a tuple, list or set."""
    if isinstance(node, ast.Constant) and node.value in STATE_VALUES:
        return [node]
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return [e for e in node.elts if isinstance(e, ast.Constant) and e.value in STATE_VALUES]
    return []


def _names(target: ast.AST) -> list[str]:
    if isinstance(target, ast.Name):
        return [target.id]
    if isinstance(target, ast.Attribute):
        return [target.attr]
    if isinstance(target, ast.Tuple | ast.List):
        return [n for e in target.elts for n in _names(e)]
    return []


def _is_enum_class(node: ast.ClassDef) -> bool:
    return any((isinstance(b, ast.Name) and b.id.endswith("Enum"))
               or (isinstance(b, ast.Attribute) and b.attr.endswith("Enum")) for b in node.bases)


def bare_states(source: str) -> list[tuple[int, str]]:
    """(line, what) for each state string used as a state: compared, assigned to a state,
    passed as `state=`, a constant named after it, a table of states, returned as one."""
    found: list[tuple[int, str]] = []

    def hit(nodes: list[ast.Constant], how: str) -> None:
        found.extend((c.lineno, f"{c.value!r} {how}") for c in nodes)

    def visit(node: ast.AST, in_enum: bool) -> None:
        if isinstance(node, ast.ClassDef):
            in_enum = _is_enum_class(node)
        if isinstance(node, ast.Compare):
            for side in [node.left, *node.comparators]:
                hit(_literals(side), "compared")
        elif isinstance(node, ast.keyword) and node.arg is not None and "state" in node.arg:
            hit(_literals(node.value), f"passed as {node.arg}=")
        elif isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None \
                and not in_enum:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = [n for t in targets for n in _names(t)]
            lits = _literals(node.value)
            if lits and (any("state" in n.lower() for n in names) or len(lits) > 1
                         or any(n.lower() == c.value for n in names for c in lits)):
                hit(lits, f"assigned to {', '.join(names)}")
        elif isinstance(node, ast.Dict):
            keys = [k for k in node.keys if isinstance(k, ast.Constant)]
            state_keys = [k for k in keys if k.value in STATE_VALUES]
            if len(state_keys) > 1:
                hit(state_keys, "as a key of a table of states")
            for k, v in zip(node.keys, node.values, strict=True):
                if isinstance(k, ast.Constant) and k.value == "state":
                    hit(_literals(v), "as the value of 'state'")
        elif isinstance(node, ast.Return):
            hit(_literals(node.value), "returned")
        for child in ast.iter_child_nodes(node):
            visit(child, in_enum)

    visit(ast.parse(source), False)
    return sorted(found)


@pytest.mark.parametrize("snippet", [
    'HEALTHY, SPARE, LOST, ISOLATED = "healthy", "spare", "lost", "isolated"',
    'NODE_STATES = ("healthy", "spare", "lost", "isolated")',
    'rec.set_meta(state="queuing")',
    'ok = state == "lost"',
    'if node.state not in ("lost", "isolated"): pass',
    'STYLES = {"starting": "cyan", "running": "green"}',
    'def f():\n    return "lost"',
    'doc = {"state": "lost"}',
    'node.state = "spare"',
])
def test_the_check_finds_what_the_package_did_before(snippet: str) -> None:
    assert bare_states(snippet)


@pytest.mark.parametrize("snippet", [
    'class Trigger(str, Enum):\n    LOST = "lost"',
    'end = "running" if rec.end_at is None else "done"',
    'msg = f"a node that lost a device should be isolated"',
    'state = JobState.QUEUING.value',
])
def test_the_check_leaves_other_strings_alone(snippet: str) -> None:
    assert not bare_states(snippet)


def test_no_bare_state_strings_outside_states_py() -> None:
    """A job, node or worker state is named through its enum (trainguard.states), never as
    a bare string: grep finds every place a state is set or tested."""
    problems = [
        f"{path.relative_to(PKG_DIR.parent)}:{line}: {what}"
        for path in sorted(PKG_DIR.rglob("*.py")) if path != PKG_DIR / "states.py"
        for line, what in bare_states(path.read_text(encoding="utf-8"))
    ]
    assert not problems, "use trainguard.states instead of:\n" + "\n".join(problems)


# -- the state a reader shows -------------------------------------------------------------


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _meta(state: Any, pid: int) -> dict[str, Any]:
    return {"state": state, "launcher_pid": pid, "launcher_host": socket.gethostname()}


@pytest.mark.parametrize("state", [s for s in JobState if s.active])
def test_an_active_job_whose_launcher_is_dead_is_shown_lost(state: JobState) -> None:
    assert shown_state(_meta(state.value, _dead_pid())) == "lost"
    assert shown_state(_meta(state.value, os.getpid())) == state.value


@pytest.mark.parametrize("state", ["succeeded", "failed", "stopped"])
def test_an_ended_job_is_shown_as_recorded_whoever_is_alive(state: str) -> None:
    assert shown_state(_meta(state, _dead_pid())) == state


def test_a_launcher_on_another_host_or_an_unknown_state_is_taken_as_recorded() -> None:
    dead = _dead_pid()
    assert shown_state({"state": "running", "launcher_pid": dead,
                        "launcher_host": "another-host"}) == "running"
    assert shown_state(_meta("from-a-newer-version", dead)) == "from-a-newer-version"
    assert shown_state({}) is None
    assert shown_state({"state": 3}) is None


# -- exit codes ---------------------------------------------------------------------------


def test_exit_codes_keep_their_numbers() -> None:
    """docs/cli.md (Exit codes) and docs/multi-node.md promise these; aliases share one."""
    assert {name: int(code) for name, code in ExitCode.__members__.items()} == {
        "SUCCESS": 0, "FAILED": 1, "USAGE": 2, "NO_PROGRESS": 86, "ORPHANED": 3,
        "SUPERSEDED": 4, "NO_JOB": 2, "INTERRUPTED": 130, "NOTHING_FOUND": 1,
        "NOT_VALID": 1, "UNREADABLE": 2, "OUTPUT_CLOSED": 1, "JOB_LOST": 3}


# where a trainguard command's or process's exit code is decided (the guardian, a helper
# that only ever exits 0, is left out)
EXIT_DECIDERS = ["launch.py", "__main__.py", "node/main.py",
                 *(str(p.relative_to(PKG_DIR)) for p in sorted((PKG_DIR / "cli").glob("*.py")))]


def bare_exit_codes(source: str) -> list[tuple[int, str]]:
    """(line, what) for an exit code given as a number: a module constant EXIT_*, an int
    literal returned, or one passed to the job's ending (`end_job`, `finish`)."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Assign):
            for t in node.targets:
                if isinstance(t, ast.Name) and t.id.startswith("EXIT_"):
                    found.append((node.lineno, f"constant {t.id}"))
        elif isinstance(node, ast.Return) and isinstance(node.value, ast.Constant) \
                and type(node.value.value) is int:
            found.append((node.lineno, f"return {node.value.value}"))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in ("end_job", "finish"):
            found.extend((a.lineno, f"{node.func.attr}(..., {a.value})") for a in node.args
                         if isinstance(a, ast.Constant) and type(a.value) is int)
    return sorted(found)


def test_the_check_finds_bare_exit_codes() -> None:
    assert [w for _, w in bare_exit_codes(
        "EXIT_NO_JOB = 2\ndef f():\n    rec.finish(JobState.FAILED, 1)\n    return 1\n")] \
        == ["constant EXIT_NO_JOB", "finish(..., 1)", "return 1"]


def test_exit_codes_are_named_through_exitcode() -> None:
    problems = [
        f"trainguard/{name}:{line}: {what}"
        for name in EXIT_DECIDERS if (PKG_DIR / name).is_file()
        for line, what in bare_exit_codes((PKG_DIR / name).read_text(encoding="utf-8"))
    ]
    assert not problems, "use trainguard.exitcodes.ExitCode instead of:\n" + "\n".join(problems)


def test_a_rank_whose_end_was_never_seen_reads_lost_and_one_that_exited_keeps_its_state(
        ) -> None:
    """Walk-through 42 #12: ranks of a node whose agent went away with them (no exit code,
    no signal) read `failed` with exit code `-`; review 52 #8: one helper says so."""
    from trainguard.states import exit_seen, shown_rank_state

    assert not exit_seen(None, None) and exit_seen(1, None) and exit_seen(None, "SIGKILL")
    assert shown_rank_state("failed", "failed", False, exit_seen(None, None)) == "lost"
    assert shown_rank_state("failed", "failed", False, exit_seen(1, None)) == "failed"
    assert shown_rank_state("stopped", "stopped", False, exit_seen(None, None)) == "stopped"
    assert shown_rank_state("running", "lost", False) == "lost"  # its launcher died
    assert shown_rank_state("running", "lost", True) == "running"  # its agent runs on


def test_a_node_of_a_job_whose_launcher_died_reads_lost_unless_its_agent_runs() -> None:
    from trainguard.states import AGENT_GONE, shown_node
    for state in ("healthy", "spare"):
        assert shown_node(state, None, "lost", False) == ("lost", AGENT_GONE)
        assert shown_node(state, None, "lost", True) == (state, None)  # a takeover's
        assert shown_node(state, None, "running", False) == (state, None)
    # lost or isolated already: their own reason stays
    assert shown_node("isolated", "xid 79", "lost", False) == ("isolated", "xid 79")
    assert shown_node("lost", "its agent process ended", "lost", False) == (
        "lost", "its agent process ended")


@pytest.mark.parametrize(("rc", "draining", "state"), [
    (0, None, WorkerState.SUCCEEDED), (1, None, WorkerState.FAILED),
    (-signal.SIGTERM, None, WorkerState.FAILED),  # nobody was stopping it: a kill
    (143, StopCause.LAUNCHER, WorkerState.STOPPED),
    (-signal.SIGTERM, StopCause.OUTSIDE, WorkerState.STOPPED),
    (0, StopCause.LAUNCHER, WorkerState.SUCCEEDED),  # it ended as the stop came
    (0, StopCause.OUTSIDE, WorkerState.STOPPED),  # review 55 #6: a handler's exit 0
    (1, StopCause.OUTSIDE, WorkerState.FAILED),  # a crash while stopping is said
    (-signal.SIGKILL, StopCause.OUTSIDE, WorkerState.FAILED)])
def test_how_a_rank_ended_from_its_exit_and_who_was_stopping_its_node(
        rc: int, draining: StopCause | None, state: WorkerState) -> None:
    assert ended_state(rc, draining) == state
