"""``/api/v1/brokers/roll``: the planned roll of a group's brokers (start, resume, where it stands)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, Field

from controller.api.context import API, ApiContext
from controller.protocol.cluster.roll_plan import DEFAULT_WARMUP_S, DEFAULT_WAVE, MAX_WARMUP_S, MAX_WAVE
from controller.protocol.records.codecs import to_jsonable


class RollBody(BaseModel):
    group: str = "default"
    batch: int = Field(default=1, ge=1)
    timeout_s: float = Field(default=300.0, gt=0)
    wave: int = Field(default=DEFAULT_WAVE, ge=0, le=MAX_WAVE)
    warmup_s: float = Field(default=DEFAULT_WARMUP_S, ge=0, le=MAX_WARMUP_S)
    #: as ``zkctl broker roll --move-first/--in-place``: the first batch's tasks move away before it goes down
    #: (false: they wait for its restart in place)
    move_first: bool = True
    resume: bool = False


def router(ctx: ApiContext) -> APIRouter:
    r = APIRouter(prefix=f"{API}/brokers/roll", tags=["brokers"])

    @r.get("", summary="The roll in progress, paused or last done (null: none was asked for)")
    def status() -> Any:
        return to_jsonable(ctx.admin().roll_status())

    @r.post("", summary="Start a planned roll of a group's brokers, or resume a paused one")
    def roll(body: RollBody) -> Any:
        admin = ctx.admin()
        st = (
            admin.resume_roll()
            if body.resume
            else admin.roll(
                body.group,
                batch=body.batch,
                timeout_s=body.timeout_s,
                wave=body.wave,
                warmup_s=body.warmup_s,
                in_place=not body.move_first,
            )
        )
        return to_jsonable(st)

    return r
