"""The no-op runner's prepared start: only the rest of its latency once prepared, cold for another spec or after a
discard, nothing prepared without a share."""

from __future__ import annotations

import time

import pytest

from broker_sim.runners.noop import NoopRunner
from controller.protocol.tasks.spec import NoopPipeline, TaskSpec


# ---- the no-op runner's prepared start ------------------------------------------------------------------------
def _spec(t: str, **kw) -> TaskSpec:
    return TaskSpec(id=t, pipeline=NoopPipeline(kind="noop", **kw))


def test_a_prepared_noop_start_sleeps_only_the_rest_of_its_latency():
    slept: list[float] = []
    r = NoopRunner(start_latency_s=0.4, prepare_share=0.75, sleep=slept.append)
    spec = _spec("t")
    assert r.prepare("t", spec)
    assert r.prepared() == {"t"} and r.running() == set()  # prepared is not running
    r.start("t", spec, 1)
    assert slept == pytest.approx([0.3, 0.1]), slept  # the prepare paid 3/4 of the latency, the start the rest
    assert r.prepared() == set() and list(r.warm_starts) == ["t"]


def test_a_noop_start_of_another_spec_or_after_discard_is_cold():
    r = NoopRunner(start_latency_s=0.2, prepare_share=0.9)
    assert r.prepare("t", _spec("t"))
    t0 = time.monotonic()
    r.start("t", _spec("t", complete_after_s=5.0), 1)  # its spec changed since
    assert time.monotonic() - t0 >= 0.2 and not r.warm_starts
    assert r.prepare("u", _spec("u"))
    r.discard("u")
    r.start("u", _spec("u"), 1)
    assert not r.warm_starts


def test_a_noop_runner_without_a_share_prepares_nothing_and_kill_drops_what_it_did():
    assert not NoopRunner(start_latency_s=0.1, prepare_share=0.0).prepare("t", _spec("t"))
    r = NoopRunner(prepare_share=0.5)
    assert r.prepare("t", _spec("t"))
    r.kill()
    assert r.prepared() == set()
    with pytest.raises(ValueError):
        NoopRunner(prepare_share=1.5)
