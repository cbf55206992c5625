"""Assignors: pure, fast property tests (hypothesis) for every assignor, plus worked examples.

Everything a property needs (who is eligible, who runs a task now, the fewest moves a balanced
assignment can make) is recomputed here from the documented rules, not taken from the module.
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from itertools import combinations

import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from controller.protocol.group.assignors import ASSIGNORS, get_assignor, is_eligible
from controller.protocol.records.group_messages import MemberMetadata, TaskDescriptor

Result = dict[str, tuple[str, ...]]

MEMBER_POOL = [f"m{i}" for i in range(7)]
GHOSTS = ["gone1", "gone2"]  # named in previous assignments and pins, never present
TASK_POOL = [f"t{i:02d}" for i in range(40)]
DELETED = ["old1", "old2"]  # named in previous/owned, no longer tasks
RACKS = ["r1", "r2", "r3"]
TASK_RACKS = RACKS + ["r9"]  # r9: no member is ever there

STICKY = ["sticky", "cooperative-sticky"]
PROPERTY_SETTINGS = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# --------------------------------------------------------------------------------------------------
# scenarios
# --------------------------------------------------------------------------------------------------


@st.composite
def scenarios(draw, pins: str = "any", racks: bool = True, weights: bool = True, capacities: bool = True):
    """(members, tasks, previous). pins: "any" | "preferred" (no required pins) | "none" (no pins)."""
    member_ids = draw(st.lists(st.sampled_from(MEMBER_POOL), unique=True, max_size=7))
    task_ids = draw(st.lists(st.sampled_from(TASK_POOL), unique=True, max_size=30))
    known = task_ids + DELETED

    # previous: a genuine earlier assignment (each task at most once), on present or departed members
    owners = draw(st.lists(st.sampled_from(MEMBER_POOL + GHOSTS + [None]), min_size=len(known), max_size=len(known)))
    previous: dict[str, list[str]] = {}
    for tid, owner in zip(known, owners):
        if owner is not None:
            previous.setdefault(owner, []).append(tid)

    members = []
    for mid in member_ids:
        mode = draw(st.sampled_from(["none", "none", "all", "some", "messy"]))
        mine = previous.get(mid, [])
        if mode == "all":
            owned = tuple(mine)
        elif mode == "some":
            owned = tuple(draw(st.lists(st.sampled_from(mine), unique=True))) if mine else ()
        elif mode == "messy":  # conflicting, stale or deleted claims
            owned = tuple(draw(st.lists(st.sampled_from(known), max_size=6))) if known else ()
        else:
            owned = ()
        members.append(
            MemberMetadata(
                member_id=mid,
                owned=owned,
                capacity=draw(st.integers(1, 4)) if capacities else 1,
                rack=draw(st.sampled_from([None] + RACKS)) if racks else None,
                leaving=draw(st.sampled_from([False, False, False, False, True])),
            )
        )

    tasks = []
    for tid in task_ids:
        pinned: tuple[str, ...] = ()
        mode = "preferred"
        if pins != "none" and draw(st.sampled_from([False, False, True])):
            pinned = tuple(draw(st.lists(st.sampled_from(MEMBER_POOL + GHOSTS), unique=True, min_size=1, max_size=3)))
            mode = draw(st.sampled_from(["required", "preferred"])) if pins == "any" else "preferred"
        tasks.append(
            TaskDescriptor(
                task_id=tid,
                weight=draw(st.integers(1, 10)) if weights else 1,
                pinned=pinned,
                pin_mode=mode,
                rack=draw(st.sampled_from([None, None] + TASK_RACKS)) if racks else None,
            )
        )
    prev = {m: tuple(ts) for m, ts in previous.items()}
    return members, tasks, prev


# --------------------------------------------------------------------------------------------------
# the rules, restated independently
# --------------------------------------------------------------------------------------------------


def active_ids(members: Sequence[MemberMetadata]) -> list[str]:
    return sorted(m.member_id for m in members if not m.leaving)


def eligible_ids(task: TaskDescriptor, members: Sequence[MemberMetadata]) -> set[str]:
    required = task.pin_mode == "required" and len(task.pinned) > 0
    return {m.member_id for m in members if not m.leaving and (not required or m.member_id in task.pinned)}


def pinned_allowed(task: TaskDescriptor, members: Sequence[MemberMetadata]) -> set[str]:
    """Where the pinned assignor may put a task: its present pinned members if any, else anywhere eligible."""
    present = set(task.pinned) & set(active_ids(members))
    return present if present else eligible_ids(task, members)


def owner_of(result: Result) -> dict[str, str]:
    return {t: m for m, ts in result.items() for t in ts}


def counts(result: Result, members: Sequence[MemberMetadata]) -> dict[str, int]:
    return {mid: len(result[mid]) for mid in active_ids(members)}


def current_owner(members, tasks, previous, allowed) -> dict[str, str]:
    """The documented rule: owned (when non-empty) beats previous, then the lowest member id wins;
    only placements still allowed count, and leaving members run nothing that stays."""
    claims: dict[str, list[tuple[int, str]]] = {}
    by_id = {t.task_id: t for t in tasks}
    for m in members:
        if m.leaving:
            continue
        strength, evidence = (0, m.owned) if m.owned else (1, previous.get(m.member_id, ()))
        for tid in evidence:
            if tid in by_id and m.member_id in allowed(by_id[tid]):
                claims.setdefault(tid, []).append((strength, m.member_id))
    return {tid: min(c)[1] for tid, c in claims.items()}


def minimum_moves(members, tasks, current: Mapping[str, str]) -> int:
    """Fewest tasks a count-balanced assignment must place on a member other than the current owner.

    Any balanced assignment of A tasks over E members gives r = A % E members q + 1 = A // E + 1 tasks
    and the others q. Member i can keep at most min(held_i, quota_i) of the held_i tasks it runs now,
    so at least Σ max(0, held_i − quota_i) of them move, and every orphaned task (run by no present
    eligible member) is placed anew. Minimising over every choice of the r members is a lower bound,
    and keeping all the rest reaches it, so it is the minimum.
    """
    active = active_ids(members)
    assignable = [t.task_id for t in tasks if eligible_ids(t, members)]
    q, r = divmod(len(assignable), len(active))
    held = Counter(current[t] for t in assignable if t in current)
    orphaned = sum(1 for t in assignable if t not in current)
    excess = min(sum(max(0, held[m] - (q + 1 if m in plus else q)) for m in active) for plus in combinations(active, r))
    return orphaned + excess


def moves(result: Result, current: Mapping[str, str]) -> int:
    """Tasks placed on a member that does not run them now (orphaned ones included)."""
    return sum(1 for t, m in owner_of(result).items() if current.get(t) != m)


def check_valid(members, tasks, result: Result) -> None:
    """Complete, no duplicates, every member present, eligibility (leaving, required pins) respected."""
    assert set(result) == {m.member_id for m in members}
    for mid, ts in result.items():
        assert isinstance(ts, tuple) and list(ts) == sorted(ts), (mid, ts)
    placed = Counter(t for ts in result.values() for t in ts)
    assert [t for t, n in placed.items() if n > 1] == [], "a task assigned twice"
    assert set(placed) <= {t.task_id for t in tasks}, "an unknown task assigned"
    owner = owner_of(result)
    for task in tasks:
        allowed = eligible_ids(task, members)
        if allowed:
            assert task.task_id in owner, f"{task.task_id} unassigned though {sorted(allowed)} could run it"
            assert owner[task.task_id] in allowed, f"{task.task_id} on ineligible {owner[task.task_id]}"
        else:
            assert task.task_id not in owner, f"{task.task_id} assigned though no member is eligible"
    for m in members:
        if m.leaving:
            assert result[m.member_id] == ()
    for task in tasks:
        if task.pin_mode == "required" and task.pinned and task.task_id in owner:
            assert owner[task.task_id] in task.pinned


def check_locally_balanced(members, tasks, result: Result, allowed) -> None:
    """No single move improves the spread: a task on a may not go to an allowed member with ≤ count(a) − 2."""
    count = counts(result, members)
    by_id = {t.task_id: t for t in tasks}
    for tid, a in owner_of(result).items():
        for b in allowed(by_id[tid]):
            assert count[b] >= count[a] - 1, f"{tid} on {a} ({count[a]}) could go to {b} ({count[b]})"


def spread(values) -> int:
    values = list(values)
    return max(values) - min(values) if values else 0


# --------------------------------------------------------------------------------------------------
# properties of every assignor
# --------------------------------------------------------------------------------------------------


@PROPERTY_SETTINGS
@given(scenario=scenarios())
def test_valid_and_deterministic(scenario):
    members, tasks, previous = scenario
    shuffled_prev = {m: tuple(reversed(ts)) for m, ts in reversed(list(previous.items()))}
    for name, assignor in ASSIGNORS.items():
        note(f"assignor: {name}")
        result = assignor.assign(members, tasks, previous)
        if not members:
            assert result == {}
            continue
        check_valid(members, tasks, result)
        # same input -> same output, whatever order it comes in
        assert assignor.assign(members, tasks, previous) == result
        assert assignor.assign(list(reversed(members)), list(reversed(tasks)), shuffled_prev) == result


@PROPERTY_SETTINGS
@given(scenario=scenarios(pins="preferred"))
def test_count_balanced_without_constraints(scenario):
    """No required pins (and, for pinned, no pins at all): max − min ≤ 1 over the active members."""
    members, tasks, previous = scenario
    unpinned = [dataclasses.replace(t, pinned=()) for t in tasks]
    for name in ["round-robin", "range", "sticky", "cooperative-sticky", "pinned"]:
        note(f"assignor: {name}")
        result = ASSIGNORS[name].assign(members, unpinned if name == "pinned" else tasks, previous)
        assert spread(counts(result, members).values()) <= 1


@PROPERTY_SETTINGS
@given(scenario=scenarios())
def test_locally_balanced_with_constraints(scenario):
    """sticky, cooperative-sticky among eligible members; pinned among the members its pins allow."""
    members, tasks, previous = scenario
    for name in STICKY:
        note(f"assignor: {name}")
        result = ASSIGNORS[name].assign(members, tasks, previous)
        check_locally_balanced(members, tasks, result, lambda t: eligible_ids(t, members))
    result = ASSIGNORS["pinned"].assign(members, tasks, previous)
    check_locally_balanced(members, tasks, result, lambda t: pinned_allowed(t, members))


# --------------------------------------------------------------------------------------------------
# round-robin and range: exactly Kafka's classic ones without constraints
# --------------------------------------------------------------------------------------------------


@PROPERTY_SETTINGS
@given(scenario=scenarios(pins="preferred"))
def test_round_robin_deals_in_turn(scenario):
    members, tasks, previous = scenario
    result = ASSIGNORS["round-robin"].assign(members, tasks, previous)
    ring = active_ids(members)
    expected = {m.member_id: [] for m in members}
    for i, tid in enumerate(sorted(t.task_id for t in tasks) if ring else []):
        expected[ring[i % len(ring)]].append(tid)
    assert result == {m: tuple(ts) for m, ts in expected.items()}


@PROPERTY_SETTINGS
@given(scenario=scenarios(pins="preferred"))
def test_range_gives_contiguous_ranges(scenario):
    members, tasks, previous = scenario
    result = ASSIGNORS["range"].assign(members, tasks, previous)
    ring = active_ids(members)
    ordered = sorted(t.task_id for t in tasks) if ring else []
    expected = {m.member_id: () for m in members}
    start = 0
    for i, mid in enumerate(ring):
        size = len(ordered) // len(ring) + (1 if i < len(ordered) % len(ring) else 0)
        expected[mid] = tuple(ordered[start : start + size])
        start += size
    assert result == expected


def test_range_pin_naming_everyone_is_no_constraint():
    """A required pin that names every present member puts its task in the same range as the rest."""
    members = [MemberMetadata("m0"), MemberMetadata("m1")]
    tasks = [TaskDescriptor("a", pinned=("m0", "m1", "gone"), pin_mode="required"), TaskDescriptor("b")]
    assert get_assignor("range").assign(members, tasks, {}) == {"m0": ("a",), "m1": ("b",)}


@PROPERTY_SETTINGS
@given(scenario=scenarios())
def test_range_balanced_within_each_eligibility_class(scenario):
    """Kafka ranges per topic; our topics are the tasks sharing one eligible set."""
    members, tasks, previous = scenario
    result = ASSIGNORS["range"].assign(members, tasks, previous)
    owner = owner_of(result)
    classes: dict[frozenset[str], list[str]] = {}
    for t in tasks:
        classes.setdefault(frozenset(eligible_ids(t, members)), []).append(t.task_id)
    for holders, tids in classes.items():
        per = Counter(owner[t] for t in tids if t in owner)
        assert spread(per.get(m, 0) for m in holders) <= 1


# --------------------------------------------------------------------------------------------------
# sticky / cooperative-sticky: the fewest moves
# --------------------------------------------------------------------------------------------------


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario=scenarios(pins="preferred"))
def test_sticky_moves_the_minimum(scenario):
    members, tasks, previous = scenario
    if not active_ids(members):
        return
    current = current_owner(members, tasks, previous, lambda t: eligible_ids(t, members))
    fewest = minimum_moves(members, tasks, current)
    for name in STICKY:
        note(f"assignor: {name}")
        result = ASSIGNORS[name].assign(members, tasks, previous)
        assert spread(counts(result, members).values()) <= 1
        assert moves(result, current) == fewest


@PROPERTY_SETTINGS
@given(scenario=scenarios())
def test_sticky_is_stable(scenario):
    """Fed its own result (as previous to eager members, or as what cooperative members own), a sticky
    assignor changes nothing: a stable group stays put, constraints or not."""
    members, tasks, previous = scenario

    def reporting(owned: Result) -> list[MemberMetadata]:
        return [dataclasses.replace(m, owned=owned.get(m.member_id, ())) for m in members]

    for name in STICKY + ["pinned"]:
        note(f"assignor: {name}")
        assignor = ASSIGNORS[name]
        first = assignor.assign(members, tasks, previous)
        assert assignor.assign(reporting({}), tasks, first) == first
        assert assignor.assign(reporting(first), tasks, {}) == first
        assert assignor.assign(reporting(first), tasks, previous) == first


def test_sticky_minimum_is_not_vacuous():
    """The minimum above is reached, not just bounded: a join moves exactly the newcomer's quota."""
    tasks = [TaskDescriptor(f"t{i:02d}") for i in range(10)]
    previous = {"m0": ("t00", "t01", "t02", "t03", "t04"), "m1": ("t05", "t06", "t07", "t08", "t09")}
    members = [MemberMetadata("m0"), MemberMetadata("m1"), MemberMetadata("m2")]
    result = get_assignor("sticky").assign(members, tasks, previous)
    current = current_owner(members, tasks, previous, lambda t: eligible_ids(t, members))
    assert minimum_moves(members, tasks, current) == 3
    assert moves(result, current) == 3
    assert sorted(map(len, result.values())) == [3, 3, 4]
    assert set(result["m0"]) <= set(previous["m0"]) and set(result["m1"]) <= set(previous["m1"])


