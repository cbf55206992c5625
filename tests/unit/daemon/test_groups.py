"""A member znode read before its broker's registration is the usual race of a first start: logged at INFO,
and the member still set apart until the registration is seen; a member znode held by another session than
the broker's is news, at WARNING. Pure: the controller's context in memory, no ZooKeeper."""

from __future__ import annotations

import logging
from types import SimpleNamespace

from controller.daemon.context import BrokerRecord, ControllerContext
from controller.daemon.groups import record_member


def _levels(caplog) -> list[int]:
    return [r.levelno for r in caplog.records if "ignoring member znode" in r.getMessage()]


def test_member_before_its_broker_is_info_and_a_foreign_session_is_a_warning(caplog):
    caplog.set_level(logging.INFO, logger="controller.daemon.groups")
    ctx = ControllerContext()
    stat = SimpleNamespace(ephemeralOwner=7)
    assert record_member(ctx, "g", "b1", b"{}", stat, "/zkc/groups/g/members/b1") is False
    assert ("g", "b1") in ctx.ghost_members and _levels(caplog) == [logging.INFO]
    caplog.clear()
    ctx.ghost_members.clear()
    ctx.brokers["b2"] = BrokerRecord(epoch=1, info=None, session=8)
    assert record_member(ctx, "g", "b2", b"{}", stat, "/zkc/groups/g/members/b2") is False
    assert _levels(caplog) == [logging.WARNING]
