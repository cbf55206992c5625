"""Task specs: the one source of truth for what a task is (pydantic models; JSON Schema via ``task_schema``).

A spec is validated in full before anything is written to ZooKeeper; errors name the field and the
problem (``SpecError``). The same models decode ``/tasks/<id>`` payloads, so garbage found there is
reported as a :class:`~controller.codecs.PayloadError` and isolated to that task.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Literal, Union

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from controller.codecs import (MAX_PAYLOAD_BYTES, SCHEMA_VERSION, SUPPORTED_VERSIONS, PayloadError, TaskDescriptor,
                              Unreadable)
from controller.layout import check_name, InvalidName

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$"


class SpecError(ValueError):
    """A task spec that cannot be accepted; the message names the task, the field and the problem."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# ---- sources --------------------------------------------------------------------------------------
class FilesSource(_Model):
    type: Literal["files"]
    format: Literal["csv", "json", "parquet"]
    path: str = Field(min_length=1)
    schema_ddl: str = Field(alias="schema", min_length=1, description="Spark DDL, e.g. 'id LONG, name STRING'")
    options: dict[str, str] = Field(default_factory=dict)
    max_files_per_trigger: int | None = Field(default=None, ge=1)

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class RateSource(_Model):
    type: Literal["rate"]
    rows_per_second: int = Field(default=10, ge=1, le=1_000_000)


Source = Annotated[Union[FilesSource, RateSource], Field(discriminator="type")]


# ---- sinks ----------------------------------------------------------------------------------------
class FilesSink(_Model):
    type: Literal["files"]
    format: Literal["parquet", "json", "csv"]
    path: str = Field(min_length=1)
    options: dict[str, str] = Field(default_factory=dict)


class ConsoleSink(_Model):
    type: Literal["console"]
    num_rows: int = Field(default=20, ge=1, le=1000)


Sink = Annotated[Union[FilesSink, ConsoleSink], Field(discriminator="type")]


class Transform(_Model):
    sql: str = Field(default="SELECT * FROM input", min_length=1, description="SQL over a view named 'input'")


class Trigger(_Model):
    processing_time: str | None = Field(default=None, description="e.g. '2 seconds'")
    available_now: bool = False

    @model_validator(mode="after")
    def _one_kind(self) -> "Trigger":
        if self.processing_time and self.available_now:
            raise ValueError("choose either processing_time or available_now, not both")
        return self


# ---- pipelines ------------------------------------------------------------------------------------
class SparkPipeline(_Model):
    """Our own source -> SQL -> sink pipeline, run as one Spark (streaming) query."""

    kind: Literal["spark"] = "spark"
    source: Source
    transform: Transform = Field(default_factory=Transform)
    sink: Sink
    mode: Literal["streaming", "batch"] = "streaming"
    trigger: Trigger = Field(default_factory=Trigger)
    spark_options: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _consistent(self) -> "SparkPipeline":
        if self.mode == "batch" and isinstance(self.source, RateSource):
            raise ValueError("the rate source is streaming-only; use mode: streaming")
        if self.mode == "batch" and (self.trigger.processing_time or self.trigger.available_now):
            raise ValueError("a trigger applies to streaming pipelines only")
        if "input" not in self.transform.sql.lower():
            raise ValueError("transform.sql must read from the view named 'input'")
        return self


class DeclarativePipeline(_Model):
    """A Spark Declarative Pipelines project (``spark-pipeline.yml``), run by Spark's own engine."""

    kind: Literal["declarative"]
    project: str = Field(min_length=1, description="directory holding spark-pipeline.yml")
    interval_s: float | None = Field(default=None, gt=0, description="run every N seconds; None = once")
    full_refresh: bool = False


class NoopPipeline(_Model):
    """Simulated work (scale tests, the fast demo): runs until stopped, optionally failing or finishing."""

    kind: Literal["noop"]
    fail_after_s: float | None = Field(default=None, ge=0)
    fail_message: str = "simulated failure"
    complete_after_s: float | None = Field(default=None, ge=0)


Pipeline = Annotated[Union[SparkPipeline, DeclarativePipeline, NoopPipeline], Field(discriminator="kind")]


# Brokers one task may be pinned to: pins travel in every join result of the group.
MAX_PINNED = 256


