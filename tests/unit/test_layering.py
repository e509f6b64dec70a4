"""The import rules by package, and module size, checked on the source with `ast` (nothing
imported).

Every module under src/trainguard belongs to classes given by its path: a package prefix
(CLASSES_BY_PREFIX) or, for the top-level shared modules, the short explicit SHARED_TOP. A
module that matches neither fails test_every_module_belongs_to_a_class: a new module must be
classified. The rules, each checked on every import edge by `check`:

R1 The in-script library (trainguard/__init__, worker/, checkpoint/, testing/) imports only
   itself; outside trainguard only the standard library (and torch, fsspec in checkpoint/;
   torch in worker/step.py).
R2 Pure modules (policy/, hang/, diagnosis/ except its file readers, and the shared
   vocabulary: spec, spec_build, spec_words, errors, exitcodes, records, states, protocol,
   worker/contract and its worker/fields) import only pure modules.
R3 controller/ never imports node/.
R4 node/ never imports controller/.
R5 A side (controller/, node/) is imported only by itself, by the composition root
   (launch.py, launch_checks.py, launch_ckpt_dir.py) and by cli/, and cli/ only by cli/ and
   __main__: so only the root and cli/ import both sides, and nothing imports cli/.
R6 No import cycles among the imports that run (module- or function-level); imports under
   `if TYPE_CHECKING:` never run and are left out (checkpointer <-> exit_save is one).

R1-R5 count every import in a file: module-level, function-level and TYPE_CHECKING-only.
An edge is what the code names: `from pkg import sub` is an edge to pkg.sub, and the package
__init__ files Python runs on the way are not edges (the root's is kept light by its own test).
Each rule is also fed a synthetic graph that breaks it, so that none can pass vacuously.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

PKG_DIR = Path(__file__).resolve().parents[2] / "src" / "trainguard"
PKG = "trainguard"

# -- the classes ---------------------------------------------------------------------------

LIBRARY = "in-script library"
PURE = "pure"
SHARED = "shared I/O"  # used by both sides, does I/O: neither pure nor a side
BACKENDS = "backends"
CONTROLLER = "controller"
NODE = "node"
ROOT = "composition root"
CLI = "cli"

# A prefix covers the module of that name and every module under it; the longest one wins.
# `trainguard` itself (the package root) is matched exactly, never as a prefix.
CLASSES_BY_PREFIX: dict[str, frozenset[str]] = {
    PKG: frozenset({LIBRARY}),
    f"{PKG}.worker": frozenset({LIBRARY}),
    f"{PKG}.worker.contract": frozenset({LIBRARY, PURE}),  # the launcher side reads it too
    f"{PKG}.worker.fields": frozenset({LIBRARY, PURE}),  # the contract's typed fields
    f"{PKG}.checkpoint": frozenset({LIBRARY}),
    f"{PKG}.testing": frozenset({LIBRARY}),
    f"{PKG}.integrations": frozenset({LIBRARY}),  # imported by training scripts
    f"{PKG}.policy": frozenset({PURE}),
    f"{PKG}.hang": frozenset({PURE}),
    f"{PKG}.diagnosis": frozenset({PURE}),
    f"{PKG}.diagnosis.sources": frozenset({SHARED}),  # reads log files (node agent, cli)
    f"{PKG}.controller": frozenset({CONTROLLER}),
    # goodput reads the job store (the controller serves /metrics; cli reads it); its
    # accounting and the checkpoint-interval advice are pure
    f"{PKG}.goodput": frozenset({CONTROLLER}),
    f"{PKG}.goodput.ledger": frozenset({PURE}),
    f"{PKG}.goodput.interval": frozenset({PURE}),
    f"{PKG}.goodput.step_time": frozenset({PURE}),
    f"{PKG}.goodput.step_counts": frozenset({PURE}),
    f"{PKG}.node": frozenset({NODE}),
    f"{PKG}.backends": frozenset({BACKENDS}),
    f"{PKG}.launch": frozenset({ROOT}),
    f"{PKG}.launch_checks": frozenset({ROOT}),  # launch's checks; `run --dry-run` makes them
    f"{PKG}.launch_ckpt_dir": frozenset({ROOT}),  # launch_checks' claim on a checkpoint dir
    f"{PKG}.cli": frozenset({CLI}),
    f"{PKG}.ui": frozenset({CLI}),  # `trainguard ui`'s server: a reader, like the commands
    f"{PKG}.__main__": frozenset({CLI}),  # `python -m trainguard`: the command line
}
# The top-level shared modules, the one explicit list.
SHARED_TOP: dict[str, frozenset[str]] = {
    **{m: frozenset({PURE}) for m in ("spec", "errors", "exitcodes", "records", "states",
                                      "protocol", "suggest", "presets", "spec_words",
                                      "spec_build")},
    **{m: frozenset({SHARED}) for m in ("paths", "wire", "handshake", "sockowner",
                                        "console")},  # mkdir; sockets; /proc; a thread
}
SIDES = (CONTROLLER, NODE)
# outside trainguard, besides the standard library
LIBRARY_EXTRAS = {f"{PKG}.checkpoint": frozenset({"torch", "fsspec"}),
                  f"{PKG}.integrations.hf": frozenset({"torch", "transformers"}),
                  f"{PKG}.integrations.lightning": frozenset({"torch", "pytorch_lightning"}),
                  f"{PKG}.integrations.lightning_loaders": frozenset({"pytorch_lightning"}),
                  f"{PKG}.integrations.drain": frozenset({"torch"}),  # the ranks' vote
                  f"{PKG}.worker.step": frozenset({"torch"})}  # the step guard drives DDP

FORBIDDEN_IN_PURE = ("subprocess", "os", "socket", "sqlite3", "torch", "multiprocessing",
                     "psutil", "ctypes", "pty", "selectors", "shutil", "threading", "asyncio")
# The signal module is allowed for its constants and names only, never to send or handle.
SIGNAL_ALLOWED = {"Signals"}
MAX_LINES = 400


def _under(name: str, prefix: str) -> bool:
    return name == prefix or (prefix != PKG and name.startswith(prefix + "."))


def classes(name: str) -> frozenset[str]:
    """The classes of a trainguard module, from its path; empty: not classified."""
    top = name.removeprefix(f"{PKG}.")
    if "." not in top and top in SHARED_TOP:
        return SHARED_TOP[top]
    prefixes = [p for p in CLASSES_BY_PREFIX if _under(name, p)]
    return CLASSES_BY_PREFIX[max(prefixes, key=len)] if prefixes else frozenset()


def library_may_use(name: str, package: str) -> bool:
    """May in-script library module `name` import `package` (a top-level name, not ours)?"""
    return package in sys.stdlib_module_names or any(
        _under(name, p) and package in extra for p, extra in LIBRARY_EXTRAS.items())


# -- the import graph ------------------------------------------------------------------------

@dataclass(frozen=True)
class Imports:
    every: frozenset[str]  # anywhere in the file (function-level, TYPE_CHECKING included)
    runtime: frozenset[str]  # without the imports under `if TYPE_CHECKING:`


def _is_type_checking(test: ast.expr) -> bool:
    return ((isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
            or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


def parse_imports(source: str, name: str, is_package: bool, known: Collection[str]) -> Imports:
    """The modules one file imports: trainguard modules by full name (`known`), others as
    written (`os.path`, `torch.distributed`)."""
    tree = ast.parse(source, name)
    package = name if is_package else name.rpartition(".")[0]
    typing_only = {id(n) for node in ast.walk(tree)
                   if isinstance(node, ast.If) and _is_type_checking(node.test)
                   for stmt in node.body for n in ast.walk(stmt)}
    every: set[str] = set()
    runtime: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found = {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join([*base, node.module] if node.module else base)
            else:
                mod = node.module or ""
            # `from trainguard.node import agent` imports the module trainguard.node.agent
            subs = {f"{mod}.{a.name}" for a in node.names if f"{mod}.{a.name}" in known}
            found = subs | ({mod} if len(subs) < len(node.names) else set())
        else:
            continue
        every |= found
        if id(node) not in typing_only:
            runtime |= found
    return Imports(frozenset(every), frozenset(runtime))


@dataclass(frozen=True)
class Graph:
    """trainguard module -> what it imports."""

    imports: Mapping[str, frozenset[str]]  # trainguard modules, every import
    runtime: Mapping[str, frozenset[str]]  # trainguard modules, imports that run
    external: Mapping[str, frozenset[str]]  # top-level names of other packages


def graph_of(parsed: Mapping[str, Imports]) -> Graph:
    ours = set(parsed)
    return Graph(
        {m: frozenset(i.every & ours) for m, i in parsed.items()},
        {m: frozenset(i.runtime & ours) for m, i in parsed.items()},
        {m: frozenset(t.split(".")[0] for t in i.every
                      if t.split(".")[0] not in (PKG, "")) for m, i in parsed.items()})


# -- the rules -------------------------------------------------------------------------------

UNCLASSIFIED = "unclassified"
RULES = ("R1", "R2", "R3", "R4", "R5", "R6")


@dataclass(frozen=True, order=True)
class Violation:
    rule: str
    module: str
    detail: str

    def __str__(self) -> str:
        return f"{self.rule} {short(self.module)}: {self.detail}"


def short(name: str) -> str:
    return name.removeprefix(f"{PKG}.")


def _edge_rules(m: str, cls: frozenset[str], t: str, tcls: frozenset[str]) -> Iterator[str]:
    if LIBRARY in cls and LIBRARY not in tcls:
        yield "R1"
    if PURE in cls and PURE not in tcls:
        yield "R2"
    if CONTROLLER in cls and NODE in tcls:
        yield "R3"
    if NODE in cls and CONTROLLER in tcls:
        yield "R4"
    for side in SIDES:
        if side in tcls and side not in cls and not cls & {ROOT, CLI}:
            yield "R5"
    if CLI in tcls and CLI not in cls:
        yield "R5"


def cycles(edges: Mapping[str, Collection[str]]) -> list[list[str]]:
    """Every import cycle: the strongly connected components of more than one module, and
    modules that import themselves (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            for w in children:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(edges.get(w, ())))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    scc = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        scc.append(w)
                        if w == v:
                            break
                    if len(scc) > 1 or v in edges.get(v, ()):
                        found.append(sorted(scc))
    return sorted(found)


