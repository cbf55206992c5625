"""Task specs: the one source of truth for what a task is (pydantic models; JSON Schema via ``task_schema``).

A spec is validated in full before anything is written to ZooKeeper; a refusal names the task, the field
and what is allowed (``SpecError``, worded by ``controller.protocol.tasks.spec_errors``). The same models decode
``/tasks/<id>`` payloads, so garbage found there is reported as a :class:`~controller.protocol.records.codecs.PayloadError`
and isolated to that task.

New input (``parse_spec``, ``load_specs``) and stored payloads (``decode_task``) are told apart: a user's
spec must be written in the current format (``SPEC_VERSION``), while a znode written by an older release
is upgraded on read (``upgrade_stored``), so what older releases wrote keeps its meaning.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    SerializerFunctionWrapHandler,
    Tag,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)

from controller.protocol.cluster.layout import InvalidName, check_name
from controller.protocol.errors import ZkcError
from controller.protocol.records.codecs import MAX_PAYLOAD_BYTES, Unreadable
from controller.protocol.records.group_messages import TaskDescriptor
from controller.protocol.records.payload_validation import PayloadError
from controller.protocol.tasks.spec_errors import describe_errors
from controller.protocol.tasks.storage import check_data_path

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$"

#: The spec format this release writes. Version 2: a task names its pipeline (version 1 made a spec without
#: one a no-op task) and carries a ``restart`` policy (version 1 had ``max_failures`` only).
SPEC_VERSION = 2
#: What ``decode_task`` reads: older versions are upgraded on read (``upgrade_stored``).
STORED_SPEC_VERSIONS = (1, 2)
#: Keys a spec file may carry for editors only; dropped before validation.
EDITOR_KEYS = ("$schema",)


class SpecError(ZkcError, ValueError):
    """A task spec that cannot be accepted; the message names the task, the field and what is allowed."""

    status = 422
    code = "invalid_spec"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# ---- sources --------------------------------------------------------------------------------------
class FilesSource(_Model):
    """Files in a directory (or any Hadoop URL) read as a stream, or once in batch mode."""

    type: Literal["files"] = Field(description="a files source")
    format: Literal["csv", "json", "parquet"] = Field(description="the files' format")
    path: str = Field(min_length=1, description="a directory or Hadoop URL every worker can read")
    schema_ddl: str = Field(alias="schema", min_length=1, description="Spark DDL, e.g. 'id LONG, name STRING'")
    options: dict[str, str] = Field(default_factory=dict, description="passed to Spark's reader, e.g. header: 'true'")
    max_files_per_trigger: int | None = Field(default=None, ge=1, description="bound each micro-batch")

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class RateSource(_Model):
    """Spark's demo source: (timestamp, value) rows at a fixed rate (streaming only)."""

    type: Literal["rate"] = Field(description="the rate source")
    rows_per_second: int = Field(default=10, ge=1, le=1_000_000, description="rows generated per second")


Source = Annotated[FilesSource | RateSource, Field(discriminator="type", description="where rows come from")]


# ---- sinks ----------------------------------------------------------------------------------------
class FilesSink(_Model):
    """Files written through Spark's file sink (exactly once with its commit log)."""

    type: Literal["files"] = Field(description="a files sink")
    format: Literal["parquet", "json", "csv"] = Field(description="the files' format")
    path: str = Field(
        min_length=1, description="an absolute directory or Hadoop URL every worker can write (a reset rewrites it)"
    )
    options: dict[str, str] = Field(default_factory=dict, description="passed to Spark's writer")

    @field_validator("path")
    @classmethod
    def _absolute(cls, v: str) -> str:
        return check_data_path("sink path", v)


class ConsoleSink(_Model):
    """Rows printed to the worker's output (at least once)."""

    type: Literal["console"] = Field(description="the console sink")
    num_rows: int = Field(default=20, ge=1, le=1000, description="rows printed per batch")


Sink = Annotated[FilesSink | ConsoleSink, Field(discriminator="type", description="where rows go")]


class Transform(_Model):
    """The SQL run over the source."""

    sql: str = Field(default="SELECT * FROM input", min_length=1, description="SQL over a view named 'input'")


class Trigger(_Model):
    """When a streaming query runs its micro-batches (none given: back to back)."""

    processing_time: str | None = Field(default=None, description="e.g. '2 seconds'")
    available_now: bool = Field(default=False, description="process what is there, then complete")

    @model_validator(mode="after")
    def _one_kind(self) -> Trigger:
        if self.processing_time and self.available_now:
            raise ValueError("choose either processing_time or available_now, not both")
        return self


