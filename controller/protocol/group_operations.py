"""Operations on a group, sans-IO: the move throttle's waves, maintenance mode, the operators' settings and
the preferred layout it measures the group's imbalance against. A mixin of
:class:`~controller.protocol.group.GroupCoordinator`, whose fields it uses; ``controller/protocol/throttle.py`` plans the waves.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Mapping

from controller.protocol.assignors import get_assignor
from controller.protocol.codecs import MemberMetadata, MoveLimits
from controller.protocol.group_types import FOREVER, Decision, GroupState, WriteGroupState

if TYPE_CHECKING:  # the mixin's host
    from controller.protocol.group import GroupCoordinator

log = logging.getLogger(__name__)


class OperationsMixin:
    """The operations half of :class:`~controller.protocol.group.GroupCoordinator` (its fields live there)."""

    def on_settings(self: "GroupCoordinator", limits: MoveLimits, preferred_check_s: float,
                    max_imbalance: int) -> list[Decision]:
        """The operators' settings changed: a wider throttle may let the next wave go now."""
        self.limits = limits
        self.max_imbalance = max_imbalance
        if preferred_check_s != self.preferred_check_s:
            self.preferred_check_s = preferred_check_s
            self.next_check = self.clock.now() + preferred_check_s if preferred_check_s > 0 else None
        return self._next_wave()

    def on_maintenance(self: "GroupCoordinator", on: bool) -> list[Decision]:
        """Maintenance mode: while on, nothing moves and nothing gains an owner; a departed member's tasks
        wait for it (held without a deadline) and the rebalances it would have caused wait for the end."""
        if on == self.maintenance:
            return []
        self.maintenance = on
        if on:
            self.reason = "maintenance mode: placement frozen"
            return [WriteGroupState(self.info())] if self.state is not GroupState.DEAD else []
        held_before = self._held_info()
        released = [k for k, h in self.held.items() if h.deadline == FOREVER]
        for k in released:
            del self.held[k]
        placed = {t for ts in self.assignment.values() for t in ts}
        why = self.postponed or ("maintenance ended: held tasks move" if released else "")
        if not why and (self.deferred or set(self.tasks) - placed - self.held_tasks()
                        or set(self.members) - set(self.generation_members)):
            why = "maintenance ended"
        self.postponed = ""
        decisions: list[Decision] = []
        if why and self.members and self.state is not GroupState.DEAD:
            decisions = self._prepare_rebalance(f"maintenance ended ({why})" if not why.startswith("maintenance")
                                                else why)
        elif self.state is not GroupState.DEAD:
            self.reason = "maintenance ended"
            decisions = [WriteGroupState(self.info())]
        return self._note_held(held_before, decisions)

    def on_move_done(self: "GroupCoordinator", task_id: str, broker: str) -> list[Decision]:
        """A moved task runs on its new owner (or ended there): its slot in the throttle is free."""
        mv = self.moving.get(task_id)
        if mv is None or mv.dest != broker:
            return []
        del self.moving[task_id]
        return self._next_wave() or ([WriteGroupState(self.info())] if not self.moving else [])

    def _next_wave(self: "GroupCoordinator") -> list[Decision]:
        """Deferred moves go once the last wave's tasks all run (and the cluster's limit leaves room)."""
        if self.reconciling():
            if self.deferred and not self.moving and not self.maintenance and self._room() != 0:
                self.reason = f"next wave: {len(self.deferred)} moves waiting for the throttle"
                return self._r_step(write_state=True)
            return []
        if (self.deferred and not self.moving and self.state is GroupState.STABLE and not self.maintenance
                and self.members and self._room() != 0):
            return self._prepare_rebalance(f"next wave: {len(self.deferred)} moves waiting for the throttle")
        return []

    def throttled(self: "GroupCoordinator") -> bool:
        """Whether moves are counted: a limit or maintenance mode is in force."""
        return (self.maintenance or self.cluster_room is not None or self.limits.max_moves is not None
                or self.limits.max_moves_per_broker is not None)

    def _room(self: "GroupCoordinator") -> int | None:
        left = None if self.limits.max_moves is None else self.limits.max_moves - len(self.moving)
        if self.cluster_room is not None:
            left = self.cluster_room if left is None else min(left, self.cluster_room)
        return None if left is None else max(0, left)

    def _preferred_layout(self: "GroupCoordinator") -> dict[str, str]:
        """Task -> member in the layout the group's assignor gives with no history at all."""
        return self._layout(previous={})

    def _layout(self: "GroupCoordinator", previous: Mapping[str, tuple[str, ...]]) -> dict[str, str]:
        members = [MemberMetadata(member_id=m, capacity=r.capacity, rack=r.rack, instance_id=r.instance_id,
                                  leaving=r.leaving or m in self.shutting_down)
                   for m, r in sorted(self.members.items()) if m in self.generation_members]
        if not members:
            return {}
        held = self.held_tasks()
        tasks = [d for t, d in sorted(self.tasks.items()) if t not in held]
        try:
            target = get_assignor(self.assignor or self.config.default_assignor).assign(members, tasks, previous)
        except (KeyError, ValueError) as exc:
            log.warning("group %s: cannot compute a layout: %s", self.group, exc)
            return {}
        return {t: m for m, ts in target.items() for t in ts}

    def measure_imbalance(self: "GroupCoordinator") -> int:
        """How many tasks the group's assignor would move from where they run now (0: balanced)."""
        current = {m: ts for m, ts in self.assignment.items() if m in self.generation_members}
        target = self._layout(previous=current)
        where = {t: m for m, ts in current.items() for t in ts}
        return sum(1 for t, m in target.items() if where.get(t) != m)