def test_sticky_over_quota_keeps_the_hardest_to_place():
    """m0 must shed 4 of its 6 tasks; it keeps the two only m0 or m1 may run, so 4 move, not 5."""
    pinned = ("m0", "m1")
    tasks = [
        TaskDescriptor("t0"),
        TaskDescriptor("t1"),
        TaskDescriptor("t2", pinned=pinned, pin_mode="required"),
        TaskDescriptor("t3"),
        TaskDescriptor("t4"),
        TaskDescriptor("t5", pinned=pinned, pin_mode="required"),
    ]
    members = [MemberMetadata(f"m{i}") for i in range(5)]
    result = get_assignor("sticky").assign(members, tasks, {"m0": tuple(t.task_id for t in tasks)})
    assert result == {"m0": ("t2", "t5"), "m1": ("t0",), "m2": ("t1",), "m3": ("t3",), "m4": ("t4",)}


def test_sticky_leaves_a_balanced_constrained_group_alone():
    """b is over the count quota (1) only because of pins; the task it sheds may go to a or b, equally
    loaded: it goes back to b rather than moving for nothing."""
    tasks = [
        TaskDescriptor("ta", pinned=("a",), pin_mode="required"),
        TaskDescriptor("tb", pinned=("b",), pin_mode="required"),
        TaskDescriptor("tab", pinned=("a", "b"), pin_mode="required"),
    ]
    members = [MemberMetadata("a"), MemberMetadata("b"), MemberMetadata("c")]
    previous = {"a": ("ta",), "b": ("tab", "tb"), "c": ()}
    assert get_assignor("sticky").assign(members, tasks, previous) == previous


