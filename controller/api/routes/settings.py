"""``/api/v1/maintenance`` and ``/api/v1/settings``: maintenance mode and the live settings (every number
bounded as the CLI bounds it)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Body

from controller.admin import to_dict
from controller.admin.views import json_object
from controller.api.context import API, ApiContext
from controller.api.errors import ApiError

MAX_REASON = 500


def router(ctx: ApiContext) -> APIRouter:
    r = APIRouter(prefix=API, tags=["operations"])

    @r.get("/maintenance", summary="Maintenance mode: on or off, since when, by whom, why")
    def get_maintenance() -> dict[str, Any]:
        return json_object(ctx.admin().maintenance())

    @r.put("/maintenance", summary='Turn maintenance mode on or off: {"on": true, "reason": "..."}')
    def put_maintenance(body: dict[str, Any] = Body(...)) -> dict[str, Any]:
        on, reason = body.get("on"), body.get("reason", "")
        if not isinstance(on, bool) or set(body) - {"on", "reason"} or not isinstance(reason, str):
            raise ApiError(422, "invalid_parameter", 'expected {"on": true|false, "reason": "..."}')
        if len(reason) > MAX_REASON:
            raise ApiError(422, "invalid_parameter", f"the reason may be at most {MAX_REASON} characters")
        return json_object(ctx.admin().set_maintenance(on, reason))

    @r.get(
        "/settings",
        summary="Move throttles, automatic maintenance, preferred placement checks; `refused`: the "
        "fields stored out of bounds (shown at their defaults), each with why",
    )
    def get_settings() -> dict[str, Any]:
        stored = ctx.admin().stored_settings()
        return {**to_dict(stored.settings), "refused": list(stored.refused)}

    @r.patch("/settings", summary='Change settings: {"max_moves": 10, ...}; with ?group=G, that group\'s throttle')
    def patch_settings(body: dict[str, Any] = Body(...), group: str | None = None) -> dict[str, Any]:
        return json_object(ctx.admin().update_settings(body, group=group))

    return r
