"""Garbage payloads: what a broken or hostile client could leave in any znode of ours. The decoder tests
(tests/unit) and the running-cluster test (tests/integration/security/test_bad_input.py) use the same ones."""

from __future__ import annotations

GARBAGE = [
    b"",
    b"\x00\xff garbage",
    b"{not json",
    b"[1,2,3]",
    b'{"version": 99}',
    b'{"version": 1, "generation": "x"}',
    b"7" * 500_000,
]
