"""One ``SparkPipeline`` task as Spark work: a streaming query, or a batch job in a named thread.

Each task gets its own ``spark.newSession()`` (its own ``input`` view, its own SQL settings from
``spark_options``) on the worker's shared SparkContext, and its own FAIR scheduler pool named after the task,
so one busy task cannot starve the others. Streaming queries write with ``checkpointLocation`` = the task's
checkpoint on shared storage and ``queryName`` = the task id: a moved task resumes from the offsets and the
sink's commit log, so Spark's file sink gives exactly-once output.
"""

from __future__ import annotations

import os
import threading
import time
import traceback
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import urlparse

from broker_sim.runners.backlog import FileBacklog
from broker_sim.runners.base import RunState, RunStatus
from broker_sim.runners.spark_listener import JsonEvents, make_listener
from controller.protocol.errors import ZkcError
from controller.protocol.records.task_records import MAX_FAILURE_KIND_CHARS
from controller.protocol.tasks.failure_trace import bound_trace
from controller.protocol.tasks.load import batch_share, ewma, trigger_seconds
from controller.protocol.tasks.spec import ConsoleSink, FilesSink, FilesSource, RateSource, SparkPipeline

POOL_PROPERTY = "spark.scheduler.pool"
MAX_ERROR_CHARS = 4000
MAX_TRACE_CHARS = 16000
RATE_HISTORY = 20
#: how stale a running query's "still active" may be in its status: the listener says at once when a query
#: ends, so the JVM is asked only this often (a broker polls every pipeline twice a second, and three JVM
#: round trips a poll were most of what a steady pipeline cost its broker outside Spark)
ACTIVE_CHECK_S = 2.0
#: what a running pipeline's status says while its application has no executor on a standalone cluster (a
#: worker lost, the cluster recovering): it stays on its broker and waits for the engine, nothing moves it
ENGINE_WAITING = "waiting for the engine: no Spark executor"


def standalone_executors(sc: Any) -> int | None:
    """How many executors the application has now on a standalone cluster (the driver not counted); None on
    another master, or when Spark cannot say."""
    if sc is None or not str(sc.master).startswith("spark://"):
        return None
    try:
        return max(0, len(sc._jsc.sc().statusTracker().getExecutorInfos()) - 1)
    except Exception:
        return None


class PipelineStartError(ZkcError, RuntimeError):
    """A pipeline that Spark refused at start (analysis error, bad option); the message is Spark's."""


@dataclass(frozen=True)
class Progress:
    """Counters folded from a streaming query's progress events (one per executed micro-batch)."""

    batches: int = 0
    rows: int = 0
    last_batch_id: int | None = None
    last_batch_at: str | None = None
    input_rows_per_s: float = 0.0
    processed_rows_per_s: float = 0.0
    #: the input rate of the last ``RATE_HISTORY`` batches, oldest first (the console's sparkline)
    rate_history: tuple[float, ...] = ()
    #: the last batch's duration, and the smoothed share of the trigger interval the batches take (the
    #: load figure the load-aware assignor places by; over 1: the query falls behind its trigger)
    batch_ms: int | None = None
    load_share: float | None = None
    last_batch_mono: float | None = None
    #: where the last batch's time went, Spark's own split (``durationMs``: latestOffset, getBatch,
    #: queryPlanning, addBatch, walCommit, commitOffsets, triggerExecution): not reported, read by profiling
    phases_ms: tuple[tuple[str, int], ...] = ()

    def add(self, p: Any, trigger_s: float | None = None, now: float | None = None) -> Progress:
        rate = round(float(p.inputRowsPerSecond or 0.0), 3)
        batch_ms = int(getattr(p, "batchDuration", 0) or 0)
        since = now - self.last_batch_mono if now is not None and self.last_batch_mono is not None else None
        share = ewma(self.load_share, batch_share(batch_ms, trigger_s, since))
        return Progress(
            batches=self.batches + 1,
            rows=self.rows + int(p.numInputRows or 0),
            last_batch_id=p.batchId,
            last_batch_at=p.timestamp,
            input_rows_per_s=rate,
            processed_rows_per_s=round(float(p.processedRowsPerSecond or 0.0), 3),
            rate_history=(*self.rate_history, rate)[-RATE_HISTORY:],
            batch_ms=batch_ms,
            load_share=round(share, 4),
            last_batch_mono=now,
            phases_ms=_phases(getattr(p, "durationMs", None)),
        )

    def metrics(self) -> dict[str, Any]:
        return {
            "batches": self.batches,
            "rows": self.rows,
            "last_batch_id": self.last_batch_id,
            "last_batch_at": self.last_batch_at,
            "input_rows_per_s": self.input_rows_per_s,
            "processed_rows_per_s": self.processed_rows_per_s,
            "rate_history": list(self.rate_history),
            "batch_ms": self.batch_ms,
            "load_share": self.load_share,
        }


