"""Brokers: registrations under ``/brokers/ids`` (a broker's epoch is its znode's czxid), their
changes, and controlled shutdown requests."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from kazoo.exceptions import NoNodeError

from controller.daemon import events as ev
from controller.daemon.context import BrokerDelta, BrokerRecord
from controller.daemon.host import Host, Watcher, context_of, writer_of
from controller.daemon.metrics import ControllerMetrics
from controller.daemon.names import legal_children
from controller.daemon.operations import OperatorSettings
from controller.protocol.cluster.layout import ZkLayout
from controller.protocol.records import codecs
from controller.protocol.records.admin_records import ControlledShutdownRequest
from controller.protocol.records.payload_validation import PayloadError
from controller.protocol.records.registration_records import BrokerInfo
from controller.protocol.tasks.load import broker_figures
from controller.zk.io import InterruptibleClient, exists_many, get_many

log = logging.getLogger(__name__)

#: the longest an in-place restart's tasks wait for their broker, whatever its request asks
MAX_IN_PLACE_HOLD_S = 3600.0


def broker_record(path: str, res: tuple[bytes, Any]) -> BrokerRecord:
    """A broker's registration as read; garbage is kept as an error, so the broker still counts as live."""
    data, stat = res
    try:
        return BrokerRecord(stat.czxid, codecs.decode(BrokerInfo, data, path), session=stat.ephemeralOwner)
    except PayloadError as exc:
        log.warning("broker %s", exc)
        return BrokerRecord(stat.czxid, None, str(exc), session=stat.ephemeralOwner)


