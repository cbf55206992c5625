"""``AdminClient``: every operator request over one kazoo client, usable from Python, the CLI and the HTTP
API. It owns its parts (tasks, restarts, cluster, settings, stop, history, offsets), which share one
``ClusterReads``; its methods are theirs, so callers name the request, not the part that carries it out."""

from __future__ import annotations

from functools import partial

from kazoo.client import KazooClient

from controller.admin.cluster import ClusterAdmin
from controller.admin.load_plan import load_plans
from controller.admin.offsets import OffsetAdmin
from controller.admin.operations import SettingsAdmin
from controller.admin.reads import ClusterReads
from controller.admin.restarts import RestartAdmin
from controller.admin.roll import RollAdmin
from controller.admin.task_history import HistoryAdmin
from controller.admin.task_stop import StopAdmin
from controller.admin.tasks import TaskAdmin
from controller.protocol.layout import ZkLayout


class AdminClient:
    """Operator requests over one kazoo client. Reads are pipelined with the async API (a few waves of
    requests whatever the number of tasks); writes are single requests or one ``multi``.

    The parts are composed as kazoo attaches its recipes: each gets the client, the layout and the shared
    reads (and a callable where it needs another part's answer), and each of its requests is bound here."""

    def __init__(
        self, client: KazooClient, layout: ZkLayout, *, retries: int = 5, checkpoint_root: str | None = None
    ) -> None:
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
            self.history_admin.record,
            request_rebalance=lambda group, reason: self.cluster.rebalance(group=group, reason=reason),
        )
        self.offsets_admin = OffsetAdmin(
            client,
            layout,
            self.reads,
            checkpoint_root,
            require_stopped=self.stop_admin.require_stopped,
            record=self.history_admin.record,
            begin_reset=self.history_admin.begin_reset,
        )
        self.tasks = TaskAdmin(
            client,
            layout,
            self.reads,
            retries=retries,
            resume_guard=self.history_admin.check_resume,
            record=self.history_admin.record,
            checkpoint_size=self.offsets_admin.checkpoint_size,
            purge=self.offsets_admin.purge_note,
        )
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
        # run state and offsets
        self.stop = self.stop_admin.stop
        self.stop_state = self.stop_admin.stop_state
        self.offsets = self.offsets_admin.offsets
        self.reset_offsets = self.offsets_admin.reset_offsets
        self.history = self.history_admin.history
        self.checkpoint_size = self.offsets_admin.checkpoint_size
        self.purge_checkpoint = self.offsets_admin.purge_checkpoint
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

    @property
    def unreadable(self) -> set[str]:
        """Znodes a read met that these credentials may not read (the CLI warns of them)."""
        return self.reads.unreadable
