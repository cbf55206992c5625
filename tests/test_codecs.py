"""Codecs: round trips, and every kind of garbage gives PayloadError with the path and reason."""

from __future__ import annotations

import dataclasses
import json

import pytest
from hypothesis import given, settings, strategies as st

from controller import codecs
from controller.codecs import PayloadError

PAYLOADS = [
    codecs.ControllerInfo(controller_id="c1", epoch=3, host="h", since=1.5),
    codecs.BrokerInfo(broker_id="b1", host="h", pid=42, group="g", capacity=2, rack="r1", instance_id="i1"),
    codecs.OwnerInfo(broker="b1", generation=7),
    codecs.GroupStateInfo(state="Stable", generation=4, join_generation=4, controller_epoch=2, protocol="cooperative",
                          assignor="sticky", leader="b1", members=("b1", "b2")),
    codecs.JoinRequest(member_id="b1", join_generation=5, generation=4, protocols=("cooperative", "eager"),
                       assignors=("sticky",), owned=("t1", "t2"), capacity=3, rack=None),
    codecs.JoinResult(generation=5, leader="b1", protocol="cooperative", assignor="sticky", controller_epoch=2,
                      members=(codecs.MemberMetadata(member_id="b1", owned=("t1",)),),
                      tasks=(codecs.TaskDescriptor(task_id="t1", weight=2, pinned=("b1",)),),
                      held=("t9",), previous={"b1": ("t1",)}),
    codecs.SyncProposal(generation=5, leader="b1", assigned={"b1": ("t1",)}, revoked={"b2": ("t3",)}),
    codecs.Assignment(generation=5, controller_epoch=2, assigned=("t1",), revoked=(), leader="b1"),
    codecs.TaskStatus(broker="b1", state="RUNNING", generation=5, updated=1.0, metrics={"rows": 10}),
    codecs.RebalanceRequest(group="g"),
    codecs.ControlledShutdownRequest(broker="b1"),
    codecs.ReassignRequest(task_id="t1", to="b2"),
    codecs.IntervalLog(broker="b1", intervals=(codecs.RunInterval(task_id="t1", broker="b1", start=1.0, end=2.0),)),
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
        codecs.decode(codecs.ControllerInfo, data, "/zkc/controller")
    assert info.value.path == "/zkc/controller"
    assert reason in info.value.reason
    assert "/zkc/controller" in str(info.value)


def test_nested_errors_name_the_field():
    body = json.loads(codecs.encode(PAYLOADS[5]))
    body["members"][0]["owned"] = [1]
    with pytest.raises(PayloadError, match=r"members\[0\]\.owned\[0\]"):
        codecs.from_dict(codecs.JoinResult, body, "/j")


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
