"""What changes between two specs of one task, and whether Spark can resume the task from its checkpoint after it.

Pure: ``diff_specs(old, new)`` lists the changed fields and sorts the change into allowed, allowed only with a
reset of the checkpoint (``needs_reset``: the task must be STOPPED and the caller must ask for the reset), or
never allowed (``forbidden``). The rules are Spark's own ("Recovery Semantics after Changes in a Streaming Query"
in the Structured Streaming guide), applied to what a spec can say:

- another source (kind, format, path) or another sink (kind, format, path): not resumable; rate limits and
  reader/writer options are source/sink parameters Spark allows to change;
- a change of the SQL is a projection/filter change (allowed) unless the old or the new SQL holds a stateful
  operator (aggregation, DISTINCT, JOIN, window, LIMIT, ...): the state in the checkpoint has the old schema;
- a new source schema under a stateful query changes the state's schema;
- streaming to batch or back, or another pipeline kind: the checkpoint is not the new pipeline's.

The SQL check is lexical (no Spark here): it errs towards "stateful", so a false alarm costs a reset, never a
corrupt restart. Run state, restart nonce and revision are not part of a change (they have their own verbs).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from controller.protocol.tasks.spec import DeclarativePipeline, FilesSink, FilesSource, SparkPipeline, TaskSpec

#: Spec fields that are not the task's configuration: the run state and the restart nonce have their own verbs,
#: the revision is the cluster's count, the format version is the release's.
NOT_CONFIGURATION = frozenset({"state", "restart_nonce", "revision", "version"})
#: how much of an old or new value a change shows
SHOWN_CHARS = 120

_STRING = re.compile(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|`[^`]*`", re.S)
_COMMENT = re.compile(r"--[^\n]*|/\*.*?\*/", re.S)
#: operators that keep state in a streaming query (Spark: aggregations, deduplication, joins, windows, limits)
_STATEFUL = (
    ("GROUP BY", re.compile(r"\bgroup\s+by\b")),
    ("DISTINCT", re.compile(r"\bdistinct\b")),
    ("JOIN", re.compile(r"\bjoin\b")),
    ("window", re.compile(r"\b(?:session_)?window\s*\(")),
    ("LIMIT", re.compile(r"\blimit\b")),
    ("ORDER BY", re.compile(r"\border\s+by\b")),
    ("OVER", re.compile(r"\bover\s*\(")),
    ("WATERMARK", re.compile(r"\bwatermark\b")),
    (
        "an aggregate function",
        re.compile(
            r"\b(?:count|sum|avg|mean|min|max|first|last|collect_list|collect_set|approx_count_distinct|"
            r"count_if|stddev\w*|variance|var_pop|var_samp|percentile\w*|any_value|bool_and|bool_or|every|"
            r"some|max_by|min_by|array_agg|listagg|string_agg)\s*\("
        ),
    ),
)


@dataclass(frozen=True)
class FieldChange:
    """One changed leaf of the spec (``pipeline.transform.sql``), with its old and new values shown short."""

    path: str
    old: str
    new: str


@dataclass(frozen=True)
class SpecDiff:
    """The difference between a task's spec and a new one, and what it takes to apply it."""

    task_id: str
    changes: tuple[FieldChange, ...] = ()
    #: why Spark cannot resume the task from its checkpoint after the change (empty: it can)
    needs_reset: tuple[str, ...] = ()
    #: why the change cannot be applied at all (empty: it can)
    forbidden: tuple[str, ...] = ()
    #: what the caller should know although nothing refuses it
    notes: tuple[str, ...] = ()

    @property
    def changed(self) -> bool:
        return bool(self.changes)

    def refusal(self, *, stopped: bool, reset: bool) -> str | None:
        """Why this change may not be applied now (None: it may): ``stopped``, the task is STOPPED; ``reset``,
        the caller asks for its checkpoint to be reset in the same request."""
        if self.forbidden:
            return "; ".join(self.forbidden)
        if self.needs_reset and not (stopped and reset):
            how = "apply it with a reset" if stopped else "stop the task, then apply it with a reset"
            return (
                "Spark cannot resume this task from its checkpoint after the change: "
                + "; ".join(self.needs_reset)
                + f" ({how}: the checkpoint then starts afresh)"
            )
        return None


def stateful_operators(sql: str) -> tuple[str, ...]:
    """The stateful operators ``sql`` seems to use, by a lexical look that ignores strings and comments."""
    text = _STRING.sub(" '' ", _COMMENT.sub(" ", sql)).lower()
    return tuple(name for name, pattern in _STATEFUL if pattern.search(text))


def _normal_sql(sql: str) -> str:
    """The SQL with comments dropped and whitespace collapsed (strings kept: they are data)."""
    parts = []
    last = 0
    for m in _STRING.finditer(sql):
        parts.append(" ".join(_COMMENT.sub(" ", sql[last : m.start()]).split()).lower())
        parts.append(m.group(0))
        last = m.end()
    parts.append(" ".join(_COMMENT.sub(" ", sql[last:]).split()).lower())
    return " ".join(p for p in parts if p)


def _shown(value: Any) -> str:
    text = "-" if value is None else str(value)
    return text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 3] + "..."


