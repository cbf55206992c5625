"""A streaming query's events in Python at the cost of one JSON string each.

pyspark's own ``StreamingQueryListener`` turns every progress event into Python objects field by field
across the py4j gateway, and ends each Java map and list it reads by catching the exception its iterator
throws, which pyspark then inspects with more calls: over 400 round trips between the driver JVM and
Python for one micro-batch of a simple file pipeline, measured as the larger part of the driver's listener
thread and of what a steady pipeline cost its broker outside Spark (docs/benchmarks-placement.md, B11).
Here Spark's ``PythonStreamingQueryListener`` interface is implemented directly: a progress event is read as
``progress().json()`` (two calls) and parsed in Python, the same form ``StreamingQuery.lastProgress`` has.
It is registered and removed through the session's own ``streams.addListener``/``removeListener``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

#: a progress event larger than this is dropped (a file pipeline's is about 1.5 KB; it carries no data)
MAX_PROGRESS_CHARS = 1 << 20
JAVA_INTERFACE = "org.apache.spark.sql.streaming.PythonStreamingQueryListener"
JAVA_WRAPPER = "org.apache.spark.sql.streaming.PythonStreamingQueryListenerWrapper"


class JsonEvents:
    """The Python side of Spark's ``PythonStreamingQueryListener``: progress as JSON, termination as a run id.
    A callback never raises into Spark (its listener bus would log a trace for every event)."""

    def __init__(self, on_progress: Callable[[Any], None], on_terminated: Callable[[str], None]) -> None:
        self._on_progress = on_progress
        self._on_terminated = on_terminated

    def onQueryStarted(self, jevent: Any) -> None:  # noqa: N802 (Spark's interface)
        pass

    def onQueryProgress(self, jevent: Any) -> None:  # noqa: N802
        try:
            progress = parse_progress(str(jevent.progress().json()))
        except Exception as exc:  # the gateway closing as the driver stops, say
            log.debug("a streaming progress event could not be read: %r", exc)
            return
        if progress is not None:
            self._on_progress(progress)

    def onQueryIdle(self, jevent: Any) -> None:  # noqa: N802
        pass

    def onQueryTerminated(self, jevent: Any) -> None:  # noqa: N802
        try:
            run_id = str(jevent.runId().toString())
        except Exception as exc:
            log.debug("a streaming termination event could not be read: %r", exc)
            run_id = ""
        self._on_terminated(run_id)

    class Java:
        implements = [JAVA_INTERFACE]


def parse_progress(text: str) -> Any | None:
    """A ``StreamingQueryProgress`` from Spark's JSON for it; None (logged) when too large or not one."""
    from pyspark.sql.streaming.listener import StreamingQueryProgress

    if len(text) > MAX_PROGRESS_CHARS:
        log.warning("a streaming progress event of %d characters was dropped", len(text))
        return None
    try:
        return StreamingQueryProgress.fromJson(json.loads(text))
    except (ValueError, KeyError, TypeError) as exc:
        log.warning("a streaming progress event was not one: %r", exc)
        return None


def make_listener(events: JsonEvents) -> Any:
    """A pyspark ``StreamingQueryListener`` for ``session.streams.addListener`` whose Java side is ``events``
    (pyspark's own conversion of the events is never called)."""
    from pyspark import SparkContext
    from pyspark.sql.streaming.listener import StreamingQueryListener

    class Listener(StreamingQueryListener):
        def __init__(self) -> None:
            self._wrapper: Any = None

        @property
        def _jlistener(self) -> Any:  # what addListener/removeListener hand to the JVM
            if self._wrapper is None:
                self._wrapper = _jclass(SparkContext._jvm)(events)
            return self._wrapper

        def onQueryStarted(self, event: Any) -> None:  # noqa: N802
            pass

        def onQueryProgress(self, event: Any) -> None:  # noqa: N802
            pass

        def onQueryIdle(self, event: Any) -> None:  # noqa: N802
            pass

        def onQueryTerminated(self, event: Any) -> None:  # noqa: N802
            pass

    return Listener()


def _jclass(jvm: Any) -> Any:
    """The wrapper class by its full name (no search through the gateway's imports)."""
    target = jvm
    for part in JAVA_WRAPPER.split("."):
        target = getattr(target, part)
    return target


__all__ = ["JsonEvents", "make_listener", "parse_progress", "MAX_PROGRESS_CHARS"]