MAX_PHASES = 16
SPARK_PHASES = ("latestOffset", "getBatch", "queryPlanning", "addBatch", "walCommit", "commitOffsets")


def _phases(raw: Any) -> tuple[tuple[str, int], ...]:
    """A progress event's ``durationMs``: at most ``MAX_PHASES`` (name, whole ms) pairs, Spark's known phases
    first, the rest by name."""
    if not isinstance(raw, dict):
        return ()
    out = [(str(k)[:40], int(v)) for k, v in raw.items() if isinstance(v, (int, float)) and not isinstance(v, bool)]
    out.sort(key=lambda kv: (kv[0] not in SPARK_PHASES, kv[0]))
    return tuple(out[:MAX_PHASES])


def spark_error(exc: BaseException) -> tuple[str, str]:
    """(message, trace) of an exception, preferring Spark's own text over Python's.

    The message is Spark's error without the query description a streaming failure appends (that, and the
    JVM stack, go to the trace). The trace follows the chain of causes Spark captured (a streaming query's
    own stack names only its thread; its cause holds the SQL error or the OutOfMemoryError), each as a
    ``Caused by:`` section, and is bounded keeping those lines (``bound_trace``).
    """
    desc = getattr(exc, "_desc", None) or getattr(exc, "desc", None)
    message = str(desc) if desc else (str(exc) or type(exc).__name__)
    message = message.split("\n=== Streaming Query ===")[0].strip()
    jvm_trace = getattr(exc, "_stackTrace", None)
    if not jvm_trace:
        return message[:MAX_ERROR_CHARS], bound_trace("".join(traceback.format_exception(exc)), MAX_TRACE_CHARS)
    parts = [f"{_class_name(exc)}: {message}", f"\t at {jvm_trace}"]
    cause: Any = getattr(exc, "_cause", None)
    for _ in range(8):  # (bounded: a cause chain could loop)
        if cause is None:
            break
        cause_desc = getattr(cause, "_desc", None) or str(cause)
        parts.append(f"Caused by: {_class_name(cause)}: {cause_desc}")
        cause_trace = getattr(cause, "_stackTrace", None)
        if cause_trace:  # (one with a JVM origin is Java's own text: its exception line, frames, causes)
            parts.append(str(cause_trace) if getattr(cause, "_origin", None) is not None else f"\t at {cause_trace}")
        cause = getattr(cause, "_cause", None)
    return message[:MAX_ERROR_CHARS], bound_trace("\n".join(parts), MAX_TRACE_CHARS)


def _class_name(exc: Any) -> str:
    """A captured exception's JVM class (its origin's), else its Python class."""
    origin = getattr(exc, "_origin", None)
    if origin is not None:
        try:
            return str(origin.getClass().getName())
        except Exception:  # the JVM is gone
            pass
    return f"{type(exc).__module__}.{type(exc).__qualname__}"


def error_kind(exc: BaseException) -> str:
    """The class of what went wrong: the root cause's JVM class where Spark captured one (a streaming query's
    failure wraps the SQL error or the OutOfMemoryError that ended it), else the Python class."""
    kind = f"{type(exc).__module__}.{type(exc).__qualname__}"
    origin: Any = None
    current: Any = exc
    for _ in range(16):  # a streaming query's exception has no JVM origin of its own: its cause has
        origin = getattr(current, "_origin", None)
        current = getattr(current, "_cause", None)
        if origin is not None or current is None:
            break
    if origin is not None:
        try:
            cause = origin
            for _ in range(16):  # (bounded: a cause chain could loop)
                nxt = cause.getCause()
                if nxt is None:
                    break
                cause = nxt
            kind = str(cause.getClass().getName())
        except Exception:  # the JVM is gone, or not a Throwable: the Python class says enough
            pass
    return kind[:MAX_FAILURE_KIND_CHARS]


def _start_error(task_id: str, exc: BaseException) -> PipelineStartError:
    message, _ = spark_error(exc)
    first = message.strip().splitlines()[0] if message.strip() else type(exc).__name__  # Spark's text, not the plan
    return PipelineStartError(f"task {task_id}: {first}")


def _ensure_local_dir(path: str) -> None:
    """Create a missing local input directory so a task may start before its data arrives."""
    parsed = urlparse(path)
    if parsed.scheme in ("", "file"):
        os.makedirs(parsed.path if parsed.scheme else path, exist_ok=True)


