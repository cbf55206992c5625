"""Rules of the code base that hold for every module of the product and its harness, checked from the
sources with ``ast`` (nothing of the project is imported): one error root, and no module past 700 lines."""

from __future__ import annotations

import ast
import builtins

from tests.unit.test_layering import MODULES, REPO

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
