"""The compatibility of a spec change with the task's checkpoint (Spark's recovery rules), without ZooKeeper."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from controller.protocol.tasks.spec import TaskSpec, parse_spec
from controller.protocol.tasks.spec_changes import diff_specs, field_changes, stateful_operators


def base(**pipeline: Any) -> dict[str, Any]:
    p: dict[str, Any] = {
        "source": {"type": "files", "format": "json", "path": "/in", "schema": "id LONG, name STRING"},
        "transform": {"sql": "SELECT id, name FROM input"},
        "sink": {"type": "files", "format": "parquet", "path": "/out"},
    }
    p.update(pipeline)
    return {"id": "t1", "pipeline": p}


def spec(obj: dict[str, Any]) -> TaskSpec:
    return parse_spec(obj)


def with_path(obj: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    out: dict[str, Any] = {k: (dict(v) if isinstance(v, dict) else v) for k, v in obj.items()}
    node = out
    keys = path.split(".")
    for k in keys[:-1]:
        node[k] = dict(node.get(k, {}))
        node = node[k]
    node[keys[-1]] = value
    return out


# (name, change, verdict): "ok" allowed running, "reset" needs STOPPED + reset, "never" forbidden
MUTATIONS: list[tuple[str, str, Any, str]] = [
    ("projection", "pipeline.transform.sql", "SELECT id, name, upper(name) AS up FROM input", "ok"),
    ("filter", "pipeline.transform.sql", "SELECT id, name FROM input WHERE id > 3", "ok"),
    ("aggregation added", "pipeline.transform.sql", "SELECT name, count(*) AS n FROM input GROUP BY name", "reset"),
    ("distinct added", "pipeline.transform.sql", "SELECT DISTINCT id, name FROM input", "reset"),
    ("source path", "pipeline.source.path", "/in2", "reset"),
    ("source format", "pipeline.source.format", "csv", "reset"),
    ("source kind", "pipeline.source", {"type": "rate", "rows_per_second": 5}, "reset"),
    ("source schema, stateless", "pipeline.source.schema", "id LONG, name STRING, x INT", "ok"),
    ("source options", "pipeline.source.options", {"multiLine": "true"}, "ok"),
    ("rate limit", "pipeline.source.max_files_per_trigger", 3, "ok"),
    ("sink path", "pipeline.sink.path", "/out2", "reset"),
    ("sink format", "pipeline.sink.format", "json", "reset"),
    ("sink kind", "pipeline.sink", {"type": "console"}, "reset"),
    ("sink options", "pipeline.sink.options", {"compression": "snappy"}, "ok"),
    ("trigger", "pipeline.trigger", {"processing_time": "5 seconds"}, "ok"),
    ("spark options", "pipeline.spark_options", {"spark.sql.ansi.enabled": "true"}, "ok"),
    ("isolation", "pipeline.isolation", "process", "ok"),
    ("mode", "pipeline.mode", "batch", "reset"),
    ("pipeline kind", "pipeline", {"kind": "noop"}, "reset"),
    ("weight", "weight", 3, "ok"),
    ("placement", "placement", {"rack": "r1"}, "ok"),
    ("restart policy", "restart", {"max_attempts": 9}, "ok"),
    ("group", "group", "other", "never"),
]


def verdict(old: TaskSpec, new: TaskSpec) -> str:
    d = diff_specs(old, new)
    return "never" if d.forbidden else "reset" if d.needs_reset else "ok"


@pytest.mark.parametrize("name,path,value,expected", MUTATIONS, ids=[m[0] for m in MUTATIONS])
def test_each_change_alone(name: str, path: str, value: Any, expected: str) -> None:
    old = spec(base())
    new = spec(with_path(base(), path, value))
    d = diff_specs(old, new)
    assert d.changed, name
    assert verdict(old, new) == expected
    assert all(c.path.startswith(path.split(".")[0]) for c in d.changes)
    refusal_running = d.refusal(stopped=False, reset=False)
    refusal_stopped_reset = d.refusal(stopped=True, reset=True)
    assert (refusal_running is None) == (expected == "ok")
    assert (refusal_stopped_reset is None) == (expected != "never")
    assert d.refusal(stopped=False, reset=True) == refusal_running  # a reset alone does not make a running change
    assert (d.refusal(stopped=True, reset=False) is None) == (expected == "ok")


PAIRS = [
    (a, b)
    for a, b in itertools.combinations(MUTATIONS, 2)
    if a[1].split(".")[:2] != b[1].split(".")[:2] and not {a[1], b[1]} & {"pipeline", "pipeline.mode"}
]


@pytest.mark.parametrize("a,b", PAIRS, ids=[f"{a[0]}+{b[0]}" for a, b in PAIRS])
def test_every_pair_of_changes(a: tuple[str, str, Any, str], b: tuple[str, str, Any, str]) -> None:
    """Two changes together are judged by the stricter: a reason each, none lost, none invented."""
    obj = with_path(with_path(base(), a[1], a[2]), b[1], b[2])
    old, new = spec(base()), spec(obj)
    rank = {"ok": 0, "reset": 1, "never": 2}
    expected = max(a[3], b[3], key=rank.__getitem__)
    assert verdict(old, new) == expected
    d = diff_specs(old, new)
    singles = [diff_specs(old, spec(with_path(base(), m[1], m[2]))) for m in (a, b)]
    assert set(d.needs_reset) >= set(singles[0].needs_reset) | set(singles[1].needs_reset)


def test_same_spec_is_no_change() -> None:
    old = spec(base())
    assert not diff_specs(old, spec(base())).changed
    # run state, nonce and revision are not configuration
    other = old.model_copy(update={"state": "STOPPED", "restart_nonce": 4, "revision": 7})
    assert field_changes(old, other) == ()
    # whitespace, case and comments of the SQL are no change of the query
    sql = "select id,  name\n FROM input -- all of it"
    assert not diff_specs(old, spec(with_path(base(), "pipeline.transform.sql", sql))).needs_reset


def test_sql_string_literal_is_data() -> None:
    old = spec(base(transform={"sql": "SELECT id, 'a' AS tag FROM input"}))
    new = spec(base(transform={"sql": "SELECT id, 'A' AS tag FROM input"}))
    assert diff_specs(old, new).changed
    assert not diff_specs(old, new).needs_reset


def test_stateful_sql_changes_need_a_reset() -> None:
    agg = "SELECT name, count(*) AS n FROM input GROUP BY name"
    old = spec(base(transform={"sql": agg}))
    new = spec(base(transform={"sql": agg.replace("count(*)", "sum(id)")}))
    d = diff_specs(old, new)
    assert d.needs_reset and "GROUP BY" in d.needs_reset[0]
    removed = spec(base(transform={"sql": "SELECT name FROM input"}))
    assert diff_specs(old, removed).needs_reset  # dropping the aggregation leaves its state behind
    schema = spec(with_path(base(transform={"sql": agg}), "pipeline.source.schema", "id LONG, name STRING, x INT"))
    assert any("schema" in r for r in diff_specs(old, schema).needs_reset)


@pytest.mark.parametrize(
    "sql,ops",
    [
        ("SELECT * FROM input", ()),
        ("SELECT id FROM input WHERE name = 'group by distinct join'", ()),
        ("SELECT id FROM input -- GROUP BY id\n", ()),
        ("SELECT id FROM input /* count(x) */", ()),
        ("SELECT `group`, id FROM input", ()),
        ("SELECT name, COUNT (*) FROM input GROUP\n BY name", ("GROUP BY", "an aggregate function")),
        ("SELECT DISTINCT id FROM input", ("DISTINCT",)),
        ("SELECT * FROM input a JOIN input b ON a.id = b.id", ("JOIN",)),
        ("SELECT window(ts, '1 minute') w FROM input", ("window",)),
        ("SELECT * FROM input LIMIT 5", ("LIMIT",)),
        ("SELECT max_by(id, ts) FROM input", ("an aggregate function",)),
        ("SELECT id, count_or_not FROM input", ()),
    ],
)
def test_stateful_operators(sql: str, ops: tuple[str, ...]) -> None:
    assert stateful_operators(sql) == ops


def test_batch_and_noop_changes_are_free() -> None:
    old = spec(base(mode="batch"))
    new = spec(with_path(with_path(base(mode="batch"), "pipeline.sink.path", "/o2"), "pipeline.source.path", "/i2"))
    assert diff_specs(old, new).changed and not diff_specs(old, new).needs_reset
    a = spec({"id": "n", "pipeline": {"kind": "noop"}})
    b = spec({"id": "n", "pipeline": {"kind": "noop", "fail_after_s": 3}})
    assert diff_specs(a, b).changed and not diff_specs(a, b).needs_reset


def test_declarative_project_change_needs_reset() -> None:
    a = spec({"id": "d", "pipeline": {"kind": "declarative", "project": "/p"}})
    b = spec({"id": "d", "pipeline": {"kind": "declarative", "project": "/p", "interval_s": 5}})
    c = spec({"id": "d", "pipeline": {"kind": "declarative", "project": "/q"}})
    assert not diff_specs(a, b).needs_reset
    assert diff_specs(a, c).needs_reset


def test_notes_and_shown_values() -> None:
    old = spec(base())
    new = spec(with_path(base(), "pipeline.spark_options", {"spark.sql.shuffle.partitions": "8"}))
    d = diff_specs(old, new)
    assert any("shuffle.partitions" in n for n in d.notes)
    long_sql = "SELECT id, name, " + ", ".join(f"id + {i} AS c{i}" for i in range(60)) + " FROM input"
    change = diff_specs(old, spec(with_path(base(), "pipeline.transform.sql", long_sql))).changes[0]
    assert change.path == "pipeline.transform.sql" and len(change.new) <= 120 and change.new.endswith("...")
    moved = diff_specs(old, spec(with_path(base(), "weight", 2)))
    assert any("rebalance" in n for n in moved.notes)


def test_revision_is_stored_only_once_changed() -> None:
    s = spec(base())
    assert s.revision == 1 and b"revision" not in s.encode()
    assert b'"revision":2' in s.model_copy(update={"revision": 2}).encode()
