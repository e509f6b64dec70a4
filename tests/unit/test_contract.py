"""The launcher <-> worker contract (trainguard.worker.contract): one home for every env name
and message kind, messages checked on arrival, stdlib only."""

from __future__ import annotations

import ast
import contextlib
import json
import logging
import math
import re
import socket
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainguard.diagnosis import lines
from trainguard.node.channel import ChannelServer
from trainguard.node.env import worker_env
from trainguard.protocol import StartWorkers, WorkerAssignment
from trainguard.worker import channel, contract
from trainguard.worker.contract import (
    AGENT_ONLY,
    FIELDS,
    ControlKind,
    MessageKind,
    control_socket,
    parse_control,
    parse_message,
    validate,
)
from trainguard.worker.fields import (
    MAX_LIST,
    MAX_NAME,
    MAX_PATH,
    MAX_TEXT,
    ContractError,
)

SRC = Path(__file__).resolve().parents[2] / "src" / "trainguard"
CONTRACT = SRC / "worker" / "contract.py"

# one valid message of every kind, every field the contract names filled in
SAMPLES: dict[MessageKind, dict[str, Any]] = {
    MessageKind.PROGRESS: {"step": 7},
    MessageKind.PHASE: {"name": "eval", "state": "end", "timeout_s": 600.0, "depth": 1,
                        "seq": 3, "ok": True},
    MessageKind.CHECKPOINT_SAVED: {"step": 10, "location": "/ckpt", "bytes": 1 << 20,
                                   "write_s": 0.5, "blocked_s": 0.01, "resumed_before_s": 0.4,
                                   "on_exit": None,
                                   "missing_ranks": [3, 5], "source": "memory"},
    MessageKind.CHECKPOINT_SAVE_FAILED: {"step": 10, "error": "No space left on device",
                                         "consecutive": 2, "limit": 3, "location": "/ckpt",
                                         "on_exit": None, "source": "memory"},
    MessageKind.CHECKPOINT_EXIT_SKIPPED: {"step": 9, "reason": "no optimizer in the state"},
    MessageKind.CHECKPOINT_SAVE_SKIPPED: {"step": 20, "reason": "the save of 15 is in flight",
                                          "location": "s3://ckpts/run"},
    MessageKind.CHECKPOINT_CORRUPT: {"step": 8, "status": "corrupt", "reason": "sha differs",
                                     "location": "s3://bucket/ckpt"},
    MessageKind.NO_CHECKPOINT: {"location": "/ckpt"},
    MessageKind.RESUMED: {"step": 8, "location": "/ckpt", "source": "storage",
                          "own_part": False, "borrowed_from": 0,
                          "not_exact": "a DataLoader that keeps no position",
                          "committed_at": 1796600000.5, "skipped_step": 12},
    MessageKind.AUTO_RESUME_UNUSED: {"why": "--auto-resume hf is on, but this script loads "
                                             "Lightning's Trainer"},
    MessageKind.STEP_FAILED: {"step": 5, "generation": 0,
                              "error": "RuntimeError: Connection closed by peer"},
    MessageKind.STEP_REEXECUTED: {"step": 5, "generation": 1, "retry_s": 0.13},
    MessageKind.RESILIENT: {"generation": 2, "restart_s": 0.2},
    MessageKind.RESTART_WAITING: {"generation": 1, "error": "Connection reset by peer",
                                  "failed_at": 1_765_000_000.5},
    MessageKind.IMPORTS: {"modules": "numpy,transformers"},
    MessageKind.FAULTS: {"call": "inject", "fired": 0},
    MessageKind.MEMORY_STEPS: {"steps": [41, 42], "storage_step": 40, "attempt": 1,
                               "generation": 0},
    MessageKind.TRAIN_METRICS: {"step": 12, "loss": 2.3125, "learning_rate": 3e-4},
    MessageKind.SNAPSHOT_TAKEN: {"step": 70},
    MessageKind.SNAPSHOT_BLOCKING: {"blocked_s": 0.42, "snapshots": 7, "step": 70,
                                    "ended_at": 1796540000.5},
    MessageKind.LOG_WRITE_FAILED: {"error": "No space left on device"},
    MessageKind.CONTROL_UNREACHABLE: {"off": "step re-execution, in-process restart",
                                      "error": "[Errno 24] Too many open files"},
}
WORKER_KINDS = [k for k in MessageKind if k not in AGENT_ONLY]


