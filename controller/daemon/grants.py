"""Handing tasks over between brokers with identities of their own: before an assignment that gives a
task to a broker is written, ``/tasks/<t>`` (CREATE/DELETE of its ``owner`` child) and ``/status/<t>``
(WRITE) are given to that broker's identity alone, so no other broker can delete its owner znode or
rewrite its status. setACL cannot go in a multi, so the setACLs are sent (pipelined) and awaited first.
A missing znode is skipped (no status yet, or a task being deleted); NoAuth (an ACL from before the
per-broker policy) is logged, and the assignee waits, bounded; any other failure (connection loss) aborts
the write, and the controller reloads and writes again.

Only a secured cluster whose policy names per-broker identities pays for this; the rest is untouched."""

from __future__ import annotations

import logging
from typing import Any

from kazoo.exceptions import NoAuthError, NoNodeError

from controller.daemon.host import Host
from controller.protocol.cluster.acl import AclPolicy, grants_needed
from controller.protocol.cluster.layout import ZkLayout
from controller.protocol.group.vocabulary import WriteAssignments
from controller.zk.io import InterruptibleClient
from controller.zk.security import acl_for

log = logging.getLogger(__name__)


class TaskGrants:
    """The controller part that hands ``/tasks/<t>`` and ``/status/<t>`` to a task's assignee."""

    def __init__(self, host: Host, zk: InterruptibleClient, layout: ZkLayout, controller_id: str) -> None:
        self._host = host
        self._zk = zk
        self._layout = layout
        self._id = controller_id

    def _policy_per_broker(self) -> AclPolicy | None:
        policy = getattr(self._zk, "policy", None)
        return policy if isinstance(policy, AclPolicy) and policy.per_broker else None

    def per_broker(self) -> bool:
        """Whether tasks are handed to their assignee's identity alone (then only with its assignment)."""
        return self._policy_per_broker() is not None

    def hand_over(self, decisions: list[Any]) -> None:
        """setACL the tasks these decisions assign to a broker they were not granted to yet (this
        activation's record, ``ctx.task_grants``: empty after a failover, so the first write re-grants
        every task it assigns)."""
        policy = self._policy_per_broker()
        ctx = self._host.ctx
        if policy is None or ctx is None:
            return
        assigned = [(m, a.assigned) for d in decisions if isinstance(d, WriteAssignments) for m, a in d.assignments]
        moves = grants_needed(assigned, ctx.task_grants)
        if not moves:
            return
        lay = self._layout
        pending = [
            (t, path, self._zk.set_acls_async(path, acl_for(policy, lay, path, owner=b)))
            for t, b in sorted(moves.items())
            for path in (lay.task(t), lay.status(t))
        ]
        refused: list[str] = []
        for _t, path, result in pending:
            try:
                result.get()
            except NoNodeError:
                continue  # no status yet (its assignee creates it), or the task is being deleted
            except NoAuthError:  # an ACL from before the per-broker policy: `security init` fixes it
                refused.append(path)
        if refused:
            log.error(
                "controller %s: no ADMIN right on %d znodes to hand them to their assignee (run "
                "`zkctl security init` again): %s",
                self._id,
                len(refused),
                refused[:5],
            )
        ctx.task_grants.update(moves)
        log.debug("controller %s: handed %d tasks to their assignees", self._id, len(moves))
