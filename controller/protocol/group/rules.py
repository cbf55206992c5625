"""Pure functions of the group protocol, shared by the coordinator (controller) and the leader (worker).

- choosing the protocol every member supports (INCONSISTENT_PROTOCOL for those that can't follow),
- the cooperative adjustment of a target assignment (revoke what moves, assign it next generation),
- validating a leader's proposal before the coordinator publishes it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from controller.protocol.records.group_messages import (
    JoinRequest,
    JoinResult,
    MemberMetadata,
    SyncProposal,
    TaskDescriptor,
)

EAGER = "eager"
COOPERATIVE = "cooperative"
#: the coordinator computes targets, members reconcile alone (controller/protocol/group/reconcile.py)
RECONCILE = "reconcile"
PROTOCOLS = (RECONCILE, COOPERATIVE, EAGER)


def protocols_for(choice: str) -> tuple[str, ...]:
    """What a member that asks for ``choice`` lists, in preference order: each protocol also accepts the
    older ones, so a group whose members run different software still forms (rolling upgrades)."""
    if choice == RECONCILE:
        return (RECONCILE, COOPERATIVE)
    if choice == COOPERATIVE:
        return (COOPERATIVE, EAGER)
    if choice == EAGER:
        return (EAGER,)
    raise ValueError(f"unknown protocol {choice!r}: choose one of {', '.join(PROTOCOLS)}")


@dataclass(frozen=True)
class ProtocolChoice:
    protocol: str | None
    compatible: tuple[str, ...]
    incompatible: tuple[str, ...]


def choose_protocol(preferences: Mapping[str, Sequence[str]], leader_hint: str | None = None) -> ProtocolChoice:
    """Pick the protocol for a generation from each member's preference-ordered list.

    Candidates are the protocols that the largest number of members support (ideally all); among them
    each member votes for its most preferred one and the most votes win (ties: the leader's preference,
    then name order). Members that do not support the winner are incompatible (INCONSISTENT_PROTOCOL).
    """
    if not preferences:
        return ProtocolChoice(None, (), ())
    support = Counter(p for prefs in preferences.values() for p in dict.fromkeys(prefs))
    if not support:
        return ProtocolChoice(None, (), tuple(sorted(preferences)))
    best = max(support.values())
    candidates = {p for p, n in support.items() if n == best}
    votes: Counter[str] = Counter()
    for prefs in preferences.values():
        for p in prefs:
            if p in candidates:
                votes[p] += 1
                break
    leader_prefs = list(preferences.get(leader_hint or "", ()))

    def rank(p: str) -> tuple[int, int, str]:
        return (-votes[p], leader_prefs.index(p) if p in leader_prefs else len(leader_prefs), p)

    winner = min(candidates, key=rank)
    compatible = tuple(sorted(m for m, prefs in preferences.items() if winner in prefs))
    incompatible = tuple(sorted(m for m, prefs in preferences.items() if winner not in prefs))
    return ProtocolChoice(winner, compatible, incompatible)


def all_prefer_reconcile(requests: Mapping[str, JoinRequest], leader: str | None) -> bool:
    """Every member supports reconcile and the members' vote picks it."""
    if not requests:
        return False
    choice = choose_protocol({m: r.protocols for m, r in requests.items()}, leader)
    return choice.protocol == RECONCILE and not choice.incompatible


def identity(member_id: str, request: JoinRequest | None) -> str:
    """Static members are known by instance id across restarts; others by member id."""
    return request.instance_id if request is not None and request.instance_id else member_id


def rewritten(
    old: Mapping[str, JoinRequest], new: Mapping[str, JoinRequest]
) -> list[tuple[str, JoinRequest, JoinRequest]]:
    """The members present before and after whose request changed: (member, before, after), by member."""
    return [(m, old[m], new[m]) for m in sorted(new.keys() & old.keys()) if old[m] != new[m]]


def newly_leaving(shutting_down: Collection[str], m: str, before: JoinRequest, after: JoinRequest) -> bool:
    """A member whose request now says it is leaving starts its controlled shutdown (once)."""
    return after.leaving and not before.leaving and m not in shutting_down


def choose_assignor(preferences: Mapping[str, Sequence[str]], leader: str, default: str = "sticky") -> str:
    """The assignor every member lists (vote by preference, as for protocols), else the leader's first choice."""
    choice = choose_protocol({m: p for m, p in preferences.items() if p}, leader)
    if choice.protocol and not choice.incompatible:
        return choice.protocol
    leader_prefs = preferences.get(leader) or ()
    return leader_prefs[0] if leader_prefs else default


