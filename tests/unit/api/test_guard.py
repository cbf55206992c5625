"""The API's request guard: foreign Host names, cross-site writes and bodies that are not bounded JSON refused."""

from __future__ import annotations

from starlette.datastructures import Headers

from controller.api.guard import RequestPolicy, host_name


def test_the_guard_refuses_foreign_hosts_cross_site_writes_and_non_json_bodies():
    policy = RequestPolicy(allowed_hosts=frozenset({"127.0.0.1", "localhost", "[::1]"}), token=None, max_body_bytes=100)

    def refused(method: str, **headers: str):
        got = policy.refusal(method, "/api/v1/tasks", Headers({k.replace("_", "-"): v for k, v in headers.items()}))
        return got and got[:2]

    assert host_name("[::1]:8083") == "[::1]" and host_name("Example.org:80") == "example.org"
    assert refused("GET", host="127.0.0.1:8083") is None
    assert refused("GET", host="rebound.example:8083") == (421, "host_not_allowed")
    assert refused("POST", host="127.0.0.1:1", origin="http://evil.example") == (403, "cross_site")
    assert refused("POST", host="127.0.0.1:1", sec_fetch_site="cross-site") == (403, "cross_site")
    assert refused("POST", host="127.0.0.1:1", origin="http://127.0.0.1:1", sec_fetch_site="same-origin") is None
    # an origin is scheme, host and port: a page served over https is not this http server's
    assert refused("POST", host="127.0.0.1:1", origin="https://127.0.0.1:1") == (403, "cross_site")
    assert refused("PUT", host="127.0.0.1:1", origin="null") == (403, "cross_site")
    assert refused("GET", host="127.0.0.1:1", origin="https://127.0.0.1:1") is None  # a read changes nothing
    https = policy.refusal(
        "POST", "/api/v1/tasks", Headers({"host": "127.0.0.1:1", "origin": "https://127.0.0.1:1"}), "https"
    )
    assert https is None  # behind a proxy that says the request came over https
    assert refused("POST", host="127.0.0.1:1", content_type="text/plain", content_length="2") == (
        415,
        "unsupported_media_type",
    )
    assert refused("POST", host="127.0.0.1:1", content_type="application/json", content_length="101") == (
        413,
        "too_large",
    )
    assert refused("POST", host="127.0.0.1:1", transfer_encoding="chunked") == (411, "length_required")
