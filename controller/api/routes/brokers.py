"""``/api/v1/brokers``: the live brokers, and a broker's controlled shutdown."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from controller.admin import to_dict
from controller.api.context import API, ApiContext


def router(ctx: ApiContext) -> APIRouter:
    r = APIRouter(prefix=f"{API}/brokers", tags=["brokers"])

    @r.get("", summary="Live brokers (epoch = the registration's czxid)")
    def brokers() -> list[dict[str, Any]]:
        return [to_dict(b) for b in ctx.admin().brokers()]

    @r.post("/{broker_id}/shutdown", summary="Controlled shutdown of a broker")
    def shutdown(broker_id: str, wait: bool = False, timeout: float = 60.0) -> Any:
        return ctx.done_or_504(ctx.admin().shutdown_broker(broker_id, wait=ctx.waited(wait, timeout)), wait)

    return r
