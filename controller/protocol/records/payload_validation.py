"""Validation of parsed JSON against a payload dataclass's type hints, and the one error it raises.

Kept apart from ``codecs`` (which frames bytes: version, compression, size limits) because this is the part
that must be fast and exact on untrusted input: one converter compiled per type, the same decisions and the
same error messages as walking the hints each time (``tests/unit/protocol/records/test_codecs.py`` checks both ways agree).
"""

from __future__ import annotations

import dataclasses
import enum
import threading
import types
import typing
from typing import Any, Union

from controller.protocol.errors import ZkcError


class PayloadError(ZkcError, ValueError):
    """A znode holds bytes that are not a valid payload of the expected kind.

    ``path`` is the znode (or "<memory>" when decoding a value not read from ZooKeeper) and ``reason``
    says what is wrong, e.g. ``field 'generation': expected int, got str``.
    """

    status = 422
    code = "invalid_spec"

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"malformed payload at {path}: {reason}")
        self.path = path
        self.reason = reason


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    hints = _HINTS.get(cls)
    if hints is None:
        hints = typing.get_type_hints(cls)
        _HINTS[cls] = hints
    return hints


def type_name(value: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}.get(
        type(value), type(value).__name__
    )


def _label(where: str) -> str:
    return f"field '{where}'" if where else "payload"


def _sub(where: str, name: str) -> str:
    return f"{where}.{name}" if where else name


# One converter per type, built on first use: ``(value, path, where) -> converted``. Walking the type hints
# for every value (``get_origin``, ``fields``, ``get_args`` per task id) made decoding a 1,000-task join
# result take ~16 ms; the converters take the same decisions and raise the same errors, once compiled.
Converter = typing.Callable[[Any, str, str], Any]
_CONVERTERS: dict[Any, Converter] = {}


def coerce(tp: Any, value: Any, path: str, where: str) -> Any:
    """Check ``value`` (parsed JSON) against type ``tp`` and convert lists to tuples, objects to dataclasses."""
    return _converter(tp)(value, path, where)


_BUILD_LOCK = threading.RLock()  # workers decode on several threads: a converter is built by one of them


def _converter(tp: Any) -> Converter:
    conv = _CONVERTERS.get(tp)
    if conv is not None:
        return conv
    with _BUILD_LOCK:
        conv = _CONVERTERS.get(tp)
        if conv is None:
            # a placeholder first, so that a type that refers to itself finds its converter while it is
            # built; another thread that meets the placeholder waits for the build instead of recursing
            def placeholder(value: Any, path: str, where: str) -> Any:
                with _BUILD_LOCK:
                    return _CONVERTERS[tp](value, path, where)

            _CONVERTERS[tp] = placeholder
            try:
                conv = _CONVERTERS[tp] = _build_converter(tp)
            except BaseException:
                del _CONVERTERS[tp]
                raise
    return conv


def _build_converter(tp: Any) -> Converter:
    if tp is Any:
        return lambda value, path, where: value
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return _dataclass_converter(tp)
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        return _union_converter(tp)
    if origin is tuple:
        return _tuple_converter(tp)
    if origin is dict:
        (_key, item) = typing.get_args(tp)
        conv_item = _converter(item)

        def conv_dict(value: Any, path: str, where: str) -> Any:
            if not isinstance(value, dict):
                raise PayloadError(path, f"{_label(where)}: expected an object, got {type_name(value)}")
            return {k: conv_item(v, path, f"{where}.{k}") for k, v in value.items()}

        return conv_dict
    if isinstance(tp, type) and issubclass(tp, enum.Enum):

        def conv_enum(value: Any, path: str, where: str) -> Any:
            try:
                return tp(value)
            except ValueError:
                raise PayloadError(path, f"{_label(where)}: {value!r} is not one of {[m.value for m in tp]}") from None

        return conv_enum
    leaf = _LEAF_CONVERTERS.get(tp)
    if leaf is not None:
        return leaf

    def unsupported(value: Any, path: str, where: str) -> Any:
        raise TypeError(f"codec cannot handle type {tp!r}")  # a programming error, not bad input

    return unsupported


