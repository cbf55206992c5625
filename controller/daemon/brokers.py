"""Brokers: registrations under ``/brokers/ids`` (a broker's epoch is its znode's czxid), their
changes, and controlled shutdown requests."""

from __future__ import annotations

import logging
from typing import Any

from controller.protocol import codecs
from controller.daemon import events as ev
from controller.protocol.codecs import (
    BrokerInfo,
    PayloadError,
)
from controller.daemon.context import BrokerDelta, BrokerRecord
from controller.zk.io import exists_many, get_many

log = logging.getLogger(__name__)


class Brokers:
    """Broker registration and controlled-shutdown handlers."""

    def _broker_record(self, path: str, res: tuple[bytes, Any]) -> BrokerRecord:
        data, stat = res
        try:
            return BrokerRecord(stat.czxid, codecs.decode(BrokerInfo, data, path))
        except PayloadError as exc:
            log.warning("broker %s", exc)
            return BrokerRecord(stat.czxid, None, str(exc))

    # ---- event handlers ---------------------------------------------------------------------------
    def on_broker_change(self, token: int) -> None:
        """``/brokers/ids`` changed. Like Kafka's BrokerChange, compare every live broker's epoch (czxid)
        with the context's, so that a broker that re-registered under the same id (bounced) is told apart
        from one that joined or left even when its deletion and re-creation were seen as one change."""
        if not self._current(token):
            return
        ctx, lay = self.ctx, self.layout
        ids = sorted(self.zk.get_children(lay.broker_ids, watch=self._watch(ev.BrokerChange)))
        epochs = {b: st.czxid for b, st in zip(ids, exists_many(self.zk, [lay.broker(b) for b in ids])) if st is not None}
        read = sorted(b for b, epoch in epochs.items() if b not in ctx.brokers or ctx.brokers[b].epoch != epoch)
        self._refresh_brokers(read, gone=sorted(ctx.brokers.keys() - epochs.keys()))

    def on_broker_modifications(self, token: int, broker_ids: tuple[str, ...]) -> None:
        """Brokers' znodes changed or went away: a bounce (same id, new czxid) is a new broker."""
        if not self._current(token):
            return
        self._refresh_brokers(sorted(broker_ids), gone=[])

    def _refresh_brokers(self, read: list[str], gone: list[str]) -> None:
        """Re-read ``read`` (pipelined, re-arming their watches), drop ``gone``; record who joined, left
        or bounced."""
        ctx, lay = self.ctx, self.layout
        joined: list[str] = []
        left: list[str] = []
        bounced: list[str] = []
        watch = lambda p: self._watch(lambda t, b=p.rsplit('/', 1)[1]: ev.BrokerModification(t, b))
        gone = list(gone)
        for b, res in zip(read, get_many(self.zk, [lay.broker(b) for b in read], watch=watch)):
            old = ctx.brokers.get(b)
            if res is None:
                gone.append(b)
                continue
            record = self._broker_record(lay.broker(b), res)
            if old is None:
                joined.append(b)
            elif old.epoch != record.epoch:
                bounced.append(b)
            ctx.brokers[b] = record
        for b in gone:
            if ctx.brokers.pop(b, None) is not None:
                left.append(b)
        delta = BrokerDelta(tuple(sorted(joined)), tuple(sorted(left)), tuple(sorted(bounced)))
        self.metrics.brokers.set(len(ctx.brokers))
        if not delta:
            return
        ctx.broker_changes.append(delta)
        log.info("brokers joined %s, left %s, bounced %s", list(delta.joined), list(delta.left), list(delta.bounced))
        leaving = {m for ms in ctx.members.values() for m, r in ms.items() if r.leaving}
        clean = {b for b in delta.left if b in ctx.shutdown_requests or b in ctx.clean_exits or b in leaving}
        for b in delta.left + delta.bounced:
            self._finish_controlled_shutdown(b)  # that incarnation is gone; its request must not stop the next
        ctx.clean_exits.difference_update(delta.left)
        self._note_brokers(delta.joined + delta.bounced, delta.left, clean)

    def _finish_controlled_shutdown(self, broker_id: str) -> None:
        if broker_id in self.ctx.shutdown_requests:
            self.ctx.shutdown_requests.discard(broker_id)
            self._write(lambda: self.writer.delete_if_present([self.layout.admin_controlled_shutdown_of(broker_id)]))

    def on_controlled_shutdown(self, token: int) -> None:
        if not self._current(token):
            return
        ctx, lay = self.ctx, self.layout
        brokers = set(self.zk.get_children(lay.admin_controlled_shutdown, watch=self._watch(ev.ControlledShutdown)))
        for b in sorted(brokers - ctx.shutdown_requests):
            ctx.shutdown_requests.add(b)
            for g, coord in ctx.groups.items():
                if b in ctx.members.get(g, {}):
                    log.info("controlled shutdown of %s (group %s)", b, g)
                    self._apply(g, coord.on_controlled_shutdown(b))
            if b not in ctx.brokers:
                self._finish_controlled_shutdown(b)
        ctx.shutdown_requests &= brokers
