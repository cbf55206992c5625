"""Versioned JSON codecs for every payload the product keeps in ZooKeeper: the bytes of each record, and back.

Each payload is a frozen dataclass. ``encode`` writes it as compact JSON with a ``"version"`` field;
``decode`` parses and validates bytes read from a znode against the dataclass's type hints and raises
one error type, :class:`PayloadError` (with the path and the reason), for anything malformed: bad
UTF-8, bad JSON, a missing or unknown version, a missing field, a wrong type, an oversized value.
Callers never see a bare KeyError or JSONDecodeError.

The payloads are defined by area in modules that import nothing of ours and know nothing of encoding:
``registration_records`` (controller, brokers, sessions), ``task_records`` (owners, statuses, run intervals),
``group_messages`` (the group protocol) and ``admin_records`` (operators' requests, settings, summaries);
``payload_validation`` checks parsed JSON against their type hints and holds ``PayloadError``. This module
frames them as bytes (version, compression, size); callers import a record from the module that defines it
(``codecs.decode(task_records.TaskStatus, data)``).
"""

from __future__ import annotations

import dataclasses
import enum
import json
import zlib
from collections.abc import Sequence
from typing import Any, TypeVar, cast

from controller.protocol.records.group_messages import JoinResult, MemberMetadata, TaskDescriptor
from controller.protocol.records.payload_validation import PayloadError, coerce, type_name

SCHEMA_VERSION = 1
SUPPORTED_VERSIONS = frozenset({1})
# ZooKeeper's default jute.maxbuffer is 1 MiB; we refuse to read or write anything near it.
MAX_PAYLOAD_BYTES = 900 * 1024
COMPRESS_ABOVE = 64 * 1024
MAX_INFLATED_BYTES = 64 * 1024 * 1024

T = TypeVar("T")


# --------------------------------------------------------------------------------------------------
# encode / decode
# --------------------------------------------------------------------------------------------------


# Per-class reflection, looked up once: ``dataclasses.fields`` / ``is_dataclass`` on every object were 17% of
# the controller's event-thread time while it encoded join results of 1,000 tasks (docs/benchmarks.md, B2).
_FIELD_NAMES: dict[type, tuple[str, ...] | None] = {}
# Exact types returned as they are (subclasses, e.g. a ``str`` Enum, take the slow path).
_LEAVES = frozenset({str, int, float, bool, type(None)})
_KEEP = object()  # (no default to compare with: always written)


def _field_names(cls: type) -> tuple[str, ...] | None:
    """The field names of a dataclass type (None for any other type), cached per class."""
    try:
        return _FIELD_NAMES[cls]
    except KeyError:
        names = tuple(f.name for f in dataclasses.fields(cls)) if dataclasses.is_dataclass(cls) else None
        _FIELD_NAMES[cls] = names
        return names


def to_jsonable(payload: Any) -> Any:
    """A payload dataclass (or nested value) as plain JSON-compatible data."""
    cls = type(payload)
    if cls in _LEAVES:
        return payload
    names = _field_names(cls)  # a dataclass *instance* (a dataclass type's type is ``type``: not converted)
    if names is not None:
        omit = getattr(cls, "OMIT_AT_DEFAULT", None)
        if omit:  # fields added later, left out while at their default: older payloads stay byte for byte
            return {n: to_jsonable(v) for n in names if (v := getattr(payload, n)) != omit.get(n, _KEEP)}
        return {n: to_jsonable(getattr(payload, n)) for n in names}
    if isinstance(payload, enum.Enum):
        return payload.value
    if isinstance(payload, (list, tuple)):
        return [to_jsonable(v) for v in payload]
    if isinstance(payload, dict):
        return {str(k): to_jsonable(v) for k, v in payload.items()}
    return payload


def _serialize(payload: Any) -> bytes:
    body = to_jsonable(payload)
    body["version"] = SCHEMA_VERSION
    data = json.dumps(body, separators=(",", ":"), sort_keys=True).encode()
    return zlib.compress(data, 6) if len(data) > COMPRESS_ABOVE else data


def encoded_size(payload: Any) -> int:
    """The bytes ``encode`` would write for ``payload`` (compressed where it would be), without a limit."""
    return len(_serialize(payload))


# A group's tasks travel whole in its join result (descriptors, the previous assignment, what members own):
# creating tasks is refused when that would take the group's join result past this share of the znode limit,
# the rest being left for the members' own metadata.
GROUP_PAYLOAD_BUDGET = int(MAX_PAYLOAD_BYTES * 0.75)


