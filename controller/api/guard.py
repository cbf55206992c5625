"""What every request passes before a route sees it, as one ASGI middleware: the Host is one of this server's
names (DNS rebinding), a body is JSON and within the limit, a write comes from this origin (a page elsewhere
cannot drive the API through the operator's browser, token or not) and carries the admin token when one is
set. Every response gets the headers that keep the console's page its own (a Content-Security-Policy that
runs no inline script); every request is counted for ``/metrics``."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from controller.api.auth import check_bearer
from controller.api.errors import error_response

WRITE_METHODS = frozenset({"POST", "PUT", "DELETE", "PATCH"})
SAME_SITE = frozenset({"same-origin", "none"})  # Sec-Fetch-Site of a same-origin fetch or a typed-in request
JSON_TYPES = frozenset({"application/json"})
CONSOLE_CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
SECURITY_HEADERS = (
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
    (b"cross-origin-resource-policy", b"same-origin"),
)
Refusal = tuple[int, str, str]
Observe = Callable[[str, str, int, float], None]  # method, route, status, seconds


def host_name(host: str) -> str:
    """The name in a Host header (or an Origin's netloc), without the port; IPv6 keeps its brackets."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[: host.find("]") + 1] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


@dataclass(frozen=True)
class RequestPolicy:
    """The checks, as plain values: ``refusal`` says why a request is refused, or None."""

    allowed_hosts: frozenset[str]
    token: str | None
    max_body_bytes: int
    api_prefix: str = "/api/"

    def refusal(self, method: str, path: str, headers: Headers, scheme: str = "http") -> Refusal | None:
        """``scheme``: the request's own (``http``; ``https`` behind a proxy that says so): an origin is its
        scheme, host and port, and a page served over another scheme is another origin."""
        host = headers.get("host")
        if not host:
            return 400, "host_not_allowed", "a request must name this server in its Host header"
        if "*" not in self.allowed_hosts and host_name(host) not in self.allowed_hosts:
            return (
                421,
                "host_not_allowed",
                (
                    f"this server does not answer to the host name {host_name(host)[:100]!r}; "
                    "the operator adds it with --allowed-host"
                ),
            )
        too_big = self._body_refusal(headers)
        if too_big is not None:
            return too_big
        if method not in WRITE_METHODS or not path.startswith(self.api_prefix):
            return None
        cross = self._cross_site(headers, host, scheme)
        if cross is not None:
            return cross
        if _has_body(headers):
            media = headers.get("content-type", "").split(";", 1)[0].strip().lower()
            if media not in JSON_TYPES:
                return 415, "unsupported_media_type", "a request body must be JSON (Content-Type: application/json)"
        if self.token is not None:
            status = check_bearer(headers.get("authorization"), self.token)
            if status == 401:
                return 401, "unauthorized", "writes need 'Authorization: Bearer <admin token>'"
            if status == 403:
                return 403, "forbidden", "the admin token given is not this server's"
        return None

    def _body_refusal(self, headers: Headers) -> Refusal | None:
        length = headers.get("content-length")
        if length is None:
            if "transfer-encoding" in headers:
                return 411, "length_required", "a request body must say its length (Content-Length)"
            return None
        if not length.strip().isdigit():
            return 400, "bad_request", "Content-Length is not a number"
        if int(length) > self.max_body_bytes:
            return 413, "too_large", f"a request body may be at most {self.max_body_bytes} bytes"
        return None

    @staticmethod
    def _cross_site(headers: Headers, host: str, scheme: str) -> Refusal | None:
        site = headers.get("sec-fetch-site")
        if site is not None and site.lower() not in SAME_SITE:
            return (
                403,
                "cross_site",
                f"a write from another site ({site[:50]!r}) is refused: use the console or a client",
            )
        origin = headers.get("origin")
        if origin is None:
            return None
        try:
            parts = urlsplit(origin.strip())
        except ValueError:
            parts = urlsplit("")
        if parts.netloc.lower() != host.strip().lower() or parts.scheme.lower() != scheme.lower():
            return 403, "cross_site", f"a write from another origin ({origin[:100]!r}) is refused"
        return None


def _has_body(headers: Headers) -> bool:
    return "transfer-encoding" in headers or headers.get("content-length", "0").strip() not in ("", "0")


class Guard:
    """The middleware: refuses what :class:`RequestPolicy` refuses (in the API's error shape), adds the
    security headers, and reports each request's route, status and time to ``observe``."""

    def __init__(self, app: ASGIApp, policy: RequestPolicy, observe: Observe, docs_prefix: str) -> None:
        self.app = app
        self.policy = policy
        self.observe = observe
        self.docs_prefix = docs_prefix

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        method, path = scope["method"], scope["path"]
        csp = not path.startswith(self.docs_prefix)  # the API's own docs page loads Swagger UI's script

        async def send_guarded(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", [])) + list(SECURITY_HEADERS)
                if csp:
                    headers.append((b"content-security-policy", CONSOLE_CSP.encode()))
                message = {**message, "headers": headers}
                route = getattr(scope.get("route"), "path", "other")
                self.observe(method, route, message["status"], time.perf_counter() - started)
            await send(message)

        refusal = self.policy.refusal(method, path, Headers(scope=scope), scope.get("scheme", "http"))
        if refusal is not None:
            await error_response(*refusal)(scope, receive, send_guarded)
            return
        await self.app(scope, receive, send_guarded)
