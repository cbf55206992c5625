from __future__ import annotations

import pytest

from controller.layout import InvalidName, ZkLayout


def test_paths_live_under_the_root():
    lay = ZkLayout("/prod/a")
    paths = [lay.controller, lay.controller_epoch, lay.broker("b1"), lay.task("t1"), lay.task_owner("t1"),
             lay.group_state("g"), lay.group_member("g", "b1"), lay.group_sync("g", 3), lay.group_join("g", 3),
             lay.group_assignment("g", "b1"), lay.status("t1"), lay.admin_controlled_shutdown_of("b1"),
             *lay.persistent_roots()]
    assert all(p.startswith("/prod/a/") for p in paths)
    assert lay.task_owner("t1") == "/prod/a/tasks/t1/owner"
    assert ZkLayout("zkc/").root == "/zkc"


@pytest.mark.parametrize("bad", ["", "a/b", "..", ".hidden", "x" * 201, "sp ace", "é"])
def test_bad_names_are_refused(bad):
    with pytest.raises(InvalidName):
        ZkLayout().task(bad)
