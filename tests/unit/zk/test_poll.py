"""``poll_select``, the ``select`` of the handler every client of ours uses (controller/zk/poll.py): it keeps
``select.select``'s contract, checked on a local socket pair (that clients use it: tests/integration/zk/test_zkpoll.py)."""

from __future__ import annotations

import socket
import time

import pytest

from controller.zk.poll import poll_select


@pytest.fixture
def pair():
    a, b = socket.socketpair()
    yield a, b
    a.close()
    b.close()


def test_nothing_ready_waits_for_the_timeout_and_reports_nothing(pair):
    a, _ = pair
    t0 = time.monotonic()
    assert poll_select([a], [], [], 0.05) == ([], [], [])
    assert time.monotonic() - t0 >= 0.045
    assert poll_select([a], [], [], 0) == ([], [], [])  # a zero timeout only looks


def test_readable_and_writable_objects_come_back_as_given(pair):
    a, b = pair
    assert poll_select([a], [b], [a], 1.0) == ([], [b], [])  # xlist is never reported (as in kazoo's own)
    b.sendall(b"x")
    r, w, x = poll_select([a, b], [a], [], 1.0)
    assert r == [a] and w == [a] and x == []
    assert poll_select([a.fileno()], [], [], 1.0)[0] == [a.fileno()]  # descriptors work as well as objects


def test_a_closed_peer_counts_as_readable_so_the_read_finds_out(pair):
    a, b = pair
    b.close()
    r, _, _ = poll_select([a], [], [], 1.0)
    assert r == [a] and a.recv(1) == b""


def test_bad_arguments_are_refused(pair):
    a, _ = pair
    with pytest.raises(ValueError):
        poll_select([a], [], [], -1)
    a.close()
    with pytest.raises(ValueError):
        poll_select([a], [], [], 0)  # a closed socket's descriptor is -1
