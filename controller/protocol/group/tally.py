"""The group tally's arithmetic (sans-IO): what a create adds to a group's ``GroupTally``, and when the bound
no longer proves the group fits its payload budget so that the group must be measured exactly.

A group's join result is JSON, compressed above ``COMPRESS_ABOVE``; compressed sizes do not add up, but a
compressed stream grows by at most the raw bytes appended to it (plus deflate's block overhead). So the tally
keeps an upper bound: the last exact measure plus the raw JSON bytes of every task created since. Deletions
leave it as it is (still an upper bound); when a create would take the bound past the budget, the caller reads
the group's specs, measures the join result exactly (``measure``) and writes that instead."""

from __future__ import annotations

import json
from collections.abc import Sequence

from controller.protocol.records.admin_records import GroupTally
from controller.protocol.records.codecs import GROUP_PAYLOAD_BUDGET, group_payload_bytes, to_jsonable
from controller.protocol.records.group_messages import TaskDescriptor

# deflate's stored-block overhead, a generous bound per appended byte (5 bytes per 16 KiB block) and a constant
_DEFLATE_SLACK = 64


def raw_bytes(task: TaskDescriptor) -> int:
    """The raw JSON bytes one task adds to its group's join result: its descriptor, and its id in the member's
    owned list and in the previous assignment (each with a separating comma)."""
    desc = json.dumps(to_jsonable(task), separators=(",", ":"), sort_keys=True)
    ident = json.dumps(task.task_id)
    return len(desc) + 2 * len(ident) + 3


def grow(prior: GroupTally, new: Sequence[TaskDescriptor], budget: int = GROUP_PAYLOAD_BUDGET) -> GroupTally | None:
    """``prior`` with ``new`` added, or None when the bound would pass ``budget`` (measure the group then)."""
    added = sum(raw_bytes(t) for t in new)
    bound = prior.payload_bytes + added + added // 3000 + _DEFLATE_SLACK
    if bound > budget:
        return None
    return GroupTally(tasks=prior.tasks + len(new), payload_bytes=bound)


def measure(tasks: Sequence[TaskDescriptor]) -> GroupTally:
    """The exact tally of a group holding ``tasks``."""
    return GroupTally(tasks=len(tasks), payload_bytes=group_payload_bytes(tasks))
