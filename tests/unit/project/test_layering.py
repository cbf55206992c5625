"""The shape of the code, checked: the sans-IO protocol core never reaches ZooKeeper (not even through a
module of ours that does), and imports run one way only, ``cli`` -> ``broker_sim`` -> ``controller``.

Pure: parses the sources with ``ast``, imports nothing of the project."""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
PACKAGES = ("controller", "broker_sim", "cli")

# What each layer may import of ours, by package prefix (the longest prefix that names a module decides).
# A new module is covered by its package's rule without editing this file.
ALLOWED: dict[str, tuple[str, ...]] = {
    "controller.protocol": ("controller.protocol",),
    "controller.zk": ("controller.protocol", "controller.zk"),
    "controller.daemon": ("controller.protocol", "controller.zk", "controller.daemon"),
    "controller.admin": ("controller.protocol", "controller.zk", "controller.admin"),
    "controller.api": ("controller.protocol", "controller.zk", "controller.admin", "controller.api"),
    "controller": ("controller",),
    "broker_sim.runners": ("controller.protocol", "controller.zk", "broker_sim.runners"),
    "broker_sim.worker": ("controller.protocol", "controller.zk", "broker_sim.runners", "broker_sim.worker"),
    "broker_sim": ("controller", "broker_sim"),
    "cli": ("controller", "broker_sim", "cli"),
}
# The sans-IO core: state machines, assignors, codecs, the deterministic simulation. They take events and
# return decisions; the kazoo layer (controller/zk, controller/daemon, broker_sim/worker) carries them out.
SANS_IO_PACKAGES = (
    "controller.protocol",
    "broker_sim.sim.protosim",
    "broker_sim.sim.protosim_types",
    "broker_sim.sim.protosim_faults",
    "broker_sim.sim.protosim_checks",
    "broker_sim.sim.checker",
    "broker_sim.sim.injection",
    "broker_sim.chaos.schedule",
)
IO_LIBRARIES = ("kazoo", "socket", "subprocess", "pyspark", "docker", "fastapi", "uvicorn", "click", "requests")


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


@cache
def _tree(path: Path) -> ast.Module:
    """A module's syntax tree, parsed once per process: every rule here walks every module (read only)."""
    return ast.parse(path.read_text(), filename=str(path))


def _imports(name: str) -> set[str]:
    """The absolute module names ``name`` imports at any level of its code (``from x import y`` counts
    ``x`` and, where it is a module of ours, ``x.y``)."""
    tree = _tree(MODULES[name])
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
            found.update(
                f"{node.module}.{alias.name}" for alias in node.names if f"{node.module}.{alias.name}" in MODULES
            )
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


def _rule_of(name: str) -> str:
    return max((prefix for prefix in ALLOWED if name == prefix or name.startswith(prefix + ".")), key=len)


SANS_IO_CORE = sorted(m for m in MODULES if any(m == p or m.startswith(p + ".") for p in SANS_IO_PACKAGES))


def test_every_module_has_a_layer_and_the_core_is_not_empty() -> None:
    assert all(_rule_of(m) for m in MODULES)
    assert len(SANS_IO_CORE) >= 15, SANS_IO_CORE
    missing = [p for p in SANS_IO_PACKAGES if not any(m == p or m.startswith(p + ".") for m in MODULES)]
    assert not missing, f"the sans-IO core names modules that do not exist: {missing}"


@pytest.mark.parametrize("core", SANS_IO_CORE)
def test_the_sans_io_core_never_reaches_zookeeper(core: str) -> None:
    offenders = []
    for mod, chain in _closure(core).items():
        for imported in _imports(mod):
            if imported.split(".")[0] in IO_LIBRARIES:
                offenders.append(f"{' -> '.join(chain)} imports {imported}")
    assert not offenders, "the sans-IO core must not do I/O:\n" + "\n".join(offenders)


def test_each_layer_imports_only_the_layers_below_it() -> None:
    """``controller.protocol`` imports nothing of ours outside it; ``controller.zk`` only the protocol; the
    daemon, the admin library and the API sit on those two (the API also on the admin library); the
    production worker and runners use neither the simulators nor the operator library."""
    wrong = []
    for name in MODULES:
        allowed = ALLOWED[_rule_of(name)]
        for imported in _imports(name):
            mod = _ours(imported)
            if mod is None or mod.split(".")[0] not in PACKAGES:
                continue
            if not any(mod == a or mod.startswith(a + ".") for a in allowed):
                wrong.append(f"{name} imports {mod} (its layer {_rule_of(name)} may import {', '.join(allowed)})")
    assert not wrong, "layering:\n" + "\n".join(sorted(wrong))


