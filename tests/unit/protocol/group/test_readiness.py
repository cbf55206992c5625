"""Which members the coordinator may place work on: those whose broker's registration says its session is ready (or
lazy, or has none)."""

from __future__ import annotations

from controller.protocol.group.readiness import broker_ready, placeable
from controller.protocol.records.registration_records import BrokerInfo, SessionInfo, SessionState


def test_only_a_ready_or_lazy_session_or_none_may_be_given_work() -> None:
    def info(state: SessionState | None) -> BrokerInfo:
        return BrokerInfo("b", "h", 1, session=None if state is None else SessionInfo(state, 1.0))

    assert broker_ready(info(None))  # a runner without a session (noop)
    assert broker_ready(info(SessionState.READY)) and broker_ready(info(SessionState.LAZY))
    assert not broker_ready(info(SessionState.STARTING)) and not broker_ready(info(SessionState.FAILED))
    assert not broker_ready(None)  # a registration that does not decode does not say it is ready
    members = {"a": 1, "b": 2, "c": 3}
    assert placeable(members, {"b", "x"}) == {"a": 1, "c": 3}
    assert placeable(members, set()) == members
