"""Bad input: every znode type of ours filled with garbage by a raw kazoo client while a controller and
workers run. They log it, mark the object invalid or ignore it, and keep serving everything else:
nothing crashes, threads stay alive, the good tasks keep running on one worker each. (The decoders alone
are fuzzed in tests/unit/protocol/records/test_codecs_fuzz.py.)"""

from __future__ import annotations

import json
import time

import pytest

from broker_sim.sim.checker import close_open, double_ownership
from broker_sim.worker import Worker, WorkerConfig
from controller.admin import AdminClient, wait_for
from controller.daemon import Controller, ControllerConfig
from controller.protocol.group.vocabulary import GroupConfig
from controller.protocol.records import codecs, group_messages, payload_validation, task_records
from controller.protocol.tasks.spec import NoopPipeline, TaskSpec
from controller.zk.client import ZkSettings
from controller.zk.layout_io import list_tasks
from tests.payload_support import GARBAGE

GOOD = [f"t{i}" for i in range(6)]
HUGE = b'{"version": 1, "id": "huge", "group": "default", "x": "' + b"y" * 1_000_000 + b'"}'
BAD_TASKS = {
    "bad-json": b"{not json",
    "not-utf8": b"\xff\xfe\x00",
    "wrong-types": json.dumps({"version": 1, "id": "wrong-types", "group": 5, "weight": "heavy"}).encode(),
    "unknown-version": json.dumps({"version": 99, "id": "unknown-version"}).encode(),
    "huge": HUGE,
    "empty": b"",
    "wrong-id": TaskSpec(id="someone-else", pipeline=NoopPipeline(kind="noop")).encode(),
}


def _all_alive(ctl: Controller, workers: list[Worker]) -> bool:
    return ctl.thread.is_alive() and all(
        t.is_alive() for w in workers for t in (w.thread, w.status_thread, w.pulse_thread)
    )


def _running_once(workers: list[Worker], tasks: list[str]) -> bool:
    running = [t for w in workers for t in w.running_tasks()]
    return sorted(running) == sorted(tasks)


def _status(zk, layout, t: str):
    try:
        return codecs.decode(task_records.TaskStatus, zk.get(layout.status(t))[0], layout.status(t))
    except Exception:
        return None


def _group_state(zk, layout) -> group_messages.GroupStateInfo | None:
    """The group state, or None while it is still the garbage planted there (the new controller has not
    rewritten it yet)."""
    try:
        return codecs.decode(group_messages.GroupStateInfo, zk.get(layout.group_state("default"))[0])
    except payload_validation.PayloadError:
        return None


