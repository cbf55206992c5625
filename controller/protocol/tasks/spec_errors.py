"""Refusals of task specs in the user's words: each names the task, the field (as written in the spec file)
and what is allowed there.

pydantic reports errors with locations that include the tags of tagged unions (``pipeline.spark.source``)
and messages in its own terms ("Unable to extract tag using discriminator"). Here each error is walked
through the specs' JSON Schema definitions: the tags are dropped from the path, and the schema of the field
says what it accepts (the kinds of pipeline, an enum's values, a number's bounds, a mapping's fields).
Pure functions over plain data: fast to test exhaustively.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

#: Fields of older spec formats and what replaced them.
RENAMED = {("max_failures",): 'replaced by restart.max_attempts: write "restart": {"max_attempts": N}'}
#: Words for the schema's name pattern (a regular expression means nothing to most users).
PATTERN_WORDS = {
    r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$": "a name of 1-200 characters from A-Z a-z 0-9 . _ - starting with a "
    "letter or digit",
}
#: Shown for a model, after "a ...", where the schema's title is a class name.
MODEL_WORDS = {
    "TaskSpec": "task spec",
    "SparkPipeline": "spark pipeline",
    "DeclarativePipeline": "declarative pipeline",
    "NoopPipeline": "noop pipeline",
    "FilesSource": "files source",
    "RateSource": "rate source",
    "FilesSink": "files sink",
    "ConsoleSink": "console sink",
    "Transform": "transform",
    "Trigger": "trigger",
    "Placement": "placement",
    "RestartPolicy": "restart policy",
}
MAX_SHOWN = 5
TAG_KEYS = ("kind", "type")

Schema = Mapping[str, Any]


def describe_errors(errors: Sequence[Mapping[str, Any]], label: str, defs: Mapping[str, Any]) -> str:
    """One line for pydantic's ``errors()`` of a TaskSpec validation: ``label: problem; problem``."""
    parts = [describe_error(e, defs) for e in errors[:MAX_SHOWN]]
    more = f" (and {len(errors) - MAX_SHOWN} more)" if len(errors) > MAX_SHOWN else ""
    return f"{label}: " + "; ".join(parts) + more


def describe_error(err: Mapping[str, Any], defs: Mapping[str, Any]) -> str:
    """One problem: the field's path as the user wrote it, then what is wrong and what is allowed."""
    path, nodes = walk(tuple(err.get("loc", ())), defs)
    node = nodes[-1]
    where = dotted(path)
    kind = err.get("type", "")
    value = err.get("input")
    ctx = err.get("ctx") or {}
    if kind == "missing":
        return f"{where} is missing: add {_addition(path[-1], node, defs)}"
    if kind == "extra_forbidden":
        parent = nodes[-2] if len(nodes) > 1 else None
        renamed = RENAMED.get(tuple(path))
        if renamed:
            return f"{where} is {renamed}"
        fields = list((_resolve(parent, defs) or {}).get("properties", {})) if parent is not None else []
        owner = _model_name(parent, defs) if parent is not None else "task spec"
        return f"{where} is not a field of a {owner}" + (f" (allowed: {', '.join(fields)})" if fields else "")
    if kind in ("union_tag_invalid", "union_tag_not_found"):
        return _bad_tag(where, value, node, defs, ctx)
    if kind in ("literal_error", "enum"):
        return f"{where} {_show(value)} is not one of {_choices(node, defs) or ctx.get('expected', '?')}"
    if kind in ("value_error", "assertion_error"):
        message = str(err.get("msg", "")).removeprefix("Value error, ").removeprefix("Assertion failed, ")
        return f"{where}: {message}" if path else message
    allowed = _allowed(node, defs) if node is not None else None
    if allowed:
        return f"{where} must be {allowed}, not {_show(value)}"
    return f"{where}: {err.get('msg', 'invalid')}"


