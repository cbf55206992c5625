from __future__ import annotations

import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controller.protocol.cluster.layout import BUCKET_NAMES, BUCKETS, InvalidName, ZkLayout, bucket_of, is_bucket


def test_paths_live_under_the_root():
    lay = ZkLayout("/prod/a")
    paths = [
        lay.controller,
        lay.controller_epoch,
        lay.broker("b1"),
        lay.task("t1"),
        lay.task_owner("t1"),
        lay.group_state("g"),
        lay.group_member("g", "b1"),
        lay.group_sync("g", 3),
        lay.group_join("g", 3),
        lay.group_assignment("g", "b1"),
        lay.status("t1"),
        lay.admin_controlled_shutdown_of("b1"),
        *lay.persistent_roots(),
    ]
    assert all(p.startswith("/prod/a/") for p in paths)
    assert lay.task_owner("t1") == "/prod/a/tasks/_37/t1/owner"
    assert lay.status("t1") == "/prod/a/status/_37/t1" and lay.task_bucket("t1") == "/prod/a/tasks/_37"
    assert ZkLayout("zkc/").root == "/zkc"


def test_a_bucket_is_the_crc32_of_the_id_and_never_a_legal_task_id():
    """The hash is part of the layout on disk: every process of every release must agree on it."""
    assert bucket_of("t1") == f"_{zlib.crc32(b't1') % 256:02x}" == "_37"
    assert len(set(BUCKET_NAMES)) == BUCKETS == 256 and all(is_bucket(b) for b in BUCKET_NAMES)
    for b in BUCKET_NAMES:  # a flat root's task can never be mistaken for a bucket, nor a bucket for a task
        with pytest.raises(InvalidName):
            ZkLayout().task(b)
    assert not is_bucket("_3F") and not is_bucket("_100") and not is_bucket("3f")


_ids = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,40}", fullmatch=True)


@given(_ids)
def test_task_of_inverts_task_and_nothing_else(task_id):
    lay = ZkLayout("/r")
    assert lay.task_of(lay.task(task_id)) == task_id
    assert lay.task(task_id).rsplit("/", 2)[-2] == bucket_of(task_id) == lay.task_bucket(task_id).rsplit("/", 1)[1]
    assert lay.task_of(lay.task_owner(task_id)) is None
    assert lay.task_of(lay.task_bucket(task_id)) is None
    assert lay.task_of(lay.tasks + "/" + task_id) is None  # a flat entry
    wrong = next(b for b in BUCKET_NAMES if b != bucket_of(task_id))
    assert lay.task_of(f"{lay.tasks}/{wrong}/{task_id}") is None  # in another id's bucket: garbage


def test_buckets_spread_evenly():
    counts: dict[str, int] = {}
    for i in range(100_000):
        b = bucket_of(f"task-{i}")
        counts[b] = counts.get(b, 0) + 1
    assert len(counts) == BUCKETS and max(counts.values()) < 2 * 100_000 / BUCKETS


@pytest.mark.parametrize("bad", ["", "a/b", "..", ".hidden", "x" * 201, "sp ace", "é"])
def test_bad_names_are_refused(bad):
    with pytest.raises(InvalidName):
        ZkLayout().task(bad)


def test_split_children_sets_illegal_names_apart_by_the_parents_kind() -> None:
    lay = ZkLayout("/r")
    assert lay.split_children(lay.broker_ids, ["b2", "evil<b>", "b1"]) == (["b1", "b2"], ["evil<b>"])
    assert lay.split_children(lay.groups, ["bad<g>", "g"]) == (["g"], ["bad<g>"])
    assert lay.split_children(lay.group_members("g"), ["m\n", "m"]) == (["m"], ["m\n"])
    assert lay.legal_children(lay.intervals, ["x" * 201, "b1"]) == ["b1"]
    assert lay.split_children(lay.admin_reassign, ["../t"]) == ([], ["../t"])
    # children not named after anything of ours (generations, sequential requests) are left as they are
    assert lay.child_kind(lay.group_joins("g")) is None
    assert lay.legal_children(lay.admin_rebalance, ["req-0000000001"]) == ["req-0000000001"]
    assert lay.legal_children(lay.groups, None) == []
