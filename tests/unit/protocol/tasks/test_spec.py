"""Task specs, pure: what is accepted, how every refusal is worded (the task, the field as written, what is
allowed), how stored specs of older versions still decode, the restart policy's backoff, and the published
JSON Schema (checked with the ``jsonschema`` package against the documentation's examples). No ZooKeeper."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from controller.protocol.records.payload_validation import PayloadError
from controller.protocol.tasks.spec import (
    PIPELINE_KINDS,
    SPEC_VERSION,
    NoopPipeline,
    RestartPolicy,
    SparkPipeline,
    SpecError,
    TaskSpec,
    decode_task,
    load_specs,
    parse_spec,
    task_schema,
)

REPO = Path(__file__).resolve().parents[4]
NOOP = {"kind": "noop"}
RATE_TO_CONSOLE = {"source": {"type": "rate"}, "sink": {"type": "console"}}


def refusal(obj: Any, label: str = "spec") -> str:
    with pytest.raises(SpecError) as info:
        parse_spec(obj, label)
    message = str(info.value)
    assert "\n" not in message and "Unable to extract tag" not in message and "Input should be" not in message, message
    return message


# ---- what is accepted ---------------------------------------------------------------------------------
def test_every_pipeline_kind_is_accepted_when_named():
    assert parse_spec({"id": "n", "pipeline": NOOP}).pipeline == NoopPipeline(kind="noop")
    assert parse_spec({"id": "d", "pipeline": {"kind": "declarative", "project": "/p"}}).pipeline.kind == "declarative"
    assert parse_spec({"id": "s", "pipeline": {"kind": "spark", **RATE_TO_CONSOLE}}).pipeline.kind == "spark"


@pytest.mark.parametrize(
    "pipeline",
    [
        RATE_TO_CONSOLE,
        {
            "source": {"type": "rate"},
            "sink": {"type": "console"},
            "mode": "streaming",
            "transform": {"sql": "SELECT * FROM input"},
        },
    ],
)
def test_a_pipeline_with_source_and_sink_and_no_kind_is_a_spark_pipeline(pipeline):
    spec = parse_spec({"id": "x1", "pipeline": pipeline})
    assert isinstance(spec.pipeline, SparkPipeline) and spec.pipeline.kind == "spark"
    assert json.loads(spec.encode())["pipeline"]["kind"] == "spark"  # stored with its kind spelled out


def test_a_task_without_a_pipeline_is_refused_with_what_to_add():
    assert refusal({"id": "x1"}) == (
        'task \'x1\': pipeline is missing: add "pipeline": {"kind": "spark"|"declarative"|"noop", ...}'
    )
    with pytest.raises(ValidationError):
        TaskSpec(id="x1")  # type: ignore[call-arg]  # no default no-op in code either


def test_an_editor_schema_key_is_ignored():
    assert parse_spec({"$schema": "./task-spec.schema.json", "id": "x1", "pipeline": NOOP}).id == "x1"


# ---- every refusal names the task, the field and what is allowed ----------------------------------------
def spec(**fields: Any) -> dict[str, Any]:
    return {"id": "x1", "pipeline": NOOP, **fields}


def spark(**fields: Any) -> dict[str, Any]:
    return {"id": "x1", "pipeline": {"kind": "spark", **RATE_TO_CONSOLE, **fields}}


# (spec, the field as the user wrote it, words that must follow it: the problem and what is allowed,
#  whether the JSON Schema can see the problem too)
MALFORMED = [
    ({"id": "x1"}, "pipeline", ["is missing", '"kind": "spark"|"declarative"|"noop"'], True),
    (spec(pipeline={}), "pipeline.kind", ["is missing", '"spark"|"declarative"|"noop"'], True),
    (spec(pipeline={"kind": "sprak"}), "pipeline.kind", ['"sprak" is not one of spark, declarative, noop'], True),
    (spec(pipeline={"kind": 7}), "pipeline.kind", ["7 is not one of spark, declarative, noop"], True),
    (
        spec(pipeline="noop"),
        "pipeline",
        ['must be a mapping like {"kind": "spark"|"declarative"|"noop"', '"noop"'],
        True,
    ),
    (
        spec(pipeline={"kind": "noop", "colour": "red"}),
        "pipeline.colour",
        ["is not a field of a noop pipeline", "kind, fail_after_s, fail_message, complete_after_s"],
        True,
    ),
    (spec(pipeline={"kind": "noop", "fail_after_s": -1}), "pipeline.fail_after_s", ["a number at least 0", "-1"], True),
    (spec(pipeline={"kind": "declarative"}), "pipeline.project", ["is missing", "non-empty text"], True),
    (
        spec(pipeline={"kind": "declarative", "project": "/p", "interval_s": 0}),
        "pipeline.interval_s",
        ["a number above 0"],
        True,
    ),
    (
        spec(pipeline={"kind": "declarative", "project": "/p", "full_refresh": "often"}),
        "pipeline.full_refresh",
        ["true or false", '"often"'],
        True,
    ),
    (
        spec(pipeline={"kind": "spark", "sink": {"type": "console"}}),
        "pipeline.source",
        ["is missing", '"type": "files"|"rate"'],
        True,
    ),
    (spec(pipeline={"source": {"type": "rate"}}), "pipeline.sink", ["is missing", '"type": "files"|"console"'], True),
    (
        spec(pipeline={"source": {}, "sink": {"type": "console"}}),
        "pipeline.source.type",
        ["is missing", '"files"|"rate"'],
        True,
    ),
    (
        spec(pipeline={"source": {"type": "kafka"}, "sink": {"type": "console"}}),
        "pipeline.source.type",
        ['"kafka" is not one of files, rate'],
        True,
    ),
    (
        spec(pipeline={"source": {"type": "rate"}, "sink": {"type": "hdfs"}}),
        "pipeline.sink.type",
        ['"hdfs" is not one of files, console'],
        True,
    ),
    (
        spec(
            pipeline={
                "source": {"type": "files", "format": "xml", "path": "/d", "schema": "a INT"},
                "sink": {"type": "console"},
            }
        ),
        "pipeline.source.format",
        ['"xml" is not one of csv, json, parquet'],
        True,
    ),
    (
        spec(pipeline={"source": {"type": "files", "format": "csv", "path": "/d"}, "sink": {"type": "console"}}),
        "pipeline.source.schema",
        ["is missing", "non-empty text"],
        True,
    ),
    (spark(mode="micro"), "pipeline.mode", ['"micro" is not one of streaming, batch'], True),
    (
        spark(source={"type": "rate", "rows_per_second": 0}),
        "pipeline.source.rows_per_second",
        ["a whole number from 1 to 1,000,000", "not 0"],
        True,
    ),
    (
        spark(sink={"type": "console", "num_rows": "ten"}),
        "pipeline.sink.num_rows",
        ["a whole number from 1 to 1000"],
        True,
    ),
    (
        spark(spark_options={"spark.sql.shuffle.partitions": 4}),
        "pipeline.spark_options.spark.sql.shuffle.partitions",
        ["must be text", "not 4"],
        True,
    ),
    (
        spark(trigger={"every": "1 s"}),
        "pipeline.trigger.every",
        ["is not a field of a trigger", "processing_time, available_now"],
        True,
    ),
    (
        spark(trigger={"processing_time": "1 s", "available_now": True}),
        "pipeline.trigger",
        ["choose either processing_time or available_now"],
        False,
    ),
    (spark(transform={"sql": "SELECT 1"}), "pipeline", ["transform.sql must read from the view named 'input'"], False),
    (spark(mode="batch"), "pipeline", ["the rate source is streaming-only"], False),
    (spec(state="SLEEPING"), "state", ['"SLEEPING" is not one of RUNNING, PAUSED, STOPPED'], True),
    (spec(weight=0), "weight", ["a whole number from 1 to 1000", "not 0"], True),
    (spec(weight="heavy"), "weight", ["a whole number from 1 to 1000", '"heavy"'], True),
    (spec(group="x/y"), "group", ["a name of 1-200 characters from A-Z a-z 0-9 . _ -"], True),
    ({"id": "has space", "pipeline": NOOP}, "id", ["a name of 1-200 characters"], True),
    (
        spec(colour="red"),
        "colour",
        ["is not a field of a task spec", "id, group, state, weight, placement, restart"],
        True,
    ),
    (
        spec(max_failures=3),
        "max_failures",
        ['replaced by restart.max_attempts: write "restart": {"max_attempts": N}'],
        True,
    ),
    (spec(placement={"pinned": "b1"}), "placement.pinned", ["a list, each text", '"b1"'], True),
    (
        spec(placement={"pin_mode": "always"}),
        "placement.pin_mode",
        ['"always" is not one of required, preferred'],
        True,
    ),
    (spec(placement={"pinned": ["no/pe"]}), "placement.pinned", ["broker id"], False),
    (spec(placement=5), "placement", ["a mapping (a placement) with the fields pinned, pin_mode, rack"], True),
    (spec(restart={"max_attempts": -1}), "restart.max_attempts", ["a whole number from 0 to 1000"], True),
    (spec(restart={"backoff_initial_s": 0}), "restart.backoff_initial_s", ["a number above 0 and at most 3600"], True),
    (
        spec(restart={"backoff_initial_s": 60, "backoff_max_s": 30}),
        "restart",
        ["backoff_initial_s 60 is above backoff_max_s 30"],
        False,
    ),
    (
        spec(restart={"attempts": 3}),
        "restart.attempts",
        ["is not a field of a restart policy", "max_attempts, backoff_initial_s, backoff_max_s"],
        True,
    ),
    (spec(restart_nonce=-1), "restart_nonce", ["a whole number at least 0"], True),
    (spark(isolation="thread"), "pipeline.isolation", ['"thread" is not one of shared, process'], True),
    (spark(driver_memory="1g"), "pipeline", ['driver_memory applies to isolation "process" only'], False),
    (spark(isolation="process", driver_memory="256m"), "pipeline", ["driver_memory '256m' is out of bounds"], False),
    (spark(isolation="process", driver_memory="1t"), "pipeline.driver_memory", ["must be text matching"], True),
    (spark(isolation="process", driver_memory=512), "pipeline.driver_memory", ["must be text", "not 512"], True),
    (spec(version=1), "version", [f"unsupported version 1: this release writes version {SPEC_VERSION}"], True),
]


@pytest.mark.parametrize("obj, field, words, _schema", MALFORMED, ids=[f"{i}-{m[1]}" for i, m in enumerate(MALFORMED)])
def test_every_refusal_names_the_task_the_field_and_what_is_allowed(obj, field, words, _schema):
    message = refusal(obj)
    task = obj.get("id")
    prefix = f"task {task!r}: " if isinstance(task, str) else "spec: "
    assert message.startswith(prefix), message
    at = message.find(field, len(prefix))
    assert at == len(prefix) or message[at - 2 : at] == "; ", f"{field!r} does not start a problem: {message}"
    for w in words:
        assert w in message[at:], f"{w!r} missing from: {message}"


def test_a_spec_without_an_id_is_named_by_its_place_in_the_file(tmp_path):
    path = tmp_path / "tasks.yaml"
    path.write_text("- id: good\n  pipeline: {kind: noop}\n- group: g\n  pipeline: {kind: noop}\n")
    with pytest.raises(SpecError, match=re.escape(f'{path}[1]: id is missing: add "id" (a name of')):
        load_specs(path)


def test_several_problems_are_listed_together_and_bounded():
    message = refusal({"id": "x1", "weight": 0, "state": "X", "a": 1, "b": 2, "c": 3, "d": 4, "pipeline": NOOP})
    assert message.count("; ") == 4 and message.endswith("(and 1 more)"), message


def test_a_spark_pipeline_may_run_in_a_driver_process_of_its_own():
    default = parse_spec({"id": "s", "pipeline": RATE_TO_CONSOLE}).pipeline
    assert isinstance(default, SparkPipeline) and default.isolation == "shared" and default.driver_memory is None
    isolated = parse_spec(
        {"id": "s", "pipeline": {**RATE_TO_CONSOLE, "isolation": "process", "driver_memory": "2G"}}
    ).pipeline
    assert isinstance(isolated, SparkPipeline) and (isolated.isolation, isolated.driver_memory) == ("process", "2G")
    assert isinstance(
        parse_spec({"id": "s", "pipeline": {**RATE_TO_CONSOLE, "isolation": "process"}}).pipeline, SparkPipeline
    )


def test_isolation_left_at_its_default_is_not_stored_so_earlier_releases_read_the_spec_unchanged():
    shared = parse_spec({"id": "s", "pipeline": RATE_TO_CONSOLE})
    assert b"isolation" not in shared.encode() and b"driver_memory" not in shared.encode()
    isolated = parse_spec({"id": "s", "pipeline": {**RATE_TO_CONSOLE, "isolation": "process", "driver_memory": "1g"}})
    data = isolated.encode()
    assert b'"isolation":"process"' in data and b'"driver_memory":"1g"' in data
    assert decode_task(data, "/zkc/tasks/s") == isolated
    assert decode_task(shared.encode(), "/zkc/tasks/s") == shared


# ---- stored specs: older versions decode as they meant -------------------------------------------------
def stored(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj).encode()


def test_a_version_1_znode_without_a_pipeline_still_decodes_as_a_noop_task():
    spec = decode_task(
        stored({"version": 1, "id": "old", "group": "g", "state": "PAUSED", "weight": 3}), "/zkc/tasks/old"
    )
    assert spec.pipeline == NoopPipeline(kind="noop") and (spec.group, spec.state, spec.weight) == ("g", "PAUSED", 3)
    assert spec.version == SPEC_VERSION and spec.restart == RestartPolicy()
    again = decode_task(spec.encode(), "/zkc/tasks/old")  # written back: version 2, the same meaning
    assert again == spec and json.loads(spec.encode())["version"] == SPEC_VERSION


def test_a_version_1_max_failures_becomes_the_restart_policys_attempts():
    old = {
        "version": 1,
        "id": "old",
        "max_failures": 2,
        "restart_nonce": 4,
        "pipeline": {"kind": "noop", "fail_after_s": 1.0},
    }
    spec = decode_task(stored(old), "/zkc/tasks/old")
    assert spec.restart == RestartPolicy(max_attempts=2) and spec.restart_nonce == 4
    assert spec.pipeline == NoopPipeline(kind="noop", fail_after_s=1.0)


@pytest.mark.parametrize(
    "obj, reason",
    [
        ({"version": 2, "id": "t"}, "pipeline is missing"),  # only version 1 meant "no-op"
        ({"version": 2, "id": "t", "pipeline": NOOP, "max_failures": 1}, "max_failures"),
        ({"version": 1, "id": "t", "restart": {"max_attempts": 1}}, "version 1 spec has no 'restart'"),
        ({"version": 1, "id": "t", "max_failures": -1}, "restart.max_attempts"),
        ({"version": 3, "id": "t", "pipeline": NOOP}, "unsupported version 3"),
        ({"version": True, "id": "t", "pipeline": NOOP}, "unsupported version True"),
        ({"version": "1", "id": "t"}, "unsupported version '1'"),
    ],
)
def test_stored_specs_that_no_version_allows_are_payload_errors(obj, reason):
    with pytest.raises(PayloadError, match=re.escape(reason)):
        decode_task(stored(obj), "/zkc/tasks/t")


# ---- the restart policy -------------------------------------------------------------------------------
def test_backoff_doubles_from_the_initial_wait_up_to_the_maximum():
    policy = RestartPolicy(max_attempts=6, backoff_initial_s=0.5, backoff_max_s=5.0)
    assert [policy.delay_before(k) for k in range(1, 7)] == [0.5, 1.0, 2.0, 4.0, 5.0, 5.0]
    assert [policy.gives_up(f) for f in range(0, 8)] == [False] * 7 + [True]
    assert RestartPolicy(max_attempts=0).gives_up(1)
    assert RestartPolicy() == RestartPolicy(max_attempts=5, backoff_initial_s=0.5, backoff_max_s=30.0)


@given(initial=st.floats(0.001, 3600), ratio=st.floats(1.0, 100.0), attempts=st.integers(0, 1000))
def test_backoff_never_shrinks_and_stays_within_bounds(initial, ratio, attempts):
    policy = RestartPolicy(max_attempts=attempts, backoff_initial_s=initial, backoff_max_s=min(initial * ratio, 86_400))
    delays = [policy.delay_before(k) for k in range(1, attempts + 2)]
    assert delays[0] == pytest.approx(initial)
    assert all(a <= b for a, b in zip(delays, delays[1:]))
    assert all(initial - 1e-9 <= d <= policy.backoff_max_s for d in delays)
    assert not policy.gives_up(attempts) and policy.gives_up(attempts + 1)


# ---- the JSON Schema ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def validator() -> jsonschema.protocols.Validator:
    schema = task_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def documented_specs() -> list[tuple[str, Any]]:
    """Every YAML spec example of the README and docs/pipelines.md (blocks that start with ``- id:``)."""
    found = []
    for doc in (REPO / "README.md", REPO / "docs" / "pipelines.md"):
        for i, block in enumerate(re.findall(r"```yaml\n(.*?)```", doc.read_text(), re.S)):
            if block.lstrip().startswith("- id:"):
                found.append((f"{doc.name}#{i}", yaml.safe_load(block)))
    return found


DOCUMENTED = documented_specs()


def test_the_documentation_has_examples_of_every_kind():
    kinds = {s["pipeline"].get("kind", "spark") for _, doc in DOCUMENTED for s in doc}
    assert kinds == set(PIPELINE_KINDS), kinds


@pytest.mark.parametrize("name, doc", DOCUMENTED, ids=[d[0] for d in DOCUMENTED])
def test_the_documented_examples_are_valid_for_the_schema_and_the_models(name, doc, validator):
    validator.validate(doc)
    assert [parse_spec(s).id for s in doc] == [s["id"] for s in doc]
    for s in doc:  # one spec alone, with "$schema" as an editor writes it, too
        validator.validate({"$schema": "https://example.org/task-spec.schema.json", **s})


@pytest.mark.parametrize(
    "obj", [m[0] for m in MALFORMED if m[3]], ids=[f"{i}-{m[1]}" for i, m in enumerate(MALFORMED) if m[3]]
)
def test_the_schema_refuses_what_the_models_refuse(obj, validator):
    assert not validator.is_valid(obj) and not validator.is_valid([obj])


def test_the_schema_accepts_what_the_models_accept(validator):
    for obj in (
        {"id": "x1", "pipeline": RATE_TO_CONSOLE},
        {"id": "x1", "pipeline": NOOP, "restart": {"max_attempts": 0}},
        [{"id": "a", "pipeline": NOOP}, {"id": "b", "pipeline": {"kind": "declarative", "project": "/p"}}],
    ):
        validator.validate(obj)
        for s in obj if isinstance(obj, list) else [obj]:
            parse_spec(s)


def test_every_field_of_the_schema_says_what_it_is():
    defs = task_schema()["$defs"]
    undescribed = [
        f"{name}.{field}"
        for name, model in defs.items()
        for field, prop in model.get("properties", {}).items()
        if not prop.get("description")
        and not defs.get(str(prop.get("$ref", "")).rsplit("/", 1)[-1], {}).get("description")
    ]
    assert undescribed == []
    assert all(model.get("title") and model.get("description") for model in defs.values()), (
        "every model titled and described"
    )