def task_session(spark: Any, task_id: str, pipeline: SparkPipeline) -> Any:
    """A new session on the shared context with the task's ``spark_options`` (per-session settable only)."""
    session = spark.newSession()
    for key, value in pipeline.spark_options.items():
        if not session.conf.isModifiable(key):
            raise PipelineStartError(
                f"task {task_id}: spark option {key!r} cannot be set per task (it is not a "
                f"runtime SQL setting); set it for the worker with --spark-conf {key}=..."
            )
        session.conf.set(key, value)
    return session


def _input_frame(session: Any, pipeline: SparkPipeline, streaming: bool) -> Any:
    source = pipeline.source
    if isinstance(source, RateSource):
        return session.readStream.format("rate").option("rowsPerSecond", source.rows_per_second).load()
    assert isinstance(source, FilesSource)
    reader = session.readStream if streaming else session.read
    reader = reader.format(source.format).schema(source.schema_ddl).options(**source.options)
    if streaming:
        _ensure_local_dir(source.path)
        if source.max_files_per_trigger is not None:
            reader = reader.option("maxFilesPerTrigger", source.max_files_per_trigger)
    return reader.load(source.path)


def build_frame(session: Any, task_id: str, pipeline: SparkPipeline, streaming: bool) -> Any:
    """source -> view ``input`` -> ``transform.sql``; Spark analyses it here, so a bad column raises now."""
    try:
        _input_frame(session, pipeline, streaming).createOrReplaceTempView("input")
        return session.sql(pipeline.transform.sql)
    except PipelineStartError:
        raise
    except Exception as exc:
        raise _start_error(task_id, exc) from exc


def _local_missing(path: str) -> bool:
    """A local input directory that does not exist yet (its frame cannot be resolved without creating it)."""
    parsed = urlparse(path)
    if parsed.scheme not in ("", "file"):
        return False
    return not os.path.exists(parsed.path if parsed.scheme else path)


@dataclass(frozen=True)
class PreparedQuery:
    """A streaming task's start done up to the query itself: its session (the task's settings), the analysed
    frame and the configured writer. Nothing of it is visible outside the driver: no query, no output, no
    checkpoint written. ``writer`` None: the input directory did not exist yet (creating it is the start's)."""

    pipeline: SparkPipeline
    checkpoint: str
    session: Any
    writer: Any


