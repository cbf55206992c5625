"""Registration: our ephemeral broker znode and the session that holds it. An answer about that znode is
what proves our session alive (the fence's check); a znode held by another live session means we must not
run under this id."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from dataclasses import dataclass, replace
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

from controller.protocol.errors import ZkcError
from controller.protocol.records import codecs
from controller.protocol.records.payload_validation import PayloadError
from controller.protocol.records.registration_records import BrokerInfo, SessionInfo

log = logging.getLogger(__name__)


class RegistrationConflict(ZkcError, RuntimeError):
    """Our broker id is registered by another live session: we must not run, nor act in its name."""

    status = 409
    code = "conflict"


class IdentityMismatch(RegistrationConflict):
    """Our credentials are another broker's own (per-broker identities): we must not run under this id."""


@dataclass
class BrokerSession:
    """Who the broker is now, as each of its parts reads it: its id, the session that registered its broker
    znode (None before the first registration), the group generation its owner znodes, statuses and run
    intervals record, and whether it is closing. Only the worker (and its registration) write it."""

    broker_id: str
    session_id: int | None = None
    generation: int = -1
    closing: bool = False

    def is_closing(self) -> bool:
        return self.closing


class Registration:
    """Our broker znode: created at each new session, checked by the fence (``SessionCheck``)."""

    def __init__(
        self, client: KazooClient, path: str, info: BrokerInfo, session: BrokerSession, session_timeout_s: float
    ) -> None:
        self.client = client
        self.path = path
        self.info = info
        self.session = session
        self.session_timeout_s = session_timeout_s
        self._info_lock = threading.Lock()  # the event thread reports the session, the status thread the load

    # ---- the fence's session check ----------------------------------------------------------------
    @property
    def session_id(self) -> int | None:
        return self.session.session_id

    @property
    def connected(self) -> bool:
        return bool(self.client.connected)

    def exists(self) -> Any:
        """One round trip: the stat of our broker znode now (None: gone)."""
        return self.client.exists(self.path)

    def exists_async(self) -> Any:
        """The same, in flight (kazoo's async result)."""
        return self.client.exists_async(self.path)

    def owns(self, stat: Any) -> bool:
        """Whether an answer about our broker znode shows our session alive (it still owns the znode)."""
        return stat is not None and stat.ephemeralOwner == self.session.session_id

    # ---- registering ------------------------------------------------------------------------------
    def holder(self) -> tuple[BrokerInfo | None, Any]:
        """Who holds our broker znode now: its payload (None if unreadable) and stat, or (None, None)."""
        try:
            data, stat = self.client.get(self.path)
        except NoNodeError:
            return None, None
        try:
            return codecs.decode(BrokerInfo, data, self.path), stat
        except PayloadError:
            return None, stat

    def check_not_running_here(self) -> None:
        """Raise RegistrationConflict if our id is registered by another session whose process runs on this
        host (a duplicate ``broker run --id``): no need to wait for a session that cannot expire."""
        who = self.info.broker_id
        info, stat = self.holder()
        if stat is None or stat.ephemeralOwner == self.client.client_id[0] or info is None:
            return
        if info.host == socket.gethostname() and info.pid != os.getpid() and _process_alive(info.pid, who):
            raise RegistrationConflict(
                f"broker id {who} is already running (pid {info.pid} on {info.host}); "
                "stop it first or choose another --id"
            )

    def register(self) -> None:
        """Create our ephemeral broker znode. A znode of an earlier session of ours (a restart after a
        crash) goes once that session expires: wait for it, bounded; a live one is a duplicate id."""
        who = self.info.broker_id
        deadline = time.monotonic() + self.session_timeout_s * 3
        waiting = False
        while True:
            with self._info_lock:
                created = self.info
            try:
                self.client.create(self.path, codecs.encode(created), ephemeral=True)
                break
            except NodeExistsError:
                holder, stat = self.holder()
                if stat is not None and stat.ephemeralOwner == self.client.client_id[0]:
                    break
                if stat is not None:
                    self.check_not_running_here()
                    if time.monotonic() > deadline:
                        where = f" (pid {holder.pid} on {holder.host})" if holder else ""
                        raise RegistrationConflict(
                            f"broker id {who} is registered by another live session{where}; "
                            "stop that broker first or choose another --id"
                        ) from None
                    if not waiting:
                        waiting = True
                        log.warning(
                            "worker %s: id registered by an earlier session; waiting up to %.0fs for it to expire",
                            who,
                            deadline - time.monotonic(),
                        )
                time.sleep(0.2)
        with self._info_lock:
            self.session.session_id = self.client.client_id[0]
            if self.info is not created:  # a report (session, load) came while we registered
                self._write_own(self.info)

    def report_session(self, session: SessionInfo | None) -> None:
        """Our compute session's readiness into our broker znode (the controller places no work on us until it
        says ready); a later registration (a new session after LOST) carries it too."""
        with self._info_lock:
            self.info = replace(self.info, session=session)
            self._write_own(self.info)

    def report_load(self, load: dict[str, Any]) -> None:
        """Our measured load into our broker znode (the load-aware assignor and ``broker describe`` read it)."""
        with self._info_lock:
            self.info = replace(self.info, load=load)
            self._write_own(self.info)

    def _write_own(self, info: BrokerInfo) -> None:
        """``info`` into our broker znode only while our session holds it (checked and written at one version):
        a znode another live session holds under our id is never written in its name; ``info`` is kept, and our
        next registration carries it."""
        stat = self.client.exists(self.path)
        if not self.owns(stat):
            return
        try:
            self.client.set(self.path, codecs.encode(info), version=stat.version)
        except (BadVersionError, NoNodeError):
            pass  # it changed hands (or went) since: not ours to write


def _process_alive(pid: int, broker_id: str) -> bool:
    """Whether ``pid`` is a live process that looks like a broker with this id (not a recycled pid)."""
    try:
        import psutil  # type: ignore[import-untyped, unused-ignore]  # (no type information installed)

        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        return broker_id in " ".join(proc.cmdline())
    except Exception:  # gone, or not ours to inspect
        return False
