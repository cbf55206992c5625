"""``/api/v1/groups`` and ``/api/v1/rebalance``: the groups' state, and asking the controller to rebalance."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from controller.admin import to_dict
from controller.admin.views import json_object
from controller.api.context import API, ApiContext


def router(ctx: ApiContext) -> APIRouter:
    r = APIRouter(prefix=API, tags=["groups"])

    @r.get("/groups", summary="Every group: state, generation, protocol, leader, members")
    def groups() -> list[dict[str, Any]]:
        return [to_dict(g) for g in ctx.admin().status().groups]

    @r.get("/groups/{group}", summary="One group with its members")
    def group(group: str) -> dict[str, Any]:
        return json_object(ctx.admin().describe_group(group)[0])

    @r.post(
        "/rebalance",
        summary="Ask the controller for a rebalance (of one group, or all); preferred: "
        "towards the assignor's layout from scratch, in throttled waves",
    )
    def rebalance(
        group: str | None = None,
        reason: str = "manual",
        preferred: bool = False,
        wait: bool = False,
        timeout: float = 60.0,
    ) -> Any:
        waited = ctx.waited(wait, timeout)
        return ctx.done_or_504(ctx.admin().rebalance(group, reason=reason, wait=waited, preferred=preferred), wait)

    return r
