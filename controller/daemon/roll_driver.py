"""The planned roll (``/admin/roll``), carried out on the event thread: each step's plan
(``controller.protocol.cluster.roll_plan``) pinned on the group's coordinator, the batch asked to shut down once it owns
nothing, its return under the same ids (a new registration, joined, the group Stable) awaited, then the
next batch; the roll pauses itself, with the reason in the znode, when a phase outlasts its bound. Its
state lives in ZooKeeper, so ``roll --resume`` and a new controller go on from where it stood."""

from __future__ import annotations

import dataclasses
import logging
import time

from kazoo.exceptions import NoNodeError

from controller.daemon import events as ev
from controller.daemon.host import Host, context_of, writer_of
from controller.protocol.cluster.layout import ZkLayout
from controller.protocol.cluster.roll_plan import (
    Plan,
    RollState,
    balance_plan,
    drain_plan,
    hold_plan,
    incoming_of,
    next_wave,
    placed,
)
from controller.protocol.group.coordinator import GroupCoordinator
from controller.protocol.group.state import GroupState
from controller.protocol.records import codecs
from controller.protocol.records.admin_records import ControlledShutdownRequest
from controller.protocol.records.payload_validation import PayloadError
from controller.zk.io import InterruptibleClient

log = logging.getLogger(__name__)


