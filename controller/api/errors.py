"""Errors as JSON ``{"error": code, "message": ...}`` with the status a client of this field expects: the
admin library's kinds map one to one, ZooKeeper being away is a 503 (retry elsewhere or later)."""

from __future__ import annotations

from kazoo.exceptions import ConnectionLoss, KazooException, NoAuthError, OperationTimeoutError, SessionExpiredError
from kazoo.handlers.threading import KazooTimeoutError

from controller.admin import AdminError, Conflict, NotFound
from controller.codecs import PayloadError
from controller.layout import InvalidName
from controller.layout_io import LayoutError
from controller.security import SecurityError
from controller.taskspec import SpecError

UNAVAILABLE = (ConnectionLoss, SessionExpiredError, OperationTimeoutError, KazooTimeoutError)
# what the application turns into JSON errors (anything else is a bug: a 500 with a logged traceback)


class ApiError(Exception):
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
    if isinstance(exc, NotFound):
        return 404, "not_found", message
    if isinstance(exc, InvalidName):
        return 404, "not_found", message  # a name that cannot exist names nothing
    if isinstance(exc, Conflict):
        return 409, "conflict", message
    if isinstance(exc, (SpecError, PayloadError)):
        return 422, "invalid_spec", message
    if isinstance(exc, SecurityError):
        return 400, "bad_request", message
    if isinstance(exc, LayoutError):  # a root of an earlier release, to migrate: not the caller's to fix
        return 503, "layout_not_migrated", message
    if isinstance(exc, AdminError):
        return 400, "bad_request", message
    if isinstance(exc, UNAVAILABLE):
        return 503, "zookeeper_unavailable", "ZooKeeper is not reachable from this API server; retry later"
    if isinstance(exc, NoAuthError):
        return 403, "zookeeper_no_auth", "the API server's ZooKeeper credentials may not do this (NoAuth)"
    return None


HANDLED: tuple[type[BaseException], ...] = (AdminError, SpecError, PayloadError, InvalidName, SecurityError,
                                            LayoutError, KazooException, KazooTimeoutError)