class StreamingRun:
    """A task's streaming query. ``stop`` returns only when the query has terminated."""

    mode = "streaming"

    def __init__(self, task_id: str, pipeline: SparkPipeline, checkpoint: str) -> None:
        self.task_id = task_id
        self.pipeline = pipeline
        self.checkpoint = checkpoint
        self.started = time.monotonic()
        self._lock = threading.Lock()
        self._progress = Progress()
        self._trigger_s = trigger_seconds(pipeline.trigger.processing_time)
        self._query: Any = None
        self._session: Any = None
        self._context: Any = None
        self._listener: Any = None
        self._query_id: str | None = None
        self._run_id: str | None = None
        #: set by the listener when the query ends; the monotonic time the JVM last said it was active
        self._terminated = threading.Event()
        self._active_at = float("-inf")
        #: set once ``stop`` begins: a query it stopped is inactive with no error, which is not a completion
        self._stopping = threading.Event()
        source = pipeline.source
        self._backlog = FileBacklog.of(source.path, checkpoint) if isinstance(source, FilesSource) else None

    def _on_progress(self, p: Any) -> None:
        if self._query_id is not None and str(p.id) != self._query_id:
            return
        with self._lock:
            last = self._progress.last_batch_id
            if last is None or p.batchId > last:  # once per batch: the listener and reconcile may both see it
                self._progress = self._progress.add(p, self._trigger_s, time.monotonic())

    def phases(self) -> dict[str, int]:
        """Spark's split of the last batch's duration (empty before the first batch)."""
        with self._lock:
            return dict(self._progress.phases_ms)

    def _on_terminated(self, run_id: str) -> None:
        if self._run_id is None or run_id in ("", self._run_id):  # (unreadable: ask the JVM at the next status)
            self._terminated.set()

    def _still_active(self) -> bool:
        """Whether the query runs, asking the JVM at most every ``ACTIVE_CHECK_S`` while the listener has not
        said it ended and no stop began (a JVM gone away raises here: the runner reports that as FAILED). Once a
        stop began the JVM is asked every time: the listener's word that the query ended may come after the stop
        returned, and a status read then must not say RUNNING."""
        now = time.monotonic()
        if not self._terminated.is_set() and not self._stopping.is_set() and now - self._active_at < ACTIVE_CHECK_S:
            return True
        active = bool(self._query.isActive)
        if active and not self._terminated.is_set():
            self._active_at = now
        return active

    def _reconcile(self) -> None:
        """Fold in progress the (asynchronous) listener has not delivered yet; used once the query ended."""
        for p in self._query.recentProgress:
            self._on_progress(p)

    @staticmethod
    def prepare(spark: Any, task_id: str, pipeline: SparkPipeline, checkpoint: str) -> PreparedQuery:
        """The part of ``start`` that needs no ownership (a planned roll's warm-up): the task's session, its
        source resolved and its SQL analysed, the writer configured with the sink and checkpoint paths."""
        session = task_session(spark, task_id, pipeline)
        source = pipeline.source
        if isinstance(source, FilesSource) and _local_missing(source.path):
            return PreparedQuery(pipeline, checkpoint, session, None)
        frame = build_frame(session, task_id, pipeline, streaming=True)
        return PreparedQuery(pipeline, checkpoint, session, StreamingRun._writer(frame, task_id, pipeline, checkpoint))

    @staticmethod
    def _writer(frame: Any, task_id: str, pipeline: SparkPipeline, checkpoint: str) -> Any:
        writer = frame.writeStream.queryName(task_id).option("checkpointLocation", checkpoint)
        sink = pipeline.sink
        if isinstance(sink, FilesSink):
            writer = writer.format(sink.format).outputMode("append").options(**sink.options).option("path", sink.path)
        else:
            assert isinstance(sink, ConsoleSink)
            writer = (
                writer.format("console")
                .outputMode("update")
                .option("numRows", sink.num_rows)
                .option("truncate", "false")
            )
        trigger = pipeline.trigger
        if trigger.processing_time:
            writer = writer.trigger(processingTime=trigger.processing_time)
        elif trigger.available_now:
            writer = writer.trigger(availableNow=True)
        return writer

    def start(self, spark: Any, prepared: PreparedQuery | None = None) -> StreamingRun:
        """Start the query, from ``prepared`` when it was prepared for this very pipeline and checkpoint."""
        if prepared is not None and (prepared.pipeline != self.pipeline or prepared.checkpoint != self.checkpoint):
            prepared = None
        if prepared is not None:
            session, writer = prepared.session, prepared.writer
        else:
            session, writer = task_session(spark, self.task_id, self.pipeline), None
        if writer is None:
            frame = build_frame(session, self.task_id, self.pipeline, streaming=True)
            writer = self._writer(frame, self.task_id, self.pipeline, self.checkpoint)
        self._listener = make_listener(JsonEvents(self._on_progress, self._on_terminated))
        session.streams.addListener(self._listener)
        sc = spark.sparkContext
        self._context = sc
        sc.setLocalProperty(POOL_PROPERTY, self.task_id)  # the query's thread inherits this thread's pool
        try:
            self._query = writer.start()
        except Exception as exc:
            session.streams.removeListener(self._listener)
            raise _start_error(self.task_id, exc) from exc
        finally:
            sc.setLocalProperty(POOL_PROPERTY, None)
        self._query_id, self._run_id = str(self._query.id), str(self._query.runId)  # fixed for this run
        self._session = session
        return self

    def active(self) -> bool:
        return bool(self._query is not None and self._query.isActive)

    def status(self) -> RunStatus:
        query = self._query
        active = self._still_active()
        if not active:
            self._reconcile()
        with self._lock:
            metrics = {"mode": self.mode, **self._progress.metrics()}
        metrics.update(
            query_id=self._query_id,
            run_id=self._run_id,
            pool=self.task_id,
            uptime_s=round(time.monotonic() - self.started, 3),
        )
        backlog = self._backlog.files() if self._backlog is not None else None
        if backlog is not None:
            metrics["backlog_files"] = backlog
        if active:
            executors = standalone_executors(self._context)
            if executors is not None:
                metrics["executors"] = executors
                if executors == 0:
                    metrics["engine"] = ENGINE_WAITING
            return RunStatus(RunState.RUNNING, metrics=metrics)
        if self._stopping.is_set():
            return RunStatus(RunState.STOPPED, metrics=metrics)  # (a stopped query looks like one that ran out)
        exc = query.exception()
        if exc is not None:
            message, trace = spark_error(exc)
            return RunStatus(RunState.FAILED, error=message, trace=trace, metrics=metrics, error_type=error_kind(exc))
        return RunStatus(RunState.COMPLETED, metrics=metrics)  # e.g. trigger available_now ran out of data

    def stop(self, timeout: float) -> None:
        self._stopping.set()
        query = self._query
        errors: list[BaseException] = []

        def _stop() -> None:
            try:
                query.stop()  # interrupts the micro-batch thread and waits for it (spark.sql.streaming.stopTimeout)
            except BaseException as exc:  # reported below
                errors.append(exc)

        stopper = threading.Thread(target=_stop, name=f"spark-stop-{self.task_id}", daemon=True)
        stopper.start()
        stopper.join(timeout)
        if stopper.is_alive() or query.isActive:
            raise TimeoutError(f"task {self.task_id}: streaming query still active {timeout:.0f}s after stop()")
        self._terminated.set()  # confirmed inactive: no status read waits for the listener to say so
        if errors:  # e.g. spark.sql.streaming.stopTimeout ran out: the stream thread may still be running
            raise TimeoutError(
                f"task {self.task_id}: the streaming query's stop did not confirm it stopped: "
                f"{type(errors[0]).__name__}: {str(errors[0])[:300]}"
            )
        try:
            self._session.streams.removeListener(self._listener)
        except Exception:
            pass  # the listener dies with the session anyway