def envelope(kind: str, **fields: Any) -> dict[str, Any]:
    return {"kind": kind, "rank": 3, "pid": 4242, "at": time.time(), **fields}


# --- (a) no env name and no message kind spelled outside the contract ------------------

ENV_LITERAL = re.compile(r"""["']TRAINGUARD_[A-Z_]+["']""")
KIND_VALUES = frozenset(k.value for k in MessageKind)


def _mentions_kind(node: ast.AST) -> bool:
    """`kind`, `x.kind`, `msg_kind`, `m["kind"]`, `m.get("kind")`."""
    if isinstance(node, ast.Name):
        return node.id == "kind" or node.id.endswith("_kind")
    if isinstance(node, ast.Attribute):
        return node.attr == "kind" or node.attr.endswith("_kind")
    if isinstance(node, ast.Subscript):
        return isinstance(node.slice, ast.Constant) and node.slice.value == "kind"
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        return (node.func.attr == "get" and bool(node.args)
                and isinstance(node.args[0], ast.Constant) and node.args[0].value == "kind")
    return False


def _kind_literals(node: ast.AST | None) -> list[ast.Constant]:
    """String constants equal to a kind, in `node` or, for a tuple/list/set, its items."""
    if isinstance(node, ast.Constant) and node.value in KIND_VALUES:
        return [node]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [c for e in node.elts for c in _kind_literals(e)]
    return []


def _docstrings(tree: ast.Module) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                out.add(id(body[0].value))
    return out


def contract_breaches(source: str, name: str) -> list[str]:
    """`name:line: what` for each env name or message kind spelled outside the contract."""
    found = [f"{name}:{i}: env name literal {m.group(0)}"
             for i, line in enumerate(source.splitlines(), 1)
             for m in ENV_LITERAL.finditer(line)]
    tree = ast.parse(source, name)
    docs = _docstrings(tree)
    used: list[ast.Constant] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            fname = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if fname == "send" and node.args:  # channel.send("progress", ...)
                used += _kind_literals(node.args[0])
            if fname == "MessageKind" and node.args:  # MessageKind("resumed")
                used += _kind_literals(node.args[0])
            used += [c for kw in node.keywords if kw.arg == "kind"  # WorkerMessage(kind=...)
                     for c in _kind_literals(kw.value)]
            if (fname == "getattr" and len(node.args) >= 2
                    and isinstance(node.args[1], ast.JoinedStr)):  # getattr(x, f"_on_{kind}")
                found.append(f"{name}:{node.lineno}: dispatch by getattr on a built name "
                             "(use a table keyed by MessageKind)")
        elif isinstance(node, ast.Compare):  # m.kind == "resumed", kind in ("a", "b")
            sides = [node.left, *node.comparators]
            if any(_mentions_kind(s) for s in sides):
                used += [c for s in sides for c in _kind_literals(s)]
        elif isinstance(node, ast.Dict):
            for k, v in zip(node.keys, node.values, strict=True):
                if isinstance(k, ast.Constant) and k.value == "kind":  # {"kind": "progress"}
                    used += _kind_literals(v)
                elif isinstance(v, (ast.Attribute, ast.Name)):  # {"resumed": self._on_resumed}
                    used += _kind_literals(k)
        elif isinstance(node, ast.Match) and _mentions_kind(node.subject):
            used += [c for case in node.cases if isinstance(case.pattern, ast.MatchValue)
                     for c in _kind_literals(case.pattern.value)]
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str)
              and "_" in node.value and node.value in KIND_VALUES
              and id(node) not in docs):  # "checkpoint_saved" means one thing anywhere
            used.append(node)
    found += sorted({f"{name}:{c.lineno}: message kind literal {c.value!r}" for c in used})
    return found


