"""Rules of the code base that hold for every module of the product and its harness, checked from the
sources with ``ast`` (nothing of the project is imported): one error root, and no module past 700 lines."""

from __future__ import annotations

import ast
import builtins

from tests.unit.project.test_layering import MODULES, REPO

#: a module longer than this is doing more than one job: split it by job
MAX_MODULE_LINES = 700
BUILTIN_EXCEPTIONS = {
    name for name, value in vars(builtins).items() if isinstance(value, type) and issubclass(value, BaseException)
}


def _base_name(base: ast.expr) -> str:
    if isinstance(base, ast.Name):
        return base.id
    if isinstance(base, ast.Attribute):
        return base.attr
    return ""


def _classes(source: str) -> list[tuple[int, str, list[str]]]:
    return [
        (n.lineno, n.name, [_base_name(b) for b in n.bases])
        for n in ast.walk(ast.parse(source))
        if isinstance(n, ast.ClassDef)
    ]


def _exceptions_outside_the_root(sources: dict[str, str]) -> list[str]:
    """Classes that derive from a library's or the builtins' exception and from no class under ``ZkcError``
    (``sources``: where -> source text), as ``where:line class Name(bases)``."""
    classes = [(where, *c) for where, source in sources.items() for c in _classes(source)]
    rooted = {"ZkcError"}
    while True:  # the classes of ours under the root, by name (bounded: each round adds one at least)
        more = {name for _, _, name, bases in classes if name not in rooted and rooted.intersection(bases)}
        if not more:
            break
        rooted |= more
    return [
        f"{where}:{line} class {name}({', '.join(bases)})"
        for where, line, name, bases in classes
        if name not in rooted and any(b in BUILTIN_EXCEPTIONS or b.endswith("Exception") for b in bases)
    ]


def test_every_exception_of_ours_is_under_zkc_error() -> None:
    wrong = _exceptions_outside_the_root({str(p.relative_to(REPO)): p.read_text() for p in MODULES.values()})
    assert not wrong, "exceptions outside the root (controller.protocol.errors.ZkcError):\n" + "\n".join(wrong)


def test_the_error_rule_sees_a_class_outside_the_root() -> None:
    planted = (
        "class Full(Exception): ...\nclass Fine(ZkcError, ValueError): ...\n"
        "class Inner(Fine, RuntimeError): ...\nclass Loose(Full, KeyError): ...\n"
    )
    outside = _exceptions_outside_the_root({"m": planted})
    assert outside == ["m:1 class Full(Exception)", "m:4 class Loose(Full, KeyError)"]


def test_no_module_is_over_700_lines() -> None:
    long = {
        str(path.relative_to(REPO)): n
        for path in MODULES.values()
        if (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert not long, f"modules over {MAX_MODULE_LINES} lines (split each by job): {long}"


# ---- a part keeps its state; it does not write its owner's -------------------------------------------------
#: the parts of the group coordinator: every module of ``controller.protocol.group`` that is handed the
#: coordinator as ``core``. A part returns what it decided (a result the coordinator takes); it never assigns
#: the coordinator's fields, nor the coordinator a part's.
OWNER = "controller.protocol.group.coordinator"
GROUP_PACKAGE = OWNER.rsplit(".", 1)[0]
PARTS = ("join", "reconcile", "operations", "holds", "machine")


def _attribute_path(node: ast.expr) -> list[str]:
    out = []
    while isinstance(node, ast.Attribute):
        out.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        out.append(node.id)
    return out[::-1]


def _writes_through(source: str, roots: tuple[tuple[str, ...], ...]) -> set[str]:
    """The attribute paths assigned below one of ``roots`` (``("core",)``, ``("self", "core")``): for
    ``core.join.static_returned = x``, ``join.static_returned``."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            continue
        for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
            elements = target.elts if isinstance(target, (ast.Tuple, ast.List)) else [target]
            for element in elements:
                if not isinstance(element, ast.Attribute):
                    continue
                path = _attribute_path(element)
                for root in roots:
                    if tuple(path[: len(root)]) == root and len(path) > len(root):
                        found.add(".".join(path[len(root) :]))
    return found


def _owner_writes() -> dict[str, set[str]]:
    return {
        name: writes
        for name, path in sorted(MODULES.items())
        if name.startswith(GROUP_PACKAGE + ".") and name != OWNER
        if (writes := _writes_through(path.read_text(), (("core",), ("self", "core"))))
    }


def test_parts_do_not_assign_their_owners_fields() -> None:
    found = {m: sorted(w) for m, w in _owner_writes().items()}
    assert not found, f"a part assigns its owner's fields (return a result instead): {found}"


def test_the_coordinator_does_not_assign_its_parts_fields() -> None:
    source = MODULES[OWNER].read_text()
    found = {f"{part}.{w}" for part in PARTS for w in _writes_through(source, (("self", part),))}
    assert not found, f"the coordinator assigns a part's fields (ask the part instead): {sorted(found)}"


def test_the_write_rule_sees_a_planted_write() -> None:
    planted = "def f(core, self):\n    core.generation = 1\n    core.join.x, y = 2, 3\n    self.core.reason += 'a'\n"
    assert _writes_through(planted, (("core",), ("self", "core"))) == {"generation", "join.x", "reason"}
