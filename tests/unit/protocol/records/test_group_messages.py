"""The roll's announcement (``incoming``) in the ``Assignment`` codec: an old payload without it decodes, a
broker of an earlier release reads one with it, a malformed one is refused."""

from __future__ import annotations

import dataclasses
import json

import pytest

from controller.protocol.records import codecs
from controller.protocol.records.group_messages import MAX_INCOMING, Assignment
from controller.protocol.records.payload_validation import PayloadError


# ---- the codec ------------------------------------------------------------------------------------------
def test_an_assignment_without_incoming_decodes():
    """An assignment of a controller before the warm-up: no field, nothing announced."""
    old = {"version": 1, "generation": 4, "controller_epoch": 2, "assigned": ["t1"], "revoked": []}
    a = codecs.decode(Assignment, json.dumps(old).encode())
    assert a.incoming == () and a.assigned == ("t1",)


def test_a_broker_of_an_earlier_release_reads_an_assignment_with_incoming():
    """Its codec knows no such field: the rest decodes, the field is ignored."""

    @dataclasses.dataclass(frozen=True)
    class EarlierAssignment:
        generation: int
        controller_epoch: int
        assigned: tuple[str, ...] = ()
        revoked: tuple[str, ...] = ()

    data = codecs.encode(Assignment(generation=4, controller_epoch=2, assigned=("t1",), incoming=("t2",)))
    assert codecs.decode(EarlierAssignment, data) == EarlierAssignment(4, 2, ("t1",))


def test_incoming_round_trips():
    a = Assignment(generation=4, controller_epoch=2, assigned=("t1",), incoming=("t2", "t3"))
    assert codecs.decode(Assignment, codecs.encode(a)) == a


@pytest.mark.parametrize(
    "incoming, why",
    [
        (["t2", "t2"], "twice"),
        (["t1"], "already assigned"),
        ([""], "empty"),
        (["x" * 201], "over 200"),
        ([f"t{i}" for i in range(MAX_INCOMING + 1)], f"over {MAX_INCOMING}"),
        ("t2", "expected an array"),
        ([2], "expected string"),
    ],
)
def test_a_malformed_incoming_is_refused(incoming, why):
    body = {"version": 1, "generation": 4, "controller_epoch": 2, "assigned": ["t1"], "incoming": incoming}
    with pytest.raises(PayloadError, match=why):
        codecs.decode(Assignment, json.dumps(body).encode(), "/groups/g/assignment/m")


# ---- the handoff of a planned move ----------------------------------------------------------------------
def test_handoff_round_trips_and_an_old_payload_has_none():
    a = Assignment(generation=4, controller_epoch=2, assigned=("t1",), revoked=("t4",), handoff=("t2", "t3"))
    assert codecs.decode(Assignment, codecs.encode(a)) == a
    old = {"version": 1, "generation": 4, "controller_epoch": 2, "assigned": ["t1"]}
    assert codecs.decode(Assignment, json.dumps(old).encode()).handoff == ()


@pytest.mark.parametrize(
    "handoff, why",
    [
        (["t2", "t2"], "twice"),
        (["t1"], "also assigned or revoked"),
        (["t4"], "also assigned or revoked"),
        ([""], "empty"),
        ([f"t{i}" for i in range(MAX_INCOMING + 1)], f"over {MAX_INCOMING}"),
        ("t2", "expected an array"),
    ],
)
def test_a_malformed_handoff_is_refused(handoff, why):
    body = {"version": 1, "generation": 4, "controller_epoch": 2, "assigned": ["t1"], "revoked": ["t4"]}
    body["handoff"] = handoff
    with pytest.raises(PayloadError, match=why):
        codecs.decode(Assignment, json.dumps(body).encode(), "/groups/g/assignment/m")