# ---- pipelines ------------------------------------------------------------------------------------
DRIVER_MEMORY_PATTERN = r"^[1-9][0-9]{0,6}[mMgG]$"
#: Spark refuses a driver heap under 450 MiB ("Insufficient driver memory"); 512m is the least that starts.
MIN_DRIVER_MEMORY_MB = 512
MAX_DRIVER_MEMORY_MB = 256 * 1024
#: Fields of a Spark pipeline left out of the stored spec while they hold their defaults, so a spec that
#: does not use them stays byte for byte what earlier releases wrote and read.
_OMITTED_AT_DEFAULT = {"isolation": "shared", "driver_memory": None}


def memory_mb(size: str) -> int:
    """MiB of a JVM size matched by ``DRIVER_MEMORY_PATTERN`` ('512m', '2g')."""
    return int(size[:-1]) * (1024 if size[-1] in "gG" else 1)


class SparkPipeline(_Model):
    """Our own source -> SQL -> sink pipeline, run as one Spark (streaming) query. A pipeline with a source
    and a sink and no ``kind`` is one of these."""

    kind: Literal["spark"] = Field(default="spark", description="may be left out when source and sink are given")
    source: Source
    transform: Transform = Field(default_factory=Transform, description="the SQL between source and sink")
    sink: Sink
    mode: Literal["streaming", "batch"] = Field(default="streaming", description="streaming query or one batch run")
    trigger: Trigger = Field(default_factory=Trigger, description="streaming only: when micro-batches run")
    spark_options: dict[str, str] = Field(default_factory=dict, description="per-task Spark SQL settings")
    isolation: Literal["shared", "process"] = Field(
        default="shared",
        description="shared: on the broker's one Spark driver; process: in a driver process of its own",
    )
    driver_memory: str | None = Field(
        default=None,
        pattern=DRIVER_MEMORY_PATTERN,
        description="isolation process only: its driver's heap, e.g. '512m', '2g' (at least 512m; "
        "default: the broker's spark.driver.memory)",
    )

    @model_validator(mode="after")
    def _consistent(self) -> SparkPipeline:
        if self.driver_memory is not None:
            if self.isolation != "process":
                raise ValueError('driver_memory applies to isolation "process" only (a shared driver is the broker\'s)')
            if not MIN_DRIVER_MEMORY_MB <= memory_mb(self.driver_memory) <= MAX_DRIVER_MEMORY_MB:
                raise ValueError(
                    f"driver_memory {self.driver_memory!r} is out of bounds: from {MIN_DRIVER_MEMORY_MB}m "
                    f"(Spark's least) to {MAX_DRIVER_MEMORY_MB // 1024}g"
                )
        if self.mode == "batch" and isinstance(self.source, RateSource):
            raise ValueError("the rate source is streaming-only; use mode: streaming")
        if self.mode == "batch" and (self.trigger.processing_time or self.trigger.available_now):
            raise ValueError("a trigger applies to streaming pipelines only")
        if "input" not in self.transform.sql.lower():
            raise ValueError("transform.sql must read from the view named 'input'")
        return self

    @model_serializer(mode="wrap")
    def _omit_defaults(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        out: dict[str, Any] = handler(self)
        for key, default in _OMITTED_AT_DEFAULT.items():
            if out.get(key, default) == default:
                out.pop(key, None)
        return out


class DeclarativePipeline(_Model):
    """A Spark Declarative Pipelines project (``spark-pipeline.yml``), run by Spark's own engine."""

    kind: Literal["declarative"] = Field(description="a Spark Declarative Pipelines project")
    project: str = Field(min_length=1, description="directory holding spark-pipeline.yml")
    interval_s: float | None = Field(default=None, gt=0, description="run every N seconds; none = once")
    full_refresh: bool = Field(default=False, description="every run is --full-refresh-all")


class NoopPipeline(_Model):
    """Simulated work (scale tests, the fast demo): runs until stopped, optionally failing or finishing."""

    kind: Literal["noop"] = Field(description="simulated work")
    fail_after_s: float | None = Field(default=None, ge=0, description="fail this long after each start")
    fail_message: str = Field(default="simulated failure", description="the error of a simulated failure")
    complete_after_s: float | None = Field(default=None, ge=0, description="complete this long after each start")
    cost: float | None = Field(
        default=None, ge=0, le=10, description="the load share it reports (its simulated batch time / trigger)"
    )


PIPELINE_KINDS = ("spark", "declarative", "noop")


def pipeline_kind(value: Any) -> str | None:
    """The pipeline's kind: as written, or ``spark`` for a pipeline that names a source or a sink without
    one (how users write them); None when nothing says (the refusal then lists the kinds)."""
    if isinstance(value, dict):
        kind = value.get("kind")
        if kind is None and ("source" in value or "sink" in value):
            return "spark"
        return kind if isinstance(kind, str) else None
    return getattr(value, "kind", None)


Pipeline = Annotated[
    Annotated[SparkPipeline, Tag("spark")]
    | Annotated[DeclarativePipeline, Tag("declarative")]
    | Annotated[NoopPipeline, Tag("noop")],
    Discriminator(pipeline_kind),
    Field(description='what runs: {"kind": "spark"|"declarative"|"noop", ...}'),
]


# Brokers one task may be pinned to: pins travel in every join result of the group.
MAX_PINNED = 256


class Placement(_Model):
    """Where the task may run."""

    pinned: tuple[str, ...] = Field(default=(), description="broker ids this task is pinned to")
    pin_mode: Literal["required", "preferred"] = Field(
        default="preferred", description="required: only on a pinned broker"
    )
    rack: str | None = Field(default=None, description="prefer brokers of this rack")

    @field_validator("pinned")
    @classmethod
    def _names(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if len(value) > MAX_PINNED:
            raise ValueError(
                f"pins {len(value)} brokers; at most {MAX_PINNED} may be pinned (every pin travels in "
                "each rebalance of the group)"
            )
        for b in value:
            check_name("broker id", b)
        return value


class RestartPolicy(_Model):
    """What the owning worker does when the task fails: restart it up to ``max_attempts`` times, waiting
    ``backoff_initial_s`` before the first restart and twice as long before each next one (never more than
    ``backoff_max_s``); then the task is FAILED with its last error until `zkctl task restart`."""

    max_attempts: int = Field(default=5, ge=0, le=1000, description="automatic restarts after failures (0: none)")
    backoff_initial_s: float = Field(default=0.5, gt=0, le=3600, description="wait before the first restart")
    backoff_max_s: float = Field(default=30.0, gt=0, le=86_400, description="the longest wait between restarts")

    @model_validator(mode="after")
    def _ordered(self) -> RestartPolicy:
        if self.backoff_initial_s > self.backoff_max_s:
            raise ValueError(
                f"backoff_initial_s {self.backoff_initial_s:g} is above backoff_max_s {self.backoff_max_s:g}"
            )
        return self

    def delay_before(self, attempt: int) -> float:
        """Seconds to wait before restart number ``attempt`` (1-based): doubling, capped."""
        return min(self.backoff_initial_s * 2.0 ** min(max(attempt - 1, 0), 64), self.backoff_max_s)

    def gives_up(self, failures: int) -> bool:
        """After this many failures in a row the task stays FAILED."""
        return failures > self.max_attempts


class TaskSpec(_Model):
    """A task: one pipeline, in one group, RUNNING, PAUSED or STOPPED."""

    version: int = Field(
        default=SPEC_VERSION, strict=True, description=f"the spec format; {SPEC_VERSION} (may be left out)"
    )
    id: str = Field(pattern=NAME_PATTERN, description="the task's name, unique in the cluster")
    group: str = Field(default="default", pattern=NAME_PATTERN, description="the group of brokers that runs it")
    state: Literal["RUNNING", "PAUSED", "STOPPED"] = Field(
        default="RUNNING",
        description="PAUSED: nobody runs it; STOPPED: nobody runs it, confirmed, and its offsets may be reset",
    )
    weight: int = Field(default=1, ge=1, le=1000, description="its share of a broker's capacity")
    placement: Placement = Field(default_factory=Placement, description="pins and rack preference")
    restart: RestartPolicy = Field(default_factory=RestartPolicy, description="automatic restarts after failures")
    restart_nonce: int = Field(default=0, ge=0, description="bumped by `task restart`: the owner restarts it")
    revision: int = Field(
        default=1,
        ge=1,
        description="the spec version, counted by the cluster: 1 at create, one more at each applied change "
        "(a value in a file is ignored)",
    )
    pipeline: Pipeline

    @field_validator("version")
    @classmethod
    def _version(cls, value: int) -> int:
        if value != SPEC_VERSION:
            raise ValueError(
                f'unsupported version {value}: this release writes version {SPEC_VERSION} (leave "version" out)'
            )
        return value

    def descriptor(self) -> TaskDescriptor:
        """The projection of this spec that assignors see."""
        return TaskDescriptor(
            task_id=self.id,
            weight=self.weight,
            pinned=self.placement.pinned,
            pin_mode=self.placement.pin_mode,
            rack=self.placement.rack,
        )

    @model_serializer(mode="wrap")
    def _omit_first_revision(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """A spec never changed stays byte for byte what earlier releases wrote (they know no revision)."""
        out: dict[str, Any] = handler(self)
        if out.get("revision") == 1:
            out.pop("revision")
        return out

    def encode(self) -> bytes:
        data = json.dumps(self.model_dump(mode="json", by_alias=True), separators=(",", ":"), sort_keys=True).encode()
        if len(data) > MAX_PAYLOAD_BYTES:
            raise SpecError(f"task {self.id}: spec is {len(data)} bytes, over {MAX_PAYLOAD_BYTES}")
        return data

    def with_state(self, state: str) -> TaskSpec:
        return self.model_copy(update={"state": state})


def _describe(exc: ValidationError, label: str) -> str:
    return describe_errors(exc.errors(), label, schema_definitions())


def parse_spec(obj: Any, label: str = "spec") -> TaskSpec:
    """Validate one spec object (already parsed) or raise SpecError naming the task, field and what is allowed."""
    if not isinstance(obj, dict):
        raise SpecError(f"{label}: expected a mapping (a task spec), got {type(obj).__name__}")
    name = obj.get("id")
    if isinstance(name, str):
        label = f"task {name!r}"
    obj = {k: v for k, v in obj.items() if k not in EDITOR_KEYS}
    try:
        return TaskSpec.model_validate(obj)
    except ValidationError as exc:
        raise SpecError(_describe(exc, label)) from None


def load_specs(path: str | Path) -> list[TaskSpec]:
    """Read a YAML or JSON file holding one spec or a list of specs; validate all before returning any."""
    p = Path(path)
    try:
        text = p.read_bytes().decode("utf-8")
    except OSError as exc:
        raise SpecError(f"{path}: cannot read ({exc.strerror})") from None
    except UnicodeDecodeError as exc:
        raise SpecError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    return parse_specs_text(text, str(path), as_json=p.suffix == ".json")


#: the largest spec file read from standard input
MAX_SPEC_TEXT = 16 * 1024 * 1024


def _where(exc: Exception) -> str:
    """``line L, column C: problem`` of a YAML or JSON syntax error (1-based, as editors count)."""
    if isinstance(exc, json.JSONDecodeError):
        return f"line {exc.lineno}, column {exc.colno}: {exc.msg}"
    mark = getattr(exc, "problem_mark", None)
    if isinstance(exc, yaml.MarkedYAMLError) and mark is not None:
        return f"line {mark.line + 1}, column {mark.column + 1}: {exc.problem or exc.context or 'syntax error'}"
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def parse_specs_text(text: str, name: str, as_json: bool = False) -> list[TaskSpec]:
    """Specs from YAML (or, ``as_json``, JSON) text named ``name`` in errors (a file, ``-`` for stdin)."""
    if len(text) > MAX_SPEC_TEXT:
        raise SpecError(f"{name}: {len(text):,} characters, over the {MAX_SPEC_TEXT:,} a spec file may hold")
    try:
        doc = json.loads(text) if as_json else yaml.safe_load(text)
    except (ValueError, RecursionError, yaml.YAMLError) as exc:  # ValueError: JSON errors, huge integers
        raise SpecError(f"{name}: not valid {'JSON' if as_json else 'YAML'}: {_where(exc)}") from None
    if doc is None:
        raise SpecError(f"{name}: empty file, expected a task spec or a list of them")
    items = doc if isinstance(doc, list) else [doc]
    specs = [parse_spec(item, f"{name}[{i}]") for i, item in enumerate(items)]
    seen: set[str] = set()
    for s in specs:
        if s.id in seen:
            raise SpecError(f"{name}: task id {s.id!r} appears twice")
        seen.add(s.id)
    return specs


def upgrade_stored(obj: dict[str, Any], path: str) -> dict[str, Any]:
    """A stored spec of an older version in the current format, meaning what it meant when written.

    Version 1: a spec without ``pipeline`` was a no-op task, and ``max_failures`` is now
    ``restart.max_attempts`` (its backoff was the broker's, 0.5 s doubling to 30 s: the policy's defaults)."""
    version = obj.get("version")
    if type(version) is not int or version not in STORED_SPEC_VERSIONS:
        raise PayloadError(path, f"unsupported version {version!r} (readable: {list(STORED_SPEC_VERSIONS)})")
    if version == SPEC_VERSION:
        return obj
    if "restart" in obj:
        raise PayloadError(path, "a version 1 spec has no 'restart'")
    out = {k: v for k, v in obj.items() if k != "max_failures"}
    out["version"] = SPEC_VERSION
    out.setdefault("pipeline", {"kind": "noop"})
    if "max_failures" in obj:
        out["restart"] = {"max_attempts": obj["max_failures"]}
    return out


def decode_task(data: bytes | None, path: str) -> TaskSpec:
    """Decode ``/tasks/<id>`` (of any readable version) or raise PayloadError (never a bare JSON/validation error)."""
    if isinstance(data, Unreadable):
        raise PayloadError(path, Unreadable.REASON)
    if data is None or not data:
        raise PayloadError(path, "znode has no data")
    if len(data) > MAX_PAYLOAD_BYTES:
        raise PayloadError(path, f"{len(data)} bytes, over the limit")
    expected = path.rsplit("/", 1)[-1]
    try:  # the fast path: a current spec, parsed and validated in one pass (a failover reads every spec)
        spec = TaskSpec.model_validate_json(data)
        if "version" in spec.model_fields_set and spec.id == expected:
            return spec
    except ValidationError:
        pass  # anything strict validation refuses takes the path below: the upgrade, or the precise error
    try:
        obj = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError) as exc:  # also integers past int_max_str_digits
        raise PayloadError(path, f"not JSON ({exc})") from None
    if not isinstance(obj, dict):
        raise PayloadError(path, "expected a JSON object")
    if "version" not in obj:
        raise PayloadError(path, "missing 'version'")
    obj = upgrade_stored(obj, path)
    try:
        spec = TaskSpec.model_validate(obj)
    except ValidationError as exc:
        raise PayloadError(path, _describe(exc, "task spec")) from None
    if spec.id != expected:
        raise PayloadError(path, f"spec id {spec.id!r} does not match the znode name {expected!r}")
    return spec


_DEFINITIONS: dict[str, Any] = {}


def schema_definitions() -> dict[str, Any]:
    """The models' JSON Schema definitions (``$defs``, ``TaskSpec`` among them), built once."""
    if not _DEFINITIONS:
        raw = TaskSpec.model_json_schema(by_alias=True, ref_template="#/$defs/{model}")
        defs = dict(raw.pop("$defs", {}))
        defs["TaskSpec"] = raw
        _DEFINITIONS.update(defs)
    return _DEFINITIONS


def task_schema() -> dict[str, Any]:
    """The JSON Schema of a spec file (one task spec or a list of them), for editors and CI checks
    (``zkctl task schema``; documented in docs/pipelines.md)."""
    defs = json.loads(json.dumps(schema_definitions()))  # a copy the caller may change
    spec = defs["TaskSpec"]
    spec["properties"] = {
        "$schema": {"type": "string", "description": "this schema's location, for editors"},
        **spec["properties"],
    }
    spec["properties"]["version"]["const"] = SPEC_VERSION
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "zkcontroller task specs",
        "description": "A task spec, or a list of them, as `zkctl task create -f` reads (YAML or JSON).",
        "anyOf": [{"$ref": "#/$defs/TaskSpec"}, {"type": "array", "items": {"$ref": "#/$defs/TaskSpec"}}],
        "$defs": defs,
    }


__all__ = [
    "SpecError",
    "TaskSpec",
    "SparkPipeline",
    "DeclarativePipeline",
    "NoopPipeline",
    "FilesSource",
    "RateSource",
    "FilesSink",
    "ConsoleSink",
    "Transform",
    "Trigger",
    "Placement",
    "RestartPolicy",
    "parse_spec",
    "load_specs",
    "parse_specs_text",
    "decode_task",
    "upgrade_stored",
    "task_schema",
    "schema_definitions",
    "InvalidName",
    "SPEC_VERSION",
    "STORED_SPEC_VERSIONS",
    "PIPELINE_KINDS",
]
