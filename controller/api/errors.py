"""Errors as JSON ``{"error": code, "message": ...}`` with the status a client of this field expects: the
admin library's kinds map one to one, ZooKeeper being away is a 503 (retry elsewhere or later)."""

from __future__ import annotations

from kazoo.exceptions import ConnectionLoss, KazooException, NoAuthError, OperationTimeoutError, SessionExpiredError
from kazoo.handlers.threading import KazooTimeoutError

from controller.protocol.errors import ZkcError

UNAVAILABLE = (ConnectionLoss, SessionExpiredError, OperationTimeoutError, KazooTimeoutError)
# what the application turns into JSON errors (anything else is a bug: a 500 with a logged traceback)


class ApiError(ZkcError):
    """An error the API raises itself (a missing token, a wait that timed out, ...)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


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


HANDLED: tuple[type[BaseException], ...] = (ZkcError, KazooException, KazooTimeoutError)
