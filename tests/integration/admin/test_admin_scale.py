"""Admin paths proportional to what they touch, against a real ZooKeeper: a one-task create and a first page
of 50 read as many znodes at 2,000 tasks as at 200 (counted on the kazoo client's requests), and paging with
a cursor returns every task once."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from kazoo.client import KazooClient
from kazoo.protocol.serialization import Exists, GetChildren, GetChildren2, GetData, Transaction

from controller.admin import AdminClient
from controller.protocol.cluster.layout import ZkLayout
from controller.protocol.tasks.spec import NoopPipeline, TaskSpec
from controller.zk.multi_read import MultiRead


class ReadCounter:
    """Counts the znodes each request reads (a multiRead counts each of its sub-reads) and the writes, by
    wrapping the client's one door to the server (``KazooClient._call``)."""

    def __init__(self, client: KazooClient) -> None:
        self.client = client
        self.reads: Counter[str] = Counter()
        self.writes = 0

    def _call(self, request: Any, result: Any) -> Any:
        if isinstance(request, (GetData, Exists)):
            self.reads["get"] += 1
        elif isinstance(request, (GetChildren, GetChildren2)):
            self.reads["children"] += 1
        elif isinstance(request, MultiRead):
            for op_type, _path in request.ops:
                self.reads["children" if op_type == GetChildren.type else "get"] += 1
        elif isinstance(request, Transaction):
            self.writes += len(request.operations)
        return self.real(request, result)

    @contextmanager
    def counting(self) -> Iterator[Counter[str]]:
        self.reads = Counter()
        self.real = self.client._call
        self.client._call = self._call  # type: ignore[method-assign]
        try:
            yield self.reads
        finally:
            del self.client._call


def _specs(ids: list[str], group: str = "default") -> list[TaskSpec]:
    return [TaskSpec(id=t, group=group, pipeline=NoopPipeline(kind="noop")) for t in ids]


def _touch(admin: AdminClient, counter: ReadCounter, n: int) -> dict[str, int]:
    with counter.counting() as create:
        admin.create_tasks(_specs([f"probe-{n}"]))
    with counter.counting() as page:
        rows = admin.list_page(limit=50)
    assert len(rows.rows) == 50 and rows.next_cursor is not None
    return {
        "create_gets": create["get"],
        "create_lists": create["children"],
        "page_gets": page["get"],
        "page_lists": page["children"],
    }


def test_a_create_and_a_first_page_read_no_more_znodes_in_a_bigger_cluster(zk, layout: ZkLayout):
    admin = AdminClient(zk, layout)
    counter = ReadCounter(zk)
    admin.create_tasks(_specs([f"t{i:05d}" for i in range(200)]))
    small = _touch(admin, counter, 200)
    for lo in range(200, 2000, 500):
        admin.create_tasks(_specs([f"t{i:05d}" for i in range(lo, min(lo + 500, 2000))]))
    big = _touch(admin, counter, 2000)
    print("reads at 200 tasks", small, "at 2,000", big)
    for what in ("create_gets", "create_lists", "page_gets", "page_lists"):
        assert big[what] <= small[what], (
            f"{what} grows with the cluster: {small[what]} at 200 tasks, {big[what]} at 2,000"
        )
    assert big["create_gets"] < 40, big  # the tally, the new task's spec and status, the layout's containers
    assert big["page_gets"] <= 3 * 50 + 2, big  # spec, owner and status of the 50 tasks shown


def test_pages_return_every_task_once_and_filter_at_the_source(zk, layout: ZkLayout):
    admin = AdminClient(zk, layout)
    ids = [f"p{i:04d}" for i in range(300)]
    admin.create_tasks(_specs(ids[:290]) + _specs(ids[290:], group="solo"))
    seen: list[str] = []
    cursor = None
    pages = 0
    while True:
        page = admin.list_page(limit=37, cursor=cursor)
        seen += [r.task_id for r in page.rows]
        pages += 1
        assert len(page.rows) <= 37
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    assert sorted(seen) == ids and len(seen) == len(set(seen)) and pages == 9
    solo = admin.list_page(group="solo", limit=5)
    assert [r.task_id for r in solo.rows] and all(r.group == "solo" for r in solo.rows) and len(solo.rows) == 5
    rest: list[str] = [r.task_id for r in solo.rows]
    while solo.next_cursor is not None:
        solo = admin.list_page(group="solo", limit=5, cursor=solo.next_cursor)
        rest += [r.task_id for r in solo.rows]
    assert sorted(rest) == ids[290:]
    assert admin.list_page(broker="nobody", limit=10).rows == ()  # no broker owns anything here
    assert [r.task_id for r in admin.list_page(state="RUNNING", limit=300).rows] != []


def test_two_creates_cannot_both_pass_on_the_same_tally(zk, zk_settings, layout: ZkLayout):
    """The create's multi sets the tally on the version it read: a create that read the tally before another
    create wrote it writes nothing, and the retry reads the new figure."""
    from controller.protocol.records import admin_records, codecs
    from controller.zk.client import make_client

    a = AdminClient(zk, layout)
    other = make_client(zk_settings)
    try:
        b = AdminClient(other, layout)
        a.create_tasks(_specs(["first"]))
        ops = a.tasks._tally_ops(_specs(["from-a"]))  # a has read the tally
        b.create_tasks(_specs(["from-b"]))  # b writes it meanwhile
        created, clashes, failed = a.tasks._commit([ops])
        assert created == [] and not clashes and len(failed) == 1, (created, clashes, failed)
        assert zk.exists(layout.task("from-a")) is None
        a.create_tasks(_specs(["from-a"]))  # read again: passes on the new figure
        tally = codecs.decode(admin_records.GroupTally, zk.get(layout.group_tally("default"))[0], "tally")
        assert tally.tasks == 3
    finally:
        other.stop()
        other.close()


def test_a_group_without_a_tally_is_measured_from_its_specs_once(zk, layout: ZkLayout):
    """Tasks written past the admin client (a raw client, an earlier release): the first create into their
    group measures it from every spec and writes the tally; the next create reads the tally alone."""
    from controller.protocol.records import admin_records, codecs

    tx = zk.transaction()
    for spec in _specs([f"raw-{i}" for i in range(30)]):
        tx.create(layout.task(spec.id), spec.encode())
    tx.commit()
    admin = AdminClient(zk, layout)
    counter = ReadCounter(zk)
    with counter.counting() as first:
        admin.create_tasks(_specs(["after-raw"]))
    tally = codecs.decode(admin_records.GroupTally, zk.get(layout.group_tally("default"))[0], "tally")
    assert tally.tasks == 31 and tally.payload_bytes == codecs.group_payload_bytes(
        [s.descriptor() for s in _specs([f"raw-{i}" for i in range(30)] + ["after-raw"])]
    )
    with counter.counting() as second:
        admin.create_tasks(_specs(["after-tally"]))
    assert first["get"] >= 30 + second["get"], (first, second)
