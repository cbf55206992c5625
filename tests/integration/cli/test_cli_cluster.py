"""``zkctl``'s cluster commands against the real ZooKeeper and a running cluster: status, groups and brokers,
rebalance, reassign, a broker's controlled shutdown, ``zk get``, ``watch``, ``timeline``, maintenance mode and
the live settings.

Every process a test starts is stopped by its pid in a ``finally``; the helpers are ``tests.cli_support``, the
``cluster`` fixture (a controller and two no-op workers in this process) ``tests/integration/conftest.py``."""

from __future__ import annotations

import json
import queue
import re
import subprocess
import threading

from controller.protocol.records import codecs, task_records
from controller.protocol.tasks.spec import parse_spec
from tests.cli_support import ZKCTL, assert_user_error, invoke, ok, ok_json, stop_process, until, zkctl

PNG = b"\x89PNG\r\n\x1a\n"


def test_status_group_describe_and_broker_list(noop_cluster, cli_env, zk, layout):
    noop_cluster.admin.create_tasks([parse_spec({"id": f"t{i}", "pipeline": {"kind": "noop"}}) for i in range(4)])
    placed = noop_cluster.wait_running({f"t{i}" for i in range(4)})
    until(lambda: ok_json(cli_env, "status")["groups"][0]["state"] == "Stable", what="Stable")
    st = ok_json(cli_env, "status", "--full")
    assert st["controller"]["controller_id"] == "ctl" and st["controller"]["epoch"] == noop_cluster.controller.epoch
    assert st["controller_epoch"] == noop_cluster.controller.epoch
    assert {b["broker_id"]: b["epoch"] for b in st["brokers"]} == {
        b: zk.exists(layout.broker(b)).czxid for b in ("b0", "b1")
    }
    (g,) = st["groups"]
    assert g["group"] == "default" and g["members"] == ["b0", "b1"] and g["leader"] in ("b0", "b1")
    assert g["protocol"] == "cooperative" and g["generation"] >= 1
    assert st["tasks"]["total"] == 4 and st["tasks"]["by_state"] == {"RUNNING": 4} and st["tasks"]["unowned"] == 0

    # the controller's summary is at most a second behind
    until(lambda: "Tasks: 4" in ok(cli_env, "status"), what="the summary counting the 4 tasks")
    human = ok(cli_env, "status")
    assert "counts from the controller's summary" in human
    assert "Controller: ctl" in human and "Stable" in human and "Tasks: 4" in human
    assert any(line.split()[:1] == ["b0"] for line in human.splitlines())

    (d,) = ok_json(cli_env, "group", "describe", "default")
    assert d["summary"]["state"] == "Stable" and d["tasks"] == 4
    members = {m["member_id"]: m for m in d["members"]}
    assert set(members) == {"b0", "b1"}
    for b, m in members.items():
        assert m["live"] and m["request"]["protocols"] == ["cooperative", "eager"]
        assert set(m["owns"]) == {t for t, o in placed.items() if o == b} == set(m["assignment"]["assigned"])
    human = ok(cli_env, "group", "describe")
    assert "Group default: Stable generation" in human and "HOLDS" in human

    brokers = ok_json(cli_env, "broker", "list")
    assert sorted((b["broker_id"], b["tasks"]) for b in brokers) == sorted(
        (b, sum(1 for o in placed.values() if o == b)) for b in ("b0", "b1")
    )
    assert "EPOCH" in ok(cli_env, "broker", "list").splitlines()[0]


def test_rebalance_bumps_the_generation(noop_cluster, cli_env):
    noop_cluster.admin.create_tasks([parse_spec({"id": "t1", "pipeline": {"kind": "noop"}})])
    noop_cluster.wait_running({"t1"})
    until(lambda: noop_cluster.admin.status().groups[0].state == "Stable", what="Stable")
    before = noop_cluster.admin.status().groups[0].generation
    p = zkctl(cli_env, "--json", "rebalance", "--group", "default", "--wait", "--timeout", "20")
    assert p.returncode == 0 and p.stderr == "", p.stderr  # --json: no progress, stdout pure JSON
    req = json.loads(p.stdout)
    assert req["done"] is True and req["path"].rsplit("/", 1)[1].startswith("req-")
    after = noop_cluster.admin.status().groups[0]
    assert after.state == "Stable" and after.generation > before
    assert "Rebalance of all groups done" in ok(cli_env, "rebalance", "--wait", "--timeout", "20")
    noop_cluster.wait_running({"t1"})


