"""The small refusals of hostile input that need no ZooKeeper: bounded registrations, bounded 404s. (Their
counterparts against the real server: tests/integration/security/test_hostile_requests.py.)"""

from __future__ import annotations

import json

import pytest

from controller.admin.reads import UNKNOWN_STAT, broker_view
from controller.protocol.cluster.layout import ZkLayout
from controller.protocol.records import codecs, registration_records
from controller.protocol.records.payload_validation import PayloadError


def test_a_huge_host_in_a_registration_is_refused_when_decoded_and_never_printed_whole() -> None:
    huge = "h" * 900_000
    data = json.dumps({"version": 1, "broker_id": "b1", "host": huge, "pid": 1}).encode()
    with pytest.raises(PayloadError) as err:
        codecs.decode(registration_records.BrokerInfo, data, "/zkc/brokers/ids/b1")
    assert len(str(err.value)) < 300 and "host" in str(err.value)
    view = broker_view(ZkLayout("/zkc"), "b1", (data, UNKNOWN_STAT), tasks=0, shutting=False)
    shown = json.dumps(codecs.to_jsonable(view))
    assert view.host is None and len(shown) < 2_000 and huge[:1000] not in shown
    for field in ("rack", "instance_id", "runner", "group"):
        body = {"version": 1, "broker_id": "b1", "host": "h", "pid": 1, field: "x" * 201}
        with pytest.raises(PayloadError):
            codecs.decode(registration_records.BrokerInfo, json.dumps(body).encode(), "/zkc/brokers/ids/b1")
    ctl = {"version": 1, "controller_id": "c", "epoch": 1, "host": huge, "since": 0.0}
    with pytest.raises(PayloadError):
        codecs.decode(registration_records.ControllerInfo, json.dumps(ctl).encode(), "/zkc/controller")
    ok = registration_records.BrokerInfo(broker_id="b1", host="a" * 255, pid=1)
    assert codecs.decode(registration_records.BrokerInfo, codecs.encode(ok), "/zkc/brokers/ids/b1") == ok


def test_a_refused_name_is_quoted_escaped_and_bounded() -> None:
    from controller.api.errors import MAX_MESSAGE_CHARS, error_response
    from controller.protocol.cluster.layout import InvalidName, check_name

    with pytest.raises(InvalidName) as err:
        check_name("task id", "\x1b[31m" + "y" * 100_000)
    message = str(err.value)
    assert len(message) < 300 and "\x1b" not in message and "\\x1b" in message and "100005 characters" in message
    with pytest.raises(InvalidName, match="invalid group 'a/b'"):
        check_name("group", "a/b")  # a short one is shown whole
    body = json.loads(error_response(404, "not_found", "z" * 50_000).body)
    assert len(body["message"]) < MAX_MESSAGE_CHARS + 40 and body["message"].endswith("(50000 characters)")


def test_a_registration_names_a_legal_broker_and_group() -> None:
    for field, value in (("broker_id", "b<1>"), ("group", "bad<g>"), ("group", "")):
        body = {"version": 1, "broker_id": "b1", "host": "h", "pid": 1, field: value}
        with pytest.raises(PayloadError, match="not a legal name"):
            codecs.decode(registration_records.BrokerInfo, json.dumps(body).encode(), "/zkc/brokers/ids/b1")