def cooperative_adjust(
    target: Mapping[str, Sequence[str]], owned: Mapping[str, Iterable[str]]
) -> tuple[dict[str, tuple[str, ...]], dict[str, tuple[str, ...]]]:
    """Turn a target assignment into this generation's (assigned, revoked), never double-owning.

    A task that some member owns now and that the target gives to another member is *moving*: it is
    revoked from its owner and withheld from its new owner until the owner has stopped it and rejoined
    (the next generation assigns it). Tasks an owner keeps stay assigned; owned tasks that are in no
    target (deleted, paused, unassignable) are revoked. For an eager group nobody owns anything at
    join time, so this is the identity.
    """
    held = {m: ts if isinstance(ts, (set, frozenset)) else set(ts) for m, ts in owned.items()}
    held_all: set[str] = set().union(*held.values())
    targeted: set[str] = set().union(*target.values())
    if sum(map(len, held.values())) == len(held_all) and sum(map(len, target.values())) == len(targeted):
        # the common case, one owner and one target per task: set algebra (10,000s of tasks at every step of a
        # reconciling group; a loop over them was most of a step). A member gets what nobody else holds; a
        # holder loses what its target does not name. Most members hold exactly their target: a look-up per
        # task says so, with no set built and no difference taken (a reconciling group's step is mostly them).
        nothing: frozenset[str] = frozenset()
        assigned: dict[str, tuple[str, ...]] = {}
        revoked: dict[str, tuple[str, ...]] = {}
        for m, ts in target.items():
            hs = held.get(m, nothing)
            if hs.issuperset(ts):  # (everything in its target is its own already)
                assigned[m] = tuple(sorted(ts))
                if len(hs) != len(assigned[m]):  # (targets name a task once: the rest is what it loses)
                    revoked[m] = tuple(sorted(hs.difference(ts)))
            else:
                assigned[m] = tuple(sorted(t for t in ts if t in hs or t not in held_all))
                gone = hs.difference(ts)
                if gone:
                    revoked[m] = tuple(sorted(gone))
        for m, hs in held.items():
            if m not in target and hs:
                revoked[m] = tuple(sorted(hs))
        return assigned, revoked
    return _adjust_conflicting(target, owned, targeted)


def _adjust_conflicting(
    target: Mapping[str, Sequence[str]], owned: Mapping[str, Iterable[str]], targeted: set[str]
) -> tuple[dict[str, tuple[str, ...]], dict[str, tuple[str, ...]]]:
    """``cooperative_adjust`` where stale or conflicting claims name a task twice (owned by two members, or
    in two targets): task by task, every other claimant loses it."""
    owners: dict[str, set[str]] = {}
    for member, tasks in owned.items():
        for t in tasks:
            owners.setdefault(t, set()).add(member)
    assigned: dict[str, tuple[str, ...]] = {}
    revoked: dict[str, list[str]] = {m: [] for m in target}
    for member, tasks in target.items():
        keep_or_new = []
        for t in tasks:
            others = owners.get(t, set()) - {member}
            if not others:
                keep_or_new.append(t)
            for holder in others:
                revoked.setdefault(holder, []).append(t)  # moving: the holder stops it first
        assigned[member] = tuple(sorted(keep_or_new))
    for member, tasks in owned.items():
        for t in tasks:
            if t not in targeted:
                revoked.setdefault(member, []).append(t)
    return assigned, {m: tuple(sorted(set(ts))) for m, ts in revoked.items() if ts}


def unassignable(task: TaskDescriptor, members: Sequence[MemberMetadata]) -> bool:
    """True when no member may run the task (required pins all absent, or only leaving members)."""
    eligible = [m for m in members if not m.leaving]
    if task.pin_mode == "required" and task.pinned:
        eligible = [m for m in eligible if m.member_id in task.pinned]
    return not eligible


def validate_proposal(join: JoinResult, proposal: SyncProposal) -> list[str]:
    """Reasons to refuse a leader's proposal (empty list: publish it).

    Checks: right generation, sent by the leader, only members of the generation, every task of the
    group at most once, each task assigned unless it is held, being revoked this round, or has no
    eligible member; nothing assigned to a leaving member; and — the safety rule — no task given to a
    member while another member still owns it. Revocations must be of tasks the member owns.
    """
    problems: list[str] = []
    if proposal.generation != join.generation:
        problems.append(f"generation {proposal.generation} is not the current {join.generation}")
    if proposal.leader != join.leader:
        problems.append(f"sent by {proposal.leader!r}, not the leader {join.leader!r}")
    members = {m.member_id: m for m in join.members}
    unknown = sorted(set(proposal.assigned) - set(members))
    if unknown:
        problems.append(f"assigns to non-members {unknown[:5]}")
    tasks = {t.task_id: t for t in join.tasks}
    held = set(join.held)
    owners_of: dict[str, set[str]] = {}
    for m in join.members:
        for t in m.owned:
            owners_of.setdefault(t, set()).add(m.member_id)
    seen: dict[str, str] = {}
    for member, assigned in proposal.assigned.items():
        if member in members and members[member].leaving and assigned:
            problems.append(f"assigns {len(assigned)} tasks to leaving member {member!r}")
        for t in assigned:
            if t not in tasks:
                problems.append(f"assigns unknown task {t!r}")
            elif t in held:
                problems.append(f"assigns task {t!r} held for a departed member")
            if t in seen:
                problems.append(f"task {t!r} assigned twice ({seen[t]!r} and {member!r})")
            seen[t] = member
            for holder in sorted(owners_of.get(t, set()) - {member}):
                problems.append(f"task {t!r} given to {member!r} while {holder!r} still owns it")
    revoked_now: set[str] = set()
    for member, revoked in proposal.revoked.items():
        owned = set(members[member].owned) if member in members else set()
        for t in revoked:
            if t not in owned:
                problems.append(f"revokes {t!r} from {member!r}, which does not own it")
            revoked_now.add(t)
    member_list = list(join.members)
    for t_id, task in tasks.items():
        if t_id in seen or t_id in held or t_id in revoked_now:
            continue
        if not unassignable(task, member_list):
            problems.append(f"task {t_id!r} is not assigned")
    return problems[:20]


def run_assignor(name: str, join: JoinResult) -> dict[str, tuple[str, ...]]:
    """What the leader computes: the named assignor over the join result's members and tasks, minus
    the tasks held for departed members (they wait for the scheduled rebalance delay)."""
    from controller.protocol.group.assignors import get_assignor

    held = set(join.held)
    tasks = [t for t in join.tasks if t.task_id not in held]
    result = get_assignor(name).assign(join.members, tasks, join.previous)
    return {m.member_id: tuple(result.get(m.member_id, ())) for m in join.members}
