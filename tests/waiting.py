"""The tests' one wait: poll a condition until it holds, failing the test with what was awaited. A test waits
for the condition it then asserts, never for a fixed time (a sleep stays only where it IS the fault)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_until(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.05) -> Any:
    """Poll ``predicate`` every ``interval`` seconds until it returns something truthy, and return that; after
    ``timeout`` seconds fail naming ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)
