"""The group tally's bound: whatever a group holds and whatever a create adds, the bound is never under the
exact size of the group's join result, and it refuses (asks for a measure) only past the budget."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from controller.protocol.group import tally
from controller.protocol.records.codecs import group_payload_bytes
from controller.protocol.records.group_messages import TaskDescriptor

_ids = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-", min_size=1, max_size=60)
_task = st.builds(
    TaskDescriptor,
    task_id=_ids,
    weight=st.integers(1, 10),
    pinned=st.lists(_ids, max_size=3).map(tuple),
)


@settings(max_examples=60, deadline=None)
@given(before=st.lists(_task, max_size=40), added=st.lists(_task, min_size=1, max_size=40))
def test_the_bound_is_never_under_the_exact_size(before, added):
    grown = tally.grow(tally.measure(before), added)
    assert grown is not None
    assert grown.tasks == len(before) + len(added)
    assert grown.payload_bytes >= group_payload_bytes(before + added)


def test_the_bound_holds_across_compression_and_asks_for_a_measure_past_the_budget():
    big = [TaskDescriptor(f"task-{i:06d}") for i in range(3000)]  # compressed: past 64 KiB of JSON
    prior = tally.measure(big)
    more = [TaskDescriptor(f"more-{i:06d}") for i in range(500)]
    grown = tally.grow(prior, more)
    assert grown is not None and grown.payload_bytes >= group_payload_bytes(big + more)
    assert tally.grow(prior, more, budget=prior.payload_bytes + 10) is None
