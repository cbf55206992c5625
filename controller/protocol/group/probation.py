"""Members whose acknowledgements ZooKeeper keeps contradicting are kept from new work for a growing back-off,
sans-IO.

Why: a broker that registers ready, acknowledges every assignment and runs nothing (its reports refused: it
does not hold the owner znodes it says it took) costs each task placed with it a rebalance timeout of downtime,
and again at every rebalance that gives it work. So after ``refusals`` acknowledgements refused in a row (a
report ZooKeeper contradicts, or tasks given and not taken within the rebalance timeout) it gets no work for a back-off (``initial_s``, doubled at each back-off in a row, at most ``max_s``): its tasks
go to the other members. After the back-off it may be given work again; a report ZooKeeper confirms (it holds
what it took) forgets its refusals and its back-offs. A part of
:class:`~controller.protocol.group.acks.Acks`; time is given, nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

#: At most this many members are remembered (a member id is data from ZooKeeper): the oldest are forgotten.
MAX_MEMBERS = 10_000


@dataclass(frozen=True)
class BackoffPolicy:
    refusals: int = 3
    initial_s: float = 30.0
    max_s: float = 960.0

    def backoff_s(self, level: int) -> float:
        """The ``level``-th back-off in a row (1-based): doubling, capped."""
        return float(min(self.max_s, self.initial_s * 2.0 ** min(max(level - 1, 0), 30)))


@dataclass
class Probation:
    """Refused acknowledgements counted per member, and the members kept from new work until when."""

    policy: BackoffPolicy = field(default_factory=BackoffPolicy)
    #: member -> acknowledgements refused since its last one ZooKeeper confirmed
    refused: dict[str, int] = field(default_factory=dict)
    #: member -> back-offs in a row (the next one lasts twice as long)
    level: dict[str, int] = field(default_factory=dict)
    #: member -> when (the coordinator's clock) its back-off ends
    until: dict[str, float] = field(default_factory=dict)
    #: member -> why it was backed off (the last refusal)
    why: dict[str, str] = field(default_factory=dict)

    def contradicted(self, member: str, now: float, why: str) -> bool:
        """One acknowledgement of ``member`` refused; True when this one starts a back-off."""
        if self.kept(member, now):
            return False
        n = self.refused.pop(member, 0) + 1
        if n < self.policy.refusals:
            self.refused[member] = n
            self._bound()
            return False
        level = self.level.get(member, 0) + 1
        self.level[member] = level
        self.until[member] = now + self.policy.backoff_s(level)
        self.why[member] = f"{n} acknowledgements refused in a row, the last: {why}"[:300]
        self._bound()
        return True

    def confirmed(self, member: str) -> None:
        """ZooKeeper confirmed a report of the member's (it holds what it said it took): it behaves."""
        self.refused.pop(member, None)
        if member not in self.until:
            self.level.pop(member, None)
            self.why.pop(member, None)

    def kept(self, member: str, now: float) -> bool:
        """Whether the member is kept from new work now."""
        end = self.until.get(member)
        return end is not None and now < end

    def expire(self, now: float) -> list[str]:
        """The members whose back-off is over (they may be given work again); their level stays until they
        behave, so a member that goes on refusing is backed off twice as long next time."""
        over = sorted(m for m, end in self.until.items() if now >= end)
        for m in over:
            del self.until[m]
        return over

    def deadline(self) -> float | None:
        """When the next back-off ends (None: nobody is kept)."""
        return float(min(self.until.values())) if self.until else None

    def describe(self, now: float) -> dict[str, str]:
        """member -> what the group state shows for a member kept from new work."""
        return {
            m: (
                f"backed off for {end - now:.0f}s more (back-off {self.policy.backoff_s(self.level.get(m, 1)):.0f}s, "
                f"no new work): {self.why.get(m, '')}"
            )
            for m, end in sorted(self.until.items())
            if now < end
        }

    def apply(
        self, target: Mapping[str, tuple[str, ...]], open_members: Collection[str], now: float
    ) -> dict[str, tuple[str, ...]]:
        """The target with every task of a kept member moved to the least loaded open member that is not kept
        (what it says it holds included: its reports are what ZooKeeper contradicted; a task it does run is
        revoked and released as any other); a task no other member can take stays where it is."""
        kept = {m for m in target if self.kept(m, now)}
        if not kept:
            return dict(target)
        out = {m: list(ts) for m, ts in target.items()}
        others = sorted(m for m in open_members if m in out and m not in kept)
        if not others:
            return dict(target)
        for m in sorted(kept):
            for t in sorted(out[m]):
                to = min(others, key=lambda x: (len(out[x]), x))
                out[m].remove(t)
                out[to].append(t)
        return {m: tuple(sorted(ts)) for m, ts in out.items()}

    def _bound(self) -> None:
        for table in (self.refused, self.level, self.why):
            while len(table) > MAX_MEMBERS:
                del table[next(iter(table))]


__all__ = ["BackoffPolicy", "Probation", "MAX_MEMBERS"]
