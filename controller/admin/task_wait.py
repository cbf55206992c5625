"""``task wait``: until tasks are running, stopped or deleted, read from ZooKeeper alone, with watches on what is
read and a bounded poll behind them (as ``kubectl wait``: the answer says what each task still waits for)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kazoo.client import KazooClient

from controller.admin.common import AdminError, Progress, Watch, wait_watched
from controller.admin.reads import decode_read
from controller.admin.task_stop import StopState
from controller.protocol.cluster.layout import ZkLayout, check_name
from controller.protocol.records import task_records
from controller.protocol.records.payload_validation import PayloadError
from controller.protocol.tasks.spec import decode_task
from controller.zk.io import exists_many, get_many

CONDITIONS = ("running", "stopped", "deleted")
#: tasks one wait may name (each look reads three znodes of each)
MAX_WAITED = 1000
#: the longest wait asked for (seconds)
MAX_WAIT_S = 24 * 3600.0


@dataclass(frozen=True)
class WaitResult:
    """``reached``: every task met the condition in time; ``waiting``: what each task that did not waits for."""

    condition: str
    reached: bool
    tasks: tuple[str, ...]
    waiting: tuple[tuple[str, str], ...] = ()


class WaitAdmin:
    """Waits for tasks to reach a condition; each look is one wave of reads whose watches wake the next."""

    def __init__(
        self, client: KazooClient, layout: ZkLayout, stop_state: Callable[[str, Watch | None], StopState]
    ) -> None:
        self.client = client
        self.layout = layout
        #: ``StopAdmin.stop_state``: whether a task is confirmed stopped, and what it waits for
        self.stop_state = stop_state

    def wait(
        self, task_ids: Sequence[str], condition: str, timeout: float, progress: Progress | None = None
    ) -> WaitResult:
        ids = list(dict.fromkeys(check_name("task id", t) for t in task_ids))
        if not ids:
            raise AdminError("name at least one task to wait for")
        if len(ids) > MAX_WAITED:
            raise AdminError(f"at most {MAX_WAITED} tasks per wait, not {len(ids)}")
        if condition not in CONDITIONS:
            raise AdminError(f"--for takes one of {', '.join(CONDITIONS)}, not {condition!r}")
        if not 0 <= timeout <= MAX_WAIT_S:
            raise AdminError(f"--timeout must be from 0 to {MAX_WAIT_S:g} seconds")
        last: dict[str, str] = {}

        def look(watch: Watch) -> tuple[int, int]:
            last.clear()
            if condition == "running":  # every task's three znodes in one pipelined wave, not a round trip each
                whys = self._running_many(ids, watch)
            else:
                whys = [self.waiting_for(t, condition, watch) for t in ids]
            last.update((t, why) for t, why in zip(ids, whys) if why is not None)
            return len(ids) - len(last), len(ids)

        reached = wait_watched(look, timeout, interval=0.5, progress=progress)
        return WaitResult(condition, reached, tuple(ids), tuple((t, last[t]) for t in ids if t in last))

    def waiting_for(self, task_id: str, condition: str, watch: Watch | None = None) -> str | None:
        """What ``task_id`` waits for to meet ``condition`` (None: it meets it)."""
        lay = self.layout
        if condition == "deleted":
            return None if self.client.exists(lay.task(task_id), watch=watch) is None else "its deletion"
        if condition == "stopped":
            if self.client.exists(lay.task(task_id), watch=watch) is None:
                return "the task, which does not exist"
            state = self.stop_state(task_id, watch)
            return None if state.confirmed else (state.waiting_for or "its stop")
        return self._running(task_id, watch)

    def _running(self, task_id: str, watch: Watch | None) -> str | None:
        return self._running_many([task_id], watch)[0]

    def _running_many(self, ids: Sequence[str], watch: Watch | None) -> list[str | None]:
        """Running: the spec RUNNING, an owner, and the owner's status RUNNING on the spec's current version.
        One pipelined ``get`` of every znode, then one pipelined ``exists`` of those missing (a ``get`` of a
        missing znode arms no watch)."""
        lay = self.layout
        paths = [p for t in ids for p in (lay.task(t), lay.task_owner(t), lay.status(t))]
        arm = (lambda _p: watch) if watch is not None else None
        got = get_many(self.client, paths, arm)
        exists_many(self.client, [p for p, g in zip(paths, got, strict=True) if g is None], arm)
        return [self._running_from(t, got[3 * i : 3 * i + 3]) for i, t in enumerate(ids)]

    def _running_from(self, task_id: str, got: Sequence[tuple[bytes, Any] | None]) -> str | None:
        lay = self.layout
        paths = (lay.task(task_id), lay.task_owner(task_id), lay.status(task_id))
        spec_res, owner_res, status_res = got
        if spec_res is None:
            return "the task, which does not exist"
        try:
            spec = decode_task(spec_res[0], paths[0])
        except PayloadError as exc:
            return f"a valid spec ({exc.reason})"
        if spec.state != "RUNNING":
            return f"a resume (the task is {spec.state})"
        owner, _ = decode_read(task_records.OwnerInfo, owner_res, paths[1])
        if owner is None:
            return "an owner (no broker has taken it yet)"
        status, err = decode_read(task_records.TaskStatus, status_res, paths[2])
        if status is None or status.broker != owner.broker:
            return f"{owner.broker} to report it ({err or 'no status yet'})"
        if status.state != "RUNNING":
            what = f"{owner.broker} to run it (it is {status.state}"
            return what + (f": {status.error[:200]})" if status.error else ")")
        if status.revision is not None and status.revision != spec.revision:
            return f"{owner.broker} to run spec version {spec.revision} (it runs {status.revision})"
        return None
