"""The live settings' rules: values bounded where they enter, salvaged field by field where the controller reads
them, and the stored settings as the tools read them (the refused field named, the others kept)."""

from __future__ import annotations

import json

import pytest

from controller.admin.operations import SettingsAdmin
from controller.protocol.cluster.layout import ZkLayout
from controller.protocol.cluster.settings_rules import SettingValueError, check_setting, read_settings
from controller.protocol.records.admin_records import ClusterSettings, MoveLimits


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
