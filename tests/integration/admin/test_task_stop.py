"""STOPPED, offsets and resets against a real ZooKeeper, controller and no-op worker in this process: the stop is
confirmed from the owner znodes and the group's state and assignments (never from a report), a reset is refused
until then, recorded in the task's history, and holds a resume off while it runs. The checkpoints here are
written in Spark's format by the test (a no-op worker runs a spark spec as simulated work); the same with
real Spark: tests/e2e/test_spark_offsets.py."""

from __future__ import annotations

import time

import pytest
from kazoo.exceptions import NoNodeError

from broker_sim.worker import Worker, WorkerConfig
from controller.admin import AdminClient, AdminError, Conflict, payload_decoder, wait_for
from controller.daemon import Controller, ControllerConfig
from controller.protocol.errors import ZkcError
from controller.protocol.group.vocabulary import GroupConfig
from controller.protocol.records import admin_records, codecs, group_messages, task_records
from controller.protocol.tasks.checkpoints import CheckpointError
from controller.protocol.tasks.spec import parse_spec
from controller.protocol.tasks.storage import ResetTarget
from tests.offsets_support import fake_checkpoint, spark_spec


@pytest.fixture(params=["cooperative"])
def cluster(request, zk, zk_settings, layout, tmp_path):
    """A controller and one no-op worker speaking ``request.param`` (cooperative, or reconcile where asked)."""
    ctl = Controller(ControllerConfig("ctl", zk_settings, GroupConfig(rebalance_timeout_s=5.0))).start()
    worker = None
    try:
        assert ctl.wait_active(15)
        config = WorkerConfig(
            "b0",
            zk_settings,
            status_interval_s=0.1,
            on_halt="kill",
            protocols=(request.param,),
            checkpoint_root=str(tmp_path / "ck"),
        )
        worker = Worker(config).start()
        yield AdminClient(zk, layout), worker, ctl
    finally:
        if worker is not None:
            worker.stop()
        ctl.stop()


def owned(zk, layout, task_id: str) -> bool:
    return zk.exists(layout.task_owner(task_id)) is not None


@pytest.mark.parametrize("cluster", ["cooperative", "reconcile"], indirect=True)
def test_stop_is_confirmed_from_zookeeper_and_recorded(cluster, zk, layout, tmp_path):
    admin, worker, _ctl = cluster
    admin.create_tasks([spark_spec("s1", tmp_path)])
    assert wait_for(lambda: owned(zk, layout, "s1"), 30)
    running = admin.stop_state("s1")
    assert not running.confirmed and running.waiting_for == "the task is RUNNING, not STOPPED"
    with pytest.raises(Conflict, match="must be STOPPED"):
        admin.reset_offsets("s1", ResetTarget(earliest=True))

    res = admin.stop("s1", wait=30)
    assert res.changed and res.confirmed and res.state == "STOPPED"
    assert not owned(zk, layout, "s1")
    assert not [i for i in worker.open_intervals() if i.task_id == "s1"]  # its run has ended
    assert admin.stop("s1").changed is False  # already STOPPED: nothing new recorded
    d = admin.describe_task("s1")
    assert [(e.action, e.detail) for e in d.history] == [("stop", "was RUNNING")]
    path = layout.task_history("s1")
    assert payload_decoder(layout, path)(zk.get(path)[0], path).events == d.history  # `zkctl zk get` decodes it
    assert d.checkpoint is not None and d.checkpoint.exists is False

    # the confirmation rests on the owner znode: one left behind (a worker that has not let go) holds it off
    zk.create(layout.task_owner("s1"), codecs.encode(task_records.OwnerInfo("b9", 1)), ephemeral=True)
    assert admin.stop_state("s1").waiting_for == "its owner b9 to let it go"
    zk.delete(layout.task_owner("s1"))
    assert admin.stop_state("s1").confirmed

    assert admin.resume("s1").state == "RUNNING"
    assert wait_for(lambda: owned(zk, layout, "s1"), 30)
    assert [e.action for e in admin.history("s1").events] == ["stop", "resume"]


@pytest.mark.parametrize("cluster", ["cooperative", "reconcile"], indirect=True)
def test_no_confirmation_until_the_coordinator_has_seen_the_stop(cluster, zk, zk_settings, layout, tmp_path):
    admin, _worker, ctl = cluster
    # pinned to a broker that does not exist: never placed, never owned, yet its group has a member
    admin.create_tasks([spark_spec("s2", tmp_path, placement={"pinned": ["ghost"], "pin_mode": "required"})])
    assert wait_for(lambda: zk.exists(layout.group_state("default")) is not None, 30)
    ctl.stop()  # nobody to take the stop in
    res = admin.stop("s2", wait=0.5)
    assert not res.confirmed and res.waiting_for == "group default's coordinator to take the stop in"
    with pytest.raises(Conflict, match="coordinator to take the stop in"):
        admin.reset_offsets("s2", ResetTarget(earliest=True))
    ctl2 = Controller(ControllerConfig("ctl2", zk_settings, GroupConfig(rebalance_timeout_s=5.0))).start()
    try:
        assert admin.stop("s2", wait=30).confirmed
    finally:
        ctl2.stop()