def test_garbage_in_every_znode_type_while_the_cluster_runs(zk, layout, zk_settings, caplog):
    caplog.set_level("WARNING")
    settings = ZkSettings(hosts=zk_settings.hosts, root=zk_settings.root, session_timeout_s=4.0)
    tx = zk.transaction()
    for t in GOOD:
        tx.create(layout.task(t), TaskSpec(id=t, pipeline=NoopPipeline(kind="noop")).encode())
    tx.commit()
    ctl = Controller(ControllerConfig("c0", settings, GroupConfig(rebalance_timeout_s=3.0))).start()
    ctls = [ctl]
    workers = [
        Worker(WorkerConfig(broker_id=f"b{i}", settings=settings, status_interval_s=0.2, on_halt="kill")).start()
        for i in range(2)
    ]
    try:
        assert ctl.wait_active(10)
        assert wait_for(lambda: _running_once(workers, GOOD) and all(w.state() == "Stable" for w in workers), 20)

        # 1. task specs: each becomes FAILED with its reason; nothing else moves
        for t, data in BAD_TASKS.items():
            zk.create(layout.task(t), data)
        assert wait_for(
            lambda: all((s := _status(zk, layout, t)) is not None and s.state == "FAILED" for t in BAD_TASKS), 10
        ), "every bad task spec is marked FAILED"
        reasons = {t: _status(zk, layout, t).error for t in BAD_TASKS}
        assert "not JSON" in reasons["bad-json"] and "over the limit" in reasons["huge"]
        assert "group" in reasons["wrong-types"] and "version" in reasons["unknown-version"]
        assert "does not match" in reasons["wrong-id"]
        # a good task's spec overwritten with garbage: FAILED too, and it stops running
        zk.set(layout.task("t5"), b"\x00garbage")
        assert wait_for(lambda: _running_once(workers, GOOD[:5]), 10)
        assert wait_for(lambda: (s := _status(zk, layout, "t5")) is not None and s.state == "FAILED", 10)
        # fixed again: it runs again
        zk.set(layout.task("t5"), TaskSpec(id="t5", pipeline=NoopPipeline(kind="noop")).encode())
        assert wait_for(lambda: _running_once(workers, GOOD), 15)

        # 2. a garbage join request from a member that does not exist: ignored, no rebalance
        assert wait_for(lambda: all(w.state() == "Stable" for w in workers), 10)
        gen = workers[0].generation
        zk.create(layout.group_member("default", "ghost"), b"\x00 not a join request", ephemeral=True)
        zk.create(layout.broker("ghost"), b"[broken", ephemeral=True)
        zk.create(
            layout.group_member("default", "ghost2"),
            json.dumps({"version": 1, "member_id": 5}).encode(),
            ephemeral=True,
        )
        time.sleep(1.5)  # give the controller time to (not) react; what is checked is that nothing changed
        assert all(w.generation == gen for w in workers) and _running_once(workers, GOOD)

        # 3. garbage assignment for b0: b0 ignores it and keeps its tasks
        mine = workers[0].running_tasks()
        for data in GARBAGE:
            zk.set(layout.group_assignment("default", "b0"), data)
        time.sleep(1.0)  # a window for a wrong change to show (nothing to wait for when all goes right)
        assert workers[0].running_tasks() == mine and _running_once(workers, GOOD)

        # 4. garbage statuses, interval logs: the workers write over them
        for t in GOOD[:3]:
            zk.set(layout.status(t), b"\xffnot a status")
        assert wait_for(
            lambda: all((s := _status(zk, layout, t)) is not None and s.state == "RUNNING" for t in GOOD[:3]), 10
        )
        zk.set(layout.broker_intervals("b0"), b"{{{") if zk.exists(layout.broker_intervals("b0")) else None

        # 5. garbage admin requests: dropped (deleted), nothing else happens
        zk.create(layout.admin_rebalance_request_prefix, b"{not json", sequence=True)
        zk.create(layout.admin_reassign_of("t0"), b"[]")
        zk.create(layout.admin_controlled_shutdown_of("ghost-broker"), b"\x00")
        zk.create(layout.admin_delete_task("no-such-task"), b"garbage")
        assert wait_for(
            lambda: (
                not zk.get_children(layout.admin_rebalance)
                and not zk.get_children(layout.admin_reassign)
                and not zk.get_children(layout.admin_controlled_shutdown)
                and not zk.get_children(layout.admin_delete_tasks)
            ),
            10,
        ), "garbage requests are dropped"
        assert _running_once(workers, GOOD)

        # 6. a garbage owner on a new task: that task waits for the owner to go, the rest keeps running
        tx = zk.transaction()
        tx.create(layout.task("t6"), TaskSpec(id="t6", pipeline=NoopPipeline(kind="noop")).encode())
        tx.create(layout.task_owner("t6"), b"\x00 squatter", ephemeral=True)
        tx.commit()
        time.sleep(1.0)  # a window for a wrong change to show (nothing to wait for when all goes right)
        assert _running_once(workers, GOOD)
        zk.delete(layout.task_owner("t6"))
        assert wait_for(lambda: _running_once(workers, GOOD + ["t6"]), 15)

        # 7. garbage group state, then a controller failover: the new controller rebuilds the group
        gen = max(w.generation for w in workers)
        zk.set(layout.group_state("default"), b"\x00\x01 garbage state")
        ctl.stop()
        ctl = Controller(ControllerConfig("c1", settings, GroupConfig(rebalance_timeout_s=3.0))).start()
        ctls.append(ctl)
        assert ctl.wait_active(10)
        assert wait_for(
            lambda: (
                _running_once(workers, GOOD + ["t6"])
                and all(w.state() == "Stable" for w in workers)
                and (s := _group_state(zk, layout)) is not None
                and s.state == "Stable"
            ),
            20,
        ), "the group is rebuilt from garbage state"
        info = codecs.decode(group_messages.GroupStateInfo, zk.get(layout.group_state("default"))[0])
        assert info.generation >= gen, "a rebuilt group does not go back in generations"

        # 8. garbage controller epoch: the active controller is fenced (its version moved) and a controller
        #    is elected again at an epoch above every earlier one
        epoch = ctl.epoch
        zk.set(layout.controller_epoch, b"not an epoch")
        AdminClient(zk, layout).rebalance(reason="after garbage epoch")  # makes the controller write
        assert wait_for(lambda: ctl.active and ctl.epoch is not None and ctl.epoch > epoch, 15), (
            "a controller is elected again after garbage in /controller_epoch"
        )
        assert codecs.decode_epoch(zk.get(layout.controller_epoch)[0]) == ctl.epoch
        assert wait_for(
            lambda: _running_once(workers, GOOD + ["t6"]) and all(w.state() == "Stable" for w in workers), 20
        )

        # nothing crashed; the checker finds no double ownership
        assert _all_alive(ctl, workers)
        intervals = close_open([i for w in workers for i in list(w.intervals) + w.open_intervals()], time.time())
        assert double_ownership(intervals) == []
        assert not [r for r in caplog.records if r.levelname == "ERROR" and "Traceback" in (r.exc_text or "")]
    finally:
        for w in workers:
            w.stop()
        for c in ctls:
            c.stop()


