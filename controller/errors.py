"""Protocol error codes, each with behaviour flags that the member's reaction table reads
(after Kafka's ``Errors``): retry, rejoin, reset the generation, rediscover the coordinator."""

from __future__ import annotations

from enum import Enum


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

    def __init__(self, retriable: bool, rejoin: bool, reset_generation: bool, rediscover: bool, doc: str) -> None:
        self.retriable = retriable
        self.rejoin = rejoin
        self.reset_generation = reset_generation
        self.rediscover_coordinator = rediscover
        self.doc = doc

    @classmethod
    def parse(cls, name: str | None) -> "ProtocolError | None":
        if name is None:
            return None
        try:
            return cls[name]
        except KeyError:
            return None