def test_offsets_and_resets_of_a_checkpoint(cluster, zk, layout, tmp_path):
    admin, _worker, _ctl = cluster
    admin.create_tasks([spark_spec("s3", tmp_path)])
    ck = tmp_path / "ck" / "s3"
    fake_checkpoint(ck, tmp_path)
    v = admin.offsets("s3")
    assert (v.exists, v.last_committed, v.last_planned, v.earliest, v.sink_last_batch) == (True, 2, 2, 0, 2)
    assert v.query_id == "6f6c7cdd-f20a-4e0c-9354-73ab75187bc8" and v.committed_at == 1_700_000_000.002
    (src,) = v.sources
    assert (src.kind, src.offset, src.files_in_batch, src.files_taken, src.files_pending) == (
        "files",
        {"logOffset": 2},
        1,
        3,
        1,
    )
    assert src.files == ((tmp_path / "in" / "f2.json").absolute().as_uri(),)
    assert admin.describe_task("s3").checkpoint.files == 10  # metadata and three batches of three logs

    assert admin.stop("s3", wait=30).confirmed
    with pytest.raises(
        CheckpointError, match=r"batch 7 is not a committed batch still in the checkpoint \(kept: 0 to 2\)"
    ):
        admin.reset_offsets("s3", ResetTarget(batch=7))
    before = sorted(p.name for p in ck.rglob("*"))
    dry = admin.reset_offsets("s3", ResetTarget(batch=0), dry_run=True)
    assert dry.sink_batches_removed == (1, 2) and dry.sink_files_removed == 2
    assert sorted(p.name for p in ck.rglob("*")) == before  # a dry run changes nothing
    assert admin.history("s3").events[-1].action == "stop"

    r = admin.reset_offsets("s3", ResetTarget(batch=0))
    assert r.position == 0 and r.sink_files_removed == 2
    assert sorted(p.name for p in (ck / "offsets").iterdir()) == ["0"]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["_spark_metadata", "part-0.parquet"]
    assert sorted(p.name for p in (tmp_path / "out" / "_spark_metadata").iterdir()) == [".0.crc", "0"]
    assert admin.offsets("s3").sources[0].files_pending == 3  # f1, f2 and f3 wait for the next start
    assert admin.history("s3").events[-1].detail == (
        "to batch 0: position 0 (broker b0), sink batches 1-2 removed (2 files)"
    )

    r = admin.reset_offsets("s3", ResetTarget(latest=True))
    assert r.position == 1
    v = admin.offsets("s3")
    assert (v.last_committed, v.sources[0].files_pending, v.sources[0].files_in_batch) == (1, 0, 3)

    r = admin.reset_offsets("s3", ResetTarget(earliest=True))
    assert r.position == -1 and not ck.exists()
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == []  # every committed file and the log
    assert [e.detail.split(":")[0] for e in admin.history("s3").events] == [
        "was RUNNING",
        "to batch 0",
        "to latest",
        "to earliest",
    ]
    assert admin.history("s3").resetting is None


def test_garbage_in_the_checkpoint_is_a_clear_error_and_changes_nothing(cluster, tmp_path):
    admin, _worker, _ctl = cluster
    admin.create_tasks([spark_spec("s4", tmp_path)])
    ck = tmp_path / "ck" / "s4"
    fake_checkpoint(ck, tmp_path)
    (ck / "offsets" / "2").write_bytes(b"v1\n{truncat")
    with pytest.raises(CheckpointError, match=r"offsets/2: 1 line\(s\) after the version"):
        admin.offsets("s4")
    assert admin.stop("s4", wait=30).confirmed
    (ck / "offsets" / "2").write_bytes(b"\x00\x01garbage")
    with pytest.raises(CheckpointError, match="offsets/2: log version"):
        admin.reset_offsets("s4", ResetTarget(latest=True))
    assert (ck / "offsets" / "2").read_bytes() == b"\x00\x01garbage" and (ck / "commits" / "2").exists()
    assert [e.action for e in admin.history("s4").events] == ["stop"]  # nothing recorded: nothing done
    for bad in ("../s4", "..", "s4/../../etc", ""):  # an id is one path segment, checked before any read
        for call in (admin.offsets, admin.purge_checkpoint, admin.checkpoint_size, admin.stop):
            with pytest.raises(ZkcError, match="invalid task id"):
                call(bad)
        with pytest.raises(ZkcError, match="invalid task id"):
            admin.reset_offsets(bad, ResetTarget(earliest=True))
    with pytest.raises(Conflict, match="not a streaming spark pipeline"):
        admin.create_tasks([parse_spec({"id": "n1", "pipeline": {"kind": "noop"}})])
        admin.offsets("n1")


