"""Warm brokers, the controller's side: a member whose broker's registration says its session is not ready is
not a member the coordinator (and so no assignor) sees, whatever its join request says; the member joins the
next generation once its registration says ready. Real ZooKeeper, a real controller and a real worker; the
not-yet-ready broker is planted the way a broker process would write it (its registration and join request,
ephemeral, on a session of its own), before the controller starts, so the failover load is covered too."""

from __future__ import annotations

import time

from controller.admin import AdminClient
from controller.protocol.group.member import Member, WriteJoin
from controller.protocol.group.rules import run_assignor
from controller.protocol.records import codecs
from controller.protocol.records.group_messages import Assignment
from controller.protocol.records.registration_records import BrokerInfo, SessionInfo, SessionState
from tests.controller_support import create_tasks, group_state, join_request, settle
from tests.waiting import wait_until

TASKS = [f"t{i}" for i in range(6)]


def _registration(state: SessionState, **kw: object) -> bytes:
    session = SessionInfo(state, time.time(), **kw)  # type: ignore[arg-type]
    return codecs.encode(BrokerInfo("b", "host-b", 4242, runner="spark", session=session))


def test_a_member_whose_session_is_not_ready_gets_no_work_until_it_is(cluster, zk, layout) -> None:
    b = cluster.client()  # broker b's own session: its znodes are ephemeral, as a broker's are
    b.create(layout.broker("b"), _registration(SessionState.STARTING), ephemeral=True)
    b.create(layout.group_member("default", "b"), join_request("b"), ephemeral=True, makepath=True)
    ctl = cluster.controller("c")
    a = cluster.worker("a")  # a no-op broker: no session to wait for
    create_tasks(zk, layout, TASKS)
    wait_until(lambda: a.running_tasks() == set(TASKS), 20, "every task running on a")
    settle(ctl)
    st = group_state(zk, layout)
    assert st is not None and st.members == ("a",), st
    assert zk.exists(layout.group_assignment("default", "b")) is None, "b was given an assignment"
    generation = st.generation
    shown = {v.broker_id: v.session for v in AdminClient(zk, layout).status().brokers}
    assert shown["a"] is None and shown["b"] is not None and shown["b"]["state"] == "starting", shown

    # garbage in its registration is not a ready session either
    b.set(layout.broker("b"), b'{"version": 1, "broker_id": "b", "host": "h", "pid": 1, "session": {"state": 7}}')
    settle(ctl)
    st = group_state(zk, layout)
    assert st is not None and st.members == ("a",) and st.generation == generation, st

    # b writes a current join request (what its member state machine asks for now): still not a member
    member = Member("b", run_assignor, protocols=("cooperative", "eager"), assignors=("cooperative-sticky",))
    write = next(act for act in member.start(group_state(zk, layout)) if isinstance(act, WriteJoin))
    b.set(layout.group_member("default", "b"), codecs.encode(write.request))
    settle(ctl)
    st = group_state(zk, layout)
    assert st is not None and st.members == ("a",) and st.generation == generation, st

    # its session is ready: b is a member of the next generation, and the leader's assignment gives it tasks
    b.set(layout.broker("b"), _registration(SessionState.READY, startup_s=3.5))

    def b_assigned() -> bool:
        if zk.exists(layout.group_assignment("default", "b")) is None:
            return False
        got = codecs.decode(Assignment, zk.get(layout.group_assignment("default", "b"))[0])
        return got.generation > generation

    wait_until(lambda: (s := group_state(zk, layout)) is not None and "b" in s.members, 20, "b in the group")
    wait_until(b_assigned, 20, "an assignment for b")
    assert ctl.ctx is not None and "b" not in ctl.ctx.unready_brokers()