class BrokerTracker:
    """Broker registration and controlled-shutdown handlers."""

    def __init__(
        self,
        host: Host,
        zk: InterruptibleClient,
        layout: ZkLayout,
        metrics: ControllerMetrics,
        operations: OperatorSettings,
        on_readiness: Callable[[Sequence[str]], None],
    ) -> None:
        self._on_readiness = on_readiness
        #: broker -> its bounded task figures (task -> load share), as its registration last said
        self._loads: dict[str, dict[str, float]] = {}
        self._load_problems: dict[str, tuple[str, ...]] = {}
        self._host = host
        self._zk = zk
        self._layout = layout
        self._metrics = metrics
        self._operations = operations

    def broker_watch(self, path: str) -> Watcher:
        """The data watch of one broker's znode (``path``): a firing re-reads that broker."""
        broker = path.rsplit("/", 1)[1]
        return self._host.watch(lambda t: ev.BrokerModification(t, broker))

    # ---- event handlers ---------------------------------------------------------------------------
    def on_broker_change(self, token: int) -> None:
        """``/brokers/ids`` changed. Like Kafka's BrokerChange, compare every live broker's epoch (czxid)
        with the context's, so that a broker that re-registered under the same id (bounced) is told apart
        from one that joined or left even when its deletion and re-creation were seen as one change."""
        if not self._host.current(token):
            return
        ctx, lay = context_of(self._host), self._layout
        ids = legal_children(
            self._host,
            lay,
            lay.broker_ids,
            self._zk.get_children(lay.broker_ids, watch=self._host.watch(ev.BrokerChange)),
        )
        stats = exists_many(self._zk, [lay.broker(b) for b in ids])
        epochs = {b: st.czxid for b, st in zip(ids, stats) if st is not None}
        read = sorted(b for b, epoch in epochs.items() if b not in ctx.brokers or ctx.brokers[b].epoch != epoch)
        self._refresh_brokers(read, gone=sorted(ctx.brokers.keys() - epochs.keys()))

    def on_broker_modifications(self, token: int, broker_ids: tuple[str, ...]) -> None:
        """Brokers' znodes changed or went away: a bounce (same id, new czxid) is a new broker."""
        if not self._host.current(token):
            return
        self._refresh_brokers(sorted(broker_ids), gone=[])

    def _refresh_brokers(self, read: list[str], gone: list[str]) -> None:
        """Re-read ``read`` (pipelined, re-arming their watches), drop ``gone``; record who joined, left
        or bounced."""
        ctx, lay = context_of(self._host), self._layout
        joined: list[str] = []
        left: list[str] = []
        bounced: list[str] = []
        gone = list(gone)
        unready_before = ctx.unready_brokers()
        for b, res in zip(read, get_many(self._zk, [lay.broker(b) for b in read], watch=self.broker_watch)):
            old = ctx.brokers.get(b)
            if res is None:
                gone.append(b)
                continue
            record = broker_record(lay.broker(b), res)
            if old is None:
                joined.append(b)
            elif old.epoch != record.epoch:
                bounced.append(b)
            ctx.brokers[b] = record
        for b in gone:
            if ctx.brokers.pop(b, None) is not None:
                left.append(b)
        self._note_loads(read, gone)
        delta = BrokerDelta(tuple(sorted(joined)), tuple(sorted(left)), tuple(sorted(bounced)))
        self._metrics.brokers.set(len(ctx.brokers))
        flipped = sorted(unready_before ^ ctx.unready_brokers())
        if flipped:  # a session became ready (its member may now be placed), or a broker stopped being ready
            log.info("brokers whose session readiness changed: %s", flipped)
            self._on_readiness(flipped)
        if not delta:
            return
        ctx.broker_changes.append(delta)
        log.info("brokers joined %s, left %s, bounced %s", list(delta.joined), list(delta.left), list(delta.bounced))
        leaving = {m for ms in ctx.members.values() for m, r in ms.items() if r.leaving}
        clean = {b for b in delta.left if b in ctx.shutdown_requests or b in ctx.clean_exits or b in leaving}
        for b in delta.left + delta.bounced:
            self._finish_controlled_shutdown(b)  # that incarnation is gone; its request must not stop the next
        ctx.clean_exits.difference_update(delta.left)
        self._operations.note_brokers(delta.joined + delta.bounced, delta.left, clean)
        arrived = set(delta.joined + delta.bounced)
        for g, m in sorted(k for k in ctx.ghost_members if k[1] in arrived):
            self._host.put(ev.MemberChange(self._host.token, g, m))  # its broker is here now: read it again

    def _note_loads(self, read: list[str], gone: list[str]) -> None:
        """The load reports of the brokers just read, bounded (a repaired one logged once), to every group."""
        ctx = context_of(self._host)
        changed = False
        for b in gone:
            changed |= self._loads.pop(b, None) is not None
            self._load_problems.pop(b, None)
        for b in read:
            record = ctx.brokers.get(b)
            raw = record.info.load if record is not None and record.info is not None else None
            f = broker_figures(raw)
            if f.problems and self._load_problems.get(b) != f.problems:
                log.warning("broker %s: its load report was repaired: %s", b, "; ".join(f.problems))
            self._load_problems[b] = f.problems
            tasks = dict(f.tasks)
            if self._loads.get(b) != tasks:
                self._loads[b] = tasks
                changed = True
        if changed:
            reports = dict(self._loads)
            for coord in ctx.groups.values():
                coord.on_load_reports(reports)

    def _finish_controlled_shutdown(self, broker_id: str) -> None:
        ctx = context_of(self._host)
        if broker_id in ctx.shutdown_requests:
            ctx.shutdown_requests.discard(broker_id)
            path = self._layout.admin_controlled_shutdown_of(broker_id)
            self._host.write(lambda: writer_of(self._host).delete_if_present([path]))

    def _read_request(self, broker_id: str) -> ControlledShutdownRequest | None:
        """The controlled-shutdown request of ``broker_id`` (None: gone, or refused). Only the operator and
        the controller may create one (the ACL policy); one that does not decode, or names another broker,
        is refused: logged and deleted, never acted on."""
        path = self._layout.admin_controlled_shutdown_of(broker_id)
        try:
            data, _ = self._zk.get(path)
            request = codecs.decode(ControlledShutdownRequest, data, path)
        except NoNodeError:
            return None
        except PayloadError as exc:
            self._refuse(path, f"{exc}")
            return None
        if request.broker != broker_id:
            self._refuse(path, f"it names broker {request.broker[:200]!r}")
            return None
        return request

    def _refuse(self, path: str, why: str) -> None:
        log.warning("refusing the controlled-shutdown request %s: %s; deleting it", path, why[:500])
        self._host.write(lambda: writer_of(self._host).delete_if_present([path]))

    def on_controlled_shutdown(self, token: int) -> None:
        if not self._host.current(token):
            return
        ctx, lay = context_of(self._host), self._layout
        watch = self._host.watch(ev.ControlledShutdown)
        brokers = set(
            legal_children(
                self._host,
                lay,
                lay.admin_controlled_shutdown,
                self._zk.get_children(lay.admin_controlled_shutdown, watch=watch),
            )
        )
        for b in sorted(brokers - ctx.shutdown_requests):
            request = self._read_request(b)
            if request is None:
                brokers.discard(b)
                continue
            ctx.shutdown_requests.add(b)
            hold_s = min(max(request.hold_s, 0.0), MAX_IN_PLACE_HOLD_S) if request.in_place else None
            for g, coord in ctx.groups.items():
                if b in ctx.members.get(g, {}):
                    if hold_s is not None and coord.holds.hold_on_leave(b, hold_s):
                        log.info("%s restarts in place (group %s): its tasks wait up to %.0fs for it", b, g, hold_s)
                        continue
                    log.info("controlled shutdown of %s (group %s)", b, g)
                    self._host.apply(g, coord.on_controlled_shutdown(b))
            if b not in ctx.brokers:
                self._finish_controlled_shutdown(b)
        ctx.shutdown_requests &= brokers
