"""The cluster summary's counts and rules (``controller/protocol/tasks/summary.py``), pure."""

from __future__ import annotations

from dataclasses import replace

from controller.protocol.records import codecs
from controller.protocol.records.admin_records import ClusterSummary, GroupTaskCount
from controller.protocol.tasks.spec import NoopPipeline, TaskSpec
from controller.protocol.tasks.summary import MAX_AGE_S, REWRITE_S, SummaryPlan, summarize, trusted


def _spec(t: str, group: str = "g", state: str = "RUNNING") -> TaskSpec:
    return TaskSpec(id=t, group=group, state=state, pipeline=NoopPipeline(kind="noop"))


def test_counts_by_state_group_and_assignment():
    tasks = {t.id: t for t in (_spec("a"), _spec("b"), _spec("c", state="PAUSED"), _spec("d", "h"))}
    # "c" is paused and "gone" no longer exists: neither counts as assigned
    s = summarize(3, 100.0, tasks, {"bad": "garbage"}, {"b"}, {"g": {"w1": ("a", "c", "gone")}, "h": {"w2": ()}})
    assert s.total == 5 and s.invalid == 1 and s.deleting == 1
    assert s.by_state == {"PAUSED": 1, "RUNNING": 3}
    assert s.assigned == 1 and s.unassigned == 2 and s.by_broker == {"w1": 1, "w2": 0}
    assert s.groups == (GroupTaskCount("g", running=2, paused=1, assigned=1), GroupTaskCount("h", running=1))
    assert codecs.decode(ClusterSummary, codecs.encode(s)) == s


def test_stopped_tasks_count_apart_from_paused_and_are_never_assigned():
    tasks = {t.id: t for t in (_spec("a"), _spec("p", state="PAUSED"), _spec("s", state="STOPPED"))}
    s = summarize(3, 100.0, tasks, {}, set(), {"g": {"w1": ("a", "s")}})  # an assignment not yet revoked
    assert s.by_state == {"PAUSED": 1, "RUNNING": 1, "STOPPED": 1}
    assert s.assigned == 1 and s.unassigned == 0
    assert s.groups == (GroupTaskCount("g", running=1, paused=1, assigned=1, stopped=1),)


def test_written_when_changed_or_every_rewrite_period_and_trusted_while_fresh():
    first = summarize(3, 100.0, {"a": _spec("a")}, {}, set(), {})
    plan = SummaryPlan()
    assert plan.should_write(first)
    plan = SummaryPlan(written=first)
    assert not plan.should_write(replace(first, computed_at=101.0))
    assert plan.should_write(replace(first, computed_at=100.0 + REWRITE_S))
    assert plan.should_write(replace(first, computed_at=101.0, total=2))
    assert plan.should_write(replace(first, epoch=4))
    assert trusted(first, 3, 100.0 + MAX_AGE_S) is None
    assert "old" in (trusted(first, 3, 101.0 + MAX_AGE_S) or "")
    assert "epoch" in (trusted(first, 4, 101.0) or "")
    assert trusted(first, None, 101.0) is not None