def test_no_env_name_or_message_kind_is_spelled_outside_the_contract() -> None:
    found = []
    for path in sorted(SRC.rglob("*.py")):
        if path == CONTRACT:
            continue
        found += contract_breaches(path.read_text(encoding="utf-8"),
                                   str(path.relative_to(SRC.parent)))
    assert not found, ("use the names of trainguard.worker.contract (ENV_*, MessageKind):\n"
                       + "\n".join(found))


@pytest.mark.parametrize("planted", [
    'os.environ.get("TRAINGUARD_GRACE_PERIOD_S")',
    "env = {'TRAINGUARD_NEW_THING': '1'}",
    'channel.send("progress", step=1)',
    "send('phase', name='eval')",
    'if m.kind == "resumed":\n    pass',
    'if kind in ("progress", "phase"):\n    pass',
    'ok = raw.get("kind") != "phase"',
    'ok = m["kind"] == "progress"',
    'WorkerMessage(kind="log_write_failed", rank=None)',
    'msg = {"kind": "progress", "step": 1}',
    'table = {"resumed": self._on_resumed}',
    'k = MessageKind("resumed")',
    'handler = getattr(self, f"_on_{m.kind}", None)',
    'x = "no_checkpoint"',
    'match m.kind:\n    case "phase":\n        pass',
])
def test_the_scan_finds_a_planted_literal(planted: str) -> None:
    assert contract_breaches(planted, "planted.py")


@pytest.mark.parametrize("innocent", [
    'channel.send(MessageKind.PROGRESS, step=1)',
    '__all__ = ["phase", "progress"]',
    'def f():\n    """Sends `checkpoint_saved` (docs may name kinds)."""',
    'env = {ENV_GRACE: "30"}',
    'with phase("checkpoint"):\n    pass',
    '"""Reads TRAINGUARD_FAULT, in prose."""',
])
def test_the_scan_lets_names_from_the_contract_pass(innocent: str) -> None:
    assert contract_breaches(innocent, "innocent.py") == []


def test_every_trainguard_env_name_is_listed_once() -> None:
    names = {v for k, v in vars(contract).items() if k.startswith("ENV_")}
    ours = {n for n in names if n.startswith("TRAINGUARD_")}
    assert set(contract.TRAINGUARD_ENV) == ours
    assert set(contract.TORCHRUN_ENV) == names - ours
    assert len(names) == len(contract.TRAINGUARD_ENV) + len(contract.TORCHRUN_ENV)


def test_a_worker_gets_torchruns_variables_and_the_agents_own() -> None:
    cmd = StartWorkers(run_id="r", attempt=2, argv=["x"], env={}, world_size=4,
                       workers=[WorkerAssignment(rank=1, local_rank=1, start_count=3,
                                                 schedule_count=1)],
                       group_rank=0, group_world_size=1, master_addr="127.0.0.1",
                       master_port=29500, max_restarts=3, grace_s=1, log_dir="/l", job_dir="/j",
                       checkpoint_dir="/c")
    env = worker_env(cmd, cmd.workers[0], "/e.json", "mark")
    assert set(contract.TORCHRUN_ENV) <= set(env)
    assert env[contract.ENV_RANK] == "1" and env[contract.ENV_RESTART_COUNT] == "2"
    assert env[contract.ENV_ATTEMPT] == "2" and env[contract.ENV_MARKER] == "mark"
    assert env[contract.ENV_CHECKPOINT_DIR] == "/c"


# --- (b) messages: each kind round-trips, bad ones are refused -------------------------


def test_every_kind_has_fields_and_a_sample() -> None:
    assert set(FIELDS) == set(MessageKind) == set(SAMPLES)
    for kind, sample in SAMPLES.items():
        assert set(sample) == set(FIELDS[kind]), kind


@pytest.mark.parametrize("kind", list(MessageKind), ids=str)
def test_each_kind_round_trips_through_validate(kind: MessageKind) -> None:
    sample = SAMPLES[kind]
    assert validate(kind, sample) == sample
    assert validate(kind.value, json.loads(json.dumps(sample))) == sample