def test_sticky_owned_beats_previous():
    tasks = [TaskDescriptor("a"), TaskDescriptor("b")]
    members = [MemberMetadata("m0", owned=("b",)), MemberMetadata("m1")]
    # previous says m0 ran "a" and m1 ran "b"; m0 reports that it runs "b" now: owned wins for m0, and
    # m1 (reporting nothing) falls back to previous, claiming "b" too: the owned claim wins.
    result = get_assignor("cooperative-sticky").assign(members, tasks, {"m0": ("a",), "m1": ("b",)})
    assert result == {"m0": ("b",), "m1": ("a",)}


def test_sticky_leaving_member_drains_only_its_tasks():
    tasks = [TaskDescriptor(f"t{i}") for i in range(6)]
    previous = {"m0": ("t0", "t1"), "m1": ("t2", "t3"), "m2": ("t4", "t5")}
    members = [MemberMetadata("m0"), MemberMetadata("m1"), MemberMetadata("m2", leaving=True)]
    result = get_assignor("sticky").assign(members, tasks, previous)
    assert result["m2"] == ()
    assert set(previous["m0"]) <= set(result["m0"]) and set(previous["m1"]) <= set(result["m1"])
    assert sorted(result["m0"] + result["m1"]) == [f"t{i}" for i in range(6)]


