"""Whole subtrees deleted: listed level by level in multiRead requests, deleted deepest level first."""

from __future__ import annotations

import logging

from kazoo.client import KazooClient
from kazoo.exceptions import (
    NoNodeError,
    NotEmptyError,
)

from controller.zk.io import WAIT_S, WriteFailed
from controller.zk.multi_read import multi_children

log = logging.getLogger(__name__)

DELETE_TREE_OPS = 1000  # deletes per multi
DELETE_TREE_ROUNDS = 5  # listings of the tree, when znodes are created under it while it is deleted


def delete_tree(client: KazooClient, path: str, max_nodes: int = 2_000_000) -> int:
    """Delete ``path`` and its subtree; returns how many znodes went. kazoo's ``delete(recursive=True)`` pays
    a round trip per znode (a freshly laid out root: 528 znodes, 1-2 s); here the tree is listed level by
    level in multiRead requests and deleted deepest level first in multis of ``DELETE_TREE_OPS``. A multi
    that fails (a znode gone or created meanwhile) is redone one znode at a time; a child created under
    the tree while it goes makes its parent's delete fail, and the tree is listed again (bounded rounds)."""
    deleted = 0
    for _ in range(DELETE_TREE_ROUNDS):
        levels: list[list[str]] = [[path]]
        seen = 1
        while levels[-1] and seen < max_nodes:
            kids = multi_children(client, levels[-1])
            level = [f"{p.rstrip('/')}/{c}" for p, cs in zip(levels[-1], kids) for c in (cs or ())]
            seen += len(level)
            levels.append(level)
        if seen >= max_nodes:
            raise WriteFailed(f"{path} has more than {max_nodes} znodes: not deleted", [])
        blocked = False
        for level in reversed(levels):
            for lo in range(0, len(level), DELETE_TREE_OPS):
                chunk = level[lo : lo + DELETE_TREE_OPS]
                tx = client.transaction()
                for p in chunk:
                    tx.delete(p)
                if not any(isinstance(r, Exception) for r in tx.commit()):
                    deleted += len(chunk)
                    continue
                for pending in [client.delete_async(p) for p in chunk]:  # all sent, then all awaited
                    try:
                        pending.get(timeout=WAIT_S)
                        deleted += 1
                    except NoNodeError:
                        pass
                    except NotEmptyError:
                        blocked = True
        if not blocked:
            return deleted
    raise WriteFailed(f"{path}: znodes kept being created under it; not deleted after {DELETE_TREE_ROUNDS} rounds", [])
