"""``/api/v1/status``, ``/api/v1/controller`` and ``/api/v1/intervals``: the cluster at a glance, and the
ownership timeline's run intervals."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter

from controller.admin.interval_ends import close_ended_sessions
from controller.admin.views import json_object
from controller.api.context import API, ApiContext
from controller.protocol.records import codecs


def router(ctx: ApiContext) -> APIRouter:
    r = APIRouter(prefix=API, tags=["cluster"])

    @r.get(
        "/status",
        summary="The controller, brokers, groups and task counts at a glance (the task counts from the "
        "controller's summary unless full, or it is missing or stale: see source and fallback)",
    )
    def status(full: bool = False) -> dict[str, Any]:
        return json_object(ctx.admin().status(full=full))

    @r.get("/controller", summary="The active controller and the controller epoch")
    def controller() -> dict[str, Any]:
        st = ctx.admin().status()
        return {"controller": st.controller, "epoch": st.controller_epoch}

    @r.get(
        "/intervals",
        summary="Recorded run intervals (the ownership timeline), since a time; an interval "
        "left open by a session that has ended ends at the latest when that session ended",
    )
    def intervals(since: float = 0.0) -> list[dict[str, Any]]:
        now = time.time()
        ivs = close_ended_sessions(ctx.config.client, ctx.config.layout, ctx.admin().intervals())
        return [codecs.to_jsonable(i) for i in ivs if (i.end or now) >= since]

    return r
