"""Codecs: round trips, and every kind of garbage gives PayloadError with the path and reason."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controller.protocol.records import (
    admin_records,
    codecs,
    group_messages,
    payload_validation,
    registration_records,
    task_records,
)
from controller.protocol.records.payload_validation import PayloadError

PAYLOADS = [
    registration_records.ControllerInfo(controller_id="c1", epoch=3, host="h", since=1.5),
    registration_records.BrokerInfo(
        broker_id="b1", host="h", pid=42, group="g", capacity=2, rack="r1", instance_id="i1"
    ),
    task_records.OwnerInfo(broker="b1", generation=7),
    group_messages.GroupStateInfo(
        state="Stable",
        generation=4,
        join_generation=4,
        controller_epoch=2,
        protocol="cooperative",
        assignor="sticky",
        leader="b1",
        members=("b1", "b2"),
    ),
    group_messages.JoinRequest(
        member_id="b1",
        join_generation=5,
        generation=4,
        protocols=("cooperative", "eager"),
        assignors=("sticky",),
        owned=("t1", "t2"),
        capacity=3,
        rack=None,
    ),
    group_messages.JoinResult(
        generation=5,
        leader="b1",
        protocol="cooperative",
        assignor="sticky",
        controller_epoch=2,
        members=(group_messages.MemberMetadata(member_id="b1", owned=("t1",)),),
        tasks=(group_messages.TaskDescriptor(task_id="t1", weight=2, pinned=("b1",)),),
        held=("t9",),
        previous={"b1": ("t1",)},
    ),
    group_messages.SyncProposal(generation=5, leader="b1", assigned={"b1": ("t1",)}, revoked={"b2": ("t3",)}),
    group_messages.Assignment(generation=5, controller_epoch=2, assigned=("t1",), revoked=(), leader="b1"),
    task_records.TaskStatus(broker="b1", state="RUNNING", generation=5, updated=1.0, metrics={"rows": 10}),
    admin_records.RebalanceRequest(group="g"),
    admin_records.ControlledShutdownRequest(broker="b1"),
    admin_records.ReassignRequest(task_id="t1", to="b2"),
    task_records.IntervalLog(
        broker="b1", intervals=(task_records.RunInterval(task_id="t1", broker="b1", start=1.0, end=2.0),)
    ),
]


@pytest.mark.parametrize("payload", PAYLOADS, ids=lambda p: type(p).__name__)
def test_round_trip(payload):
    data = codecs.encode(payload)
    assert json.loads(data)["version"] == codecs.SCHEMA_VERSION
    assert codecs.decode(type(payload), data, "/x") == payload


GARBAGE = [
    (None, "no data"),
    (b"", "not JSON"),
    (b"\xff\xfe", "not UTF-8"),
    (b"{not json", "not JSON"),
    (b"[1,2]", "expected a JSON object"),
    (b'{"controller_id":"c"}', "missing 'version'"),
    (b'{"version":99,"controller_id":"c","epoch":1,"host":"h","since":1}', "unsupported version"),
    (b'{"version":"1","controller_id":"c","epoch":1,"host":"h","since":1}', "unsupported version"),
    (b'{"version":1,"epoch":1,"host":"h","since":1}', "missing field 'controller_id'"),
    (b'{"version":1,"controller_id":"c","epoch":"1","host":"h","since":1}', "field 'epoch': expected integer"),
    (b'{"version":1,"controller_id":"c","epoch":true,"host":"h","since":1}', "field 'epoch': expected integer"),
    (b'{"version":1,"controller_id":5,"epoch":1,"host":"h","since":1}', "field 'controller_id': expected string"),
    (b"x" * (codecs.MAX_PAYLOAD_BYTES + 1), "over the"),
    (b"[" * 100000 + b"]" * 100000, "not JSON"),
]


@pytest.mark.parametrize("data,reason", GARBAGE)
def test_garbage_gives_payload_error_with_path_and_reason(data, reason):
    with pytest.raises(PayloadError) as info:
        codecs.decode(registration_records.ControllerInfo, data, "/zkc/controller")
    assert info.value.path == "/zkc/controller"
    assert reason in info.value.reason
    assert "/zkc/controller" in str(info.value)


def test_nested_errors_name_the_field():
    body = json.loads(codecs.encode(PAYLOADS[5]))
    body["members"][0]["owned"] = [1]
    with pytest.raises(PayloadError, match=r"members\[0\]\.owned\[0\]"):
        codecs.from_dict(group_messages.JoinResult, body, "/j")


def test_epoch_codec():
    assert codecs.decode_epoch(codecs.encode_epoch(12)) == 12
    for bad in (None, b"-1", b"abc", b"\xff", b"9" * 40):
        with pytest.raises(PayloadError):
            codecs.decode_epoch(bad, "/e")


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=20,
)


@pytest.mark.parametrize("cls", sorted({type(p) for p in PAYLOADS}, key=lambda c: c.__name__), ids=lambda c: c.__name__)
@settings(max_examples=150, deadline=None)
@given(data=st.one_of(st.binary(max_size=200), JSON.map(lambda v: json.dumps(v).encode())))
def test_fuzz_decoder_only_raises_payload_error(cls, data):
    try:
        codecs.decode(cls, data, "/fuzz")
    except PayloadError:
        pass


@pytest.mark.parametrize("payload", PAYLOADS, ids=lambda p: type(p).__name__)
@settings(max_examples=60, deadline=None)
@given(st.data())
def test_fuzz_field_mutations(payload, data):
    """Replace one field of a valid payload with arbitrary JSON: either valid or a PayloadError naming that field."""
    body = json.loads(codecs.encode(payload))
    name = data.draw(st.sampled_from([f.name for f in dataclasses.fields(payload)]))
    body[name] = data.draw(JSON)
    try:
        codecs.from_dict(type(payload), body, "/fuzz")
    except PayloadError as exc:
        assert name in exc.reason or "no alternative" in exc.reason


# ---- the compiled converters and the cached reflection behave as the plain recursive walk did ----------
def _reference_coerce(tp, value, path, where):
    """The straightforward recursive decoder the compiled converters replaced (kept as the oracle)."""
    import enum
    import types
    import typing

    label = f"field '{where}'" if where else "payload"
    if tp is typing.Any:
        return value
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise PayloadError(path, f"{label}: expected an object, got {payload_validation.type_name(value)}")
        hints = typing.get_type_hints(tp)
        kwargs = {}
        for f in dataclasses.fields(tp):
            sub = f"{where}.{f.name}" if where else f.name
            if f.name in value:
                kwargs[f.name] = _reference_coerce(hints[f.name], value[f.name], path, sub)
            elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise PayloadError(path, f"missing field '{sub}'")
        try:
            return tp(**kwargs)
        except PayloadError:
            raise
        except ValueError as exc:  # a payload's own bounds (``__post_init__``): refused like a bad field
            raise PayloadError(path, f"{label}: {exc}") from None
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _reference_coerce(arg, value, path, where)
            except PayloadError as exc:
                errors.append(exc.reason)
        raise PayloadError(
            path, errors[0] if len(errors) == 1 else f"{label}: no alternative matches ({'; '.join(errors)})"
        )
    if origin is tuple:
        (item, _ellipsis) = typing.get_args(tp)
        if not isinstance(value, list):
            raise PayloadError(path, f"{label}: expected an array, got {payload_validation.type_name(value)}")
        return tuple(_reference_coerce(item, v, path, f"{where}[{i}]") for i, v in enumerate(value))
    if origin is dict:
        (_key, item) = typing.get_args(tp)
        if not isinstance(value, dict):
            raise PayloadError(path, f"{label}: expected an object, got {payload_validation.type_name(value)}")
        return {k: _reference_coerce(item, v, path, f"{where}.{k}") for k, v in value.items()}
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        try:
            return tp(value)
        except ValueError:
            raise PayloadError(path, f"{label}: {value!r} is not one of {[m.value for m in tp]}") from None
    if tp is bool:
        if not isinstance(value, bool):
            raise PayloadError(path, f"{label}: expected boolean, got {payload_validation.type_name(value)}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise PayloadError(path, f"{label}: expected integer, got {payload_validation.type_name(value)}")
        if abs(value) > 2**63:
            raise PayloadError(path, f"{label}: integer out of range")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise PayloadError(path, f"{label}: expected number, got {payload_validation.type_name(value)}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise PayloadError(path, f"{label}: expected string, got {payload_validation.type_name(value)}")
        return value
    raise TypeError(f"codec cannot handle type {tp!r}")


def _outcome(fn):
    try:
        return "ok", fn()
    except PayloadError as exc:
        return "error", (exc.path, exc.reason)


ITEM = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**64), max_value=2**64),
    st.floats(allow_nan=False),
    st.text(max_size=5),
)


@pytest.mark.parametrize("payload", PAYLOADS, ids=lambda p: type(p).__name__)
@settings(max_examples=80, deadline=None)
@given(st.data())
def test_compiled_converters_match_the_reference_walk(payload, data):
    """Mutate a valid payload's body anywhere (a field, a list item, a nested field; drop one): the compiled
    converter returns the same value or raises a PayloadError with the same path and reason."""
    body = json.loads(codecs.encode(payload))
    del body["version"]
    containers = [body]
    for v in body.values():
        if isinstance(v, dict):
            containers.append(v)
            containers += [x for x in v.values() if isinstance(x, (list, dict))]
        elif isinstance(v, list):
            containers.append(v)
            containers += [x for x in v if isinstance(x, (list, dict))]
    target = data.draw(st.sampled_from(containers))
    if target:
        key = data.draw(st.sampled_from(list(target) if isinstance(target, dict) else list(range(len(target)))))
        action = data.draw(
            st.sampled_from(["replace", "item", "drop"] if isinstance(target, dict) else ["replace", "item"])
        )
        if action == "drop":
            del target[key]
        else:
            target[key] = data.draw(JSON if action == "replace" else ITEM)
    cls = type(payload)
    assert _outcome(lambda: payload_validation.coerce(cls, body, "/p", "")) == _outcome(
        lambda: _reference_coerce(cls, body, "/p", "")
    )


def test_tuple_of_ids_names_the_first_bad_item():
    body = json.loads(codecs.encode(PAYLOADS[4]))  # JoinRequest
    body["owned"] = ["t1", "t2", 3, None]
    with pytest.raises(PayloadError, match=r"field 'owned\[2\]': expected string, got int"):
        codecs.from_dict(group_messages.JoinRequest, body, "/m")
    body["owned"] = "t1"
    with pytest.raises(PayloadError, match=r"field 'owned': expected an array, got string"):
        codecs.from_dict(group_messages.JoinRequest, body, "/m")


def test_to_jsonable_leaves_enums_types_and_containers_as_before():
    import enum
    from collections import namedtuple

    class Colour(str, enum.Enum):
        RED = "red"

    Pair = namedtuple("Pair", "a b")
    assert codecs.to_jsonable(Colour.RED) == "red" and type(codecs.to_jsonable(Colour.RED)) is str
    assert codecs.to_jsonable(task_records.OwnerInfo) is task_records.OwnerInfo  # a dataclass *type* is not converted
    assert codecs.to_jsonable(Pair(1, (2, 3))) == [1, [2, 3]]
    assert codecs.to_jsonable({1: task_records.OwnerInfo("b", 2)}) == {"1": {"broker": "b", "generation": 2}}
    omitted = group_messages.TaskDescriptor.OMIT_AT_DEFAULT

    def without_defaults(v: Any) -> Any:
        """asdict's output less the task descriptor's fields left out at their defaults."""
        if isinstance(v, dict):
            drop = "task_id" in v and "pin_mode" in v
            return {k: without_defaults(x) for k, x in v.items() if not (drop and k in omitted and omitted[k] == x)}
        return [without_defaults(x) for x in v] if isinstance(v, list) else v

    for p in PAYLOADS:
        assert json.loads(json.dumps(codecs.to_jsonable(p))) == without_defaults(
            json.loads(json.dumps(dataclasses.asdict(p)))
        )
    loaded = group_messages.TaskDescriptor("t", load=0.5, moved_recently=True)
    assert codecs.decode(group_messages.TaskDescriptor, codecs.encode(loaded)) == loaded


def test_decoders_built_by_several_threads_at_once_give_whole_values(monkeypatch: pytest.MonkeyPatch) -> None:
    """Workers decode on several threads (event thread, pool threads releasing tasks): the first decodes of a
    type, racing to build its converter, all get the complete value. Building is slowed down so that the
    threads really meet inside it."""
    import threading
    import time

    build = payload_validation._build_converter

    def slow_build(tp):  # type: ignore[no-untyped-def]
        time.sleep(0.002)
        return build(tp)

    monkeypatch.setattr(payload_validation, "_build_converter", slow_build)

    data = codecs.encode(
        task_records.TaskStatus(broker="b1", state="STOPPED", generation=3, updated=1.0, error="x", failures=2)
    )
    for _ in range(5):
        payload_validation._CONVERTERS.clear()
        barrier = threading.Barrier(8)
        results: list[object] = []

        def decode_one() -> None:
            barrier.wait()
            try:
                results.append(codecs.decode(task_records.TaskStatus, data, "/s"))
            except Exception as exc:  # collected: the assertion below names it
                results.append(exc)

        threads = [threading.Thread(target=decode_one, name=f"decode-{i}") for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        assert results == [codecs.decode(task_records.TaskStatus, data, "/s")] * 8