def test_sticky_scales():
    """10,000 tasks x 100 members: a join of ten, a departure, a cold start; each well under 100 ms.

    CPU time of this process, best of three, so that a busy machine does not make it flaky."""
    tasks = [TaskDescriptor(f"task-{i:05d}") for i in range(10_000)]
    old = [MemberMetadata(f"m{j:03d}") for j in range(90)]
    sticky = get_assignor("sticky")
    previous = sticky.assign(old, tasks, {})
    grown = old + [MemberMetadata(f"m{j:03d}") for j in range(90, 100)]
    for members, prev in ((grown, previous), (grown[1:], previous), (grown, {})):
        best = float("inf")
        for _ in range(3):
            start = time.process_time()
            result = sticky.assign(members, tasks, prev)
            best = min(best, time.process_time() - start)
        assert spread(counts(result, members).values()) <= 1
        assert best < 0.1, f"sticky took {best * 1000:.0f} ms"


# --------------------------------------------------------------------------------------------------
# capacity
# --------------------------------------------------------------------------------------------------


@PROPERTY_SETTINGS
@given(scenario=scenarios())
def test_capacity_lpt_property(scenario):
    """LPT: tasks by descending weight (ties by id), each to the lowest resulting load/capacity.

    So for every member a and the last task t placed on it (its lightest, ties: highest id), at the
    moment t was placed a was a best choice, and later placements only raised the others' loads:
    load_a / cap_a <= (load_b + w_t) / cap_b for every other member b eligible for t.
    """
    members, tasks, previous = scenario
    result = ASSIGNORS["capacity"].assign(members, tasks, previous)
    weight = {t.task_id: t.weight for t in tasks}
    cap = {m.member_id: m.capacity for m in members}
    load = {mid: sum(weight[t] for t in ts) for mid, ts in result.items()}
    by_id = {t.task_id: t for t in tasks}
    for a, ts in result.items():
        if not ts:
            continue
        last = max(ts, key=lambda t: (-weight[t], t))
        for b in eligible_ids(by_id[last], members) - {a}:
            assert load[a] * cap[b] <= (load[b] + weight[last]) * cap[a], (a, b, last)


