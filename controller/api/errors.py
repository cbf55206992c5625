"""Errors as JSON ``{"error": code, "message": ...}`` with the status a client of this field expects: the
admin library's kinds map one to one, ZooKeeper being away is a 503 (retry elsewhere or later), and the
framework's own refusals (an unknown path, a method not allowed, malformed parameters) take the same shape,
never FastAPI's ``{"detail": ...}``."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from kazoo.exceptions import ConnectionLoss, KazooException, NoAuthError, OperationTimeoutError, SessionExpiredError
from kazoo.handlers.threading import KazooTimeoutError
from starlette.exceptions import HTTPException

from controller.protocol.errors import ZkcError

UNAVAILABLE = (ConnectionLoss, SessionExpiredError, OperationTimeoutError, KazooTimeoutError)
# what the application turns into JSON errors (anything else is a bug: a 500 with a logged traceback)
HTTP_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    406: "not_acceptable",
    413: "too_large",
    415: "unsupported_media_type",
    422: "invalid_parameter",
    429: "too_many_requests",
    503: "unavailable",
}


class ApiError(ZkcError):
    """An error the API raises itself (a missing token, a wait that timed out, ...)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


# The longest message an error answer carries (an error that quotes its input quotes a bounded prefix of it;
# this bounds the rest).
MAX_MESSAGE_CHARS = 2000


def error_response(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    if len(message) > MAX_MESSAGE_CHARS:
        message = message[:MAX_MESSAGE_CHARS] + f"... ({len(message)} characters)"
    return JSONResponse({"error": code, "message": message}, status_code=status, headers=headers)


def classify(exc: BaseException) -> tuple[int, str, str] | None:
    """(status, code, message) for an exception that is the client's or ZooKeeper's problem; None for a bug."""
    message = " ".join(str(exc).split())
    if isinstance(exc, ApiError):
        return exc.status, exc.code, exc.message
    if isinstance(exc, ZkcError):
        return (exc.status, exc.code, message) if exc.user_facing else None
    if isinstance(exc, UNAVAILABLE):
        return 503, "zookeeper_unavailable", "ZooKeeper is not reachable from this API server; retry later"
    if isinstance(exc, NoAuthError):
        return 403, "zookeeper_no_auth", "the API server's ZooKeeper credentials may not do this (NoAuth)"
    return None


HANDLED: tuple[type[Exception], ...] = (ZkcError, KazooException, KazooTimeoutError)


def install_error_handlers(app: FastAPI) -> None:
    """Every error the application answers, in the one documented shape."""

    async def known_errors(_request: Request, exc: Exception) -> JSONResponse:
        known = classify(exc)
        if known is None:  # a subclass we do not map (a kazoo error we did not expect): still JSON
            return error_response(500, "internal", f"{type(exc).__name__}: {exc}")
        return error_response(*known)

    for kind in HANDLED:
        app.add_exception_handler(kind, known_errors)

    async def bad_parameters(_request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        parts = [f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg')}" for e in exc.errors()[:5]]
        return error_response(422, "invalid_parameter", "; ".join(parts))

    async def http_errors(_request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, HTTPException)
        message = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
        return error_response(
            exc.status_code, HTTP_CODES.get(exc.status_code, "error"), message, headers=dict(exc.headers or {})
        )

    app.add_exception_handler(RequestValidationError, bad_parameters)
    app.add_exception_handler(HTTPException, http_errors)
