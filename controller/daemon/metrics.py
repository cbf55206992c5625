"""Prometheus metrics of one controller (its own registry, so several can live in one process) and a
small HTTP server, on a named thread, that serves them as Prometheus text."""

from __future__ import annotations

import threading
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, make_wsgi_app


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # no access log on stderr
        pass


class ControllerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        buckets = (0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 30)
        self.events = Counter("zkc_controller_events", "events processed", ["event"], registry=r)
        # raw events = zkc_controller_events + this, per type (ControllerEventThread's live coalescing)
        self.merged_events = Counter(
            "zkc_controller_events_merged",
            "events processed inside a merged re-read, not on their own",
            ["event"],
            registry=r,
        )
        self.queue_time = Histogram(
            "zkc_controller_event_queue_seconds",
            "time events wait in the queue",
            ["event"],
            buckets=buckets,
            registry=r,
        )
        self.process_time = Histogram(
            "zkc_controller_event_process_seconds", "time to process an event", ["event"], buckets=buckets, registry=r
        )
        self.queue_size = Gauge("zkc_controller_queue_size", "events waiting", registry=r)
        self.epoch = Gauge("zkc_controller_epoch", "controller epoch of this candidate when active", registry=r)
        self.active = Gauge("zkc_controller_active", "1 if this candidate is the active controller", registry=r)
        self.brokers = Gauge("zkc_controller_brokers", "live brokers", registry=r)
        self.tasks = Gauge("zkc_controller_tasks", "tasks known", registry=r)
        self.invalid_tasks = Gauge("zkc_controller_invalid_tasks", "tasks whose spec is malformed", registry=r)
        self.zk_writes = Counter("zkc_controller_zk_write_requests", "ZooKeeper write requests (multis)", registry=r)
        self.fenced = Counter("zkc_controller_fenced_writes", "writes rejected by the epoch check", registry=r)
        self.rebalances = Counter("zkc_controller_rebalances", "rebalances started", ["group"], registry=r)
        self.ignored_members = Gauge(
            "zkc_controller_ignored_members",
            "member znodes given no work: no live broker of the same session behind them, or a refused request",
            ["group"],
            registry=r,
        )
        self.unacked = Gauge(
            "zkc_controller_unacked_members",
            "reconcile: members that have not acknowledged their current assignment",
            ["group"],
            registry=r,
        )
        self.fenced_tasks = Gauge(
            "zkc_controller_fenced_tasks",
            "reconcile: tasks a member was fenced from (not taken within the rebalance timeout), this activation",
            ["group"],
            registry=r,
        )
        self.maintenance = Gauge("zkc_controller_maintenance", "1 while the cluster is in maintenance mode", registry=r)
        self.moving = Gauge(
            "zkc_group_moves_in_flight", "moved tasks not yet running on their new owner", ["group"], registry=r
        )
        self.deferred = Gauge(
            "zkc_group_moves_deferred", "moves waiting for a later wave (throttle, maintenance)", ["group"], registry=r
        )
        self.imbalance = Gauge(
            "zkc_group_imbalance", "tasks the group's assignor would move from where they run", ["group"], registry=r
        )

    def observe(self, event: str, queued: float, elapsed: float) -> None:
        self.events.labels(event).inc()
        self.queue_time.labels(event).observe(queued)
        self.process_time.labels(event).observe(elapsed)

    def observe_merged(self, event: str, n: int) -> None:
        """``n`` events of type ``event`` were processed inside one merged event (the thread's ``on_merge``)."""
        self.merged_events.labels(event).inc(n)


class MetricsServer:
    """Serves a registry at ``http://host:port/metrics`` from one named daemon thread."""

    def __init__(
        self, registry: CollectorRegistry, port: int, host: str = "127.0.0.1", name: str = "metrics-http"
    ) -> None:
        self._server: WSGIServer = make_server(host, port, make_wsgi_app(registry), handler_class=_QuietHandler)
        self.port = self._server.server_port
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.5}, name=name, daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)