@pytest.mark.parametrize("kind", WORKER_KINDS, ids=str)
def test_each_worker_kind_round_trips_through_parse_message(kind: MessageKind) -> None:
    raw = json.loads(json.dumps(envelope(kind, **SAMPLES[kind])))
    got = parse_message(raw)
    assert got == raw and got["kind"] is kind


def test_each_worker_kind_crosses_a_real_channel(monkeypatch: pytest.MonkeyPatch) -> None:
    server = ChannelServer(f"@tg-test-{uuid.uuid4().hex[:8]}")
    try:
        monkeypatch.setenv(channel.ENV_SOCKET, server.name)
        monkeypatch.setenv(contract.ENV_RANK, "2")
        got = []
        for i, kind in enumerate(WORKER_KINDS):  # the kernel queues 10 datagrams at most
            assert channel.send(kind, **SAMPLES[kind])
            if i % 8 == 7:
                got += server.drain()
        got += server.drain()
        assert [m["kind"] for m in got] == WORKER_KINDS
        for m in got:
            assert {k: m[k] for k in SAMPLES[m["kind"]]} == SAMPLES[m["kind"]]
            assert m["rank"] == 2 and isinstance(m["pid"], int) and isinstance(m["at"], float)
    finally:
        server.close()


def test_the_envelope_may_be_absent_and_unknown_fields_are_left_out() -> None:
    assert parse_message({"kind": "resumed", "step": 4}) == {"kind": "resumed", "step": 4}
    got = parse_message(envelope("progress", step=1, added_by_a_newer_library="x"))
    assert "added_by_a_newer_library" not in got and got["step"] == 1
    assert parse_message(envelope("progress", step=1, rank=None))["rank"] is None


def test_a_kind_prints_as_its_value() -> None:
    k = MessageKind.CHECKPOINT_SAVED
    assert str(k) == f"{k}" == "checkpoint_saved" and json.dumps(k) == '"checkpoint_saved"'


BAD: list[tuple[str, dict[str, Any], str]] = [
    ("progress", {"step": "x"}, "step"),
    ("progress", {"step": True}, "step"),
    ("progress", {"step": 1.5}, "step"),
    ("progress", {"step": 2**64}, "step"),
    ("progress", {"step": None}, "step"),
    ("progress", {}, "step"),
    ("resumed", {"location": "/c"}, "step"),
    ("phase", {"name": "eval"}, "state"),
    ("phase", {"name": "eval", "state": "middle"}, "state"),
    ("phase", {"name": "x" * (MAX_NAME + 1), "state": "begin"}, "name"),
    ("phase", {"name": "eval", "state": "begin", "timeout_s": math.nan}, "timeout_s"),
    ("phase", {"name": "eval", "state": "begin", "timeout_s": math.inf}, "timeout_s"),
    ("phase", {"name": "eval", "state": "begin", "timeout_s": 0}, "timeout_s"),
    ("phase", {"name": "eval", "state": "begin", "timeout_s": 1e300}, "timeout_s"),
    ("phase", {"name": "eval", "state": "begin", "depth": 0}, "depth"),
    ("phase", {"name": "eval", "state": "end", "ok": "yes"}, "ok"),
    ("phase", {"name": 7, "state": "begin"}, "name"),
    ("checkpoint_saved", {"step": 1, "location": "/" * (MAX_PATH + 1)}, "location"),
    ("checkpoint_saved", {"step": 1, "write_s": -1.0}, "write_s"),
    ("checkpoint_saved", {"step": 1, "bytes": -1}, "bytes"),
    ("checkpoint_saved", {"step": 1, "missing_ranks": [0] * (MAX_LIST + 1)}, "missing_ranks"),
    ("checkpoint_saved", {"step": 1, "missing_ranks": ["x"]}, "missing_ranks"),
    ("checkpoint_saved", {"step": 1, "missing_ranks": 3}, "missing_ranks"),
    ("checkpoint_save_failed", {"step": 1, "error": "e" * (MAX_TEXT + 1)}, "error"),
    ("checkpoint_save_failed", {"step": 1}, "error"),
    ("checkpoint_corrupt", {"step": 1, "status": "corrupt", "reason": ["r"]}, "reason"),
    ("no_checkpoint", {}, "location"),
    ("teleport", {"step": 1}, "unknown"),
    ("", {}, "unknown"),
]


