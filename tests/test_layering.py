"""The shape of the code, checked: the sans-IO protocol core never reaches ZooKeeper (not even through a
module of ours that does), and imports run one way only, ``cli`` -> ``broker_sim`` -> ``controller``.

Pure: parses the sources with ``ast``, imports nothing of the project."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("controller", "broker_sim", "cli")

# The protocol core: state machines, assignors, codecs, the deterministic simulation. They take events and
# return decisions; the kazoo layer (controller/daemon, broker_sim/worker) carries the decisions out.
SANS_IO_CORE = (
    "controller.assignors",
    "controller.clock",
    "controller.codecs",
    "controller.errors",
    "controller.group",
    "controller.group_types",
    "controller.group_operations",
    "controller.join_round",
    "controller.reconcile",
    "controller.throttle",
    "controller.layout",
    "controller.protocol",
    "controller.spec_errors",
    "controller.taskspec",
    "broker_sim.checker",
    "broker_sim.member",
    "broker_sim.protosim",
    "broker_sim.chaos.schedule",
)
IO_LIBRARIES = ("kazoo", "socket", "subprocess", "pyspark", "docker")


def _module_files() -> dict[str, Path]:
    """Every module of the project by dotted name (a package by its ``__init__``)."""
    out: dict[str, Path] = {}
    for pkg in PACKAGES:
        for path in (REPO / pkg).rglob("*.py"):
            rel = path.relative_to(REPO).with_suffix("")
            parts = list(rel.parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


MODULES = _module_files()


def _imports(name: str) -> set[str]:
    """The absolute module names ``name`` imports at any level of its code (``from x import y`` counts
    ``x`` and, where it is a module of ours, ``x.y``)."""
    tree = ast.parse(MODULES[name].read_text(), filename=str(MODULES[name]))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names
                         if f"{node.module}.{alias.name}" in MODULES)
    return found


def _ours(imported: str) -> str | None:
    """The module of ours an import names (the longest known prefix), or None for a library."""
    parts = imported.split(".")
    for n in range(len(parts), 0, -1):
        candidate = ".".join(parts[:n])
        if candidate in MODULES:
            return candidate
    return None


def _closure(name: str) -> dict[str, list[str]]:
    """Every module of ours reachable from ``name`` by imports, with the chain that reaches it."""
    chains = {name: [name]}
    todo = [name]
    while todo:
        current = todo.pop()
        for imported in _imports(current):
            mod = _ours(imported)
            if mod is not None and mod not in chains and mod.split(".")[0] in PACKAGES:
                chains[mod] = chains[current] + [mod]
                todo.append(mod)
    return chains


def test_every_core_module_exists() -> None:
    missing = [m for m in SANS_IO_CORE if m not in MODULES]
    assert not missing, f"the sans-IO core lists modules that do not exist: {missing}"


@pytest.mark.parametrize("core", SANS_IO_CORE)
def test_the_sans_io_core_never_reaches_zookeeper(core: str) -> None:
    offenders = []
    for mod, chain in _closure(core).items():
        for imported in _imports(mod):
            if imported.split(".")[0] in IO_LIBRARIES:
                offenders.append(f"{' -> '.join(chain)} imports {imported}")
    assert not offenders, "the sans-IO core must not do I/O:\n" + "\n".join(offenders)


def test_imports_run_one_way() -> None:
    """``controller`` imports neither ``broker_sim`` nor ``cli``; ``broker_sim`` does not import ``cli``.
    (``controller.admin`` loads the declarative validator from ``broker_sim`` by name, lazily, so that it
    may be absent: that is a string, not an import.)"""
    rank = {"controller": 0, "broker_sim": 1, "cli": 2}
    wrong = []
    for name in MODULES:
        own = rank[name.split(".")[0]]
        for imported in _imports(name):
            top = imported.split(".")[0]
            if top in rank and rank[top] > own:
                wrong.append(f"{name} imports {imported}")
    assert not wrong, "imports must run cli -> broker_sim -> controller:\n" + "\n".join(sorted(wrong))


def test_the_checker_sees_a_planted_import(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check itself can fail: a core module that imports kazoo through a helper of ours is caught."""
    helper = tmp_path / "helper.py"
    helper.write_text("from kazoo.client import KazooClient\n")
    core = tmp_path / "core.py"
    core.write_text("import controller.helper_planted\n")
    monkeypatch.setitem(MODULES, "controller.helper_planted", helper)
    monkeypatch.setitem(MODULES, "controller.core_planted", core)
    chains = _closure("controller.core_planted")
    assert "controller.helper_planted" in chains
    with pytest.raises(AssertionError, match="imports kazoo.client"):
        test_the_sans_io_core_never_reaches_zookeeper("controller.core_planted")