@PROPERTY_SETTINGS
@given(scenario=scenarios(pins="preferred", weights=False, capacities=False))
def test_capacity_with_unit_weights_balances_counts(scenario):
    members, tasks, previous = scenario
    result = ASSIGNORS["capacity"].assign(members, tasks, previous)
    assert spread(counts(result, members).values()) <= 1


def test_capacity_spreads_heavy_tasks_by_capacity():
    tasks = [
        TaskDescriptor("big", weight=8),
        TaskDescriptor("mid1", weight=4),
        TaskDescriptor("mid2", weight=4),
        TaskDescriptor("s1", weight=2),
        TaskDescriptor("s2", weight=2),
    ]
    members = [MemberMetadata("a", capacity=2), MemberMetadata("b", capacity=1), MemberMetadata("c", capacity=1)]
    result = get_assignor("capacity").assign(members, tasks, {})
    # big -> a (8/2=4 beats 8/1); mid1 -> b (4 beats a's 6); mid2 -> c (4 beats 6, 8);
    # s1 -> a (10/2=5 beats 6, 6); s2 -> a (12/2=6 ties b's and c's 6: lowest id)
    assert result == {"a": ("big", "s1", "s2"), "b": ("mid1",), "c": ("mid2",)}


def test_capacity_prefers_the_current_owner_on_ties():
    tasks = [TaskDescriptor("x"), TaskDescriptor("y")]
    members = [MemberMetadata("a"), MemberMetadata("b")]
    assert get_assignor("capacity").assign(members, tasks, {"b": ("x",), "a": ("y",)}) == {"a": ("y",), "b": ("x",)}
    assert get_assignor("capacity").assign(members, tasks, {}) == {"a": ("x",), "b": ("y",)}