def check(graph: Graph) -> list[Violation]:
    """Every break of R1-R6 in `graph`, and every module that belongs to no class."""
    out: list[Violation] = []
    for m in sorted(graph.imports):
        cls = classes(m)
        if not cls:
            out.append(Violation(UNCLASSIFIED, m, "belongs to no class: give its package a "
                                 "prefix in CLASSES_BY_PREFIX, or list it in SHARED_TOP"))
            continue
        for t in sorted(graph.imports[m]):
            tcls = classes(t)
            out += [Violation(rule, m, f"imports {short(t)} ({', '.join(sorted(tcls))})")
                    for rule in dict.fromkeys(_edge_rules(m, cls, t, tcls))]
        if LIBRARY in cls:
            out += [Violation("R1", m, f"imports {p}, not in the standard library")
                    for p in sorted(graph.external.get(m, ())) if not library_may_use(m, p)]
    out += [Violation("R6", c[0], "import cycle: " + " -> ".join(map(short, [*c, c[0]])))
            for c in cycles(graph.runtime)]
    return sorted(out)


# -- the tree ----------------------------------------------------------------------------------

def module_name(path: Path) -> str:
    rel = path.relative_to(PKG_DIR).with_suffix("")
    parts = [PKG, *rel.parts]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES: dict[str, Path] = {module_name(p): p for p in sorted(PKG_DIR.rglob("*.py"))}