def test_reassign_moves_a_task_without_double_ownership(noop_cluster, cli_env, zk, layout):
    noop_cluster.admin.create_tasks([parse_spec({"id": f"t{i}", "pipeline": {"kind": "noop"}}) for i in range(4)])
    placed = noop_cluster.wait_running({f"t{i}" for i in range(4)})
    source = placed["t0"]
    target = "b1" if source == "b0" else "b0"
    assert f"Task t0 now runs on {target}" in ok(
        cli_env, "task", "reassign", "t0", "--to", target, "--wait", "--timeout", "20"
    )
    until(lambda: noop_cluster.running().get("t0") == target, what="t0 running on the target")
    assert codecs.decode(task_records.OwnerInfo, zk.get(layout.task_owner("t0"))[0]).broker == target
    # the runs of t0: the source released its owner znode before the target acquired it
    runs = [
        i for w in noop_cluster.workers.values() for i in list(w.intervals) + w.open_intervals() if i.task_id == "t0"
    ]
    src = [i for i in runs if i.broker == source]
    dst = [i for i in runs if i.broker == target]
    assert src and dst
    for a in src:
        for b in dst:
            assert a.released is not None and a.end is not None
            assert a.released <= b.acquired or (b.released is not None and b.released <= a.acquired), (a, b)
    until(lambda: zk.get_children(layout.admin_reassign) == [], what="the request removed")


def test_broker_shutdown_moves_its_tasks_away(noop_cluster, cli_env):
    noop_cluster.admin.create_tasks([parse_spec({"id": f"t{i}", "pipeline": {"kind": "noop"}}) for i in range(4)])
    placed = noop_cluster.wait_running({f"t{i}" for i in range(4)})
    assert "b1" in placed.values()
    held = sum(1 for b in placed.values() if b == "b1")
    p = zkctl(cli_env, "broker", "shutdown", "b1", "--wait", "--timeout", "30")
    assert p.returncode == 0 and "Broker b1 holds no tasks any more" in p.stdout, (p.stdout, p.stderr)
    # its progress, on stderr as plain lines (no terminal here): what it waits for, and how far it is
    lines = p.stderr.strip().splitlines()
    assert lines and all(
        re.match(
            r"^\[\s*\d+\.\ds\] waiting for b1 to hand over its tasks: \d+/\d+ moved "
            r"\(timeout 30s\)$",
            line,
        )
        for line in lines
    ), lines
    assert lines[-1].split(": ")[1].startswith(f"{held}/{held} moved") and "\r" not in p.stderr
    assert set(noop_cluster.running().values()) == {"b0"}
    until(noop_cluster.workers["b1"].exited.is_set, what="b1's controlled shutdown to complete")
    noop_cluster.workers["b1"].stop()  # what `zkctl broker run` does once `exited` is set
    until(lambda: noop_cluster.running() == {f"t{i}": "b0" for i in range(4)}, what="every task on b0")


def test_zk_get_decodes_payloads(noop_cluster, cli_env, layout):
    noop_cluster.admin.create_tasks([parse_spec({"id": "t1", "weight": 3, "pipeline": {"kind": "noop"}})])
    noop_cluster.wait_running({"t1"})
    got = ok_json(cli_env, "zk", "get", layout.task("t1"))
    assert got["data"]["id"] == "t1" and got["data"]["weight"] == 3 and got["error"] is None
    assert ok_json(cli_env, "zk", "get", layout.controller)["data"]["controller_id"] == "ctl"
    owner = ok_json(cli_env, "zk", "get", layout.task_owner("t1"))
    assert owner["data"]["broker"] in ("b0", "b1") and owner["stat"]["ephemeral_owner"]
    assert ok_json(cli_env, "zk", "get", layout.broker("b0"))["data"]["broker_id"] == "b0"
    assert ok(cli_env, "zk", "get", "--raw", layout.controller_epoch).strip() == str(noop_cluster.controller.epoch)
    assert "tasks" in ok(cli_env, "zk", "tree", layout.root)


