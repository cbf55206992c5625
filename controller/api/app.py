"""The ASGI application: ``/api/v1`` over ``AdminClient``, server-sent events from ZooKeeper watches, the
console's static files, Prometheus metrics. Handlers are plain (threaded) functions: the admin library is
blocking kazoo I/O, pipelined inside each call."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from fastapi import Body, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, Response, StreamingResponse
from fastapi.staticfiles import StaticFiles
from kazoo.client import KazooClient
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest

from controller.protocol import codecs
from controller.admin import AdminClient, to_dict
from controller.api.auth import check_bearer
from controller.api.errors import HANDLED, ApiError, classify
from controller.protocol.layout import ZkLayout
from controller.protocol.taskspec import SpecError, parse_spec

STATIC = Path(__file__).resolve().parent / "static"
API = "/api/v1"
WRITE_METHODS = frozenset({"POST", "PUT", "DELETE", "PATCH"})


@dataclass(frozen=True)
class ApiConfig:
    """What one API server serves: its ZooKeeper client and root, and the admin token (None: writes open)."""

    client: KazooClient
    layout: ZkLayout
    token: str | None = None
    sse_idle_s: float = 15.0      # keep-alive comment on a quiet event stream
    max_wait_s: float = 600.0     # the longest ?timeout= a request may ask for


def _error(status: int, code: str, message: str) -> JSONResponse:
    return JSONResponse({"error": code, "message": message}, status_code=status)


def create_app(config: ApiConfig) -> FastAPI:
    """Build the application; every request uses ``config.client`` (one session per server)."""
    app = FastAPI(title="zkcontroller", version="1", docs_url=f"{API}/docs", openapi_url=f"{API}/openapi.json",
                  description="Tasks, brokers, groups and the controller of one zkcontroller cluster (one root).")
    registry = CollectorRegistry()
    requests = Counter("zkc_api_requests", "HTTP requests by route and status", ["method", "route", "status"],
                       registry=registry)
    latency = Histogram("zkc_api_request_seconds", "HTTP request latency by route", ["method", "route"],
                        registry=registry)

    def admin() -> AdminClient:
        if not config.client.connected:
            raise ApiError(503, "zookeeper_unavailable", "ZooKeeper is not reachable from this API server; retry later")
        return AdminClient(config.client, config.layout)

    def waited(wait: bool, timeout: float) -> float:
        if timeout < 0 or timeout > config.max_wait_s:
            raise ApiError(422, "invalid_parameter", f"timeout must be between 0 and {config.max_wait_s:g} seconds")
        return timeout if wait else 0.0

    def done_or_504(result: Any, wait: bool) -> Any:
        body = to_dict(result)
        if wait and not getattr(result, "done", True):
            return _error(504, "timeout", f"not done within the wait: {json.dumps(body, default=str)}")
        return body

    # ---- cross-cutting: auth for writes, errors, metrics ----------------------------------------------
    @app.middleware("http")
    async def guard(request: Request, call_next: Callable) -> Response:
        started = time.perf_counter()
        if config.token is not None and request.method in WRITE_METHODS and request.url.path.startswith(API):
            status = check_bearer(request.headers.get("authorization"), config.token)
            if status is not None:
                response: Response = _error(status, "unauthorized" if status == 401 else "forbidden",
                                            "writes need 'Authorization: Bearer <admin token>'" if status == 401
                                            else "the admin token given is not this server's")
            else:
                response = await call_next(request)
        else:
            response = await call_next(request)
        route = request.scope.get("route")
        name = getattr(route, "path", "other")
        requests.labels(request.method, name, str(response.status_code)).inc()
        latency.labels(request.method, name).observe(time.perf_counter() - started)
        return response

    async def known_errors(_request: Request, exc: Exception) -> JSONResponse:
        known = classify(exc)
        if known is None:  # a subclass we do not map (a kazoo error we did not expect): still JSON
            return _error(500, "internal", f"{type(exc).__name__}: {exc}")
        return _error(*known)

    for kind in HANDLED:
        app.add_exception_handler(kind, known_errors)

    @app.exception_handler(ApiError)
    async def api_errors(_request: Request, exc: ApiError) -> JSONResponse:
        return _error(exc.status, exc.code, exc.message)

    @app.exception_handler(RequestValidationError)
    async def bad_parameters(_request: Request, exc: RequestValidationError) -> JSONResponse:
        parts = [f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg')}" for e in exc.errors()[:5]]
        return _error(422, "invalid_parameter", "; ".join(parts))

    # ---- tasks --------------------------------------------------------------------------------------
    @app.get(f"{API}/tasks", summary="List tasks (filters and paging; X-Total-Count holds the total)")
    def list_tasks(group: str | None = None, state: str | None = None,
                   owner: str | None = None, offset: int = Query(0, ge=0),
                   limit: int | None = Query(None, ge=1, le=100_000)) -> Response:
        rows = admin().list_tasks(group)
        if state:
            wanted = state.upper()
            rows = [r for r in rows if wanted in (r.state, r.status, r.shown)]
        if owner:
            rows = [r for r in rows if r.owner == owner]
        page = rows[offset: None if limit is None else offset + limit]
        # serialised directly: at 10,000 rows FastAPI's generic encoder costs more than reading ZooKeeper
        return Response(json.dumps([to_dict(r) for r in page], separators=(",", ":")), media_type="application/json",
                        headers={"X-Total-Count": str(len(rows))})

    @app.post(f"{API}/tasks", summary="Create one task or a list (validated as `zkctl task create`)")
    def create_tasks(response: Response, body: Any = Body(...), dry_run: bool = False) -> dict[str, Any]:
        objs = body if isinstance(body, list) else [body]
        if not objs:
            raise SpecError("no task specs given")
        specs = [parse_spec(o, f"spec {i + 1}" if len(objs) > 1 else "spec") for i, o in enumerate(objs)]
        result = admin().create_tasks(specs, dry_run=dry_run)
        response.status_code = 200 if dry_run else 201
        return to_dict(result)

    @app.post(f"{API}/tasks/restart", summary="Restart many tasks in one batched write: every FAILED one "
              "(only_failed, as Kafka Connect's KIP-745), of a group")
    def restart_many(only_failed: bool = Query(True), group: str | None = None) -> dict[str, Any]:
        return to_dict(admin().restart_tasks(group=group, only_failed=only_failed))

    @app.get(f"{API}/tasks/{{task_id}}", summary="A task: spec, owner, status, last error")
    def describe_task(task_id: str) -> dict[str, Any]:
        return to_dict(admin().describe_task(task_id))

    @app.delete(f"{API}/tasks/{{task_id}}", summary="Delete a task (the controller revokes it first)")
    def delete_task(task_id: str, wait: bool = False, timeout: float = 60.0) -> Any:
        return done_or_504(admin().delete_task(task_id, wait=waited(wait, timeout)), wait)

    @app.put(f"{API}/tasks/{{task_id}}/pause", summary="Pause a task")
    def pause(task_id: str) -> dict[str, Any]:
        return to_dict(admin().pause(task_id))

    @app.put(f"{API}/tasks/{{task_id}}/resume", summary="Resume a task")
    def resume(task_id: str) -> dict[str, Any]:
        return to_dict(admin().resume(task_id))

    @app.post(f"{API}/tasks/{{task_id}}/restart", summary="Restart a task (its owner stops and starts it)")
    def restart(task_id: str) -> dict[str, Any]:
        return to_dict(admin().restart(task_id))

    @app.post(f"{API}/tasks/{{task_id}}/reassign", summary='Move a task to a broker: {"to": broker}')
    def reassign(task_id: str, body: dict[str, Any] = Body(...), wait: bool = False, timeout: float = 60.0) -> Any:
        to = body.get("to")
        if not isinstance(to, str) or not to:
            raise ApiError(422, "invalid_parameter", 'the body must be {"to": "<broker id>"}')
        return done_or_504(admin().reassign(task_id, to, wait=waited(wait, timeout)), wait)

    # ---- brokers, groups, cluster -------------------------------------------------------------------
    @app.get(f"{API}/brokers", summary="Live brokers (epoch = the registration's czxid)")
    def brokers() -> list[dict[str, Any]]:
        return [to_dict(b) for b in admin().brokers()]

    @app.post(f"{API}/brokers/{{broker_id}}/shutdown", summary="Controlled shutdown of a broker")
    def shutdown(broker_id: str, wait: bool = False, timeout: float = 60.0) -> Any:
        return done_or_504(admin().shutdown_broker(broker_id, wait=waited(wait, timeout)), wait)

    @app.get(f"{API}/groups", summary="Every group: state, generation, protocol, leader, members")
    def groups() -> list[dict[str, Any]]:
        return [to_dict(g) for g in admin().status().groups]

    @app.get(f"{API}/groups/{{group}}", summary="One group with its members")
    def group(group: str) -> dict[str, Any]:
        return to_dict(admin().describe_group(group)[0])

    @app.post(f"{API}/rebalance", summary="Ask the controller for a rebalance (of one group, or all); preferred: "
              "towards the assignor's layout from scratch, in throttled waves")
    def rebalance(group: str | None = None, reason: str = "manual", preferred: bool = False, wait: bool = False,
                  timeout: float = 60.0) -> Any:
        return done_or_504(admin().rebalance(group, reason=reason, wait=waited(wait, timeout), preferred=preferred), wait)

    @app.get(f"{API}/maintenance", summary="Maintenance mode: on or off, since when, by whom, why")
    def get_maintenance() -> dict[str, Any]:
        return to_dict(admin().maintenance())

    @app.put(f"{API}/maintenance", summary='Turn maintenance mode on or off: {"on": true, "reason": "..."}')
    def put_maintenance(body: dict[str, Any] = Body(...)) -> dict[str, Any]:
        on = body.get("on")
        if not isinstance(on, bool) or set(body) - {"on", "reason"} or not isinstance(body.get("reason", ""), str):
            raise ApiError(422, "invalid_parameter", 'expected {"on": true|false, "reason": "..."}')
        return to_dict(admin().set_maintenance(on, body.get("reason", "")))

    @app.get(f"{API}/settings", summary="Move throttles, automatic maintenance, preferred placement checks")
    def get_settings() -> dict[str, Any]:
        return to_dict(admin().settings())

    @app.patch(f"{API}/settings", summary='Change settings: {"max_moves": 10, ...}; with ?group=G, that group\'s throttle')
    def patch_settings(body: dict[str, Any] = Body(...), group: str | None = None) -> dict[str, Any]:
        return to_dict(admin().update_settings(body, group=group))

    @app.get(f"{API}/status", summary="The controller, brokers, groups and task counts at a glance")
    def status() -> dict[str, Any]:
        return to_dict(admin().status())

    @app.get(f"{API}/controller", summary="The active controller and the controller epoch")
    def controller() -> dict[str, Any]:
        st = admin().status()
        return {"controller": st.controller, "epoch": st.controller_epoch}

    @app.get(f"{API}/intervals", summary="Recorded run intervals (the ownership timeline), since a time")
    def intervals(since: float = 0.0) -> list[dict[str, Any]]:
        now = time.time()
        return [codecs.to_jsonable(i) for i in admin().intervals() if (i.end or now) >= since]

    @app.get(f"{API}/events", summary="Server-sent events from ZooKeeper watches (as `zkctl watch`)")
    def events(max_events: int | None = Query(None, ge=1), duration: float | None = Query(None, gt=0)) -> Response:
        watcher = admin()

        def stream() -> Iterator[str]:
            yield "retry: 2000\n\n"
            for e in watcher.watch(duration=duration, max_events=max_events, idle_s=config.sse_idle_s):
                if e is None:
                    yield ": keep-alive\n\n"
                    continue
                yield f"data: {json.dumps(to_dict(e), default=str)}\n\n"  # the kind is in the data

        return StreamingResponse(stream(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    @app.get("/metrics", include_in_schema=False)
    def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/healthz", include_in_schema=False)
    def healthz() -> dict[str, Any]:
        return {"zookeeper": "connected" if config.client.connected else "unreachable", "root": config.layout.root}

    # ---- the console ----------------------------------------------------------------------------------
    @app.get("/", include_in_schema=False)
    def console() -> FileResponse:
        return FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-cache"})

    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    return app
