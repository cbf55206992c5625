"""Pure functions of the group protocol: choosing the protocol and assignor, the cooperative adjustment,
and the coordinator's validation of a leader's proposal. Worked examples plus hypothesis properties;
the properties restate the rules here (who owns what, what moves) instead of reusing the module's code.
"""

from __future__ import annotations

from collections.abc import Mapping
from itertools import permutations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controller.protocol.group.rules import (
    COOPERATIVE,
    EAGER,
    choose_assignor,
    choose_protocol,
    cooperative_adjust,
    unassignable,
    validate_proposal,
)
from controller.protocol.records.group_messages import JoinResult, MemberMetadata, SyncProposal, TaskDescriptor

PROPERTY_SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

MEMBERS = ["a", "b", "c", "d", "e"]
TASKS = [f"t{i}" for i in range(12)]


# --------------------------------------------------------------------------------------------------
# choose_protocol
# --------------------------------------------------------------------------------------------------


def test_no_members_no_protocol():
    assert choose_protocol({}).protocol is None


def test_everyone_cooperative_first_picks_cooperative():
    choice = choose_protocol({"a": (COOPERATIVE, EAGER), "b": (COOPERATIVE, EAGER)})
    assert choice.protocol == COOPERATIVE
    assert choice.compatible == ("a", "b") and choice.incompatible == ()


def test_one_eager_only_member_keeps_the_group_eager():
    """Mixed group during an upgrade: eager is the only protocol all three support."""
    choice = choose_protocol({"a": (COOPERATIVE, EAGER), "b": (COOPERATIVE, EAGER), "c": (EAGER,)})
    assert choice.protocol == EAGER
    assert choice.incompatible == ()


def test_votes_decide_among_protocols_everyone_supports():
    choice = choose_protocol({"a": (EAGER, COOPERATIVE), "b": (EAGER, COOPERATIVE), "c": (COOPERATIVE, EAGER)})
    assert choice.protocol == EAGER
    choice = choose_protocol({"a": (EAGER, COOPERATIVE), "b": (COOPERATIVE, EAGER), "c": (COOPERATIVE, EAGER)})
    assert choice.protocol == COOPERATIVE


def test_tie_goes_to_the_leaders_preference_then_name_order():
    prefs = {"a": (EAGER, COOPERATIVE), "b": (COOPERATIVE, EAGER)}
    assert choose_protocol(prefs, leader_hint="a").protocol == EAGER
    assert choose_protocol(prefs, leader_hint="b").protocol == COOPERATIVE
    # no (or an unknown) leader: name order
    assert choose_protocol(prefs).protocol == COOPERATIVE
    assert choose_protocol(prefs, leader_hint="zz").protocol == COOPERATIVE
    assert choose_protocol({"a": ("zeta", "alpha"), "b": ("alpha", "zeta")}).protocol == "alpha"


def test_members_without_the_winner_are_incompatible():
    choice = choose_protocol({"a": (COOPERATIVE,), "b": (COOPERATIVE,), "c": (EAGER,)})
    assert choice.protocol == COOPERATIVE
    assert choice.compatible == ("a", "b")
    assert choice.incompatible == ("c",)


def test_member_with_no_protocols_is_incompatible():
    choice = choose_protocol({"a": (COOPERATIVE,), "b": ()})
    assert (choice.protocol, choice.incompatible) == (COOPERATIVE, ("b",))
    nobody = choose_protocol({"a": (), "b": ()})
    assert nobody.protocol is None and nobody.incompatible == ("a", "b")


def test_a_protocol_listed_twice_is_supported_once():
    # counted twice, eager would have 2 supporters against 1 and win outright
    choice = choose_protocol({"a": (EAGER, EAGER), "b": (COOPERATIVE,)})
    assert choice.protocol == COOPERATIVE  # a 1:1 tie, no leader: name order


@st.composite
def preferences(draw):
    names = draw(st.lists(st.sampled_from(MEMBERS), unique=True, min_size=1))
    protos = ["cooperative", "eager", "x"]
    return {m: tuple(draw(st.lists(st.sampled_from(protos), unique=True, max_size=3))) for m in names}