class BatchRun:
    """A task's batch job, run once in a named thread; overwrite mode makes a rerun idempotent."""

    mode = "batch"

    def __init__(self, task_id: str, pipeline: SparkPipeline) -> None:
        self.task_id = task_id
        self.pipeline = pipeline
        self.group = f"zkc-batch-{task_id}"
        self.started = time.monotonic()
        self._stopping = threading.Event()
        self._result: RunStatus | None = None
        self._thread: threading.Thread | None = None
        self._spark: Any = None

    def start(self, spark: Any) -> BatchRun:
        session = task_session(spark, self.task_id, self.pipeline)
        frame = build_frame(session, self.task_id, self.pipeline, streaming=False)
        self._spark = spark
        self._thread = threading.Thread(
            target=self._run, args=(frame,), name=f"spark-batch-{self.task_id}", daemon=True
        )
        self._thread.start()
        return self

    def _run(self, frame: Any) -> None:
        from pyspark.sql import Observation
        from pyspark.sql import functions as F

        sc = self._spark.sparkContext
        sc.setLocalProperty(POOL_PROPERTY, self.task_id)
        sc.setJobGroup(self.group, f"zkcontroller batch task {self.task_id}", interruptOnCancel=True)
        t0 = time.monotonic()
        try:
            sink = self.pipeline.sink
            metrics: dict[str, Any] = {}
            if isinstance(sink, FilesSink):
                observation = Observation(f"zkc_{self.task_id}".replace("-", "_").replace(".", "_"))
                observed = frame.observe(observation, F.count(F.lit(1)).alias("rows"))
                observed.write.mode("overwrite").format(sink.format).options(**sink.options).save(sink.path)
                metrics["rows_written"] = int(observation.get.get("rows", 0))  # complete: the write succeeded
            else:
                assert isinstance(sink, ConsoleSink)
                frame.show(sink.num_rows, truncate=False)  # a limited read: no row count to observe
            metrics["duration_s"] = round(time.monotonic() - t0, 3)
            self._result = RunStatus(RunState.COMPLETED, metrics=metrics)
        except BaseException as exc:
            if self._stopping.is_set():
                self._result = RunStatus(RunState.STOPPED)
            else:
                message, trace = spark_error(exc)
                self._result = RunStatus(
                    RunState.FAILED,
                    error=message,
                    trace=trace,
                    metrics={"duration_s": round(time.monotonic() - t0, 3)},
                    error_type=error_kind(exc),
                )
        finally:
            sc.setLocalProperty(POOL_PROPERTY, None)
            sc.setLocalProperty("spark.jobGroup.id", None)

    def active(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def status(self) -> RunStatus:
        base = {"mode": self.mode, "pool": self.task_id, "uptime_s": round(time.monotonic() - self.started, 3)}
        result = self._result
        if result is None or self.active():
            return RunStatus(RunState.RUNNING, metrics=base)
        return replace(result, metrics={**base, **result.metrics})

    def stop(self, timeout: float) -> None:
        if not self.active():
            return
        self._stopping.set()
        self._spark.sparkContext.cancelJobGroup(self.group)
        assert self._thread is not None
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError(f"task {self.task_id}: batch job still running {timeout:.0f}s after cancel")


__all__ = [
    "PipelineStartError",
    "PreparedQuery",
    "Progress",
    "StreamingRun",
    "BatchRun",
    "spark_error",
    "task_session",
    "build_frame",
]
