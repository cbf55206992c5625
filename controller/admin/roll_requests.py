"""The planned roll's requests: start one (``/admin/roll``, the group's brokers in order, ``batch`` at a
time), resume a paused one, read where one stands. The controller carries it out
(``controller.daemon.roll_driver``)."""

from __future__ import annotations

import dataclasses
import time

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

from controller.admin.common import AdminError
from controller.protocol.cluster.layout import ZkLayout, check_name
from controller.protocol.cluster.roll_plan import (
    DEFAULT_WARMUP_S,
    DEFAULT_WAVE,
    MAX_WARMUP_S,
    MAX_WAVE,
    RollState,
    roll_order,
)
from controller.protocol.records import codecs
from controller.protocol.records.payload_validation import PayloadError
from controller.protocol.records.registration_records import BrokerInfo


class RollAdmin:
    """``roll``, ``resume_roll``, ``roll_status``: one znode, written at the version read."""

    def __init__(self, client: KazooClient, layout: ZkLayout) -> None:
        self.client = client
        self.layout = layout

    def _read(self) -> tuple[RollState | None, int]:
        path = self.layout.admin_roll
        try:
            data, stat = self.client.get(path)
        except NoNodeError:
            return None, -1
        if not data:
            return None, stat.version
        try:
            return codecs.decode(RollState, data, path), stat.version
        except PayloadError as exc:
            raise AdminError(f"{exc}; a new `zkctl broker roll` replaces it") from None

    def roll_status(self) -> RollState | None:
        """The roll in progress, paused or last done (None: none was ever asked for)."""
        return self._read()[0]

    def roll(
        self,
        group: str = "default",
        batch: int = 1,
        timeout_s: float = 300.0,
        wave: int = DEFAULT_WAVE,
        warmup_s: float = DEFAULT_WARMUP_S,
        in_place: bool = False,
    ) -> RollState:
        """Start rolling ``group``'s brokers (the live brokers registered in it now, members yet or not: a broker
        still starting its session is one to roll), ``batch`` at a time; each batch must come back
        within ``timeout_s`` (else the roll pauses itself); ``wave``: at most that many tasks in flight at once
        (0: a step's moves all at once); ``warmup_s``: how long each step's first wave waits for the brokers
        receiving its tasks to prepare their starts (0: no wait); ``in_place``: the first batch's tasks wait for its
        restart instead of moving away before it goes down (fewer moves, each of those tasks down for a restart)."""
        check_name("group", group)
        if batch < 1 or timeout_s <= 0 or not 0 <= wave <= MAX_WAVE or not 0 <= warmup_s <= MAX_WARMUP_S:
            raise AdminError(
                f"a roll needs --batch >= 1, --timeout > 0, 0 <= --wave <= {MAX_WAVE} "
                f"and 0 <= --warmup <= {MAX_WARMUP_S:g}"
            )
        current, version = self._read()
        if current is not None and current.phase != "done":
            raise AdminError(
                f"a roll of group {current.group} is {current.phase}"
                + (f" ({current.reason})" if current.reason else "")
                + "; `zkctl broker roll --resume` goes on with it"
            )
        members = self._group_brokers(group)
        if not members:
            raise AdminError(f"group {group} has no live brokers to roll")
        now = time.time()
        state = RollState(
            group=group,
            order=roll_order(members, batch),
            batch=batch,
            timeout_s=timeout_s,
            since=now,
            started=now,
            wave=wave,
            warmup_s=warmup_s,
            in_place=in_place,
        )
        path = self.layout.admin_roll
        try:
            if version == -1:
                self.client.create(path, codecs.encode(state), makepath=True)
            else:
                self.client.set(path, codecs.encode(state), version=version)
        except (NodeExistsError, BadVersionError):
            raise AdminError("another roll was asked for at the same time; see `zkctl broker roll --status`") from None
        return state

    def _group_brokers(self, group: str) -> list[str]:
        """The live brokers whose registration names ``group`` (a member znode with no registration behind it
        is no broker: it is not rolled). Reads pipelined, one per broker; a registration that does not decode
        is left out (its broker is shown as such by ``broker list``)."""
        try:
            ids = self.layout.legal_children(self.layout.broker_ids, self.client.get_children(self.layout.broker_ids))
        except NoNodeError:
            return []
        pending = [(b, self.client.get_async(self.layout.broker(b))) for b in ids]
        out = []
        for b, res in pending:
            try:
                data, _ = res.get()
                info = codecs.decode(BrokerInfo, data, self.layout.broker(b))
            except (NoNodeError, PayloadError):
                continue
            if info.group == group:
                out.append(b)
        return out

    def resume_roll(self) -> RollState:
        """Go on with a paused roll from the phase it paused in (its bound counted afresh)."""
        current, version = self._read()
        if current is None:
            raise AdminError("no roll to resume")
        if current.phase != "paused":
            raise AdminError(f"the roll of group {current.group} is {current.phase}, not paused")
        state = dataclasses.replace(
            current, phase=current.resume_phase or "drain", resume_phase="", reason="", since=time.time()
        )
        try:
            self.client.set(self.layout.admin_roll, codecs.encode(state), version=version)
        except (BadVersionError, NoNodeError):
            raise AdminError("the roll changed under this request; try again") from None
        return state