@cache
def tree(name: str) -> ast.Module:
    return ast.parse(MODULES[name].read_text(encoding="utf-8"), str(MODULES[name]))


@cache
def parsed(name: str) -> Imports:
    path = MODULES[name]
    return parse_imports(path.read_text(encoding="utf-8"), name, path.name == "__init__.py",
                         MODULES)


@cache
def the_graph() -> Graph:
    return graph_of({m: parsed(m) for m in MODULES})


@cache
def violations() -> tuple[Violation, ...]:
    return tuple(check(the_graph()))


@cache
def closure(name: str) -> frozenset[str]:
    """The trainguard modules `name` loads, directly or through other trainguard modules."""
    seen: set[str] = set()
    todo = [name]
    while todo:
        for m in the_graph().imports[todo.pop()]:
            if m not in seen:
                seen.add(m)
                todo.append(m)
    return frozenset(seen)


PURE_MODULES = sorted(m for m in MODULES if PURE in classes(m))
LIBRARY_MODULES = sorted(m for m in MODULES if LIBRARY in classes(m))


def test_the_walker_sees_the_package() -> None:
    assert {f"{PKG}.{m}" for m in ("spec", "launch", "controller.loop", "node.agent",
                                   "testing.faults")} <= set(MODULES)
    assert f"{PKG}.diagnosis.verdict" in closure(f"{PKG}.node.agent")
    assert {f"{PKG}.controller.loop", f"{PKG}.node.agent"} <= closure(f"{PKG}.launch")
    assert PURE_MODULES and LIBRARY_MODULES and f"{PKG}.worker.contract" in PURE_MODULES


