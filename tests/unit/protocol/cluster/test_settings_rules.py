"""Pure rules behind issue "Hostile input, round 3": settings bounded where they enter and salvaged field by
field where the controller reads them; a dead session's open run ends when the session did; the API's request
guard (Host names, cross-site writes, bodies)."""

from __future__ import annotations

import json

import pytest
from starlette.datastructures import Headers

from controller.admin.interval_ends import session_ends, unflushed_ends
from controller.admin.operations import SettingsAdmin
from controller.api.guard import RequestPolicy, host_name
from controller.protocol.cluster.layout import ZkLayout
from controller.protocol.cluster.settings_rules import SettingValueError, check_setting, read_settings
from controller.protocol.records.admin_records import ClusterSettings, MoveLimits
from controller.protocol.records.task_records import RunInterval


@pytest.mark.parametrize(
    "name, value",
    [
        ("max_moves", 10**23),
        ("max_moves", 0),
        ("preferred_check_s", 1e-9),
        ("preferred_check_s", float("inf")),
        ("offline_window_s", float("nan")),
        ("max_offline_brokers", -1),
        ("max_imbalance", True),
        ("max_moves", "5"),
    ],
)
def test_out_of_bounds_values_are_refused(name, value):
    with pytest.raises(SettingValueError, match=name):
        check_setting(name, value)


def test_the_reader_keeps_the_last_good_value_of_a_refused_field_only():
    last = ClusterSettings(throttle=MoveLimits(max_moves=5), max_offline_brokers=2)
    body = {
        "version": 1,
        "throttle": {"max_moves": 10**23, "max_moves_per_broker": 3},
        "max_offline_brokers": 4,
        "preferred_check_s": 1e-9,
    }
    s, refused = read_settings(json.dumps(body).encode(), "/s", last)
    assert s.throttle == MoveLimits(max_moves=5, max_moves_per_broker=3) and s.max_offline_brokers == 4
    assert s.preferred_check_s == 60.0 and len(refused) == 2 and refused[0].startswith("max_moves")
    assert read_settings(b"garbage", "/s", last)[0] == last


def test_a_dead_sessions_open_run_ends_when_the_session_did():
    runs = [
        RunInterval("t1", "dead", 100.0),
        RunInterval("t2", "dead", 100.0),
        RunInterval("t3", "live", 100.0),
        RunInterval("t4", "back", 100.0),
    ]
    ends = session_ends(
        runs,
        registered={"dead": None, "live": 50.0, "back": 130.0},
        owners={"t1": ("other", 120.0), "t2": None, "t3": ("live", 60.0), "t4": ("back", 135.0)},
        flushed={"dead": 110.0, "back": 105.0},
    )
    assert ends == {0: 120.0, 1: 110.0, 3: 130.0}  # t3's broker is alive since before the run: still running


def test_a_live_sessions_open_run_of_a_task_it_let_go_awaits_its_end():
    """A live broker writes the end of a run to its log after it let go of the task: until then the log reads
    as if it still ran it, beside the next owner's start. Those runs are the ones a checker waits for."""
    runs = [
        RunInterval("t1", "live", 100.0, acquired=99.5),  # its owner znode: the one it took for this run
        RunInterval("t2", "live", 100.0, acquired=99.5),  # moved to another broker since
        RunInterval("t3", "live", 100.0, acquired=99.5),  # let go, nobody has it yet
        RunInterval("t4", "live", 100.0, acquired=99.5),  # let go, taken by another, and taken back since
        RunInterval("t5", "gone", 100.0),  # an ended session: session_ends closes it, nothing to wait for
        RunInterval("t6", "live", 100.0),  # a run recorded without its acquisition: its start stands for it
    ]
    pending = unflushed_ends(
        runs,
        registered={"live": 50.0, "gone": None},
        owners={
            "t1": ("live", 99.4),
            "t2": ("other", 120.0),
            "t3": None,
            "t4": ("live", 125.0),
            "t5": ("other", 120.0),
            "t6": ("live", 99.9),
        },
    )
    assert pending == [1, 2, 3]


def test_the_guard_refuses_foreign_hosts_cross_site_writes_and_non_json_bodies():
    policy = RequestPolicy(allowed_hosts=frozenset({"127.0.0.1", "localhost", "[::1]"}), token=None, max_body_bytes=100)

    def refused(method: str, **headers: str):
        got = policy.refusal(method, "/api/v1/tasks", Headers({k.replace("_", "-"): v for k, v in headers.items()}))
        return got and got[:2]

    assert host_name("[::1]:8083") == "[::1]" and host_name("Example.org:80") == "example.org"
    assert refused("GET", host="127.0.0.1:8083") is None
    assert refused("GET", host="rebound.example:8083") == (421, "host_not_allowed")
    assert refused("POST", host="127.0.0.1:1", origin="http://evil.example") == (403, "cross_site")
    assert refused("POST", host="127.0.0.1:1", sec_fetch_site="cross-site") == (403, "cross_site")
    assert refused("POST", host="127.0.0.1:1", origin="http://127.0.0.1:1", sec_fetch_site="same-origin") is None
    # an origin is scheme, host and port: a page served over https is not this http server's
    assert refused("POST", host="127.0.0.1:1", origin="https://127.0.0.1:1") == (403, "cross_site")
    assert refused("PUT", host="127.0.0.1:1", origin="null") == (403, "cross_site")
    assert refused("GET", host="127.0.0.1:1", origin="https://127.0.0.1:1") is None  # a read changes nothing
    https = policy.refusal(
        "POST", "/api/v1/tasks", Headers({"host": "127.0.0.1:1", "origin": "https://127.0.0.1:1"}), "https"
    )
    assert https is None  # behind a proxy that says the request came over https
    assert refused("POST", host="127.0.0.1:1", content_type="text/plain", content_length="2") == (
        415,
        "unsupported_media_type",
    )
    assert refused("POST", host="127.0.0.1:1", content_type="application/json", content_length="101") == (
        413,
        "too_large",
    )
    assert refused("POST", host="127.0.0.1:1", transfer_encoding="chunked") == (411, "length_required")


def test_settings_read_by_the_tools_name_the_refused_field_and_keep_the_others_as_stored():
    class Stat:
        version = 3

    class Znode:
        def get(self, _path: str) -> tuple[bytes, Stat]:
            body = {"version": 1, "throttle": {"max_moves": 0, "max_moves_per_broker": 2}, "max_offline_brokers": 4}
            return json.dumps(body).encode(), Stat()

    stored = SettingsAdmin(Znode(), ZkLayout("/r")).stored_settings()  # type: ignore[arg-type]
    assert stored.settings.throttle == MoveLimits(max_moves=None, max_moves_per_broker=2)
    assert stored.settings.max_offline_brokers == 4
    assert len(stored.refused) == 1 and stored.refused[0].startswith("max_moves: 0 is not a whole number >= 1")