@PROPERTY_SETTINGS
@given(preferences(), st.sampled_from(MEMBERS + [None]))
def test_choose_protocol_properties(prefs, leader):
    choice = choose_protocol(prefs, leader)
    support = {p: sum(p in ps for ps in prefs.values()) for ps in prefs.values() for p in ps}
    assert set(choice.compatible) | set(choice.incompatible) == set(prefs)
    assert not set(choice.compatible) & set(choice.incompatible)
    if not support:
        assert choice.protocol is None
        return
    # the winner is supported by as many members as any protocol; everyone else is incompatible
    assert support[choice.protocol] == max(support.values())
    assert set(choice.compatible) == {m for m, ps in prefs.items() if choice.protocol in ps}
    if max(support.values()) == len(prefs):
        assert choice.incompatible == ()
    # deterministic: the order members are listed in does not matter
    for order in list(permutations(prefs))[:6]:
        assert choose_protocol({m: prefs[m] for m in order}, leader) == choice


# --------------------------------------------------------------------------------------------------
# choose_assignor
# --------------------------------------------------------------------------------------------------


def test_assignor_everyone_lists_wins():
    assert choose_assignor({"a": ("sticky", "range"), "b": ("range",)}, "a") == "range"


def test_assignor_falls_back_to_the_leaders_first_choice_then_the_default():
    assert choose_assignor({"a": ("sticky",), "b": ("range",)}, "b") == "range"
    assert choose_assignor({"a": ("sticky",), "b": ("range",)}, "a") == "sticky"
    assert choose_assignor({"a": (), "b": ("range",)}, "a", default="round-robin") == "range"  # b alone lists one
    assert choose_assignor({"a": (), "b": ()}, "a", default="round-robin") == "round-robin"


# --------------------------------------------------------------------------------------------------
# cooperative_adjust: examples
# --------------------------------------------------------------------------------------------------


def test_adjust_keeps_what_stays_and_gives_new_tasks_at_once():
    assigned, revoked = cooperative_adjust({"a": ("t1", "t2"), "b": ("t3",)}, {"a": ("t1",), "b": ()})
    assert assigned == {"a": ("t1", "t2"), "b": ("t3",)}
    assert revoked == {}


def test_adjust_withholds_a_moving_task_and_revokes_it_from_its_owner():
    assigned, revoked = cooperative_adjust({"a": ("t1",), "b": ("t2",)}, {"a": ("t1", "t2")})
    assert assigned == {"a": ("t1",), "b": ()}
    assert revoked == {"a": ("t2",)}


def test_adjust_revokes_owned_tasks_that_no_longer_exist():
    assigned, revoked = cooperative_adjust({"a": ("t1",)}, {"a": ("t1", "gone"), "b": ("gone2",)})
    assert assigned == {"a": ("t1",)}
    assert revoked == {"a": ("gone",), "b": ("gone2",)}


def test_adjust_is_the_identity_when_nobody_owns_anything():
    target = {"a": ("t2", "t1"), "b": ("t3",), "c": ()}
    assigned, revoked = cooperative_adjust(target, {"a": (), "b": ()})
    assert assigned == {"a": ("t1", "t2"), "b": ("t3",), "c": ()}
    assert revoked == {}


# --------------------------------------------------------------------------------------------------
# cooperative_adjust + validate_proposal: properties
# --------------------------------------------------------------------------------------------------


@st.composite
def adjust_inputs(draw, disjoint: bool):
    """(members, tasks, target, owned). The target places every task once (as assignors do); owned may
    list tasks that no longer exist. disjoint: each task owned by at most one member (the owner lock)."""
    members = draw(st.lists(st.sampled_from(MEMBERS), unique=True, min_size=1))
    tasks = draw(st.lists(st.sampled_from(TASKS), unique=True))
    target: dict[str, list[str]] = {m: [] for m in members}
    for t in tasks:
        target[draw(st.sampled_from(members))].append(t)
    owned: dict[str, list[str]] = {m: [] for m in members}
    if disjoint:
        for t in TASKS:
            owner = draw(st.sampled_from(members + [None, None]))
            if owner is not None:
                owned[owner].append(t)
    else:
        for m in members:
            owned[m] = draw(st.lists(st.sampled_from(TASKS), unique=True, max_size=6))
    return members, tasks, {m: tuple(ts) for m, ts in target.items()}, {m: tuple(ts) for m, ts in owned.items()}