def test_a_resume_waits_for_a_reset_in_flight_and_a_delete_takes_the_history(cluster, zk, layout, tmp_path):
    admin, _worker, _ctl = cluster
    admin.create_tasks([spark_spec("s5", tmp_path)])
    fake_checkpoint(tmp_path / "ck" / "s5", tmp_path)
    assert admin.stop("s5", wait=30).confirmed
    hist = admin.history("s5")
    zk.set(layout.task_history("s5"), codecs.encode(admin_records.TaskHistory(hist.events, resetting=time.time())))
    with pytest.raises(Conflict, match="a reset of its offsets began at"):
        admin.resume("s5")
    stale = time.time() - admin_records.RESET_LEASE_S - 1  # a reset that died long ago no longer holds it
    zk.set(layout.task_history("s5"), codecs.encode(admin_records.TaskHistory(hist.events, resetting=stale)))
    assert admin.resume("s5").state == "RUNNING"

    with pytest.raises(AdminError, match="--purge-checkpoint needs --wait"):
        admin.delete_task("s5", purge_checkpoint=True)
    req = admin.delete_task("s5", wait=30, purge_checkpoint=True)
    removed = f"checkpoint {tmp_path / 'ck' / 's5'} removed on broker b0 ("
    assert req.done and any(n.startswith(removed) for n in req.notes), req.notes
    assert not (tmp_path / "ck" / "s5").exists()
    with pytest.raises(NoNodeError):
        zk.get(layout.task_history("s5"))  # deleted with the task, in the controller's multi


def test_a_task_never_runnable_is_confirmed_through_its_coordinator(cluster, zk, layout, tmp_path):
    """PAUSED (or created STOPPED) to STOPPED changes nothing the coordinator schedules, so it writes nothing of
    its own: the stop asks it for a rebalance of the group, whose state write, after the stop, confirms it."""
    admin, _worker, _ctl = cluster
    admin.create_tasks([spark_spec("p1", tmp_path, state="PAUSED"), spark_spec("p2", tmp_path, state="STOPPED")])
    assert wait_for(lambda: zk.exists(layout.group_state("default")) is not None, 30)
    assert admin.stop("p1", wait=30).confirmed
    assert admin.stop("p2", wait=30).confirmed


def test_a_ghost_member_does_not_hold_a_stop_up(cluster, zk, layout, tmp_path):
    """A member znode with no broker behind it (anyone may write one) is never given work: a group whose only
    members are such ghosts confirms a stop on the owner znode alone."""
    admin, _worker, _ctl = cluster
    admin.create_tasks([spark_spec("g1", tmp_path, group="lonely")])
    zk.create(layout.group_member("lonely", "ghost-1"), b"{}", ephemeral=True, makepath=True)

    def ghost_seen() -> bool:  # the coordinator has set it apart: nothing more for it to write
        try:
            return b'"member":"ghost-1"' in zk.get(layout.group_state("lonely"))[0]
        except NoNodeError:
            return False

    assert wait_for(ghost_seen, 30)
    res = admin.stop("g1", wait=10)
    assert res.confirmed


def test_a_departed_members_last_assignment_does_not_hold_a_stop_up(cluster, zk, layout, tmp_path):
    """A broker that died (killed, never started again) leaves its last assignment behind: the coordinator
    writes assignments only for the members it has. Such an assignment places nothing (no member, no broker,
    no owner znode): the stop is confirmed all the same."""
    admin, _worker, _ctl = cluster
    admin.create_tasks([spark_spec("d1", tmp_path)])
    assert wait_for(lambda: owned(zk, layout, "d1"), 30)
    assert admin.stop("d1", wait=30).confirmed
    stale = group_messages.Assignment(generation=1, controller_epoch=1, assigned=("d1",))
    zk.create(layout.group_assignment("default", "gone-1"), codecs.encode(stale), makepath=True)
    state = admin.stop_state("d1")
    assert state.confirmed, state.waiting_for
    admin.resume("d1")
    assert wait_for(lambda: owned(zk, layout, "d1"), 30)


def test_a_purge_does_not_follow_a_symbolic_link(cluster, tmp_path):
    admin, _worker, _ctl = cluster
    admin.create_tasks([spark_spec("s6", tmp_path)])
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "offsets").mkdir(parents=True)
    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / "s6").symlink_to(elsewhere)
    with pytest.raises(AdminError, match="is deleted; its checkpoint was not removed: .* symbolic link"):
        admin.delete_task("s6", wait=30, purge_checkpoint=True)
    assert (elsewhere / "offsets").is_dir()
