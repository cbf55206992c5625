"""The controller's cluster summary against a real ZooKeeper and a real controller: it matches the full read
after creates, pauses and deletes; ``status`` from it reads as many znodes at 1,800 tasks as at 300 (counted as
test_admin_scale counts them); without a controller ``status`` reads every task and says why."""

from __future__ import annotations

import time

from controller.admin import AdminClient
from controller.protocol.cluster.layout import ZkLayout
from controller.protocol.records import admin_records, codecs
from tests.integration.admin.test_admin_scale import ReadCounter, _specs


def _counts(st) -> dict:
    t = st.tasks
    return {k: t[k] for k in ("total", "by_state", "invalid", "unowned")}


def _until_summary_matches(admin: AdminClient, timeout: float = 20.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        summary, full = admin.status(), admin.status(full=True)
        if summary.source == "summary" and _counts(summary) == _counts(full):
            return _counts(full)
        assert time.monotonic() < deadline, (summary.source, summary.fallback, _counts(summary), _counts(full))
        time.sleep(0.3)


def test_the_summary_matches_the_full_read_and_status_reads_no_task(cluster, zk, layout: ZkLayout):
    admin = AdminClient(zk, layout)
    ctl = cluster.controller("ctl")
    assert ctl.wait_active(30)
    admin.create_tasks(_specs([f"a{i:04d}" for i in range(200)]) + _specs([f"b{i:04d}" for i in range(100)], "b"))
    counts = _until_summary_matches(admin)
    assert counts["total"] == 300 and counts["by_state"] == {"RUNNING": 300}

    for t in ("a0000", "a0001", "b0000"):
        admin.pause(t)
    admin.stop("b0002")
    for t in ("a0002", "b0001"):
        admin.delete_task(t)
    counts = _until_summary_matches(admin)
    assert counts["total"] == 298 and counts["by_state"] == {"PAUSED": 3, "RUNNING": 294, "STOPPED": 1}
    st = admin.status()
    assert st.tasks["by_group"]["b"] == {"group": "b", "running": 97, "paused": 1, "stopped": 1, "assigned": 0}
    assert 0 <= st.summary_age < 5 and st.fallback is None
    stored = codecs.decode(admin_records.ClusterSummary, zk.get(layout.cluster_summary)[0])
    assert stored.epoch == ctl.epoch

    counter = ReadCounter(zk)
    with counter.counting() as small:
        assert admin.status().source == "summary"
    for lo in range(300, 1800, 500):
        admin.create_tasks(_specs([f"c{i:05d}" for i in range(lo, lo + 500)]))
    assert _until_summary_matches(admin)["total"] == 1798
    with counter.counting() as big:
        assert admin.status().source == "summary"
    print("status reads at 300 tasks", dict(small), "at 1,800", dict(big))
    assert big == small and sum(big.values()) < 20, (small, big)

    # no controller: the full read, saying why
    ctl.stop()
    st = admin.status()
    assert st.source == "full" and st.fallback == "no active controller" and st.tasks["total"] == 1798