def group_payload_bytes(tasks: Sequence[TaskDescriptor]) -> int:
    """The size of the largest protocol payload a group of ``tasks`` makes: its join result with every task
    owned and previously assigned (what a cooperative rebalance of a loaded group carries)."""
    ids = tuple(t.task_id for t in tasks)
    worst = JoinResult(
        generation=1,
        leader="m",
        protocol="cooperative",
        assignor="cooperative-sticky",
        controller_epoch=1,
        members=(MemberMetadata("m", owned=ids),),
        tasks=tuple(tasks),
        previous={"m": ids},
    )
    return encoded_size(worst)


def encode(payload: Any) -> bytes:
    """Encode a payload dataclass as versioned JSON bytes (refusing oversized payloads).

    JSON larger than ``COMPRESS_ABOVE`` is stored zlib-compressed (a znode's bytes then start with the
    zlib header, never with ``{``): join results and assignments of groups with tens of thousands of
    tasks stay well under ZooKeeper's 1 MiB limit, small payloads stay readable with any client."""
    data = _serialize(payload)
    if len(data) > MAX_PAYLOAD_BYTES:
        raise PayloadError("<memory>", f"{type(payload).__name__} is {len(data)} bytes, over {MAX_PAYLOAD_BYTES}")
    return data


def inflate(data: bytes, path: str) -> bytes:
    """Undo ``encode``'s compression (bounded: a small znode cannot expand into gigabytes)."""
    if not data or data[:1] not in (b"\x78",):
        return data
    d = zlib.decompressobj()
    try:
        out = d.decompress(data, MAX_INFLATED_BYTES)
    except zlib.error as exc:
        raise PayloadError(path, f"not JSON and not a valid compressed payload ({exc})") from None
    if d.unconsumed_tail:
        raise PayloadError(path, f"compressed payload expands past {MAX_INFLATED_BYTES} bytes")
    return out


class Unreadable(bytes):
    """What a reader got for a znode its credentials may not read (NoAuth): decoding it raises a
    PayloadError that says so, so that one such znode is reported, not fatal to a whole listing."""

    REASON = "not readable with these credentials (NoAuth)"


def decode(cls: type[T], data: bytes | None, path: str = "<memory>") -> T:
    """Parse and validate ``data`` as a ``cls`` payload, or raise PayloadError naming path and reason."""
    if isinstance(data, Unreadable):
        raise PayloadError(path, Unreadable.REASON)
    if data is None:
        raise PayloadError(path, "znode has no data")
    if len(data) > MAX_PAYLOAD_BYTES:
        raise PayloadError(path, f"{len(data)} bytes, over the {MAX_PAYLOAD_BYTES}-byte limit")
    data = inflate(data, path)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PayloadError(path, f"not UTF-8 ({exc.reason} at byte {exc.start})") from None
    try:
        body = json.loads(text)
    except (ValueError, RecursionError) as exc:  # ValueError: also integers past int_max_str_digits
        raise PayloadError(path, f"not JSON ({exc})") from None
    return from_dict(cls, body, path)


def from_dict(cls: type[T], body: Any, path: str = "<memory>") -> T:
    """Validate an already-parsed versioned JSON object as a ``cls`` payload."""
    if not isinstance(body, dict):
        raise PayloadError(path, f"expected a JSON object, got {type_name(body)}")
    version = body.get("version")
    if version is None:
        raise PayloadError(path, "missing 'version'")
    if isinstance(version, bool) or not isinstance(version, int) or version not in SUPPORTED_VERSIONS:
        raise PayloadError(path, f"unsupported version {version!r} (supported: {sorted(SUPPORTED_VERSIONS)})")
    return cast(T, coerce(cls, {k: v for k, v in body.items() if k != "version"}, path, ""))


def decode_epoch(data: bytes | None, path: str = "<memory>") -> int:
    """``/controller_epoch`` holds the epoch as decimal text."""
    if data is None:
        raise PayloadError(path, "znode has no data")
    try:
        text = data.decode("ascii").strip()
    except UnicodeDecodeError:
        raise PayloadError(path, "epoch is not ASCII text") from None
    if not text.isdigit() or len(text) > 18:
        raise PayloadError(path, f"epoch {text[:40]!r} is not a non-negative integer")
    return int(text)


def encode_epoch(epoch: int) -> bytes:
    return str(int(epoch)).encode("ascii")
