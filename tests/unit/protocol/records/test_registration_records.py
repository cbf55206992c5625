"""A broker registration's session readiness as decoded: untrusted, bounded, and absent from registrations of an
earlier release."""

from __future__ import annotations

import json

import pytest

from controller.protocol.records import codecs
from controller.protocol.records.payload_validation import PayloadError
from controller.protocol.records.registration_records import BrokerInfo, SessionInfo, SessionState


def _registration(session: object) -> bytes:
    body = {"version": 1, "broker_id": "b1", "host": "h", "pid": 1, "session": session}
    return json.dumps(body).encode()


# ---- the registration's session ----------------------------------------------------------------------
def test_session_round_trips_and_old_registrations_have_none() -> None:
    info = BrokerInfo("b1", "h", 1, runner="spark", session=SessionInfo(SessionState.READY, 1e9, startup_s=9.5))
    assert codecs.decode(BrokerInfo, codecs.encode(info)) == info
    old = b'{"version": 1, "broker_id": "b1", "host": "h", "pid": 1}'
    assert codecs.decode(BrokerInfo, old).session is None


@pytest.mark.parametrize(
    ("session", "reason"),
    [
        ({"state": "warm", "since": 1.0}, "is not one of"),
        ({"state": "ready"}, "missing field 'session.since'"),
        ({"state": "ready", "since": -5}, "not a wall time"),
        ({"state": "ready", "since": 1.0, "startup_s": -1}, "startup_s"),
        ({"state": "ready", "since": 1.0, "startup_s": 1e9}, "startup_s"),
        ({"state": "failed", "since": 1.0, "error": "x" * 501}, "over 500"),
        ({"state": "ready", "since": "now"}, "expected number"),
        ("ready", "expected an object"),
    ],
)
def test_a_session_out_of_bounds_is_a_payload_error(session: object, reason: str) -> None:
    with pytest.raises(PayloadError, match=reason):
        codecs.decode(BrokerInfo, _registration(session))


def test_a_session_that_is_not_a_finite_number_is_refused() -> None:
    data = b'{"version": 1, "broker_id": "b1", "host": "h", "pid": 1, "session": {"state": "ready", "since": NaN}}'
    with pytest.raises(PayloadError, match="not a wall time"):
        codecs.decode(BrokerInfo, data)