def test_every_module_belongs_to_a_class() -> None:
    bad = [str(v) for v in violations() if v.rule == UNCLASSIFIED]
    assert not bad, "\n".join(bad)


def test_the_explicit_list_names_only_modules_that_exist() -> None:
    assert sorted(m for m in SHARED_TOP if f"{PKG}.{m}" not in MODULES) == []


@pytest.mark.parametrize("rule", RULES)
def test_the_tree_obeys(rule: str) -> None:
    bad = [str(v) for v in violations() if v.rule == rule]
    assert not bad, "\n".join(bad)


# -- each rule can fail ------------------------------------------------------------------------

def synthetic(edges: dict[str, set[str]], *, typing_only: dict[str, set[str]] | None = None,
              external: dict[str, set[str]] | None = None) -> Graph:
    """A graph of made-up modules (classified by their names like real ones)."""
    typing_only = typing_only or {}
    names = set(edges) | {t for ts in [*edges.values(), *typing_only.values()] for t in ts}
    return Graph({m: frozenset(edges.get(m, set()) | typing_only.get(m, set())) for m in names},
                 {m: frozenset(edges.get(m, ())) for m in names},
                 {m: frozenset((external or {}).get(m, ())) for m in names})


def rules_broken(graph: Graph) -> set[str]:
    return {v.rule for v in check(graph)}


C, N = f"{PKG}.controller.fake", f"{PKG}.node.fake"


