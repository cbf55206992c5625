"""The small refusals of hostile input that need no ZooKeeper: bounded registrations, bounded 404s. (Their
counterparts against the real server: tests/integration/test_hostile_requests.py.)"""

from __future__ import annotations

import json

import pytest

from controller.admin.reads import UNKNOWN_STAT, broker_view
from controller.protocol import codecs
from controller.protocol.codecs import PayloadError
from controller.protocol.layout import ZkLayout


def test_a_huge_host_in_a_registration_is_refused_when_decoded_and_never_printed_whole() -> None:
    huge = "h" * 900_000
    data = json.dumps({"version": 1, "broker_id": "b1", "host": huge, "pid": 1}).encode()
    with pytest.raises(PayloadError) as err:
        codecs.decode(codecs.BrokerInfo, data, "/zkc/brokers/ids/b1")
    assert len(str(err.value)) < 300 and "host" in str(err.value)
    view = broker_view(ZkLayout("/zkc"), "b1", (data, UNKNOWN_STAT), tasks=0, shutting=False)
    shown = json.dumps(codecs.to_jsonable(view))
    assert view.host is None and len(shown) < 2_000 and huge[:1000] not in shown
    for field in ("rack", "instance_id", "runner", "group"):
        body = {"version": 1, "broker_id": "b1", "host": "h", "pid": 1, field: "x" * 201}
        with pytest.raises(PayloadError):
            codecs.decode(codecs.BrokerInfo, json.dumps(body).encode(), "/zkc/brokers/ids/b1")
    ctl = {"version": 1, "controller_id": "c", "epoch": 1, "host": huge, "since": 0.0}
    with pytest.raises(PayloadError):
        codecs.decode(codecs.ControllerInfo, json.dumps(ctl).encode(), "/zkc/controller")
    ok = codecs.BrokerInfo(broker_id="b1", host="a" * 255, pid=1)
    assert codecs.decode(codecs.BrokerInfo, codecs.encode(ok), "/zkc/brokers/ids/b1") == ok
