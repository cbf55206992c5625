"""Protocol error codes, each with behaviour flags that the member's reaction table reads
(after Kafka's ``Errors``): retry, rejoin, reset the generation, rediscover the coordinator."""

from __future__ import annotations

from enum import Enum
from typing import ClassVar


class ZkcError(Exception):
    """The root of every error this project raises (after kazoo's ``KazooException``). Each kind also stays
    under the builtin it was under (``ValueError``, ``RuntimeError``), so ``except ValueError`` still works.

    ``user_facing`` kinds are the operator's or the client's problem (a malformed spec, an unknown task, an
    unreachable ZooKeeper): the CLI prints one line, the API answers ``status`` with ``{"error": code}``. The
    others are the product's own conditions (a fenced write, an illegal transition): a traceback, a 500."""

    user_facing: ClassVar[bool] = True
    status: int = 400
    code: str = "bad_request"


class InternalError(ZkcError):
    """A condition of the product's own, not its user's: never turned into a one-line user error."""

    user_facing: ClassVar[bool] = False
    status: int = 500
    code: str = "internal"


class ProtocolError(Enum):
    #                         (retriable, rejoin, reset_generation, rediscover_coordinator, doc)
    REBALANCE_IN_PROGRESS = (True, True, False, False, "the group is rebalancing: rejoin")
    ILLEGAL_GENERATION = (True, True, True, False, "stale generation: reset it and rejoin")
    UNKNOWN_MEMBER_ID = (True, True, True, False, "the coordinator does not know this member: reset and rejoin")
    NOT_COORDINATOR = (True, True, False, True, "the answering controller is not (or no longer) active")
    COORDINATOR_NOT_AVAILABLE = (True, True, False, True, "no active controller: wait for one, then rejoin")
    INCONSISTENT_PROTOCOL = (False, True, True, False, "no protocol that every member supports")
    REBALANCE_TIMEOUT = (True, True, True, False, "the member did not rejoin within the rebalance timeout")
    INVALID_ASSIGNMENT = (True, True, False, False, "the leader's proposal was refused by the coordinator")
    INVALID_REPORT = (
        True,
        True,
        False,
        False,
        "the member's request or report was refused (out of bounds): rewrite it",
    )

    def __init__(self, retriable: bool, rejoin: bool, reset_generation: bool, rediscover: bool, doc: str) -> None:
        self.retriable = retriable
        self.rejoin = rejoin
        self.reset_generation = reset_generation
        self.rediscover_coordinator = rediscover
        self.doc = doc

    @classmethod
    def parse(cls, name: str | None) -> ProtocolError | None:
        if name is None:
            return None
        try:
            return cls[name]
        except KeyError:
            return None