@pytest.mark.parametrize(("graph", "rule"), [
    pytest.param(synthetic({f"{PKG}.worker.fake": {f"{PKG}.controller.store"}}), "R1",
                 id="R1 library imports the launcher"),
    pytest.param(synthetic({f"{PKG}.checkpoint.fake": {f"{PKG}.errors"}}), "R1",
                 id="R1 library imports a shared module"),
    pytest.param(synthetic({f"{PKG}.worker.fake": set()}, external={f"{PKG}.worker.fake":
                                                                    {"psutil"}}),
                 "R1", id="R1 library imports a package outside the standard library"),
    pytest.param(synthetic({f"{PKG}.testing.fake": set()}, external={f"{PKG}.testing.fake":
                                                                     {"torch"}}),
                 "R1", id="R1 torch outside checkpoint"),
    pytest.param(synthetic({f"{PKG}.policy.fake": {f"{PKG}.paths"}}), "R2",
                 id="R2 pure imports shared I/O"),
    pytest.param(synthetic({f"{PKG}.records": {f"{PKG}.controller.store"}}), "R2",
                 id="R2 shared vocabulary imports a side"),
    pytest.param(synthetic({f"{PKG}.diagnosis.fake": {f"{PKG}.diagnosis.sources"}}), "R2",
                 id="R2 pure diagnosis imports its file reader"),
    pytest.param(synthetic({C: {N}}), "R3", id="R3 controller imports node"),
    pytest.param(synthetic({C: set()}, typing_only={C: {N}}), "R3",
                 id="R3 controller imports node for types only"),
    pytest.param(synthetic({N: {C}}), "R4", id="R4 node imports controller"),
    pytest.param(synthetic({f"{PKG}.backends.fake": {N}}), "R5", id="R5 backends import node"),
    pytest.param(synthetic({f"{PKG}.diagnosis.sources": {C}}), "R5",
                 id="R5 shared I/O imports controller"),
    pytest.param(synthetic({C: {f"{PKG}.cli.fake"}}), "R5", id="R5 controller imports cli"),
    pytest.param(synthetic({f"{PKG}.launch": {f"{PKG}.cli"}}), "R5",
                 id="R5 the composition root imports cli"),
    pytest.param(synthetic({f"{PKG}.hang.a": {f"{PKG}.hang.b"}, f"{PKG}.hang.b":
                            {f"{PKG}.hang.a"}}), "R6", id="R6 a cycle of two"),
    pytest.param(synthetic({C: {f"{C}2"}, f"{C}2": {f"{C}3"}, f"{C}3": {C}}), "R6",
                 id="R6 a cycle of three"),
    pytest.param(synthetic({f"{PKG}.somethingnew": set()}), UNCLASSIFIED,
                 id="a new top-level module nobody classified"),
])
def test_each_rule_reports_what_breaks_it(graph: Graph, rule: str) -> None:
    assert rule in rules_broken(graph)


@pytest.mark.parametrize("graph", [
    pytest.param(synthetic({f"{PKG}.launch": {C, N}, f"{PKG}.cli.fake": {C, N, f"{PKG}.cli"},
                            f"{PKG}.__main__": {f"{PKG}.cli"}}),
                 id="launch and cli import both sides; __main__ imports cli"),
    pytest.param(synthetic({C: {f"{PKG}.protocol", f"{PKG}.wire", f"{PKG}.worker.contract"},
                            N: {f"{PKG}.diagnosis.sources", f"{PKG}.worker.channel"}}),
                 id="the sides import shared modules and the library"),
    pytest.param(synthetic({f"{PKG}.checkpoint.fake": {f"{PKG}.checkpoint.other"}},
                           external={f"{PKG}.checkpoint.fake": {"torch", "fsspec", "json"}}),
                 id="checkpoint imports torch and fsspec"),
    pytest.param(synthetic({f"{PKG}.hang.a": {f"{PKG}.hang.b"}},
                           typing_only={f"{PKG}.hang.b": {f"{PKG}.hang.a"}}),
                 id="a cycle closed only under TYPE_CHECKING"),
])
def test_what_the_rules_allow(graph: Graph) -> None:
    assert check(graph) == []


def test_the_walker_finds_function_level_imports_and_sets_type_checking_ones_apart() -> None:
    known = {f"{PKG}.controller", f"{PKG}.controller.fake", f"{PKG}.node.procs",
             f"{PKG}.controller.store", f"{PKG}.controller.sibling"}
    got = parse_imports(
        "from typing import TYPE_CHECKING\n"
        "import os.path\n"
        "from . import sibling\n"
        "if TYPE_CHECKING:\n"
        "    from trainguard.controller.store import JobStore\n"
        "def f():\n"
        "    from trainguard.node.procs import spawn\n",
        f"{PKG}.controller.fake", False, known)
    assert got.every == {"typing", "os.path", f"{PKG}.controller.sibling",
                         f"{PKG}.controller.store", f"{PKG}.node.procs"}
    assert got.runtime == got.every - {f"{PKG}.controller.store"}
    graph = graph_of({**{m: Imports(frozenset(), frozenset()) for m in known},
                      f"{PKG}.controller.fake": got})
    assert {"R3"} <= rules_broken(graph)
    assert graph.external[f"{PKG}.controller.fake"] == {"typing", "os"}