CLI_GAPS = [  # malformed spec files tests/integration/cli/test_cli_errors.py does not cover
    ("nonutf8.yaml", b"\xff\xfeid: a\n", "not UTF-8"),
    ("digits.json", b'{"id": "d", "weight": ' + b"9" * 5000 + b"}", "not valid JSON"),
    ("deep.yaml", b"id: a\nx: " + b"[" * 5000 + b"]" * 5000 + b"\n", "not valid YAML"),
    ("version.yaml", b"id: a\nversion: 99\n", "unsupported version 99"),
    (  # the good spec beside it is not written either
        "isolation.yaml",
        b"- id: good\n  pipeline: {kind: noop}\n"
        b"- id: iso\n  pipeline: {source: {type: rate}, sink: {type: console}, isolation: thread}\n",
        'pipeline.isolation "thread" is not one of shared, process',
    ),
    (
        "driver-memory.yaml",
        b"- id: good\n  pipeline: {kind: noop}\n"
        b"- id: iso\n  pipeline: {source: {type: rate}, sink: {type: console}, driver_memory: 4g}\n",
        'driver_memory applies to isolation "process" only',
    ),
    (
        "huge.json",
        json.dumps(
            {
                "id": "big",
                "pipeline": {
                    "kind": "spark",
                    "source": {"type": "rate"},
                    "sink": {"type": "console"},
                    "transform": {"sql": "SELECT * FROM input -- " + "x" * 1_000_000},
                },
            }
        ).encode(),
        "over",
    ),
]


@pytest.mark.parametrize("name, content, needle", CLI_GAPS, ids=[c[0] for c in CLI_GAPS])
def test_cli_refuses_more_malformed_spec_files_and_writes_nothing(
    name, content, needle, zk, zk_hosts, layout, tmp_path
):
    from click.testing import CliRunner

    from cli.main import cli

    path = tmp_path / name
    path.write_bytes(content)
    res = CliRunner().invoke(cli, ["--zk", zk_hosts, "--zk-root", layout.root, "task", "create", "-f", str(path)])
    assert res.exit_code == 1 and needle in res.output and "Traceback" not in res.output, res.output[-500:]
    assert list_tasks(zk, layout) == []
