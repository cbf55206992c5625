"""The ControllerEventThread on its own (no ZooKeeper): one event at a time, in arrival order, measured
per event type, stopped by Shutdown, never killed by a failing event, and a run of re-reads of single
znodes merged into one (bounded, never across another event)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import pytest

from controller.daemon.event_thread import ControllerEventThread
from controller.daemon.events import Shutdown


@dataclass(frozen=True)
class Step:
    seq: int


@dataclass(frozen=True)
class Slow:
    hold_s: float


@dataclass(frozen=True)
class Boom:
    pass


@dataclass(frozen=True)
class Gate:
    """Blocks the thread until ``release`` is set (bounded), so events can pile up behind it."""

    entered: threading.Event
    release: threading.Event


class Recorder:
    """A process step that records what it saw, on which thread, and whether two calls ever overlapped."""

    def __init__(self) -> None:
        self.seen: list[object] = []
        self.threads: set[str] = set()
        self.inside = 0
        self.max_inside = 0

    def __call__(self, event: object) -> None:
        self.inside += 1
        self.max_inside = max(self.max_inside, self.inside)
        try:
            self.threads.add(threading.current_thread().name)
            if isinstance(event, Boom):
                raise ValueError("boom")
            if isinstance(event, Slow):
                threading.Event().wait(event.hold_s)  # the work itself takes this long
            if isinstance(event, Gate):
                event.entered.set()
                assert event.release.wait(10), "gate never released"
            self.seen.append(event)
        finally:
            self.inside -= 1


@pytest.fixture
def running():
    threads: list[ControllerEventThread] = []

    def start(process, **kw) -> ControllerEventThread:
        t = ControllerEventThread(process, name=f"test-events-{len(threads)}", **kw)
        t.start()
        threads.append(t)
        return t

    yield start
    for t in threads:
        t.shutdown(timeout=10)
        assert not t.is_alive(), f"{t.name} did not stop"


def test_events_are_processed_one_at_a_time_in_arrival_order(running):
    rec = Recorder()
    t = running(rec)
    for i in range(2000):
        t.put(Step(i))
    t.shutdown(timeout=10)
    assert not t.is_alive()
    steps = [e.seq for e in rec.seen if isinstance(e, Step)]
    assert steps == list(range(2000))
    assert rec.max_inside == 1
    assert rec.threads == {t.name}
    assert isinstance(rec.seen[-1], Shutdown)


def test_concurrent_producers_keep_their_order_and_never_overlap(running):
    rec = Recorder()
    t = running(rec)
    order_lock = threading.Lock()
    arrival: list[int] = []
    barrier = threading.Barrier(20)

    def produce(k: int) -> None:
        barrier.wait(10)
        for i in range(100):
            with order_lock:  # defines one arrival order across producers
                seq = k * 1000 + i
                arrival.append(seq)
                t.put(Step(seq))

    producers = [threading.Thread(target=produce, args=(k,), name=f"test-producer-{k}") for k in range(20)]
    for p in producers:
        p.start()
    for p in producers:
        p.join(10)
    t.shutdown(timeout=10)
    assert [e.seq for e in rec.seen if isinstance(e, Step)] == arrival
    assert len(arrival) == 2000 and rec.max_inside == 1


def test_per_type_count_queue_time_and_processing_time(running):
    rec = Recorder()
    observed: list[tuple[str, float, float]] = []
    t = running(rec, observe=lambda name, q, p: observed.append((name, q, p)))
    gate = Gate(threading.Event(), threading.Event())
    t.put(gate)
    assert gate.entered.wait(5)
    for i in range(5):
        t.put(Step(i))
    t.put(Slow(0.05))
    threading.Event().wait(0.1)  # time passes while the Steps and Slow wait behind the gate
    gate.release.set()
    t.shutdown(timeout=10)

    stats = t.snapshot()
    assert stats["Step"].count == 5 and stats["Slow"].count == 1 and stats["Gate"].count == 1
    assert stats["Shutdown"].count == 1
    # queued behind the gate for at least the 0.1 s it was held
    assert stats["Step"].max_queue_time_s >= 0.09
    assert stats["Step"].queue_time_s >= 5 * 0.09
    assert stats["Slow"].max_queue_time_s >= 0.09
    # processing time is the time inside the step
    assert stats["Slow"].process_time_s >= 0.045
    assert stats["Gate"].process_time_s >= 0.09
    assert stats["Step"].process_time_s < stats["Slow"].process_time_s
    # the observer (metrics) saw the same events, with the same type names
    assert [name for name, _, _ in observed] == ["Gate"] + ["Step"] * 5 + ["Slow", "Shutdown"]
    assert all(q >= 0 and p >= 0 for _, q, p in observed)


def test_a_failing_event_does_not_kill_the_thread(running):
    rec = Recorder()
    t = running(rec)
    t.put(Step(1))
    t.put(Boom())
    t.put(Step(2))
    t.put(Boom())
    t.put(Step(3))
    t.shutdown(timeout=10)
    assert [e.seq for e in rec.seen if isinstance(e, Step)] == [1, 2, 3]
    stats = t.snapshot()
    assert stats["Boom"].count == 2 and stats["Boom"].errors == 2
    assert stats["Step"].errors == 0


def test_shutdown_stops_the_thread_and_later_events_are_not_processed(running):
    rec = Recorder()
    t = running(rec)
    t.put(Step(1))
    t.shutdown(timeout=10)
    assert not t.is_alive()
    t.put(Step(2))  # after Shutdown: queued, never processed
    assert [e.seq for e in rec.seen if isinstance(e, Step)] == [1]
    assert t.queue_size() == 1


def test_put_front_requeues_held_events_ahead_of_newer_ones(running):
    rec = Recorder()
    t = running(rec)
    gate = Gate(threading.Event(), threading.Event())
    t.put(gate)
    assert gate.entered.wait(5)
    t.put(Step(10))
    t.put(Step(11))
    t.put_front([Step(1), Step(2), Step(3)])
    gate.release.set()
    t.shutdown(timeout=10)
    assert [e.seq for e in rec.seen if isinstance(e, Step)] == [1, 2, 3, 10, 11]


def test_current_names_the_event_being_processed(running):
    rec = Recorder()
    t = running(rec)
    gate = Gate(threading.Event(), threading.Event())
    t.put(gate)
    assert gate.entered.wait(5)
    assert t.current == "Gate"
    gate.release.set()
    deadline = time.monotonic() + 5
    while t.current is not None and time.monotonic() < deadline:
        threading.Event().wait(0.01)
    assert t.current is None


def test_coalesce_merges_held_rereads_and_keeps_everything_else_in_order():
    from controller.daemon import events as ev

    held = [
        ev.Suspended(),
        ev.TaskConfigChange(3, "t1"),
        ev.BrokerModification(3, "b1"),
        Step(1),
        ev.TaskConfigChange(3, "t2"),
        ev.MemberChange(3, "g", "m1"),
        ev.TaskChange(3),
        ev.TaskConfigChange(3, "t1"),
        ev.MemberChange(3, "g", "m2"),
        ev.MemberChange(3, "h", "m1"),
        ev.TaskChange(3),
        Step(2),
        ev.BrokerModification(3, "b2"),
        ev.TaskConfigChange(2, "t9"),  # an older activation's: merged separately (and dropped when processed)
    ]
    assert ev.coalesce(held) == [
        ev.Suspended(),
        ev.TaskConfigChanges(3, ("t1", "t2")),
        ev.BrokerModifications(3, ("b1", "b2")),
        Step(1),
        ev.MemberChanges(3, "g", ("m1", "m2")),
        ev.TaskChange(3),
        ev.MemberChanges(3, "h", ("m1",)),
        Step(2),
        ev.TaskConfigChanges(2, ("t9",)),
    ]
    assert ev.coalesce([]) == []
    assert ev.coalesce([Step(1), Step(1)]) == [Step(1), Step(1)]  # not a re-read: never merged


# ---- live coalescing: a run of re-reads of single znodes waiting one behind another is one event -----


def _blocked(running, **kw):
    """A started thread held inside a Gate, so that events pile up behind it; returns (thread, rec, gate)."""
    rec = Recorder()
    t = running(rec, **kw)
    gate = Gate(threading.Event(), threading.Event())
    t.put(gate)
    assert gate.entered.wait(5)
    return t, rec, gate


def test_a_run_of_task_config_changes_is_processed_as_one_plural_event(running):
    from controller.daemon import events as ev

    t, rec, gate = _blocked(running)
    for i in range(50):
        t.put(ev.TaskConfigChange(7, f"t{i}"))
    t.put(ev.TaskConfigChange(7, "t3"))  # a second firing for the same task: read once
    gate.release.set()
    t.shutdown(timeout=10)
    assert rec.seen[1:] == [ev.TaskConfigChanges(7, tuple(f"t{i}" for i in range(50))), ev.Shutdown()]
    assert rec.max_inside == 1


def test_runs_stop_at_other_kinds_tokens_and_groups_and_keep_the_order(running):
    from controller.daemon import events as ev

    t, rec, gate = _blocked(running)
    queued = [
        ev.TaskConfigChange(3, "t1"),
        ev.TaskConfigChange(3, "t2"),
        ev.TaskChange(3),  # not a per-znode re-read: a wall
        ev.TaskConfigChange(3, "t3"),
        ev.TaskConfigChange(4, "t4"),  # another token (a new activation)
        ev.MemberChange(4, "g", "m1"),
        ev.MemberChange(4, "g", "m2"),
        ev.MemberChange(4, "h", "m1"),  # another group
        ev.MemberChange(4, "g", "m3"),  # g again, but not contiguous
        ev.BrokerModification(4, "b1"),
        ev.BrokerModifications(4, ("b2", "b3")),
        ev.BrokerModification(4, "b1"),
        Step(1),
        ev.BrokerModification(4, "b4"),
    ]
    for e in queued:
        t.put(e)
    gate.release.set()
    t.shutdown(timeout=10)
    assert rec.seen[1:] == [
        ev.TaskConfigChanges(3, ("t1", "t2")),
        ev.TaskChange(3),
        ev.TaskConfigChange(3, "t3"),  # alone: processed as itself
        ev.TaskConfigChange(4, "t4"),
        ev.MemberChanges(4, "g", ("m1", "m2")),
        ev.MemberChange(4, "h", "m1"),
        ev.MemberChange(4, "g", "m3"),
        ev.BrokerModifications(4, ("b1", "b2", "b3")),
        Step(1),
        ev.BrokerModification(4, "b4"),
        ev.Shutdown(),
    ]


def test_a_merged_event_holds_at_most_max_merge_ids(running):
    from controller.daemon import events as ev

    t, rec, gate = _blocked(running, max_merge=100)
    for i in range(250):
        t.put(ev.MemberChange(1, "g", f"m{i:03d}"))
    t.put(ev.MemberChanges(1, "g", tuple(f"x{i}" for i in range(60))))  # 50 + 60 would pass the bound
    t.put(ev.MemberChanges(1, "g", tuple(f"y{i}" for i in range(150))))  # over it alone: taken as it is
    t.put(ev.MemberChange(1, "g", "z"))
    gate.release.set()
    t.shutdown(timeout=10)
    ids = [ev.merge_key(e)[1] for e in rec.seen[1:-1]]
    assert [len(i) for i in ids] == [100, 100, 50, 60, 150, 1]
    assert isinstance(rec.seen[-2], ev.MemberChange)  # a lone one is processed as itself
    assert [m for i in ids for m in i] == (
        [f"m{i:03d}" for i in range(250)] + [f"x{i}" for i in range(60)] + [f"y{i}" for i in range(150)] + ["z"]
    )
    with pytest.raises(ValueError):
        ControllerEventThread(Recorder(), name="test-events-bad", max_merge=0)


def test_max_merge_1_processes_every_event_alone(running):
    from controller.daemon import events as ev

    t, rec, gate = _blocked(running, max_merge=1)
    for i in range(5):
        t.put(ev.TaskConfigChange(1, f"t{i}"))
    gate.release.set()
    t.shutdown(timeout=10)
    assert rec.seen[1:-1] == [ev.TaskConfigChange(1, f"t{i}") for i in range(5)]


def test_merged_events_count_once_with_the_oldest_queue_time_and_the_raw_ones_as_merged(running):
    from controller.daemon import events as ev

    observed: list[tuple[str, float, float]] = []
    merged: list[tuple[str, int]] = []
    t, rec, gate = _blocked(
        running, observe=lambda n, q, p: observed.append((n, q, p)), on_merge=lambda n, k: merged.append((n, k))
    )
    t.put(ev.TaskConfigChange(1, "t0"))
    threading.Event().wait(0.15)  # the oldest of the run waits longest
    for i in range(1, 10):
        t.put(ev.TaskConfigChange(1, f"t{i}"))
    t.put(ev.TaskConfigChanges(1, ("u1", "u2")))
    t.put(Step(1))
    t.put(ev.TaskConfigChange(1, "alone"))
    gate.release.set()
    t.shutdown(timeout=10)

    stats = t.snapshot()
    assert stats["TaskConfigChanges"].count == 1 and stats["TaskConfigChanges"].merged == 1
    assert stats["TaskConfigChange"].count == 1 and stats["TaskConfigChange"].merged == 10
    assert stats["TaskConfigChanges"].max_queue_time_s >= 0.14  # the queue time of t0, not of the newest
    assert [n for n, _, _ in observed] == ["Gate", "TaskConfigChanges", "Step", "TaskConfigChange", "Shutdown"]
    assert sorted(merged) == [("TaskConfigChange", 10), ("TaskConfigChanges", 1)]
    assert stats["Step"].merged == 0 and stats["Gate"].merged == 0


def test_put_front_events_merge_with_the_run_they_join_and_shutdown_still_stops(running):
    from controller.daemon import events as ev

    t, rec, gate = _blocked(running)
    t.put(ev.TaskConfigChange(2, "new"))
    t.put(ev.Shutdown())
    t.put(ev.TaskConfigChange(2, "after-shutdown"))
    t.put_front([ev.TaskConfigChanges(2, ("held1", "held2")), Step(1), ev.TaskConfigChange(2, "held3")])
    gate.release.set()
    t.join(10)
    assert not t.is_alive()
    assert rec.seen[1:] == [
        ev.TaskConfigChanges(2, ("held1", "held2")),
        Step(1),
        ev.TaskConfigChanges(2, ("held3", "new")),
        ev.Shutdown(),
    ]
    assert t.queue_size() == 1  # behind Shutdown: never taken, never merged


def test_coalesce_merges_plural_events_too():
    from controller.daemon import events as ev

    assert ev.coalesce(
        [ev.TaskConfigChanges(1, ("a", "b")), ev.TaskConfigChange(1, "c"), ev.TaskConfigChanges(1, ("b", "d"))]
    ) == [ev.TaskConfigChanges(1, ("a", "b", "c", "d"))]
    assert ev.merge_key(ev.MemberChange(1, "g", "m")) == ((ev.MemberChanges, 1, "g"), ("m",))
    assert ev.merge_key(ev.TaskChange(1)) is None and ev.merge_key(Step(1)) is None
