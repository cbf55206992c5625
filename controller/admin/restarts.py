"""Restarting many tasks at once (Kafka Connect's KIP-745 ``onlyFailed``): every FAILED task, of one group
or all, restarted by one batched write that bumps each spec's ``restart_nonce`` (as ``task restart`` does
for one task), conditional on each spec's znode version."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NoNodeError, RolledBackError

from controller.admin.common import WAIT_S, AdminError
from controller.admin.reads import ClusterReads
from controller.admin.views import BulkRestart, SkippedRestart, TaskChange, TaskRow, restart_candidates
from controller.protocol.cluster.layout import ZkLayout
from controller.protocol.records.payload_validation import PayloadError
from controller.protocol.tasks.spec import decode_task
from controller.zk.io import SetData, chunk_ops

#: the task listing a bulk restart chooses from (``TaskAdmin.list_tasks``): what ``task list`` shows
ListTasks = Callable[[str | None], list[TaskRow]]


class RestartAdmin:
    """The bulk-restart part of ``AdminClient``: it chooses from the task listing and writes the specs back."""

    def __init__(
        self, client: KazooClient, layout: ZkLayout, reads: ClusterReads, list_tasks: ListTasks, *, retries: int = 5
    ) -> None:
        self.client = client
        self.layout = layout
        self.reads = reads
        self.list_tasks = list_tasks
        self.retries = retries

    def restart_tasks(self, group: str | None = None, only_failed: bool = True) -> BulkRestart:
        """Restart every task shown FAILED (``only_failed``; else every task) of ``group`` (None: all groups).

        The candidates come from one pipelined read (what ``task list`` shows); their specs are re-read and
        written back with the nonce bumped in multis (one for up to a thousand tasks), each write conditional on
        the version read. A multi that meets a concurrent change is retried from a fresh read (bounded by
        ``retries``); a task deleted meanwhile is reported as skipped."""
        chosen, skipped = restart_candidates(self.list_tasks(group), only_failed)
        restarted: list[TaskChange] = []
        multis = 0
        todo = chosen
        for _ in range(self.retries):
            if not todo:
                break
            done, todo, passed, sent = self._bump_nonces(todo)
            restarted += done
            skipped += passed
            multis += sent
        if todo:
            made = f"; restarted meanwhile: {', '.join(c.task_id for c in restarted)}" if restarted else ""
            raise AdminError(f"the specs of {', '.join(todo)} kept changing during the restart; try again{made}")
        return BulkRestart(
            only_failed,
            group,
            tuple(sorted(restarted, key=lambda c: c.task_id)),
            tuple(sorted(skipped, key=lambda s: s.task_id)),
            multis,
        )

    def _bump_nonces(self, task_ids: Sequence[str]) -> tuple[list[TaskChange], list[str], list[SkippedRestart], int]:
        """One round: read the specs (one wave), write them back with the nonce bumped (pipelined multis).
        Returns (changes made, tasks to try again, tasks skipped, multis sent)."""
        lay = self.layout
        got, _ = self.reads.wave([lay.task(t) for t in task_ids] + [lay.admin_delete_task(t) for t in task_ids])
        n = len(task_ids)
        ops: list[SetData] = []
        new_specs: dict[str, Any] = {}
        skipped: list[SkippedRestart] = []
        for i, t in enumerate(task_ids):
            res, deleting = got[i], got[n + i]
            if res is None:
                skipped.append(SkippedRestart(t, "deleted meanwhile"))
                continue
            if deleting is not None:
                skipped.append(SkippedRestart(t, "being deleted"))
                continue
            try:
                spec = decode_task(res[0], lay.task(t))
            except PayloadError as exc:
                skipped.append(SkippedRestart(t, f"invalid spec: {exc.reason}"))
                continue
            new = spec.model_copy(update={"restart_nonce": spec.restart_nonce + 1})
            new_specs[t] = new
            ops.append(SetData(lay.task(t), new.encode(), version=res[1].version))
        pending = []
        for batch in chunk_ops(ops):
            tx = self.client.transaction()
            for op in batch:
                assert isinstance(op, SetData)  # chunk_ops keeps the ops it is given
                tx.set_data(op.path, op.data, version=op.version)
            pending.append((batch, tx.commit_async()))
        done: list[TaskChange] = []
        again: list[str] = []
        for batch, result in pending:
            results = result.get(timeout=WAIT_S)
            errors = [(op, r) for op, r in zip(batch, results) if isinstance(r, Exception)]
            if not errors:
                for op, stat in zip(batch, results):
                    t = op.path.rsplit("/", 1)[1]
                    done.append(
                        TaskChange(t, "restart", True, new_specs[t].state, new_specs[t].restart_nonce, stat.version)
                    )
                continue
            gone = {op.path for op, r in errors if isinstance(r, NoNodeError)}
            unexpected = [
                (op, r) for op, r in errors if not isinstance(r, (NoNodeError, BadVersionError, RolledBackError))
            ]
            if unexpected:
                op, r = unexpected[0]
                raise AdminError(f"restarting {op.path.rsplit('/', 1)[1]}: {type(r).__name__}")
            for op in batch:  # a multi is all or nothing: every other task of it is tried again
                t = op.path.rsplit("/", 1)[1]
                if op.path in gone:
                    skipped.append(SkippedRestart(t, "deleted meanwhile"))
                else:
                    again.append(t)
        return done, again, skipped, len(pending)