def _leaves(value: Any, prefix: str = "") -> dict[str, Any]:
    """A JSON value flattened to ``dotted.path -> leaf`` (a list is one leaf: it is replaced whole)."""
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        if not value and prefix:
            out[prefix] = {}
        for k, v in value.items():
            out.update(_leaves(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: value}


def field_changes(old: TaskSpec, new: TaskSpec) -> tuple[FieldChange, ...]:
    """Every configuration leaf that differs, sorted by path."""
    a = {k: v for k, v in old.model_dump(mode="json", by_alias=True).items() if k not in NOT_CONFIGURATION}
    b = {k: v for k, v in new.model_dump(mode="json", by_alias=True).items() if k not in NOT_CONFIGURATION}
    la, lb = _leaves(a), _leaves(b)
    return tuple(
        FieldChange(p, _shown(la.get(p)), _shown(lb.get(p)))
        for p in sorted(set(la) | set(lb))
        if la.get(p) != lb.get(p)
    )


def diff_specs(old: TaskSpec, new: TaskSpec) -> SpecDiff:
    """The difference between ``old`` (the stored spec) and ``new`` (the one to apply), judged by Spark's rules."""
    changes = field_changes(old, new)
    forbidden: list[str] = []
    if old.id != new.id:
        forbidden.append(f"another task id ({old.id!r} -> {new.id!r})")
    if old.group != new.group:
        forbidden.append(
            f"another group ({old.group!r} -> {new.group!r}): a task does not move between groups; delete it and "
            "create it in the other group"
        )
    notes: list[str] = []
    if old.weight != new.weight or old.placement != new.placement:
        notes.append("weight or placement changed: the group's next rebalance may move the task")
    reset, more = _pipeline_rules(old.pipeline, new.pipeline)
    return SpecDiff(old.id, changes, tuple(reset), tuple(forbidden), tuple(notes + more))


def _pipeline_rules(old: Any, new: Any) -> tuple[list[str], list[str]]:
    """(reasons the checkpoint cannot be resumed from, notes) for a change of pipeline ``old`` -> ``new``."""
    if old.kind != new.kind:
        return [f"another pipeline kind ({old.kind} -> {new.kind})"], []
    if isinstance(old, DeclarativePipeline) and isinstance(new, DeclarativePipeline):
        if old.project != new.project:
            return ["another declarative project (its tables and checkpoints are the project's)"], []
        return [], []
    if not (isinstance(old, SparkPipeline) and isinstance(new, SparkPipeline)):
        return [], []  # noop: nothing is kept between runs
    if old.mode != new.mode:
        return [f"another mode ({old.mode} -> {new.mode}): a batch run keeps no checkpoint to resume from"], []
    if old.mode == "batch":
        return [], []  # each run reads everything again: any change applies to the next run
    return _source_rules(old, new) + _sink_rules(old, new) + _sql_rules(old, new), _option_notes(old, new)


def _source_rules(old: SparkPipeline, new: SparkPipeline) -> list[str]:
    a, b = old.source, new.source
    if a.type != b.type:
        return [f"another source ({a.type} -> {b.type}): the checkpoint's offsets are the old source's"]
    if isinstance(a, FilesSource) and isinstance(b, FilesSource):
        out = []
        if a.path != b.path:
            out.append("another source path: the checkpoint's file log lists the old directory's files")
        if a.format != b.format:
            out.append(f"another source format ({a.format} -> {b.format})")
        if a.schema_ddl != b.schema_ddl and stateful_operators(old.transform.sql):
            out.append("another source schema under a stateful query: the state's schema would change")
        return out
    return []  # the rate source: rows_per_second is a rate limit, which Spark allows to change


def _sink_rules(old: SparkPipeline, new: SparkPipeline) -> list[str]:
    a, b = old.sink, new.sink
    if a.type != b.type:
        return [f"another sink ({a.type} -> {b.type})"]
    if isinstance(a, FilesSink) and isinstance(b, FilesSink):
        out = []
        if a.path != b.path:
            out.append("another sink path: the file sink's log of committed batches is in the old directory")
        if a.format != b.format:
            out.append(f"another sink format ({a.format} -> {b.format}): the directory would mix formats")
        return out
    return []


def _sql_rules(old: SparkPipeline, new: SparkPipeline) -> list[str]:
    if _normal_sql(old.transform.sql) == _normal_sql(new.transform.sql):
        return []
    ops = sorted(set(stateful_operators(old.transform.sql)) | set(stateful_operators(new.transform.sql)))
    if ops:
        return [
            f"the SQL changed and uses a stateful operator ({', '.join(ops)}): its state in the checkpoint has "
            "the old query's shape"
        ]
    return []  # a projection or filter change, which Spark allows


def _option_notes(old: SparkPipeline, new: SparkPipeline) -> list[str]:
    key = "spark.sql.shuffle.partitions"
    if old.spark_options.get(key) != new.spark_options.get(key):
        return [f"{key} is fixed by the checkpoint: Spark keeps the first run's value"]
    return []


__all__ = ["FieldChange", "SpecDiff", "diff_specs", "field_changes", "stateful_operators", "NOT_CONFIGURATION"]
