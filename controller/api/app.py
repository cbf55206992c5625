"""The ASGI application, assembled: the routers by resource, the error shape, the request guard, the shared
event hub and the metrics. Handlers that read ZooKeeper are plain (threaded) functions: the admin library is
blocking kazoo I/O, pipelined inside each call; event streams and ``/healthz`` are async and hold no thread."""

from __future__ import annotations

from fastapi import FastAPI

from controller.admin.watch import ClusterWatch
from controller.api.context import API, LOOPBACK_HOSTS, ApiConfig, ApiContext
from controller.api.errors import install_error_handlers
from controller.api.guard import Guard, RequestPolicy
from controller.api.hub import EventHub
from controller.api.routes import brokers, cluster, console, events, groups, metrics, roll, settings, tasks
from controller.api.task_metrics import TaskMetricsCollector

__all__ = ["API", "ApiConfig", "LOOPBACK_HOSTS", "create_app"]


def create_app(config: ApiConfig) -> FastAPI:
    """Build the application; every request uses ``config.client`` (one session per server). The event hub
    is ``app.state.hub``: the server closes it when it shuts down, so open streams end instead of being
    cancelled mid-write."""
    app = FastAPI(
        title="zkcontroller",
        version="1",
        docs_url=f"{API}/docs",
        openapi_url=f"{API}/openapi.json",
        description="Tasks, brokers, groups and the controller of one zkcontroller cluster (one root).",
    )
    ctx = ApiContext(config)
    hub = EventHub(lambda: ClusterWatch(config.client, config.layout), config.max_streams, config.stream_buffer)
    per_task = TaskMetricsCollector(lambda n: ctx.admin().list_page(limit=max(1, n)), config.task_metrics_max)
    measured = metrics.RequestMetrics(hub, per_task)
    app.state.hub = hub
    install_error_handlers(app)
    for part in (
        tasks.router(ctx),
        roll.router(ctx),
        brokers.router(ctx),
        groups.router(ctx),
        cluster.router(ctx),
        settings.router(ctx),
        events.router(ctx, hub),
        metrics.router(ctx, measured),
    ):
        app.include_router(part)
    console.mount(app)
    policy = RequestPolicy(allowed_hosts=config.allowed_hosts, token=config.token, max_body_bytes=config.max_body_bytes)
    app.add_middleware(Guard, policy=policy, observe=measured.observe, docs_prefix=f"{API}/docs")
    return app
