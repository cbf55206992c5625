"""What the worker's parts share, as one plain value built once by the worker (no part is given the worker,
nor a callable that looks one of its attributes up later), and the holder of its current Member (a lost
session replaces the Member; the parts that drive it read it here)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from kazoo.client import KazooClient

from broker_sim.worker.registration import BrokerSession
from broker_sim.worker.slots import TaskTable
from controller.protocol.cluster.layout import ZkLayout
from controller.protocol.group.member import Member


class MemberRef:
    """The worker's current Member: driven by the event thread only; ``renew`` starts over with a fresh one."""

    def __init__(self, factory: Callable[[], Member]) -> None:
        self._factory = factory
        self.current = factory()

    def renew(self) -> Member:
        self.current = self._factory()
        return self.current

    def follows_assignment_alone(self) -> bool:
        """Whether the member reconciles (read off the event thread as a hint: the event thread checks again)."""
        return self.current.follows_assignment_alone


@dataclass(frozen=True)
class WorkerDeps:
    """The worker's shared parts: its client and layout, who it is now, its task table and pool, its event
    queue's ``put`` (kazoo callbacks and pool threads only enqueue), the event set once it stops, its Member."""

    client: KazooClient
    layout: ZkLayout
    session: BrokerSession
    table: TaskTable
    pool: ThreadPoolExecutor
    enqueue: Callable[[object], None]
    stopped: threading.Event
    members: MemberRef

    @property
    def who(self) -> str:
        return self.session.broker_id
