"""``zkio.delete_tree`` against a real ZooKeeper: a whole subtree goes in a few multis, and a tree too big to
walk is refused with the module's own error, not a TypeError raised while building it."""

from __future__ import annotations

import pytest
from kazoo.client import KazooClient

from controller.protocol.cluster.layout import ZkLayout
from controller.zk.io import WriteFailed
from controller.zk.subtrees import delete_tree


def test_delete_tree_removes_a_subtree_and_counts_it(zk: KazooClient, layout: ZkLayout) -> None:
    base = f"{layout.root}/scratch"
    for i in range(3):
        zk.create(f"{base}/a{i}/b", makepath=True)
    assert delete_tree(zk, base) == 7
    assert zk.exists(base) is None


def test_delete_tree_refuses_a_tree_larger_than_its_bound(zk: KazooClient, layout: ZkLayout) -> None:
    base = f"{layout.root}/scratch"
    for i in range(3):
        zk.create(f"{base}/a{i}", makepath=True)
    with pytest.raises(WriteFailed, match="more than 2 znodes") as raised:
        delete_tree(zk, base, max_nodes=2)
    assert raised.value.failures == []
    assert sorted(zk.get_children(base)) == ["a0", "a1", "a2"]