# -- pure modules, the package root, size, what a real import loads ------------------------------

@pytest.mark.parametrize("mod", PURE_MODULES, ids=short)
def test_pure_modules_import_no_process_socket_database_or_torch_api(mod: str) -> None:
    bad = sorted(m for m in parsed(mod).every if m.split(".")[0] in FORBIDDEN_IN_PURE)
    assert not bad, f"{short(mod)} imports {bad}"


@pytest.mark.parametrize("mod", PURE_MODULES, ids=short)
def test_pure_modules_use_signal_only_for_its_names(mod: str) -> None:
    if "signal" not in parsed(mod).every:
        return
    used = {n.attr for n in ast.walk(tree(mod)) if isinstance(n, ast.Attribute)
            and isinstance(n.value, ast.Name) and n.value.id == "signal"}
    from_imported = {a.name for n in ast.walk(tree(mod)) if isinstance(n, ast.ImportFrom)
                     and n.module == "signal" for a in n.names}
    bad = sorted(a for a in used | from_imported
                 if not (a in SIGNAL_ALLOWED or a.startswith("SIG")))
    assert not bad, f"{short(mod)} calls signal.{bad}"


@pytest.mark.parametrize("mod", LIBRARY_MODULES, ids=short)
def test_in_script_library_modules_load_nothing_from_the_launcher_side(mod: str) -> None:
    bad = sorted(short(m) for m in closure(mod) if LIBRARY not in classes(m))
    assert not bad, f"{short(mod)} loads {bad}"


def test_the_package_root_imports_only_the_in_script_api() -> None:
    # `import trainguard; trainguard.progress(step)` / `trainguard.run_resilient(main)`:
    # standard library only, no launcher side
    assert closure(PKG) <= {f"{PKG}.worker.{m}" for m in (
        "progress", "channel", "contract", "fields", "resilient", "control", "transient")} | {
        f"{PKG}.worker"}
    assert not {m for m in parsed(PKG).every if m.split(".")[0] in ("torch", "psutil",
                                                                     "pydantic")}


@pytest.mark.parametrize("name", sorted(MODULES), ids=short)
def test_every_module_is_under_400_lines(name: str) -> None:
    lines = len(MODULES[name].read_text(encoding="utf-8").splitlines())
    assert lines < MAX_LINES, f"{short(name)} has {lines} lines: split it by concern"


LAUNCHER = ("trainguard.controller.loop", "trainguard.node.agent", "trainguard.node.procs",
            "trainguard.controller.store", "trainguard.cli", "trainguard.launch", "sqlite3",
            "psutil")


@pytest.mark.parametrize(("imported", "forbidden"), [
    pytest.param("trainguard, trainguard.testing.faults", ("torch", *LAUNCHER),
                 id="fault injection: no launcher, no torch"),
    pytest.param("trainguard.checkpoint, trainguard.worker.channel", (*LAUNCHER, "pydantic"),
                 id="checkpoint library: no launcher"),
    pytest.param("trainguard.cli, trainguard.launch, trainguard.cli.ckpt", ("torch", "numpy"),
                 id="launcher and its commands: no torch"),
    pytest.param("trainguard.cli, trainguard.launch, trainguard.cli.run, "
                 "trainguard.cli.run_checks, trainguard.controller.loop, "
                 "trainguard.controller.worker_messages, trainguard.node.main",
                 ("trainguard.testing.faults",),  # the spec's reading: testing/fault_spec.py
                 id="launcher: not the rank-side fault injector"),
])
def test_importing_one_side_loads_nothing_of_the_other(
        imported: str, forbidden: tuple[str, ...]) -> None:
    code = (f"import sys, {imported}; bad = {list(forbidden)!r}; "
            "print(sorted(m for m in sys.modules if m in bad or any("
            "m.startswith(b + '.') for b in bad if b in ('torch', 'numpy'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True)
    assert out.stdout.strip() == "[]"
