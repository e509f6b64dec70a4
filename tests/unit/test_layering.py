"""The dependency rule and module size, checked on the source with `ast` (nothing imported)."""

from __future__ import annotations

import ast
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

PKG_DIR = Path(__file__).resolve().parents[2] / "src" / "trainguard"
PKG = "trainguard"

# Decisions and data: no I/O, no processes, no torch.
PURE = ("spec", "policy", "records", "protocol", "exitcodes", "errors", "logformat",
        "diagnosis", "diagnosis.taxonomy", "diagnosis.findings", "diagnosis.lines",
        "diagnosis.rules", "diagnosis.scan", "diagnosis.verdict", "diagnosis.attempt",
        "diagnosis.trigger", "diagnosis.hung", "liveness", "hang", "hang.stacks",
        "hang.classify", "ladder", "precheck_rules", "cluster", "cluster.messages")
# Modules that do I/O or drive processes (prefix match: cli covers cli_run, cli_read).
IO_MODULES = ("agent", "procs", "logs", "store", "controller", "launch", "cli", "guardian",
              "incidents", "paths", "__main__", "diagnosis.sources", "activity", "hang_watch",
              "hang.dump", "precheck", "worker_env", "backends", "cluster.wire", "cluster.hub",
              "cluster.fleet", "cluster.recovery", "cluster.launch", "cluster.agent_main")
FORBIDDEN_IN_PURE = ("subprocess", "os", "socket", "sqlite3", "torch", "multiprocessing",
                     "psutil", "ctypes", "pty", "selectors", "shutil", "threading", "asyncio")
# The signal module is allowed for its constants and names only, never to send or handle.
SIGNAL_ALLOWED = {"Signals"}
WORKER_SIDE = ("testing", "worker", "checkpoint")
MAX_LINES = 400


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
def imports(name: str) -> frozenset[str]:
    """Every module `name` imports, anywhere in the file (function-level imports included)."""
    is_pkg = MODULES[name].name == "__init__.py"
    package = name if is_pkg else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree(name)):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join([*base, node.module] if node.module else base)
            else:
                mod = node.module or ""
            found.add(mod)
            # `from trainguard import agent` imports the submodule trainguard.node.agent
            found.update(f"{mod}.{a.name}" for a in node.names if f"{mod}.{a.name}" in MODULES)
    return frozenset(found)


def internal(name: str) -> set[str]:
    return {m for m in imports(name) if m in MODULES and m != PKG}


@cache
def closure(name: str) -> frozenset[str]:
    """The trainguard modules `name` loads, directly or through other trainguard modules."""
    seen: set[str] = set()
    todo = [name]
    while todo:
        for m in internal(todo.pop()):
            if m not in seen:
                seen.add(m)
                todo.append(m)
    return frozenset(seen)


def short(name: str) -> str:
    return name.removeprefix(f"{PKG}.")


def is_io(name: str) -> bool:
    s = short(name)
    top = s.split(".")[0]
    return any(top == m or s == m or (m == "cli" and top.startswith("cli")) for m in IO_MODULES)


def is_worker_side(name: str) -> bool:
    return short(name).split(".")[0] in WORKER_SIDE


PURE_PRESENT = [m for m in PURE if f"{PKG}.{m}" in MODULES]
WORKER_MODULES = sorted(m for m in MODULES if is_worker_side(m))


def test_the_walker_sees_the_package() -> None:
    assert {f"{PKG}.{m}" for m in ("spec", "controller", "testing.faults")} <= set(MODULES)
    assert f"{PKG}.diagnosis.verdict" in closure(f"{PKG}.controller")
    assert f"{PKG}.errors" in closure(f"{PKG}.policy")  # via spec


@pytest.mark.parametrize("mod", PURE_PRESENT)
def test_pure_modules_import_no_process_socket_database_or_torch_api(mod: str) -> None:
    name = f"{PKG}.{mod}"
    bad = sorted(m for m in imports(name) if m.split(".")[0] in FORBIDDEN_IN_PURE)
    assert not bad, f"{mod} imports {bad}"


@pytest.mark.parametrize("mod", PURE_PRESENT)
def test_pure_modules_use_signal_only_for_its_names(mod: str) -> None:
    name = f"{PKG}.{mod}"
    if "signal" not in imports(name):
        return
    used = {n.attr for n in ast.walk(tree(name)) if isinstance(n, ast.Attribute)
            and isinstance(n.value, ast.Name) and n.value.id == "signal"}
    from_imported = {a.name for n in ast.walk(tree(name)) if isinstance(n, ast.ImportFrom)
                     and n.module == "signal" for a in n.names}
    bad = sorted(a for a in used | from_imported
                 if not (a in SIGNAL_ALLOWED or a.startswith("SIG")))
    assert not bad, f"{mod} calls signal.{bad}"


@pytest.mark.parametrize("mod", PURE_PRESENT)
def test_pure_modules_load_nothing_from_the_io_side(mod: str) -> None:
    name = f"{PKG}.{mod}"
    bad = sorted(short(m) for m in closure(name) if is_io(m))
    assert not bad, f"{mod} loads {bad}"
    impure = sorted(short(m) for m in closure(name) if short(m) not in PURE)
    assert not impure, f"{mod} loads modules outside the pure set: {impure}"


@pytest.mark.parametrize("name", WORKER_MODULES)
def test_worker_side_modules_load_nothing_from_the_launcher_side(name: str) -> None:
    bad = sorted(short(m) for m in closure(name) if is_io(m))
    assert not bad, f"{short(name)} loads {bad}"


def test_the_package_root_imports_only_the_in_script_progress_api() -> None:
    # `import trainguard; trainguard.progress(step)`: standard library only, no launcher side
    assert closure(PKG) <= {f"{PKG}.worker", f"{PKG}.worker.progress", f"{PKG}.worker.channel"}
    assert not {m for m in imports(PKG) if m.split(".")[0] in ("torch", "psutil", "pydantic")}


@pytest.mark.parametrize("name", sorted(MODULES))
def test_every_module_is_under_400_lines(name: str) -> None:
    lines = len(MODULES[name].read_text(encoding="utf-8").splitlines())
    assert lines < MAX_LINES, f"{short(name)} has {lines} lines: split it by concern"


LAUNCHER = ("trainguard.controller.loop", "trainguard.node.agent", "trainguard.node.procs", "trainguard.controller.store",
            "trainguard.cli", "trainguard.launch", "sqlite3", "psutil")


@pytest.mark.parametrize(("imported", "forbidden"), [
    pytest.param("trainguard, trainguard.testing.faults", ("torch", *LAUNCHER),
                 id="fault injection: no launcher, no torch"),
    pytest.param("trainguard.checkpoint, trainguard.worker.channel", (*LAUNCHER, "pydantic"),
                 id="checkpoint library: no launcher"),
    pytest.param("trainguard.cli, trainguard.launch, trainguard.cli.ckpt", ("torch", "numpy"),
                 id="launcher and its commands: no torch"),
])
def test_importing_one_side_loads_nothing_of_the_other(
        imported: str, forbidden: tuple[str, ...]) -> None:
    code = (f"import sys, {imported}; bad = {list(forbidden)!r}; "
            "print(sorted(m for m in sys.modules if m in bad or any("
            "m.startswith(b + '.') for b in bad if b in ('torch', 'numpy'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True)
    assert out.stdout.strip() == "[]"