def join_result(members, tasks, owned: Mapping[str, tuple[str, ...]], generation: int = 7) -> JoinResult:
    return JoinResult(
        generation=generation,
        leader=members[0],
        protocol=COOPERATIVE,
        assignor="cooperative-sticky",
        controller_epoch=1,
        members=tuple(MemberMetadata(member_id=m, owned=tuple(sorted(owned.get(m, ())))) for m in members),
        tasks=tuple(TaskDescriptor(task_id=t) for t in tasks),
    )


def check_never_double_owned(assigned, owned):
    for m, ts in assigned.items():
        for t in ts:
            others = [o for o, os in owned.items() if o != m and t in os]
            assert not others, f"{t} assigned to {m} while {others} own it"


@PROPERTY_SETTINGS
@given(adjust_inputs(disjoint=True))
def test_adjust_revokes_exactly_what_moves_or_vanished(inputs):
    members, tasks, target, owned = inputs
    assigned, revoked = cooperative_adjust(target, owned)
    owner = {t: m for m, ts in owned.items() for t in ts}
    goes_to = {t: m for m, ts in target.items() for t in ts}
    check_never_double_owned(assigned, owned)
    for m in members:
        # kept or new (nobody else owns it): assigned now; moving: withheld until the owner lets go
        assert set(assigned[m]) == {t for t in target[m] if owner.get(t) in (None, m)}
        # revoked: exactly the owned tasks that go elsewhere or exist no more
        assert set(revoked.get(m, ())) == {t for t in owned[m] if goes_to.get(t) != m}
    assert all(ts for ts in revoked.values()), "no empty revocation lists"
    # every task is either assigned this generation or being revoked this round
    placed = {t for ts in assigned.values() for t in ts}
    moving = {t for ts in revoked.values() for t in ts}
    assert set(tasks) <= placed | moving
    proposal = SyncProposal(generation=7, leader=members[0], assigned=assigned, revoked=revoked)
    assert validate_proposal(join_result(members, tasks, owned), proposal) == []


@PROPERTY_SETTINGS
@given(adjust_inputs(disjoint=True), st.sets(st.sampled_from(TASKS)), st.booleans())
def test_adjusts_set_algebra_agrees_with_the_task_by_task_rule(inputs, departed, as_sets):
    """One owner and one target per task takes the set-algebra path; it must give exactly what the task by
    task rule (kept for conflicting claims) gives, also for a holder the target no longer names (a member
    gone: ``departed`` takes over those of the tasks nobody holds) and for holdings given as sets."""
    from controller.protocol.group.rules import _adjust_conflicting

    _members, _tasks, target, owned = inputs
    held_now = {t for ts in owned.values() for t in ts}
    if departed - held_now:
        owned = {**owned, "departed": tuple(sorted(departed - held_now))}
    if as_sets:
        owned = {m: set(ts) for m, ts in owned.items()}
    targeted = {t for ts in target.values() for t in ts}
    assert cooperative_adjust(target, owned) == _adjust_conflicting(target, owned, targeted)


@PROPERTY_SETTINGS
@given(adjust_inputs(disjoint=False))
def test_adjust_is_safe_and_valid_even_with_conflicting_claims(inputs):
    """Stale or conflicting owned lists (two members claiming one task): still never double-owned."""
    members, tasks, target, owned = inputs
    assigned, revoked = cooperative_adjust(target, owned)
    check_never_double_owned(assigned, owned)
    for m, ts in revoked.items():
        assert set(ts) <= set(owned[m]), "only what a member owns is revoked from it"
    proposal = SyncProposal(generation=7, leader=members[0], assigned=assigned, revoked=revoked)
    assert validate_proposal(join_result(members, tasks, owned), proposal) == []


@PROPERTY_SETTINGS
@given(adjust_inputs(disjoint=False))
def test_validation_refuses_the_unadjusted_target_exactly_when_it_double_owns(inputs):
    """The raw target (a leader that skipped the adjustment) passes only if it moves nothing owned."""
    members, tasks, target, owned = inputs
    problems = validate_proposal(
        join_result(members, tasks, owned), SyncProposal(generation=7, leader=members[0], assigned=target)
    )
    conflicts = [(t, m) for m, ts in target.items() for t in ts if any(o != m and t in os for o, os in owned.items())]
    assert bool(problems) == bool(conflicts), (problems, conflicts)
    for t, m in conflicts[:3]:
        assert any(f"task {t!r} given to {m!r}" in p for p in problems)


