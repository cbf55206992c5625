"""``/api/v1/events``: server-sent events from the one shared cluster watch (see ``controller.api.hub``). An
async generator: an open stream holds a queue, never a thread."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

from fastapi import APIRouter, Query, Response
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from controller.api.context import API, ApiContext
from controller.api.errors import error_response
from controller.api.hub import EventHub, Stream, StreamsFull


def router(ctx: ApiContext, hub: EventHub) -> APIRouter:
    r = APIRouter(prefix=API, tags=["events"])

    @r.get(
        "/events",
        summary="Server-sent events from ZooKeeper watches (as `zkctl watch`): a `watching` summary "
        "first, then every change",
    )
    async def events(
        max_events: int | None = Query(None, ge=1), duration: float | None = Query(None, gt=0)
    ) -> Response:
        if not ctx.config.client.connected:
            return error_response(
                503, "zookeeper_unavailable", "ZooKeeper is not reachable from this API server; retry later"
            )
        await run_in_threadpool(ctx.require_root)  # a root never set up: 404, as every read
        try:
            stream = hub.subscribe()
        except StreamsFull as exc:
            return error_response(503, "too_many_streams", str(exc), headers={"Retry-After": "5"})
        return StreamingResponse(
            _frames(hub, stream, ctx.config.sse_idle_s, max_events, duration),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    return r


async def _frames(
    hub: EventHub, stream: Stream, idle_s: float, max_events: int | None, duration: float | None
) -> AsyncIterator[str]:
    deadline = None if duration is None else time.monotonic() + duration
    count = 0
    try:
        yield "retry: 2000\n\n"
        while max_events is None or count < max_events:
            wait = idle_s if deadline is None else min(idle_s, deadline - time.monotonic())
            if wait <= 0:
                return
            try:
                item = await asyncio.wait_for(stream.queue.get(), wait)
            except TimeoutError:
                if deadline is not None and time.monotonic() >= deadline:
                    return
                yield ": keep-alive\n\n"
                continue
            for text in item.texts:
                if item.counts and max_events is not None and count >= max_events:
                    return
                yield text
                stream.sent()
                count += item.counts
            if item.end:
                return
    finally:
        hub.unsubscribe(stream)
