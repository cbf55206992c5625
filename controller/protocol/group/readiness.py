"""Which members may be given work: a member whose broker's registration says its compute session is not
ready (a Spark broker still starting its SparkSession, or one whose session failed) is left out of the
snapshot the group coordinator sees, so no assignor, on the leader or on the controller, places a task on
it. A task placed is then a task about to run, not one waiting for a JVM. Pure: the daemon passes what it
read from ZooKeeper."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

from controller.protocol.records.registration_records import BrokerInfo

V = TypeVar("V")


def broker_ready(info: BrokerInfo | None) -> bool:
    """Whether a broker may be given work, from its registration as decoded (None: unreadable, so it does not
    say its session is ready). A broker without a session (a no-op runner) is always ready."""
    if info is None:
        return False
    return info.session is None or info.session.ready


def placeable(members: Mapping[str, V], unready: frozenset[str] | set[str]) -> dict[str, V]:
    """``members`` without the ones whose broker is not ready. A member with no registration at all keeps
    its place: readiness is what a registration says, and its absence is the session's business (the
    member's own znode goes with it)."""
    return {m: r for m, r in members.items() if m not in unready}


__all__ = ["broker_ready", "placeable"]