def test_kazoo_internals_live_in_controller_zk_alone() -> None:
    """kazoo's protocol internals (its serialization, private methods) are used in one package only."""
    wrong = []
    for name, path in MODULES.items():
        if name.startswith("controller.zk"):
            continue
        for imported in _imports(name):
            if imported.startswith(("kazoo.protocol", "kazoo.handlers.utils")) and imported != "kazoo.protocol.states":
                wrong.append(f"{name} imports {imported}")
        if "._call(" in path.read_text():
            wrong.append(f"{name} calls a private kazoo method")
    assert not wrong, "\n".join(wrong)


def test_no_module_imports_another_modules_private_name() -> None:
    wrong = []
    for name, path in MODULES.items():
        tree = _tree(path)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and _ours(node.module):
                wrong += [
                    f"{name}: from {node.module} import {a.name}"
                    for a in node.names
                    if a.name.startswith("_") and not a.name.startswith("__")
                ]
    assert not wrong, "private names imported across modules:\n" + "\n".join(wrong)


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
    core.write_text("import controller.protocol.helper_planted\n")
    monkeypatch.setitem(MODULES, "controller.protocol.helper_planted", helper)
    monkeypatch.setitem(MODULES, "controller.protocol.core_planted", core)
    chains = _closure("controller.protocol.core_planted")
    assert "controller.protocol.helper_planted" in chains
    with pytest.raises(AssertionError, match="imports kazoo.client"):
        test_the_sans_io_core_never_reaches_zookeeper("controller.protocol.core_planted")


# ---- one home for each state machine; parts composed, not mixed in -------------------------------
#: the modules where a state is assigned: the group's state machine, and the member's (its one transition function)
STATE_HOMES = {"controller.protocol.group.state": None, "controller.protocol.group.member": "_transition"}