def test_capacity_clamps_nonsense():
    members = [MemberMetadata("a", capacity=0), MemberMetadata("b", capacity=-3)]
    tasks = [TaskDescriptor("x", weight=-5), TaskDescriptor("y", weight=3)]
    result = get_assignor("capacity").assign(members, tasks, {})
    check_valid(members, tasks, result)


# --------------------------------------------------------------------------------------------------
# pinned
# --------------------------------------------------------------------------------------------------


@PROPERTY_SETTINGS
@given(scenario=scenarios())
def test_pinned_honours_present_pins_and_falls_back(scenario):
    members, tasks, previous = scenario
    result = ASSIGNORS["pinned"].assign(members, tasks, previous)
    owner = owner_of(result)
    active = set(active_ids(members))
    for t in tasks:
        present = set(t.pinned) & active
        if present:
            assert owner[t.task_id] in present, f"{t.task_id} pinned to {sorted(present)}, on {owner[t.task_id]}"
        elif t.pinned and t.pin_mode == "preferred" and active:
            assert t.task_id in owner, f"preferred {t.task_id} not placed though its pins are gone"
        elif t.pinned and t.pin_mode == "required":
            assert t.task_id not in owner


def test_pinned_example():
    tasks = [
        TaskDescriptor("p-a", pinned=("a",), pin_mode="required"),
        TaskDescriptor("p-gone", pinned=("zz",), pin_mode="required"),
        TaskDescriptor("pref-b", pinned=("b",)),
        TaskDescriptor("pref-gone", pinned=("zz",)),
        TaskDescriptor("free"),
    ]
    members = [MemberMetadata("a"), MemberMetadata("b"), MemberMetadata("c")]
    result = get_assignor("pinned").assign(members, tasks, {})
    # most constrained first: p-a -> a, pref-b -> b, then free -> c, pref-gone -> a; p-gone has nowhere to go
    assert result == {"a": ("p-a", "pref-gone"), "b": ("pref-b",), "c": ("free",)}
    # b leaves: its preferred task falls back to the least-loaded other member; nothing else moves
    members[1] = MemberMetadata("b", leaving=True)
    after = get_assignor("pinned").assign(members, tasks, result)
    assert after == {"a": ("p-a", "pref-gone"), "b": (), "c": ("free", "pref-b")}
    # b is back: pref-b returns to it, and only pref-b moves
    members[1] = MemberMetadata("b")
    assert get_assignor("pinned").assign(members, tasks, after) == result


# --------------------------------------------------------------------------------------------------
# rack-aware
# --------------------------------------------------------------------------------------------------


@PROPERTY_SETTINGS
@given(scenario=scenarios())
def test_rack_aware_keeps_tasks_in_their_rack(scenario):
    members, tasks, previous = scenario
    result = ASSIGNORS["rack-aware"].assign(members, tasks, previous)
    owner = owner_of(result)
    rack_of = {m.member_id: m.rack for m in members}
    for t in tasks:
        if t.rack is not None and any(rack_of[m] == t.rack for m in eligible_ids(t, members)):
            assert rack_of[owner[t.task_id]] == t.rack, f"{t.task_id} wants {t.rack}, got {owner[t.task_id]}"