# ---- walking the schema along an error's location ---------------------------------------------------
def walk(loc: Sequence[Any], defs: Mapping[str, Any]) -> tuple[list[Any], list[Schema | None]]:
    """The user's path for a pydantic location (union tags dropped) and the schema met at each step
    (``nodes[0]`` is the task spec's, ``nodes[-1]`` the field's; None where the schema says nothing)."""
    node: Schema | None = _resolve(defs.get("TaskSpec"), defs)
    path: list[Any] = []
    nodes: list[Schema | None] = [node]
    for part in loc:
        branch = _branch(node, part, defs)
        if branch is not None:  # a tagged union's tag: pick that member, the user never wrote it
            node = branch
            nodes[-1] = node
            continue
        node = _child(node, part, defs)
        path.append(part)
        nodes.append(node)
    return path, nodes


def _resolve(node: Schema | None, defs: Mapping[str, Any]) -> Schema | None:
    """Follow ``$ref`` (keeping the referring schema's own description and default)."""
    seen = 0
    while node is not None and "$ref" in node and seen < 16:
        target = defs.get(str(node["$ref"]).rsplit("/", 1)[-1])
        if target is None:
            return None
        node = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
        seen += 1
    return node


def _options(node: Schema | None, defs: Mapping[str, Any]) -> list[Schema]:
    if node is None:
        return []
    return [o for o in (_resolve(x, defs) for x in node.get("oneOf", node.get("anyOf", ()))) if o is not None]


def _tag(option: Schema) -> tuple[str, str] | None:
    """The (key, value) that names a union member: its constant ``kind`` or ``type``."""
    for key in TAG_KEYS:
        prop = option.get("properties", {}).get(key, {})
        if "const" in prop:
            return key, prop["const"]
    return None


def _tags(options: list[Schema]) -> list[tuple[str, str]]:
    """The tags of a union whose every member has one (empty: not such a union)."""
    tags = [t for t in map(_tag, options) if t is not None]
    return tags if options and len(tags) == len(options) else []


def _branch(node: Schema | None, part: Any, defs: Mapping[str, Any]) -> Schema | None:
    if not isinstance(part, str):
        return None
    for option in _options(node, defs):
        tag = _tag(option)
        if tag is not None and tag[1] == part:
            return option
    return None


def _child(node: Schema | None, part: Any, defs: Mapping[str, Any]) -> Schema | None:
    if node is None:
        return None
    nullable = [o for o in _options(node, defs) if o.get("type") != "null"]
    if len(nullable) == 1 and "properties" not in node:
        node = nullable[0]
    if isinstance(part, int):
        return _resolve(node.get("items"), defs)
    props = node.get("properties", {})
    if part in props:
        return _resolve(props[part], defs)
    extra = node.get("additionalProperties")
    return _resolve(extra, defs) if isinstance(extra, dict) else None


# ---- what a field allows, in words --------------------------------------------------------------------
def _allowed(node: Schema | None, defs: Mapping[str, Any]) -> str | None:
    node = _resolve(node, defs)
    if node is None:
        return None
    if "const" in node:
        return _show(node["const"])
    if "enum" in node:
        return "one of " + ", ".join(str(v) for v in node["enum"])
    options = _options(node, defs)
    if options:
        tags = _tags(options)
        if tags:
            return f'a mapping with "{tags[0][0]}": ' + "|".join(json.dumps(t[1]) for t in tags)
        real = [o for o in options if o.get("type") != "null"]
        words = " or ".join(filter(None, (_allowed(o, defs) for o in real)))
        return f"{words} (or null, or left out)" if len(real) < len(options) else words
    kind = node.get("type")
    if kind == "integer":
        return "a whole number" + _bounds(node)
    if kind == "number":
        return "a number" + _bounds(node)
    if kind == "boolean":
        return "true or false"
    if kind == "string":
        pattern = node.get("pattern")
        if pattern:
            return PATTERN_WORDS.get(pattern, f"text matching {pattern}")
        return "non-empty text" if node.get("minLength") else "text"
    if kind == "array":
        item = _allowed(node.get("items"), defs)
        return f"a list, each {item}" if item else "a list"
    if kind == "object":
        props = list(node.get("properties", {}))
        if props:
            return f"a mapping (a {_model_name(node, defs)}) with the fields {', '.join(props)}"
        extra = (
            _allowed(node.get("additionalProperties"), defs)
            if isinstance(node.get("additionalProperties"), dict)
            else None
        )
        return f"a mapping of names to {extra}" if extra else "a mapping"
    return None


