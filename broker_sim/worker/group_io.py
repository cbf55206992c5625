"""The group's znodes as one member reads and writes them: the watches a new session arms, the group state, its
assignment, join results and its controlled-shutdown request read (garbage logged and ignored, never a crash of
the worker), and its join request and the leader's proposal written.

A part of the worker, run on its event thread; the watches only enqueue (kazoo's threads)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

from kazoo.client import KazooClient
from kazoo.exceptions import NodeExistsError, NoNodeError

from broker_sim.worker.events import (
    AssignmentEvent,
    CoordinatorEvent,
    GroupStateEvent,
    JoinResultEvent,
    ShutdownRequested,
)
from controller.protocol.cluster.layout import ZkLayout
from controller.protocol.records import codecs
from controller.protocol.records.admin_records import ControlledShutdownRequest
from controller.protocol.records.group_messages import Assignment, GroupStateInfo, JoinRequest, JoinResult, SyncProposal
from controller.protocol.records.payload_validation import PayloadError

log = logging.getLogger(__name__)

T = TypeVar("T")


class GroupIO:
    """One member's reads and writes of its group's znodes, and the watches it keeps on them."""

    def __init__(
        self, client: KazooClient, layout: ZkLayout, broker_id: str, group: str, enqueue: Callable[[Any], None]
    ) -> None:
        self.client = client
        self.layout = layout
        self.id = broker_id
        self.group = group
        self.enqueue = enqueue
        #: whether our watch on the group state is armed: not while the member follows its assignment alone
        self.group_state_watched = False
        self._member_written = False  # whether this session created our request znode (else the first write creates it)

    # ---- watches: enqueue only (kazoo's threads) ------------------------------------------------------
    def watch_group_state(self, _event: Any = None) -> None:
        self.enqueue(GroupStateEvent())

    def watch_assignment(self, _event: Any = None) -> None:
        self.enqueue(AssignmentEvent())

    def watch_controller(self, _event: Any = None) -> None:
        self.enqueue(CoordinatorEvent())

    def watch_shutdown(self, _event: Any = None) -> None:
        self.enqueue(ShutdownRequested())

    # ---- reads ------------------------------------------------------------------------------------
    def arm_watches(self) -> GroupStateInfo | None:
        """A new session (registered): arm every watch a member needs (the controller, a controlled-shutdown
        request, our assignment, the group state) and read the group state, in one pipelined round instead
        of five round trips one after the other before the join (a broker's start is on the path of every
        rebalance it triggers). A znode that may be missing gets an ``exists`` with its read: a ``get`` of a
        missing znode leaves no watch. An assignment from a previous life is ignored by its generation."""
        assignment = self.layout.group_assignment(self.group, self.id)
        state = self.layout.group_state(self.group)
        arms = [
            self.client.exists_async(self.layout.controller, watch=self.watch_controller),
            self.client.exists_async(self.layout.admin_controlled_shutdown_of(self.id), watch=self.watch_shutdown),
            self.client.exists_async(assignment, watch=self.watch_assignment),
            self.client.exists_async(state, watch=self.watch_group_state),
        ]
        read = self.client.get_async(state, watch=self.watch_group_state)
        for pending in arms:
            pending.get()  # (raises on a connection loss, as the reads one by one did)
        self.group_state_watched = True
        self._member_written = False  # this session has no request znode yet: the first write creates it
        try:
            data, _ = read.get()
        except NoNodeError:
            return None
        return self.decoded(GroupStateInfo, data, state)

    def read_shutdown_request(self) -> tuple[bool, ControlledShutdownRequest | None]:
        """Whether our controlled-shutdown request's znode is there (its watch armed either way), and what it
        asks (None: garbage, which counts as an ordinary controlled shutdown)."""
        path = self.layout.admin_controlled_shutdown_of(self.id)
        try:
            data, _ = self.client.get(path, watch=self.watch_shutdown)
        except NoNodeError:
            self.client.exists(path, watch=self.watch_shutdown)
            return False, None
        return True, self.decoded(ControlledShutdownRequest, data, path)

    def controller_present(self) -> bool:
        """Whether a controller is active (the watch on ``/controller`` armed again)."""
        return self.client.exists(self.layout.controller, watch=self.watch_controller) is not None

    def _read_watched(self, cls: type[T], path: str, watch: Callable[[Any], None]) -> T | None:
        """Read and decode one znode, leaving a watch on it whether or not it exists yet; garbage there
        is logged and ignored (None), never a crash of the worker."""
        try:
            data, _ = self.client.get(path, watch=watch)
        except NoNodeError:
            self.client.exists(path, watch=watch)
            return None
        return self.decoded(cls, data, path)

    def decoded(self, cls: type[T], data: bytes, path: str) -> T | None:
        """``data`` decoded as ``cls``; garbage is logged and ignored (None), never a crash of the worker."""
        try:
            return codecs.decode(cls, data, path)
        except PayloadError as exc:
            log.warning("worker %s: ignoring %s", self.id, exc)
            return None

    def read_group_state(self) -> GroupStateInfo | None:
        info = self._read_watched(GroupStateInfo, self.layout.group_state(self.group), self.watch_group_state)
        self.group_state_watched = True  # (armed by the read, whether or not the znode exists)
        return info

    def read_assignment(self) -> Assignment | None:
        return self._read_watched(Assignment, self.layout.group_assignment(self.group, self.id), self.watch_assignment)

    def watch_join_result(self, generation: int) -> None:
        """We led the last generation, and the coordinator keeps a leader that rejoins: watch the join result
        of the generation we just joined, so that we read it as soon as it is written rather than after the
        group state announcing it (AwaitingSync, written with it) has been read first: one round trip less
        between the join and the proposal. Only this member watches it (everyone reading a join result of
        thousands of tasks would cost more than it saves); a new leader learns it from the state."""
        path = self.layout.group_join(self.group, generation)
        pending = self.client.exists_async(path, watch=lambda _e: self.enqueue(JoinResultEvent(generation)))

        def already_there(result: Any) -> None:  # kazoo's thread: enqueue only
            try:
                if result.get(block=False) is not None:
                    self.enqueue(JoinResultEvent(generation))
            except Exception:
                pass

        pending.rawlink(already_there)

    def read_join_result(self, generation: int, missing_ok: bool = False) -> JoinResult | None:
        path = self.layout.group_join(self.group, generation)
        try:
            data, _ = self.client.get(path)
            return codecs.decode(JoinResult, data, path)
        except NoNodeError as exc:
            if not missing_ok:
                log.warning("worker %s: cannot read join result %s: %s", self.id, path, exc)
            return None
        except PayloadError as exc:
            log.warning("worker %s: cannot read join result %s: %s", self.id, path, exc)
            return None

    # ---- writes -----------------------------------------------------------------------------------
    def write_join(self, request: JoinRequest) -> None:
        """Our join request (ephemeral): created by a new session's first write, rewritten after."""
        path = self.layout.group_member(self.group, self.id)
        data = codecs.encode(request)
        if self._member_written:
            try:
                self.client.set(path, data)
            except NoNodeError:
                self.client.create(path, data, ephemeral=True, makepath=True)
        else:  # a new session's first request: create it (one round trip, not a failed set first)
            try:
                self.client.create(path, data, ephemeral=True, makepath=True)
            except NodeExistsError:  # an earlier session's, not expired yet
                self.client.set(path, data)
            self._member_written = True

    def write_proposal(self, proposal: SyncProposal) -> None:
        """The leader's proposal for its generation (raises if it could not be written)."""
        path = self.layout.group_sync(self.group, proposal.generation)
        data = codecs.encode(proposal)
        try:
            self.client.create(path, data, makepath=True)
        except NodeExistsError:
            self.client.set(path, data)