def test_watch_prints_events_as_they_happen(noop_cluster, cli_env):
    lines: queue.Queue[str] = queue.Queue()
    p = subprocess.Popen(
        [ZKCTL, "--json", "watch", "--duration", "60"],
        env=cli_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        threading.Thread(target=lambda: [lines.put(line) for line in p.stdout], daemon=True).start()

        def next_event(timeout: float = 20.0) -> dict:
            return json.loads(lines.get(timeout=timeout))

        first = next_event()
        assert first["kind"] == "watching" and first["detail"]["controller"] == "ctl"
        assert set(first["detail"]["brokers"]) == {"b0", "b1"}
        noop_cluster.admin.create_tasks([parse_spec({"id": "w1", "pipeline": {"kind": "noop"}})])
        seen: list[dict] = []
        until(
            lambda: (
                (seen.append(next_event()) or True)
                and any(e["kind"] == "task_owner" and e["subject"] == "w1" and e["detail"]["owner"] for e in seen)
            ),
            30,
            "w1 owned",
        )
        # causal order for w1 (other events, e.g. a generation finishing when the watch began, may come between)
        about_w1 = [e["kind"] for e in seen if e["subject"] == "w1"]
        assert about_w1[0] == "task_created" and about_w1[-1] == "task_owner", about_w1
        assert any(e["kind"] == "group" for e in seen[seen.index(next(e for e in seen if e["subject"] == "w1")) :]), [
            (e["kind"], e["subject"], e["detail"].get("generation"), e["detail"].get("state")) for e in seen
        ]
        gens = [e["detail"]["generation"] for e in seen if e["kind"] == "group"]
        assert gens == sorted(gens)
        noop_cluster.admin.pause("w1")
        seen.clear()
        until(
            lambda: (
                (seen.append(next_event()) or True)
                and any(
                    e["kind"] == "task_owner" and e["subject"] == "w1" and e["detail"]["owner"] is None for e in seen
                )
            ),
            30,
            "w1 released",
        )
        about_w1 = [e for e in seen if e["subject"] == "w1"]
        assert about_w1[0]["kind"] == "task_state" and about_w1[0]["detail"]["state"] == "PAUSED", about_w1
    finally:
        stop_process(p)
    # human form, bounded by a count
    noop_cluster.admin.resume("w1")
    out = ok(cli_env, "watch", "--duration", "1")
    assert out.splitlines()[0].split()[1:3] == ["watching", "watching"]


def test_timeline_from_zookeeper_and_from_a_file(noop_cluster, cli_env, tmp_path):
    noop_cluster.admin.create_tasks([parse_spec({"id": f"t{i}", "pipeline": {"kind": "noop"}}) for i in range(3)])
    placed = noop_cluster.wait_running({"t0", "t1", "t2"})
    ok(cli_env, "task", "reassign", "t0", "--to", "b1" if placed["t0"] == "b0" else "b0", "--wait", "--timeout", "20")
    until(lambda: any(i.task_id == "t0" for i in noop_cluster.admin.intervals()), what="intervals flushed to ZooKeeper")
    out = tmp_path / "zk.png"
    summary = ok_json(cli_env, "timeline", "--out", str(out), "--from-zk", "--title", "from zk")
    assert out.read_bytes()[:8] == PNG and summary["overlaps"] == 0 and summary["tasks"] >= 1
    intervals = tmp_path / "sim.json"
    intervals.write_text(
        json.dumps(
            [
                {"task_id": "a", "broker": "x", "start": 0.0, "end": 2.0},
                {"task_id": "a", "broker": "y", "start": 2.5, "end": 4.0},
                {"task_id": "b", "broker": "y", "start": 0.0, "end": 4.0},
            ]
        )
    )
    human = ok(cli_env, "timeline", "--out", str(tmp_path / "sim.png"), "--intervals", str(intervals))
    assert "2 tasks, 2 brokers, 3 runs over 4.0s (idle gaps 0.5s, double ownership 0)" in human
    assert (tmp_path / "sim.png").read_bytes()[:8] == PNG


def test_maintenance_and_settings_commands(cli_env, zk, layout):
    assert "Maintenance mode is off" in invoke(["maintenance", "status"], cli_env).stdout
    res = invoke(["maintenance", "on", "--reason", "disk swap"], cli_env)
    assert res.exit_code == 0 and "Maintenance mode is ON" in res.stdout and "disk swap" in res.stdout, res.output
    res = invoke(["--json", "maintenance", "status"], cli_env)
    assert json.loads(res.stdout)["on"] is True
    assert "MAINTENANCE MODE" in invoke(["status"], cli_env).stdout
    assert "Maintenance mode is off" in invoke(["maintenance", "off"], cli_env).stdout
    res = invoke(["settings", "set", "max_moves=4", "max-moves-per-broker=2"], cli_env)
    assert res.exit_code == 0 and "max_moves" in res.stdout, res.output
    assert_user_error(invoke(["settings", "set", "max_moves=2", "--group", "etl"], cli_env), "unknown group 'etl'")
    zk.ensure_path(layout.group("etl"))
    res = invoke(["--json", "settings", "set", "max_moves=2", "--group", "etl"], cli_env)
    assert json.loads(res.stdout)["group_throttle"]["etl"]["max_moves"] == 2
    before = zk.get(layout.settings)[0]
    assert_user_error(invoke(["settings", "set", "max_moves=0"], cli_env), "max_moves: 0 is not a whole number >= 1")
    assert_user_error(invoke(["settings", "set", "nonsense=1"], cli_env), "unknown setting 'nonsense'")
    assert_user_error(invoke(["settings", "set", "max_moves"], cli_env), "expected NAME=VALUE")
    assert zk.get(layout.settings)[0] == before
    res = invoke(["--json", "maintenance", "auto", "--max-offline-brokers", "2", "--window", "30"], cli_env)
    assert json.loads(res.stdout)["max_offline_brokers"] == 2 and json.loads(res.stdout)["offline_window_s"] == 30
    assert_user_error(invoke(["maintenance", "auto"], cli_env), "--max-offline-brokers")
    res = invoke(["--json", "maintenance", "auto", "--off"], cli_env)
    assert json.loads(res.stdout)["max_offline_brokers"] is None
    res = invoke(["--json", "settings", "reset"], cli_env)
    assert json.loads(res.stdout)["throttle"] == {"max_moves": None, "max_moves_per_broker": None}