def _dataclass_converter(tp: type) -> Converter:
    hints = _hints(tp)
    fields = [
        (f.name, f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
        for f in dataclasses.fields(tp)
    ]
    resolved: list[tuple[str, bool, Converter]] | None = None

    def conv_dataclass(value: Any, path: str, where: str) -> Any:
        nonlocal resolved
        if not isinstance(value, dict):
            raise PayloadError(path, f"{_label(where)}: expected an object, got {type_name(value)}")
        convs = resolved
        if convs is None:  # field converters resolved on first use (a field's type may be this dataclass);
            # published whole, so a thread decoding at the same time never sees half of them
            convs = resolved = [(name, required, _converter(hints[name])) for name, required in fields]
        kwargs = {}
        for name, required, conv in convs:
            if name in value:
                kwargs[name] = conv(value[name], path, _sub(where, name))
            elif required:
                raise PayloadError(path, f"missing field '{_sub(where, name)}'")
        try:
            return tp(**kwargs)
        except PayloadError:
            raise
        except ValueError as exc:  # a payload's own bounds (``__post_init__``)
            raise PayloadError(path, f"{_label(where)}: {exc}") from None

    return conv_dataclass


def _union_converter(tp: Any) -> Converter:
    args = typing.get_args(tp)
    nullable = type(None) in args
    alternatives = [_converter(a) for a in args if a is not type(None)]

    def conv_union(value: Any, path: str, where: str) -> Any:
        if value is None and nullable:
            return None
        errors = []
        for conv in alternatives:
            try:
                return conv(value, path, where)
            except PayloadError as exc:
                errors.append(exc.reason)
        raise PayloadError(
            path, errors[0] if len(errors) == 1 else f"{_label(where)}: no alternative matches ({'; '.join(errors)})"
        )

    return conv_union


def _tuple_converter(tp: Any) -> Converter:
    (item, _ellipsis) = typing.get_args(tp)
    if item is str or item is int:
        # the common case (ids): one pass of type checks; the converter of the first bad item names it
        conv_leaf = _LEAF_CONVERTERS[item]
        ok: typing.Callable[[Any], bool] = (
            (lambda v: isinstance(v, str))
            if item is str
            else (lambda v: isinstance(v, int) and not isinstance(v, bool) and abs(v) <= 2**63)
        )

        def conv_ids(value: Any, path: str, where: str) -> Any:
            if not isinstance(value, list):
                raise PayloadError(path, f"{_label(where)}: expected an array, got {type_name(value)}")
            for i, v in enumerate(value):
                if not ok(v):
                    conv_leaf(v, path, f"{where}[{i}]")
            return tuple(value)

        return conv_ids
    conv_item = _converter(item)

    def conv_tuple(value: Any, path: str, where: str) -> Any:
        if not isinstance(value, list):
            raise PayloadError(path, f"{_label(where)}: expected an array, got {type_name(value)}")
        return tuple(conv_item(v, path, f"{where}[{i}]") for i, v in enumerate(value))

    return conv_tuple


def _conv_bool(value: Any, path: str, where: str) -> Any:
    if not isinstance(value, bool):
        raise PayloadError(path, f"{_label(where)}: expected boolean, got {type_name(value)}")
    return value


def _conv_int(value: Any, path: str, where: str) -> Any:
    if isinstance(value, bool) or not isinstance(value, int):
        raise PayloadError(path, f"{_label(where)}: expected integer, got {type_name(value)}")
    if abs(value) > 2**63:
        raise PayloadError(path, f"{_label(where)}: integer out of range")
    return value


def _conv_float(value: Any, path: str, where: str) -> Any:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise PayloadError(path, f"{_label(where)}: expected number, got {type_name(value)}")
    return float(value)


def _conv_str(value: Any, path: str, where: str) -> Any:
    if not isinstance(value, str):
        raise PayloadError(path, f"{_label(where)}: expected string, got {type_name(value)}")
    return value


_LEAF_CONVERTERS: dict[type, Converter] = {bool: _conv_bool, int: _conv_int, float: _conv_float, str: _conv_str}
