"""``AdminClient``: every operator request over one kazoo client, usable from Python, the CLI and the HTTP
API. It owns its parts (tasks, restarts, cluster, settings, stop, history, offsets), which share one
``ClusterReads``; its methods are theirs, so callers name the request, not the part that carries it out."""

from __future__ import annotations

from functools import partial

from kazoo.client import KazooClient

from controller.admin.cluster import ClusterAdmin
from controller.admin.common import WAIT_S
from controller.admin.load_plan import load_plans
from controller.admin.offsets import OffsetAdmin
from controller.admin.operations import SettingsAdmin
from controller.admin.reads import ClusterReads
from controller.admin.restarts import RestartAdmin
from controller.admin.roll_requests import RollAdmin
from controller.admin.task_apply import ApplyAdmin
from controller.admin.task_history import HistoryAdmin
from controller.admin.task_ops import TaskAdmin
from controller.admin.task_stop import StopAdmin
from controller.admin.task_wait import WaitAdmin
from controller.protocol.cluster.layout import ZkLayout
from controller.protocol.tasks.storage import ResetTarget


class AdminClient:
    """Operator requests over one kazoo client. Reads are pipelined with the async API (a few waves of
    requests whatever the number of tasks); writes are single requests or one ``multi``.

    The parts are composed as kazoo attaches its recipes: each gets the client, the layout and the shared
    reads (and a callable where it needs another part's answer), and each of its requests is bound here."""

    def __init__(self, client: KazooClient, layout: ZkLayout, *, retries: int = 5) -> None:
        self.client = client
        self.layout = layout
        self.retries = retries
        self.reads = ClusterReads(client, layout)
        self.settings_admin = SettingsAdmin(client, layout, retries=retries)
        self.history_admin = HistoryAdmin(client, layout, self.reads)
        self.stop_admin = StopAdmin(
            client,
            layout,
            self.reads,
            self.history_admin.check_lifecycle,
            request_rebalance=lambda group, reason: self.cluster.rebalance(group=group, reason=reason),
        )
        self.offsets_admin = OffsetAdmin(
            client,
            layout,
            self.reads,
            require_stopped=self.stop_admin.require_stopped,
            record=self.history_admin.record,
            begin_reset=self.history_admin.begin_reset,
        )
        self.tasks = TaskAdmin(
            client,
            layout,
            self.reads,
            retries=retries,
            lifecycle=self.history_admin.check_lifecycle,
            checkpoint_size=self.offsets_admin.checkpoint_size,
            purge=self.offsets_admin.purge_note,
        )
        self.apply_admin = ApplyAdmin(
            client,
            layout,
            self.reads,
            create=self.tasks.create_tasks,
            reset_guard=self.history_admin.lifecycle_version,
            reset=self._reset_for_apply,
            retries=retries,
        )
        self.wait_admin = WaitAdmin(client, layout, self.stop_admin.stop_state)
        self.restarts = RestartAdmin(client, layout, self.reads, self.tasks.list_tasks, retries=retries)
        self.cluster = ClusterAdmin(client, layout, self.reads, self.settings_admin.maintenance)
        self.rolls = RollAdmin(client, layout)

        # tasks
        self.create_tasks = self.tasks.create_tasks
        self.list_tasks = self.tasks.list_tasks
        self.list_page = self.tasks.list_page
        self.describe_task = self.tasks.describe_task
        self.delete_task = self.tasks.delete_task
        self.pause = self.tasks.pause
        self.resume = self.tasks.resume
        self.restart = self.tasks.restart
        self.reassign = self.tasks.reassign
        self.intervals = self.tasks.intervals
        self.apply = self.apply_admin.apply
        self.rollback = self.apply_admin.rollback
        self.wait = self.wait_admin.wait
        # run state and offsets
        self.stop = self.stop_admin.stop
        self.stop_state = self.stop_admin.stop_state
        self.offsets = self.offsets_admin.offsets
        self.reset_offsets = self.offsets_admin.reset_offsets
        self.history = self.history_admin.history
        self.checkpoint_size = self.offsets_admin.checkpoint_size
        self.purge_checkpoint = self.offsets_admin.purge_checkpoint
        self.task_logs = self.offsets_admin.logs
        # restarts
        self.restart_tasks = self.restarts.restart_tasks
        # cluster
        self.status = self.cluster.status
        self.brokers = self.cluster.brokers
        self.describe_group = self.cluster.describe_group
        self.rebalance = self.cluster.rebalance
        self.load_plans = partial(load_plans, self.cluster)
        self.shutdown_broker = self.cluster.shutdown_broker
        self.watch = self.cluster.watch
        # planned roll
        self.roll = self.rolls.roll
        self.resume_roll = self.rolls.resume_roll
        self.roll_status = self.rolls.roll_status
        # maintenance and settings
        self.maintenance = self.settings_admin.maintenance
        self.set_maintenance = self.settings_admin.set_maintenance
        self.settings = self.settings_admin.settings
        self.stored_settings = self.settings_admin.stored_settings
        self.update_settings = self.settings_admin.update_settings
        self.reset_settings = self.settings_admin.reset_settings

    def _reset_for_apply(self, task_id: str) -> str:
        """A STOPPED task's checkpoint reset to the earliest offsets once its new spec is written, as a note."""
        spec, _stat, _deleting = self.reads.spec(task_id)
        if getattr(spec.pipeline, "mode", None) != "streaming":
            return "no checkpoint to reset: the pipeline is not a streaming one"
        # the spec's write is newer than the group state that confirmed the stop: confirmed again first (as a
        # `task stop --wait` of a STOPPED task: its coordinator is asked to write its state if it writes nothing)
        stopped = self.stop_admin.stop(task_id, wait=WAIT_S)
        if not stopped.confirmed:
            return f"checkpoint NOT reset: the stop is not confirmed ({stopped.waiting_for}); run reset-offsets"
        done = self.offsets_admin.reset_offsets(task_id, ResetTarget.parse(True, False, None))
        return f"checkpoint reset to {done.target}" + (
            f" (sink batches {done.sink_batches_removed[0]}-{done.sink_batches_removed[-1]} removed)"
            if done.sink_batches_removed
            else ""
        )

    @property
    def unreadable(self) -> set[str]:
        """Znodes a read met that these credentials may not read (the CLI warns of them)."""
        return self.reads.unreadable