@PROPERTY_SETTINGS
@given(scenario=scenarios(pins="preferred"))
def test_rack_aware_spreads_across_racks_then_members(scenario):
    members, tasks, previous = scenario
    result = ASSIGNORS["rack-aware"].assign(members, tasks, previous)
    owner = owner_of(result)
    active = [m for m in members if not m.leaving]
    racks = {m.rack for m in active}
    count = counts(result, members)
    for rack in racks:
        assert spread(count[m.member_id] for m in active if m.rack == rack) <= 1, f"unbalanced in {rack}"
    rack_of = {m.member_id: m.rack for m in members}
    free = [t.task_id for t in tasks if t.rack is None or t.rack not in racks]
    free_per_rack = Counter(rack_of[owner[t]] for t in free if t in owner)
    assert spread(free_per_rack.get(r, 0) for r in racks) <= 1


def test_rack_aware_example():
    members = [MemberMetadata("a1", rack="r1"), MemberMetadata("a2", rack="r1"), MemberMetadata("b1", rack="r2")]
    tasks = [
        TaskDescriptor("x1", rack="r2"),
        TaskDescriptor("x2", rack="r2"),
        TaskDescriptor("y", rack="r1"),
        TaskDescriptor("f1"),
        TaskDescriptor("f2"),
        TaskDescriptor("f3", rack="nowhere"),
    ]
    result = get_assignor("rack-aware").assign(members, tasks, {})
    # r2's tasks both on b1 (its only member); y on a1; free tasks alternate between racks r1, r2, r1
    assert result == {"a1": ("f3", "y"), "a2": ("f1",), "b1": ("f2", "x1", "x2")}


# --------------------------------------------------------------------------------------------------
# registry, edges
# --------------------------------------------------------------------------------------------------


def test_registry_names():
    assert sorted(ASSIGNORS) == sorted(
        ["round-robin", "range", "sticky", "cooperative-sticky", "capacity", "pinned", "rack-aware", "load-balanced"]
    )
    for name, assignor in ASSIGNORS.items():
        assert assignor.name == name
        assert get_assignor(name) is assignor


def test_unknown_assignor_is_a_clear_value_error():
    with pytest.raises(ValueError) as err:
        get_assignor("stickyy")
    message = str(err.value)
    assert "'stickyy'" in message
    for name in ASSIGNORS:
        assert name in message


@pytest.mark.parametrize("name", sorted(ASSIGNORS))
def test_edges(name):
    assignor = ASSIGNORS[name]
    tasks = [TaskDescriptor("t1"), TaskDescriptor("t2", pinned=("nobody",), pin_mode="required")]
    assert assignor.assign([], tasks, {"m": ("t1",)}) == {}
    leaving = [MemberMetadata("m1", leaving=True), MemberMetadata("m2", owned=("t1",), leaving=True)]
    assert assignor.assign(leaving, tasks, {"m1": ("t1",)}) == {"m1": (), "m2": ()}
    assert assignor.assign([MemberMetadata("m1")], [], {"m1": ("gone",)}) == {"m1": ()}
    assert assignor.assign([MemberMetadata("m1")], tasks, {}) == {"m1": ("t1",)}
    with pytest.raises(ValueError, match="duplicate member"):
        assignor.assign([MemberMetadata("m1"), MemberMetadata("m1")], tasks, {})
    with pytest.raises(ValueError, match="duplicate task"):
        assignor.assign([MemberMetadata("m1")], [TaskDescriptor("t1"), TaskDescriptor("t1")], {})


@given(
    member=st.builds(MemberMetadata, member_id=st.sampled_from(MEMBER_POOL), leaving=st.booleans()),
    task=st.builds(
        TaskDescriptor,
        task_id=st.just("t"),
        pinned=st.lists(st.sampled_from(MEMBER_POOL), unique=True, max_size=3).map(tuple),
        pin_mode=st.sampled_from(["required", "preferred"]),
    ),
)
def test_is_eligible_is_the_documented_rule(member, task):
    assert is_eligible(member, task) == (member.member_id in eligible_ids(task, [member]))