def _bounds(node: Schema) -> str:
    low, high = node.get("minimum"), node.get("maximum")
    above, below = node.get("exclusiveMinimum"), node.get("exclusiveMaximum")
    if low is not None and high is not None:
        return f" from {_num(low)} to {_num(high)}"
    words = []
    if low is not None:
        words.append(f"at least {_num(low)}")
    if above is not None:
        words.append(f"above {_num(above)}")
    if high is not None:
        words.append(f"at most {_num(high)}")
    if below is not None:
        words.append(f"below {_num(below)}")
    return " " + " and ".join(words) if words else ""


def _num(value: float) -> str:
    if isinstance(value, int):
        return f"{value:,}" if abs(value) >= 10_000 else str(value)
    return f"{value:g}"


def _choices(node: Schema | None, defs: Mapping[str, Any]) -> str | None:
    node = _resolve(node, defs)
    if node is None:
        return None
    if "enum" in node:
        return ", ".join(str(v) for v in node["enum"])
    if "const" in node:
        return str(node["const"])
    return None


def _model_name(node: Schema | None, defs: Mapping[str, Any]) -> str:
    title = str((_resolve(node, defs) or {}).get("title", ""))
    return MODEL_WORDS.get(title, title.lower() or "mapping")


def _addition(field: Any, node: Schema | None, defs: Mapping[str, Any]) -> str:
    """How to add a missing field: ``"pipeline": {"kind": "spark"|"declarative"|"noop", ...}``."""
    options = _options(node, defs)
    tags = _tags(options)
    if tags:
        return f'"{field}": {{"{tags[0][0]}": ' + "|".join(json.dumps(t[1]) for t in tags) + ", ...}"
    allowed = _allowed(node, defs)
    return f'"{field}" ({allowed})' if allowed else f'"{field}"'


def _bad_tag(where: str, value: Any, node: Schema | None, defs: Mapping[str, Any], ctx: Mapping[str, Any]) -> str:
    """A tagged union (pipeline by ``kind``, source and sink by ``type``) whose tag is wrong or absent."""
    options = _options(node, defs)
    tags = [t for t in (_tag(o) for o in options) if t]
    key = tags[0][0] if tags else _discriminator(ctx) or "kind"
    names = ", ".join(str(t[1]) for t in tags) or str(ctx.get("expected_tags", "?")).replace("'", "")
    example = "|".join(json.dumps(t[1]) for t in tags)
    if not isinstance(value, dict):
        return f'{where} must be a mapping like {{"{key}": {example or "..."}, ...}}, not {_show(value)}'
    if key in value:
        return f"{where}.{key} {_show(value[key])} is not one of {names}"
    return f'{where}.{key} is missing: add "{key}": {example}'


def _discriminator(ctx: Mapping[str, Any]) -> str | None:
    found = re.fullmatch(r"'(\w+)'", str(ctx.get("discriminator", "")))
    return found.group(1) if found else None


# ---- showing paths and values -----------------------------------------------------------------------
def dotted(path: Iterable[Any]) -> str:
    """``pipeline.source.format``; list items as ``placement.pinned[2]``."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "the spec"


def _show(value: Any, limit: int = 60) -> str:
    try:
        text = json.dumps(value, default=str, sort_keys=True)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
