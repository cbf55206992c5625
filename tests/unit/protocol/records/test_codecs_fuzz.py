"""Fuzzing of the decoders the codec tests do not cover (task specs, the epoch, deletion requests, the ACL
policy): anything at all gives the module's own error, never a bare exception; garbage group state and
assignments are refused, and a group rebuilt from unreadable state resumes above every known generation."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controller.protocol.cluster.acl import AclPolicy, SecurityError
from controller.protocol.group.vocabulary import GroupConfig
from controller.protocol.records import admin_records, codecs, group_messages, registration_records, task_records
from controller.protocol.records.payload_validation import PayloadError
from controller.protocol.tasks.spec import decode_task
from tests.payload_support import GARBAGE

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=20,
)
DATA = st.one_of(
    st.binary(max_size=200),
    JSON.map(lambda v: json.dumps(v).encode()),
    st.dictionaries(
        st.sampled_from(
            [
                "version",
                "id",
                "group",
                "state",
                "pipeline",
                "weight",
                "placement",
                "max_failures",
                "restart",
                "restart_nonce",
            ]
        ),
        JSON,
        max_size=6,
    ).map(lambda d: json.dumps(d).encode()),
)


@settings(max_examples=300, deadline=None)
@given(data=DATA)
def test_fuzz_task_spec_decoder(data):
    try:
        decode_task(data, "/zkc/tasks/t")
    except PayloadError:
        pass


@settings(max_examples=200, deadline=None)
@given(data=st.one_of(st.binary(max_size=40), st.integers().map(lambda i: str(i).encode()), DATA))
def test_fuzz_epoch_decoder(data):
    try:
        assert codecs.decode_epoch(data, "/e") >= 0
    except PayloadError:
        pass


@settings(max_examples=150, deadline=None)
@given(data=DATA)
def test_fuzz_delete_request_decoder(data):
    try:
        codecs.decode(admin_records.DeleteTaskRequest, data, "/d")
    except PayloadError:
        pass


@settings(max_examples=200, deadline=None)
@given(
    data=st.one_of(
        DATA,
        st.dictionaries(st.sampled_from(["controller", "broker", "admin", "reader", "x"]), JSON, max_size=4).map(
            lambda r: json.dumps({"version": 1, "roles": r}).encode()
        ),
    )
)
def test_fuzz_acl_policy_decoder(data):
    try:
        AclPolicy.decode(data)
    except SecurityError:
        pass


@pytest.mark.parametrize("data", GARBAGE)
def test_garbage_assignment_and_state_decoders(data):
    for cls in (
        group_messages.Assignment,
        group_messages.GroupStateInfo,
        group_messages.JoinRequest,
        task_records.OwnerInfo,
        registration_records.BrokerInfo,
    ):
        with pytest.raises(PayloadError):
            codecs.decode(cls, data, "/g")


def test_a_group_rebuilt_from_unreadable_state_resumes_above_every_known_generation():
    """Garbage in /groups/<g>/state on failover: the coordinator starts over, but above the generations
    its members and their assignments carry (members ignore older generations as stale)."""
    from controller.protocol.clock import SystemClock
    from controller.protocol.group.coordinator import GroupCoordinator
    from controller.protocol.group.vocabulary import WriteGroupState

    coord = GroupCoordinator(
        group="g", controller_epoch=3, clock=SystemClock(), config=GroupConfig(rebalance_timeout_s=5.0)
    )
    members = {
        m: group_messages.JoinRequest(
            member_id=m,
            join_generation=7,
            generation=7,
            protocols=("cooperative",),
            assignors=("sticky",),
            owned=("t1",) if m == "a" else (),
        )
        for m in ("a", "b")
    }
    assignments = {"a": group_messages.Assignment(generation=7, controller_epoch=2, assigned=("t1",), revoked=())}
    decisions = coord.load(None, members, {"t1": group_messages.TaskDescriptor(task_id="t1")}, assignments)
    states = [d.info for d in decisions if isinstance(d, WriteGroupState)]
    assert states and states[-1].state == "PreparingRebalance" and states[-1].join_generation == 8
