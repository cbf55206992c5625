"""The worker's connection states, acted on by its event thread (never inside kazoo's callback): STARTED
(register, start the runner's session, join), LOST (everything held is gone: stop it all and start over with a
new Member), CONNECTED again (a new session after LOST: register and rejoin from scratch; the same session: lift
the fence once it shows alive).

A part of the worker, given the parts it drives, its ``MemberRef`` and callables for what only the worker owns
(starting over with a new Member, its failure)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol.states import KazooState

from broker_sim.runners import TaskRunner
from broker_sim.worker.deps import MemberRef
from broker_sim.worker.events import AssignmentEvent, GroupStateEvent, ShutdownRequested
from broker_sim.worker.fence import Fence
from broker_sim.worker.group_io import GroupIO
from broker_sim.worker.registration import BrokerSession, Registration
from broker_sim.worker.slots import TaskTable
from broker_sim.worker.supervisor import TaskSupervisor
from controller.protocol.records.payload_validation import PayloadError
from controller.protocol.records.registration_records import SessionState

log = logging.getLogger(__name__)


class ConnectionHandler:
    """What each connection state does to the worker's parts."""

    def __init__(
        self,
        broker_id: str,
        client: KazooClient,
        runner: TaskRunner,
        registration: Registration,
        session: BrokerSession,
        table: TaskTable,
        fence: Fence,
        tasks: TaskSupervisor,
        io: GroupIO,
        *,
        members: MemberRef,
        new_member: Callable[[], None],
        do: Callable[[list[Any]], None],
        enqueue: Callable[[Any], None],
        fail: Callable[[str], None],
    ) -> None:
        self.id = broker_id
        self.client = client
        self.runner = runner
        self.registration = registration
        self.session = session
        self.table = table
        self.fence = fence
        self.tasks = tasks
        self.io = io
        self.members = members
        #: replaces the worker's Member with a fresh one (a lost session starts over)
        self.new_member = new_member
        self.do = do
        self.enqueue = enqueue
        #: the worker cannot run at all (the reason): the process must exit
        self.fail = fail

    def on_state(self, state: str) -> None:
        if state in ("STARTED",):
            self.registration.register()
            if not self.warm_up():
                return
            self.do(self.members.current.start(self.io.arm_watches()))
            self.enqueue(ShutdownRequested())
        elif state == str(KazooState.LOST):
            log.warning("worker %s: session lost; everything it held is gone", self.id)
            self.tasks.stop_all(release=False)
            with self.table.lock:
                self.table.session_lost()
                self.fence.clear()  # nothing runs and nothing is held: the next session starts clean
            self.do(self.members.current.stop())
            self.new_member()
        elif state == str(KazooState.CONNECTED):
            if self.session.closing:
                return
            session_id = self.session.session_id
            if self.client.client_id and session_id is not None and self.client.client_id[0] != session_id:
                # a new session after LOST: register again and rejoin from scratch; every watch of the old
                # session is gone, the controlled-shutdown one included (a request filed meanwhile counts)
                self.registration.register()
                if not self.warm_up():  # (ready already: only reports it, if a lost session cut that short)
                    return
                self.do(self.members.current.start(self.io.arm_watches()))
                self.enqueue(ShutdownRequested())
            elif self.fence.up:  # (if this fails, the probe lifts it once an answer shows the session alive)
                self.fence.resume_if_alive("reconnected and our session is alive")
            self.enqueue(GroupStateEvent())
            self.enqueue(AssignmentEvent())

    def warm_up(self) -> bool:
        """Before the first join: start the runner's session (a Spark broker's SparkSession), registered as
        ``starting`` meanwhile, then report it ready. False: it cannot start; the registration says why and the
        broker fails (the process exits with that message) rather than join a group it cannot serve."""
        info = self.runner.session_info()
        if info is not None and info.state is SessionState.STARTING:
            log.info("worker %s: starting its %s session before joining", self.id, self.runner.name)
            try:
                self.runner.warm_up()
            except Exception as exc:
                try:
                    self.registration.report_session(self.runner.session_info())
                except (KazooException, KazooTimeoutError, PayloadError):
                    pass  # the failure is ours to report; the znode goes with the process
                log.error("worker %s: %s", self.id, exc)
                self.fail(str(exc))
                return False
            info = self.runner.session_info()
            log.info("worker %s: session ready in %.1fs", self.id, (info.startup_s or 0.0) if info else 0.0)
        if self.registration.info.session != info:  # (also when a connection loss cut the last report short)
            self.registration.report_session(info)
        return True