@pytest.mark.parametrize(("kind", "fields", "named"), BAD,
                         ids=[f"{k or 'empty'}-{n}-{i}" for i, (k, _, n) in enumerate(BAD)])
def test_a_bad_message_is_refused_naming_what_is_wrong(kind: str, fields: dict[str, Any],
                                                       named: str) -> None:
    with pytest.raises(ContractError, match=named):
        validate(kind, fields)
    with pytest.raises(ContractError, match=named):
        parse_message(envelope(kind, **fields))


@pytest.mark.parametrize(("field", "value"), [
    ("at", 1e300), ("at", math.nan), ("at", math.inf), ("at", -1.0), ("at", "now"),
    ("at", None), ("rank", -1), ("rank", 2**40), ("rank", "3"), ("rank", 1.0),
    ("pid", 0), ("pid", 2**40), ("pid", "1"),
])
def test_a_bad_envelope_is_refused(field: str, value: object) -> None:
    with pytest.raises(ContractError, match=field):
        parse_message({**envelope("progress", step=1), field: value})


@pytest.mark.parametrize("raw", [None, [1, 2], "progress", 3, {"no_kind": 1}, {"kind": 7},
                                 {"kind": None, "step": 1}])
def test_what_is_not_a_message_is_refused(raw: object) -> None:
    with pytest.raises(ContractError):
        parse_message(raw)


def test_a_worker_cannot_forge_the_agents_own_kind() -> None:
    with pytest.raises(ContractError, match="agent"):
        parse_message(envelope("log_write_failed", error="x"))
    assert validate(MessageKind.LOG_WRITE_FAILED, {"error": "x"}) == {"error": "x"}


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=4),
    max_leaves=12)
FIELD_NAMES = sorted({n for spec in FIELDS.values() for n in spec} | {"rank", "pid", "at"})


@settings(max_examples=300, deadline=None)
@given(kind=st.sampled_from([*sorted(KIND_VALUES), "junk"]),
       fields=st.dictionaries(st.sampled_from(FIELD_NAMES), JSON, max_size=8))
def test_any_json_object_is_a_message_or_a_contract_error(kind: str,
                                                          fields: dict[str, Any]) -> None:
    try:
        got = parse_message({**fields, "kind": kind})
    except ContractError:
        return
    assert got["kind"] == kind and set(got) <= {"kind", *FIELD_NAMES}


@settings(max_examples=200, deadline=None)
@given(raw=JSON)
def test_any_json_value_is_a_message_or_a_contract_error(raw: object) -> None:
    with contextlib.suppress(ContractError):
        parse_message(raw)


def test_the_agent_drops_bad_datagrams_with_a_debug_log_and_keeps_reading(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="trainguard.node.channel")
    server = ChannelServer(f"@tg-test-{uuid.uuid4().hex[:8]}")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    addr = "\0" + server.name[1:]
    try:
        for junk in [b"[" * 60_000, b'{"kind": "progress", "step": "x"}',
                     json.dumps(envelope("progress", step=1, at=1e300)).encode(),
                     b'{"kind": "progress", "step": NaN}', b"\xff not json"]:
            s.sendto(junk, addr)
        time.sleep(0.5)  # the reader thread takes them
        assert server._thread.is_alive()
        s.sendto(json.dumps(envelope("progress", step=5)).encode(), addr)
        assert [m["step"] for m in server.drain()] == [5]
        dropped = [r.getMessage() for r in caplog.records if "dropped" in r.getMessage()]
        assert len(dropped) == 5, dropped
        assert any("progress: field 'step'" in d for d in dropped)
        assert any("progress: at is out of" in d for d in dropped)
    finally:
        s.close()
        server.close()


# --- the rank log stamp: one format, one definition ------------------------------------


