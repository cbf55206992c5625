"""Controller candidates: each running ``controller run`` holds ``/controller_candidates/<id>`` (ephemeral)
for as long as its session lives, so that a second candidate with the same id is refused, as a second broker
with the same id is, and ``zkctl controller list`` names every candidate beside the active one."""

from __future__ import annotations

import logging
import os
import socket
import time
from dataclasses import dataclass

from kazoo.client import KazooClient
from kazoo.exceptions import NodeExistsError, NoNodeError

from controller.protocol.cluster.layout import ZkLayout
from controller.protocol.errors import ZkcError
from controller.protocol.records import codecs
from controller.protocol.records.payload_validation import PayloadError
from controller.protocol.records.registration_records import CandidateInfo
from controller.zk.io import WAIT_S

log = logging.getLogger(__name__)
MAX_LISTED = 1000


class CandidateConflict(ZkcError, RuntimeError):
    """Another live process is a candidate under this controller id."""

    status = 409
    code = "controller_id_taken"


@dataclass(frozen=True)
class Candidate:
    """A listed candidate: its registration (None if unreadable, with why) and its session."""

    controller_id: str
    info: CandidateInfo | None
    session: int
    error: str | None = None


def _alive(pid: int, controller_id: str) -> bool:
    """Whether ``pid`` is a live process that looks like a controller with this id (not a recycled pid, nor
    a process of another container that shares the host name)."""
    try:
        import psutil  # type: ignore[import-untyped, unused-ignore]  # (no type information installed)

        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        cmdline = proc.cmdline()
        return "controller" in cmdline and controller_id in " ".join(cmdline)
    except Exception:  # gone, or not ours to inspect
        return False


class Candidacy:
    """Our candidate znode: registered before the controller stands for election, again after a new session."""

    def __init__(self, client: KazooClient, layout: ZkLayout, controller_id: str, host: str | None = None) -> None:
        self.client = client
        self.layout = layout
        self.path = layout.controller_candidate(controller_id)
        self.info = CandidateInfo(controller_id, host or socket.gethostname(), os.getpid(), time.time())

    def _holder(self) -> tuple[CandidateInfo | None, int | None]:
        try:
            data, stat = self.client.get(self.path)
        except NoNodeError:
            return None, None
        try:
            return codecs.decode(CandidateInfo, data, self.path), stat.ephemeralOwner
        except PayloadError:
            return None, stat.ephemeralOwner

    def register(self, wait_s: float) -> None:
        """Create our znode. Held by another live session: refused at once if that process runs on this host,
        else after waiting up to ``wait_s`` for the session of a crashed predecessor to expire."""
        who = self.info.controller_id
        self.client.ensure_path(self.layout.controller_candidates)
        deadline = time.monotonic() + wait_s
        waiting = False
        while True:
            try:
                self.client.create(self.path, codecs.encode(self.info), ephemeral=True)
                return
            except NodeExistsError:
                pass
            holder, session = self._holder()
            if session is None:
                continue  # gone meanwhile: create again
            if session == self.client.client_id[0]:
                return
            where = f" (pid {holder.pid} on {holder.host})" if holder else ""
            here = holder is not None and holder.host == self.info.host and holder.pid != self.info.pid
            if (here and holder is not None and _alive(holder.pid, who)) or time.monotonic() > deadline:
                raise CandidateConflict(
                    f"controller id {who} is already registered by a running candidate{where}; "
                    "stop it first or choose another --id"
                )
            if not waiting:
                waiting = True
                log.warning("controller %s: id held by an earlier session%s; waiting for it to expire", who, where)
            time.sleep(0.2)

    def ensure(self) -> None:
        """After a reconnection: our znode again if a new session lost it (another holder is logged, not fought)."""
        try:
            self.client.create(self.path, codecs.encode(self.info), ephemeral=True)
        except NodeExistsError:
            _holder, session = self._holder()
            if session is not None and session != self.client.client_id[0]:
                log.error(
                    "controller %s: another session holds its candidate znode %s", self.info.controller_id, self.path
                )
        except NoNodeError:
            self.client.ensure_path(self.layout.controller_candidates)
            self.client.create(self.path, codecs.encode(self.info), ephemeral=True)


def list_candidates(client: KazooClient, layout: ZkLayout) -> list[Candidate]:
    """Every registered candidate, sorted by id (at most ``MAX_LISTED``); garbage is listed with why."""
    try:
        names = sorted(client.get_children(layout.controller_candidates))[:MAX_LISTED]
    except NoNodeError:
        return []
    pending = [(n, client.get_async(f"{layout.controller_candidates}/{n}")) for n in names]
    out: list[Candidate] = []
    for n, result in pending:
        try:
            data, stat = result.get(timeout=WAIT_S)
        except NoNodeError:
            continue
        path = f"{layout.controller_candidates}/{n}"
        try:
            out.append(Candidate(n, codecs.decode(CandidateInfo, data, path), stat.ephemeralOwner))
        except PayloadError as exc:
            out.append(Candidate(n, None, stat.ephemeralOwner, exc.reason))
    return out


__all__ = ["Candidacy", "Candidate", "CandidateConflict", "list_candidates"]
