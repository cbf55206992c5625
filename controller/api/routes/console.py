"""The console: ``/`` and ``/static`` (plain HTML, CSS and JavaScript; the page runs no inline script, so the
Content-Security-Policy can forbid it)."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

STATIC = Path(__file__).resolve().parent.parent / "static"


def mount(app: FastAPI) -> None:
    r = APIRouter(include_in_schema=False)

    @r.get("/")
    def console() -> FileResponse:
        return FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-cache"})

    app.include_router(r)
    app.mount("/static", StaticFiles(directory=STATIC), name="static")