class RollDriver:
    """One roll at a time, advanced after every event the controller processes."""

    def __init__(self, host: Host, zk: InterruptibleClient, layout: ZkLayout, controller_id: str) -> None:
        self._host = host
        self._zk = zk
        self._layout = layout
        self._id = controller_id
        self._state: RollState | None = None
        self._read_token = -1
        #: (token, step, phase) of the plan pinned last, and that plan
        self._applied: tuple[int, int, str] | None = None
        self._plan: Plan | None = None
        #: the wave of that plan pinned last (None: the plan's first wave is still to pin)
        self._wave: dict[str, str] | None = None
        #: wall time the plan's first wave may go (its moves announced, their receivers preparing); None: now
        self._lead_until: float | None = None

    @property
    def state(self) -> RollState | None:
        return self._state

    # ---- reading ----------------------------------------------------------------------------------
    def on_change(self, token: int) -> None:
        if self._host.current(token):
            self._read()

    def _read(self) -> None:
        path = self._layout.admin_roll
        self._read_token = self._host.token
        watch = self._host.watch(ev.RollChange)
        try:
            data, _ = self._zk.get(path, watch=watch)
        except NoNodeError:
            if self._zk.exists(path, watch=watch) is not None:
                self._host.put(ev.RollChange(self._host.token))
            self._set(None)
            return
        context_of(self._host).known_paths.add(path)
        try:
            self._set(codecs.decode(RollState, data, path) if data else None)
        except PayloadError as exc:
            log.error("ignoring the roll request: %s", exc)
            self._set(None)

    def _set(self, state: RollState | None) -> None:
        before = self._state
        self._state = state
        if before is not None and (state is None or not state.active):
            self._applied, self._plan, self._wave = None, None, None  # (a resumed roll pins its phase afresh)
            self._lead_until = None
            coord = context_of(self._host).groups.get(before.group)
            if coord is not None:
                self._host.apply(before.group, coord.end_roll())

    def _write(self, state: RollState) -> None:
        path = self._layout.admin_roll
        known = context_of(self._host).known_paths
        self._host.write(lambda: writer_of(self._host).upsert([(path, codecs.encode(state))], known))
        self._set(state)

    # ---- advancing --------------------------------------------------------------------------------
    def deadline_wall(self) -> float | None:
        """Wall time the current phase's bound runs out (the timer's Tick then pauses the roll), or the plan's
        first wave may go, whichever is first."""
        st = self._state
        if st is None or not st.active:
            return None
        bound = st.since + st.timeout_s
        return bound if self._lead_until is None else min(bound, self._lead_until)

    def advance(self) -> None:
        ctx = self._host.ctx
        if ctx is None:
            return
        if self._read_token != self._host.token:
            self._read()
        st = self._state
        if st is None or not st.active:
            return
        coord = ctx.groups.get(st.group)
        if coord is None:
            return
        now = time.time()
        if st.phase == "drain":
            self._drain(st, coord, now)
        elif st.phase == "restart":
            self._restart(st, coord, now)
        elif st.phase == "balance":
            self._balance(st, coord, now)
        st = self._state
        if st is not None and st.active and now > st.since + st.timeout_s:
            self._pause(st, coord, now)

    @staticmethod
    def _settled(coord: GroupCoordinator) -> bool:
        """Stable with every task placed: the assignment a plan may start from (mid-round, a cooperative
        assignment leaves out the tasks on their way)."""
        if coord.state is not GroupState.STABLE:
            return False
        placed_tasks = {t for ts in coord.assignment.values() for t in ts}
        return placed_tasks >= set(coord.tasks)

    def _pin(self, st: RollState, coord: GroupCoordinator, plan: Plan) -> bool:
        """Pin the phase's plan once (per activation); True if it was pinned now."""
        key = (self._host.token, st.step, st.phase)
        if self._applied == key:
            return False
        self._applied, self._plan, self._wave = key, plan, None
        incoming = incoming_of(plan)
        self._host.apply(st.group, coord.on_roll_incoming(incoming))
        self._lead_until = None
        if incoming and st.warmup_s > 0 and coord.reconcile.active():
            # the moves are announced; the first wave waits for their receivers to prepare, every task pinned
            # where it runs meanwhile (a new controller's coordinator has no pins of the phase before). A join
            # round announces only with the assignments it publishes (its next waves): nothing to wait for
            self._lead_until = time.time() + st.warmup_s
            why = f"roll of {', '.join(st.batch_now()) or 'the group'}: {st.phase} (warm-up)"
            self._host.apply(st.group, coord.on_roll_placement(hold_plan(coord.assignment).placement, why))
        self._next_wave(st, coord)
        return True

    def _next_wave(self, st: RollState, coord: GroupCoordinator) -> bool:
        """Pin the plan's next wave once the one before is placed; True when the whole plan is placed."""
        plan = self._plan
        if plan is None:
            return False
        if self._lead_until is not None:
            if time.time() < self._lead_until:
                return False  # its receivers are preparing the first wave
            self._lead_until = None
        if self._wave is not None and not (coord.state is GroupState.STABLE and placed(coord.assignment, self._wave)):
            return False  # the wave pinned last is still on its way
        wave = next_wave(coord.assignment, plan, st.wave)
        first = self._wave is None
        if wave is None and not first:
            return True
        self._wave = wave if wave is not None else dict(plan.placement)  # (first: every task pinned where it is)
        why = f"roll of {', '.join(st.batch_now()) or 'the group'}: {st.phase}"
        self._host.apply(st.group, coord.on_roll_placement(self._wave, why))
        return wave is None

    def _drain(self, st: RollState, coord: GroupCoordinator, now: float) -> None:
        batch = st.batch_now()
        if self._applied != (self._host.token, st.step, st.phase) and not self._settled(coord):
            return
        in_place = st.in_place  # the first batch restarts in place, its tasks held for it (either protocol family)
        if self._pin(st, coord, drain_plan(coord.assignment, st.order, st.step, in_place)):
            plan = self._plan
            assert plan is not None
            log.info(
                "roll of group %s, step %d/%d: %s; %d tasks move",
                st.group,
                st.step + 1,
                len(st.order),
                ", ".join(batch),
                len(plan.moved),
            )
            twice = plan.moved if st.step == 0 and len(st.order) > 1 else st.twice
            kept = plan.stranded if st.step == 0 and len(st.order) > 1 else st.kept
            st = dataclasses.replace(st, moves=st.moves + len(plan.moved), twice=twice, kept=kept)
            self._write(st)
            return
        plan = self._plan
        if not self._next_wave(st, coord) and not (plan and plan.stranded):
            return
        owns = any(coord.assignment.get(b) for b in batch)
        if coord.state is not GroupState.STABLE or (owns and not (plan and plan.stranded)):
            return
        ctx = context_of(self._host)
        epochs = {b: ctx.brokers[b].epoch for b in batch if b in ctx.brokers}
        in_place = bool(plan and plan.stranded)  # its tasks wait for it (a reconciling group: they move)
        if in_place:
            # the hold is taken here, before the request is written: the broker may be gone before the
            # request's own watch reaches the event thread
            for b in batch:
                if b in ctx.brokers and coord.holds.hold_on_leave(b, st.timeout_s):
                    ctx.shutdown_requests.add(b)
        requests = [
            (
                self._layout.admin_controlled_shutdown_of(b),
                codecs.encode(ControlledShutdownRequest(b, now, in_place=in_place, hold_s=st.timeout_s)),
            )
            for b in batch
            if b in ctx.brokers
        ]
        if requests:
            self._host.write(lambda: writer_of(self._host).upsert(requests, ctx.known_paths))
        log.info(
            "roll of group %s: %s %s; asked to shut down",
            st.group,
            ", ".join(batch),
            "restart in place" if in_place else "own nothing",
        )
        self._write(dataclasses.replace(st, phase="restart", since=now, epochs=epochs, reason=""))

    def _restart(self, st: RollState, coord: GroupCoordinator, now: float) -> None:
        key = (self._host.token, st.step, "drain")
        if self._applied == key:  # the drain's pins hold everything where it is: nothing goes to a broker back
            self._applied = (self._host.token, st.step, st.phase)
        elif self._applied != (self._host.token, st.step, st.phase):
            if not self._settled(coord):
                return
            self._pin(st, coord, hold_plan(coord.assignment))  # (a new controller: where everything runs now)
        ctx = context_of(self._host)
        for b in st.batch_now():
            rec = ctx.brokers.get(b)
            if rec is None or rec.epoch == st.epochs.get(b) or b not in coord.generation_members:
                return
        if coord.state is not GroupState.STABLE:
            return
        step = st.step + 1
        phase = "drain" if step < len(st.order) else "balance"
        log.info("roll of group %s: %s back", st.group, ", ".join(st.batch_now()))
        self._write(dataclasses.replace(st, step=step, phase=phase, since=now, epochs={}))
        self.advance()

    def _balance(self, st: RollState, coord: GroupCoordinator, now: float) -> None:
        if self._applied != (self._host.token, st.step, st.phase) and not self._settled(coord):
            return
        if self._pin(st, coord, balance_plan(coord.assignment, st.twice, st.kept)):
            plan = self._plan
            assert plan is not None
            self._write(dataclasses.replace(st, moves=st.moves + len(plan.moved)))
            return
        plan = self._plan
        if not self._next_wave(st, coord):
            return
        if coord.state is GroupState.STABLE and plan is not None and placed(coord.assignment, plan.placement):
            log.info("roll of group %s done: %d task moves", st.group, st.moves)
            self._write(dataclasses.replace(st, phase="done", since=now, reason="done"))

    def _pause(self, st: RollState, coord: GroupCoordinator, now: float) -> None:
        if st.phase == "restart":
            brokers = context_of(self._host).brokers
            late = [
                b
                for b in st.batch_now()
                if b not in brokers or brokers[b].epoch == st.epochs.get(b) or b not in coord.generation_members
            ]
            reason = f"{', '.join(late) or 'the batch'} did not return within {st.timeout_s:g}s"
        else:
            reason = f"the {st.phase} of step {st.step + 1} did not finish within {st.timeout_s:g}s"
        log.warning("roll of group %s paused: %s", st.group, reason)
        self._write(dataclasses.replace(st, phase="paused", resume_phase=st.phase, reason=reason, since=now))