class Placement(_Model):
    pinned: tuple[str, ...] = ()
    pin_mode: Literal["required", "preferred"] = "preferred"
    rack: str | None = None

    @field_validator("pinned")
    @classmethod
    def _names(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if len(value) > MAX_PINNED:
            raise ValueError(f"pins {len(value)} brokers; at most {MAX_PINNED} may be pinned (every pin travels in "
                             "each rebalance of the group)")
        for b in value:
            check_name("broker id", b)
        return value


class TaskSpec(_Model):
    """A task: one pipeline, in one group, RUNNING or PAUSED."""

    version: int = SCHEMA_VERSION
    id: str = Field(pattern=NAME_PATTERN)
    group: str = Field(default="default", pattern=NAME_PATTERN)
    state: Literal["RUNNING", "PAUSED"] = "RUNNING"
    weight: int = Field(default=1, ge=1, le=1000)
    placement: Placement = Field(default_factory=Placement)
    max_failures: int = Field(default=5, ge=0, le=1000)
    restart_nonce: int = Field(default=0, ge=0, description="bumped by `task restart`: the owner restarts it")
    pipeline: Pipeline = Field(default_factory=lambda: NoopPipeline(kind="noop"))

    @field_validator("version")
    @classmethod
    def _version(cls, value: int) -> int:
        if value not in SUPPORTED_VERSIONS:
            raise ValueError(f"unsupported version {value} (supported: {sorted(SUPPORTED_VERSIONS)})")
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

    def encode(self) -> bytes:
        data = json.dumps(self.model_dump(mode="json", by_alias=True), separators=(",", ":"), sort_keys=True).encode()
        if len(data) > MAX_PAYLOAD_BYTES:
            raise SpecError(f"task {self.id}: spec is {len(data)} bytes, over {MAX_PAYLOAD_BYTES}")
        return data

    def with_state(self, state: str) -> "TaskSpec":
        return self.model_copy(update={"state": state})


def _describe(exc: ValidationError, label: str) -> str:
    parts = []
    for err in exc.errors()[:5]:
        loc = ".".join(str(p) for p in err["loc"])
        msg = err["msg"].removeprefix("Value error, ")
        parts.append(f"{loc or '<spec>'}: {msg}")
    more = f" (and {len(exc.errors()) - 5} more)" if len(exc.errors()) > 5 else ""
    return f"{label}: " + "; ".join(parts) + more


def parse_spec(obj: Any, label: str = "spec") -> TaskSpec:
    """Validate one spec object (already parsed) or raise SpecError naming the field and problem."""
    if not isinstance(obj, dict):
        raise SpecError(f"{label}: expected a mapping, got {type(obj).__name__}")
    name = obj.get("id")
    if isinstance(name, str):
        label = f"task {name!r}"
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
    try:
        doc = json.loads(text) if p.suffix == ".json" else yaml.safe_load(text)
    except (ValueError, RecursionError, yaml.YAMLError) as exc:  # ValueError: JSON errors, huge integers
        raise SpecError(f"{path}: not valid {'JSON' if p.suffix == '.json' else 'YAML'}: {str(exc).splitlines()[0]}") from None
    if doc is None:
        raise SpecError(f"{path}: empty file, expected a task spec or a list of them")
    items = doc if isinstance(doc, list) else [doc]
    specs = [parse_spec(item, f"{path}[{i}]") for i, item in enumerate(items)]
    seen: set[str] = set()
    for s in specs:
        if s.id in seen:
            raise SpecError(f"{path}: task id {s.id!r} appears twice")
        seen.add(s.id)
    return specs


def decode_task(data: bytes | None, path: str) -> TaskSpec:
    """Decode ``/tasks/<id>`` or raise PayloadError (never a bare JSON/validation error)."""
    if isinstance(data, Unreadable):
        raise PayloadError(path, Unreadable.REASON)
    if data is None or not data:
        raise PayloadError(path, "znode has no data")
    if len(data) > MAX_PAYLOAD_BYTES:
        raise PayloadError(path, f"{len(data)} bytes, over the limit")
    try:
        obj = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError) as exc:  # also integers past int_max_str_digits
        raise PayloadError(path, f"not JSON ({exc})") from None
    if not isinstance(obj, dict):
        raise PayloadError(path, "expected a JSON object")
    if "version" not in obj:
        raise PayloadError(path, "missing 'version'")
    try:
        spec = TaskSpec.model_validate(obj)
    except ValidationError as exc:
        raise PayloadError(path, _describe(exc, "task spec")) from None
    expected = path.rsplit("/", 1)[-1]
    if spec.id != expected:
        raise PayloadError(path, f"spec id {spec.id!r} does not match the znode name {expected!r}")
    return spec


def task_schema() -> dict[str, Any]:
    """The JSON Schema of a task spec (documented in docs/task-spec.md)."""
    return TaskSpec.model_json_schema(by_alias=True)


__all__ = [
    "SpecError", "TaskSpec", "SparkPipeline", "DeclarativePipeline", "NoopPipeline", "FilesSource", "RateSource",
    "FilesSink", "ConsoleSink", "Transform", "Trigger", "Placement", "parse_spec", "load_specs", "decode_task",
    "task_schema", "InvalidName",
]
