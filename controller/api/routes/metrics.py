"""``/metrics`` (Prometheus: requests by route and status, their latency, open event streams, each task's
figures: ``task_metrics``) and
``/healthz``."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from controller.api.context import ApiContext
from controller.api.hub import EventHub
from controller.api.task_metrics import TaskMetricsCollector


class RequestMetrics:
    """The API's own metrics, in a registry of their own (two servers in one process do not share them)."""

    def __init__(self, hub: EventHub, tasks: TaskMetricsCollector | None = None) -> None:
        self.registry = CollectorRegistry()
        if tasks is not None:
            self.registry.register(tasks)
        self.requests = Counter(
            "zkc_api_requests",
            "HTTP requests by route and status",
            ["method", "route", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "zkc_api_request_seconds", "HTTP request latency by route", ["method", "route"], registry=self.registry
        )
        streams = Gauge("zkc_api_event_streams", "event streams open", registry=self.registry)
        streams.set_function(lambda: len(hub.streams))
        dropped = Gauge(
            "zkc_api_event_streams_dropped", "event streams dropped for falling behind", registry=self.registry
        )
        dropped.set_function(lambda: hub.dropped)

    def observe(self, method: str, route: str, status: int, seconds: float) -> None:
        self.requests.labels(method, route, str(status)).inc()
        self.latency.labels(method, route).observe(seconds)


def router(ctx: ApiContext, metrics: RequestMetrics) -> APIRouter:
    r = APIRouter(include_in_schema=False)

    @r.get("/metrics")
    def prometheus() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @r.get("/healthz")
    async def healthz() -> dict[str, Any]:  # async: answers even when every worker thread is busy
        return {
            "zookeeper": "connected" if ctx.config.client.connected else "unreachable",
            "root": ctx.config.layout.root,
        }

    return r