def _state_assignments(name: str, attr: str = "state") -> list[tuple[int, str | None]]:
    """Every ``<something>.<attr> = ...`` in module ``name``: (line, the function it is in)."""
    found: list[tuple[int, str | None]] = []

    def visit(node: ast.AST, function: str | None) -> None:
        for child in ast.iter_child_nodes(node):
            inner = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else function
            if isinstance(child, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
                targets = child.targets if isinstance(child, ast.Assign) else [child.target]
                for target in targets:
                    for t in ast.walk(target):
                        if isinstance(t, ast.Attribute) and t.attr == attr and isinstance(t.ctx, ast.Store):
                            found.append((child.lineno, function))
            visit(child, inner)

    visit(_tree(MODULES[name]), None)
    return found


def test_states_change_only_in_their_state_machines() -> None:
    """h11's Rule 1: a group's state is assigned in ``state.py`` alone (through ``transition``, or
    ``restore`` on failover), a member's in its one transition function; nowhere else in the protocol core."""
    wrong = []
    for name in sorted(MODULES):
        if not name.startswith("controller.protocol"):
            continue
        for line, function in _state_assignments(name):
            if name in STATE_HOMES and STATE_HOMES[name] in (None, function):
                continue
            wrong.append(f"{MODULES[name].relative_to(REPO)}:{line} assigns .state (in {function or 'module'})")
    assert not wrong, "a state assigned outside its state machine:\n" + "\n".join(wrong)


#: the worker's task phases: written by the task table's one move (``TaskTable._move``, through ``phases``)
WORKER_PHASE_HOME = ("broker_sim.worker.slots", "_move")


def test_worker_task_phases_change_only_in_the_task_table() -> None:
    """A task's phase on a worker is assigned in ``TaskTable._move`` alone (which asks ``phases.transition``);
    nothing in the worker assigns a ``.state`` (a slot's status string is read from its phase)."""
    wrong = []
    for name in sorted(MODULES):
        if not name.startswith("broker_sim.worker"):
            continue
        where = MODULES[name].relative_to(REPO) if MODULES[name].is_relative_to(REPO) else MODULES[name].name
        for line, function in _state_assignments(name, "phase"):
            if (name, function) != WORKER_PHASE_HOME:
                wrong.append(f"{where}:{line} assigns .phase (in {function or 'module'})")
        for line, function in _state_assignments(name):
            wrong.append(f"{where}:{line} assigns .state (in {function or 'module'})")
    assert len(_state_assignments(WORKER_PHASE_HOME[0], "phase")) == 1, "the task table's one move is gone"
    assert not wrong, "a task phase assigned outside the task table:\n" + "\n".join(wrong)


def test_the_phase_rule_sees_a_planted_assignment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    planted = tmp_path / "planted.py"
    planted.write_text("def restart(slot):\n    slot.phase = None\n")
    monkeypatch.setitem(MODULES, "broker_sim.worker.planted", planted)
    with pytest.raises(AssertionError, match=r"planted.py:2 assigns .phase \(in restart\)"):
        test_worker_task_phases_change_only_in_the_task_table()


def _own_class_names() -> dict[str, set[str]]:
    """Module -> the classes of ours it can name: those it defines and those it imports from a module of ours."""
    defined = {
        name: {n.name for n in ast.walk(_tree(path)) if isinstance(n, ast.ClassDef)} for name, path in MODULES.items()
    }
    out: dict[str, set[str]] = {}
    for name, path in MODULES.items():
        names = set(defined[name])
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and _ours(node.module):
                source = defined.get(node.module, set())
                names.update(alias.asname or alias.name for alias in node.names if alias.name in source)
        out[name] = names
    return out


def test_no_class_is_mixed_in() -> None:
    """Parts are composed onto a core, not mixed in: no class named *Mixin, and none that inherits from two or
    more classes of ours (a class may extend one of ours, plus library types such as ``RuntimeError``). A
    ``Protocol`` may extend several: it is the union of what its parts need, with no behaviour to mix in
    (a protocol class can only extend protocols, which mypy enforces)."""
    ours = _own_class_names()
    wrong = []
    for name, path in sorted(MODULES.items()):
        for node in ast.walk(_tree(path)):
            if not isinstance(node, ast.ClassDef):
                continue
            bases = [
                b.id if isinstance(b, ast.Name) else b.attr if isinstance(b, ast.Attribute) else "" for b in node.bases
            ]
            own = [b for b in bases if b in ours[name]]
            where = f"{path.relative_to(REPO)}:{node.lineno} class {node.name}"
            if "mixin" in node.name.lower():
                wrong.append(f"{where}: a mixin")
            elif len(own) >= 2 and "Protocol" not in bases:
                wrong.append(f"{where}: inherits {', '.join(own)}")
    assert not wrong, "classes mixed in rather than composed:\n" + "\n".join(wrong)


# ---- the product apart from its harness ---------------------------------------------------------------
#: what ships and runs in production, and the test and demonstration harness beside it
PRODUCT = ("controller", "broker_sim.worker", "broker_sim.runners", "cli")
HARNESS = ("broker_sim.sim", "broker_sim.chaos", "broker_sim.deploy")
#: the one allowed edge: the CLI's harness commands (``zkctl sim``, ``demo``, ``datagen``, ``timeline``, the
#: container commands) drive the harness; ``cli.main`` loads each by name only when its command runs
#: (``COMMANDS``), so no other command, and no daemon, imports any of it
HARNESS_COMMANDS = ("cli.sim_cmd", "cli.demo", "cli.datagen", "cli.timeline", "cli.containers", "cli.spark_cmd")


def _under(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


@pytest.mark.parametrize("package", PRODUCT)
def test_the_product_never_imports_the_harness(package: str) -> None:
    wrong = []
    for name in sorted(MODULES):
        if not _under(name, (package,)) or name in HARNESS_COMMANDS:
            continue
        for imported in _imports(name):
            mod = _ours(imported)
            if mod is not None and (_under(mod, HARNESS) or mod in HARNESS_COMMANDS):
                wrong.append(f"{name} imports {mod}")
    assert not wrong, "the product imports the harness:\n" + "\n".join(wrong)


def test_the_harness_commands_are_loaded_by_name_only() -> None:
    """``cli.main`` names each harness command module in a string, loaded when its command runs."""
    main = MODULES["cli.main"].read_text()
    assert [m for m in HARNESS_COMMANDS if f'"{m}"' not in main] == []
    assert not any(_ours(i) in HARNESS_COMMANDS for i in _imports("cli.main"))


def test_the_harness_rule_sees_a_planted_import(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    planted = tmp_path / "planted.py"
    planted.write_text("from broker_sim.chaos.schedule import Schedule\n")
    monkeypatch.setitem(MODULES, "broker_sim.worker.planted", planted)
    with pytest.raises(AssertionError, match="broker_sim.worker.planted imports broker_sim.chaos.schedule"):
        test_the_product_never_imports_the_harness("broker_sim.worker")
