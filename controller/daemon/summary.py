"""The cluster summary writer: on the event thread, at most once per ``REFRESH_S``, counts the tasks from the
controller's context and writes ``/cluster_summary`` under the epoch fence when the counts changed (or every
``REWRITE_S`` unchanged). Counting is O(tasks) in memory; the write is one znode."""

from __future__ import annotations

import logging
import time

from kazoo.exceptions import ConnectionLoss, NoAuthError, OperationTimeoutError
from kazoo.handlers.threading import KazooTimeoutError

from controller.daemon.host import Host, context_of, writer_of
from controller.protocol.clock import Clock
from controller.protocol.cluster.layout import ZkLayout
from controller.protocol.records import codecs
from controller.protocol.tasks.summary import REFRESH_S, SummaryPlan, summarize
from controller.zk.io import WriteFailed

log = logging.getLogger(__name__)


class SummaryWriter:
    """Keeps ``/cluster_summary`` current for the activation in force."""

    def __init__(self, host: Host, layout: ZkLayout, clock: Clock, controller_id: str) -> None:
        self._host = host
        self._layout = layout
        self._clock = clock
        self._id = controller_id
        self._plan = SummaryPlan()
        self._next: float | None = None  # clock time of the next look (None: at once)

    def reset(self) -> None:
        """A new activation: its first look writes."""
        self._plan = SummaryPlan()
        self._next = None

    def deadline(self) -> float:
        return self._clock.now() if self._next is None else self._next

    def refresh(self) -> None:
        """Count, and write if the plan says so; the next look is ``REFRESH_S`` from now."""
        now = self._clock.now()
        if self._next is not None and now < self._next:
            return
        self._next = now + REFRESH_S
        ctx = context_of(self._host)
        epoch = self._host.epoch
        if epoch is None:
            return
        fresh = summarize(
            epoch,
            time.time(),  # wall time: readers on other machines compare it with theirs
            ctx.tasks,
            ctx.invalid_tasks,
            ctx.deleting,
            {g: coord.assignment for g, coord in ctx.groups.items()},
        )
        if not self._plan.should_write(fresh):
            return
        path = self._layout.cluster_summary
        try:
            self._host.write(lambda: writer_of(self._host).upsert([(path, codecs.encode(fresh))], ctx.known_paths))
        except (WriteFailed, NoAuthError) as exc:  # e.g. a secured root laid out before this znode existed
            log.error("controller %s: cannot write %s (%s)", self._id, path, exc)
            return
        except (ConnectionLoss, OperationTimeoutError, KazooTimeoutError) as exc:
            # The summary is advisory: a write cut short by the connection is written again at the next look.
            # Letting it through would make the event thread reload the whole context (what a decision's
            # failed write needs), here for one znode nobody depends on. A lost session still propagates.
            log.info(
                "controller %s: %s not written (%s); next look in %.0f s", self._id, path, type(exc).__name__, REFRESH_S
            )
            return
        self._plan = SummaryPlan(written=fresh)
