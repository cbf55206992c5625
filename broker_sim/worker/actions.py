"""The member's actions carried out: the sans-IO ``Member`` decides (write our join request, read a join result,
write the leader's proposal, run this set of tasks, exit), and this executes each decision on the event thread
through the group's znodes (``GroupIO``) and the task supervisor.

A part of the worker, given the few things it acts on; the Member is read from the worker's ``MemberRef`` at
each action, since a lost session replaces it."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from broker_sim.worker.deps import MemberRef
from broker_sim.worker.events import Owned
from broker_sim.worker.group_io import GroupIO
from broker_sim.worker.slots import TaskTable
from controller.protocol.group.member import Exit, Member, ReadJoinResult, SetDesired, WriteJoin, WriteProposal

log = logging.getLogger(__name__)


class ActionExecutor:
    """Executes a list of the Member's actions, in order (an action's answer may bring more: done at once)."""

    def __init__(
        self,
        broker_id: str,
        io: GroupIO,
        table: TaskTable,
        *,
        members: MemberRef,
        reconcile: Callable[[], None],
        enqueue: Callable[[Any], None],
        exited: threading.Event,
    ) -> None:
        self.id = broker_id
        self.io = io
        self.table = table
        self.members = members
        self.reconcile = reconcile
        self.enqueue = enqueue
        self.exited = exited

    @property
    def member(self) -> Member:
        return self.members.current

    def do(self, actions: list[Any]) -> None:
        for act in actions:
            if isinstance(act, WriteJoin):
                self.io.write_join(act.request)
                group = self.member.group
                if group is not None and group.leader == self.id:
                    self.io.watch_join_result(act.request.join_generation)
            elif isinstance(act, ReadJoinResult):
                result = self.io.read_join_result(act.generation)
                if result is not None:
                    self.do(self.member.on_join_result(result))
            elif isinstance(act, WriteProposal):
                try:
                    self.io.write_proposal(act.proposal)
                except Exception:
                    self.member.proposal_not_written(act.proposal.generation)
                    raise
            elif isinstance(act, SetDesired):
                with self.table.lock:
                    self.table.desired = act.tasks
                self.reconcile()
                if self.member.reconcile_mode:
                    self.enqueue(Owned())  # what we hold now that the stops and starts are under way
            elif isinstance(act, Exit):
                log.info("worker %s: controlled shutdown complete", self.id)
                self.exited.set()
