"""A stall the harness holds over an in-process controller: given to the ``Controller`` as its
``before_write``, it runs what the harness put in it before each of the controller's fenced writes (a
freeze at the next write), and nothing once released."""

from __future__ import annotations

from collections.abc import Callable


class WriteStall:
    def __init__(self) -> None:
        self._fn: Callable[[], None] | None = None

    @property
    def held(self) -> bool:
        return self._fn is not None

    def hold(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the controller's event thread before each of its writes (it blocks there while ``fn`` does)."""
        self._fn = fn

    def release(self) -> None:
        self._fn = None

    def __call__(self) -> None:
        fn = self._fn
        if fn is not None:
            fn()