# --------------------------------------------------------------------------------------------------
# validate_proposal: each rule
# --------------------------------------------------------------------------------------------------


def jr(**kw) -> JoinResult:
    base = dict(
        generation=5,
        leader="a",
        protocol=COOPERATIVE,
        assignor="sticky",
        controller_epoch=3,
        members=(MemberMetadata("a", owned=("t1",)), MemberMetadata("b", owned=("t2",)), MemberMetadata("c")),
        tasks=(TaskDescriptor("t1"), TaskDescriptor("t2"), TaskDescriptor("t3")),
    )
    base.update(kw)
    return JoinResult(**base)


def prop(assigned, revoked=None, generation=5, leader="a") -> SyncProposal:
    return SyncProposal(generation=generation, leader=leader, assigned=assigned, revoked=revoked or {})


GOOD = {"a": ("t1",), "b": ("t2",), "c": ("t3",)}


def test_a_good_proposal_has_no_problems():
    assert validate_proposal(jr(), prop(GOOD)) == []


@pytest.mark.parametrize(
    "join_kw, proposal, expected",
    [
        ({}, prop(GOOD, generation=4), "generation 4 is not the current 5"),
        ({}, prop(GOOD, leader="b"), "not the leader"),
        ({}, prop({**GOOD, "zz": ()}), "non-members ['zz']"),
        ({}, prop({**GOOD, "c": ("t3", "t9")}), "unknown task 't9'"),
        ({}, prop({"a": ("t1",), "b": ("t2",), "c": ("t3", "t1")}), "'t1' assigned twice"),
        ({}, prop({"a": ("t1", "t2"), "b": (), "c": ("t3",)}), "task 't2' given to 'a' while 'b' still owns it"),
        ({}, prop({"a": ("t1",), "b": ("t2",)}), "task 't3' is not assigned"),
        ({}, prop(GOOD, revoked={"c": ("t1",)}), "revokes 't1' from 'c', which does not own it"),
        ({"held": ("t3",)}, prop(GOOD), "task 't3' held for a departed member"),
        (
            {
                "members": (
                    MemberMetadata("a", owned=("t1",)),
                    MemberMetadata("b", owned=("t2",)),
                    MemberMetadata("c", leaving=True),
                )
            },
            prop(GOOD),
            "3 tasks" if False else "to leaving member 'c'",
        ),
    ],
)
def test_each_rule_refuses(join_kw, proposal, expected):
    problems = validate_proposal(jr(**join_kw), proposal)
    assert any(expected in p for p in problems), problems


def test_tasks_that_may_stay_unassigned():
    # held for a departed member, revoked this round, or with no eligible member: not "not assigned"
    join = jr(
        held=("t3",),
        tasks=(
            TaskDescriptor("t1"),
            TaskDescriptor("t2"),
            TaskDescriptor("t3"),
            TaskDescriptor("t4", pinned=("gone",), pin_mode="required"),
        ),
    )
    assert validate_proposal(join, prop({"a": (), "b": ("t2",), "c": ()}, revoked={"a": ("t1",)})) == []
    # a preferred pin on an absent member does not make a task unassignable
    join = jr(tasks=(TaskDescriptor("t1"), TaskDescriptor("t2"), TaskDescriptor("t4", pinned=("gone",))))
    assert any("'t4' is not assigned" in p for p in validate_proposal(join, prop({"a": ("t1",), "b": ("t2",)})))


def test_unassignable_rules():
    members = (MemberMetadata("a"), MemberMetadata("b", leaving=True))
    assert not unassignable(TaskDescriptor("t"), members)
    assert unassignable(TaskDescriptor("t"), (MemberMetadata("b", leaving=True),))
    assert unassignable(TaskDescriptor("t", pinned=("b",), pin_mode="required"), members)  # b is leaving
    assert not unassignable(TaskDescriptor("t", pinned=("a",), pin_mode="required"), members)
    assert not unassignable(TaskDescriptor("t", pinned=("b",), pin_mode="preferred"), members)


def test_problems_are_capped():
    join = jr(tasks=tuple(TaskDescriptor(f"x{i}") for i in range(50)), members=(MemberMetadata("a"),))
    problems = validate_proposal(join, prop({"a": ()}))
    assert len(problems) == 20 and all("is not assigned" in p for p in problems)