def test_the_diagnosis_reads_the_stamp_the_agent_writes() -> None:
    assert lines._STAMP.pattern == "^" + contract.STAMP_PATTERN
    for stream in contract.STREAMS:
        [line] = contract.stamp_lines("2026-12-01T10:00:00.123456+00:00", stream, ["[rank3]: x"])
        got = lines.split_prefix(line)
        assert (got.text, got.rank) == ("x", 3)
        assert got.at is not None and got.at.microsecond == 123456
    assert not hasattr(contract, "parse_stamped")


# --- (c) the contract is standard library only -------------------------------------------


@pytest.mark.parametrize("module", [CONTRACT, CONTRACT.with_name("fields.py")],
                         ids=lambda p: p.name)
def test_the_contract_imports_only_the_standard_library(module: Path) -> None:
    """The contract stands alone: its fields module and the standard library, nothing else."""
    tree = ast.parse(module.read_text(encoding="utf-8"))
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "no relative imports: the contract stands alone"
            imported.add(node.module or "")
    assert imported, "the walker found no import at all"
    bad = sorted(m for m in imported if m not in ("__future__", "trainguard.worker.fields")
                 and m.split(".")[0] not in sys.stdlib_module_names)
    assert not bad, f"{module.name} imports {bad}: standard library only"


def test_a_control_verdict_is_checked_like_a_message() -> None:
    reform = {"kind": "reform", "step": 5, "generation": 1, "master_addr": "127.0.0.1",
              "master_port": 29500}
    assert parse_control(reform)["kind"] == ControlKind.REFORM
    give_up = {"kind": "give_up", "step": 5, "reason": "budget spent"}
    assert parse_control(give_up)["reason"] == "budget spent"
    go = {"kind": "reform_go", "step": 5, "generation": 1}
    assert parse_control(go)["kind"] == ControlKind.REFORM_GO
    with pytest.raises(ContractError):
        parse_control({"kind": "reform_go", "step": 5})  # which group's REFORM it confirms
    for bad in ({**reform, "master_port": 70000}, {**reform, "generation": 0},
                {**reform, "master_addr": None}, {"kind": "reform", "step": 5},
                {"kind": "explode"}, [reform], {**give_up, "step": "5"}):
        with pytest.raises(ContractError):
            parse_control(bad)
    assert control_socket("@tg-x", 3) == "@tg-x-rank-3"


def test_an_in_process_restart_verdict_is_checked() -> None:
    restart = {"kind": "restart", "generation": 2, "master_addr": "127.0.0.1",
               "master_port": 29501}
    assert parse_control(restart)["generation"] == 2
    no = {"kind": "no_restart", "generation": 1, "reason": "nothing died"}
    assert parse_control(no)["kind"] == ControlKind.NO_RESTART
    for bad in ({**restart, "generation": 0}, {**restart, "master_port": 0},
                {"kind": "restart", "generation": 2}, {**no, "reason": 5},
                {"kind": "no_restart", "reason": "x"}):
        with pytest.raises(ContractError):
            parse_control(bad)


def test_train_metrics_take_finite_values_or_null_and_a_drain_has_its_own_socket() -> None:
    ok = envelope("train_metrics", step=3, loss=None, learning_rate=1e-3)
    assert parse_message(ok)["loss"] is None  # a NaN loss is sent as null
    assert "learning_rate" not in parse_message(envelope("train_metrics", step=3, loss=1.5))
    for bad in ({"loss": math.nan}, {"loss": math.inf}, {"learning_rate": -1e301},
                {"loss": "0.5"}, {"loss": True}):
        with pytest.raises(ContractError):
            parse_message(envelope("train_metrics", step=3, **bad))
    with pytest.raises(ContractError):
        parse_message(envelope("train_metrics", loss=0.5))  # no step
    assert parse_control({"kind": "drain", "reason": "SIGTERM"})["kind"] == ControlKind.DRAIN
    with pytest.raises(ContractError):
        parse_control({"kind": "drain"})
    assert control_socket("@tg-x", 3, ControlKind.DRAIN) == "@tg-x-rank-3-drain"
