"""The web console in a real headless Chromium, against a real ZooKeeper, controller, no-op broker
processes and ``zkctl api run``: a task created with ``zkctl task create`` appears without a reload, the
page pauses it (the spec is PAUSED in ZooKeeper), and a broker killed with SIGKILL has its tasks move on
the page. Screenshots of the run are kept under ``test-artifacts/`` (one is in the README)."""

from __future__ import annotations

import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

from controller.protocol.layout import ZkLayout
from controller.protocol.taskspec import decode_task
from controller.zk.client import ZkSettings, make_client
from controller.zk.io import delete_tree
from tests.api_support import REPO, TOKEN, ZKCTL, os_environ_without_auth, start_cluster, wait_until
from tests.browser_support import chromium, missing, quit_browser

pytestmark = [pytest.mark.browser, pytest.mark.slow]
ARTIFACTS = REPO / "test-artifacts"


@pytest.fixture
def browser():
    reason = missing()
    if reason:
        pytest.skip(reason)
    driver = chromium()
    try:
        yield driver
    finally:
        quit_browser(driver)


def _owners_on_page(driver) -> dict[str, str]:
    rows = driver.execute_script(
        "return [...document.querySelectorAll('#tasks tbody tr')].map(tr => [tr.dataset.task,"
        " tr.querySelector('td.owner').textContent.trim(), tr.querySelector('td.state').textContent.trim()])")
    return {t: owner for t, owner, _state in rows}


def _shot(driver, name: str) -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / f"console-{name}.png"
    driver.save_screenshot(str(path))
    return path


def test_console_live_create_pause_and_broker_kill(browser, zk_hosts, tmp_path):
    root = f"/console-{uuid.uuid4().hex[:10]}"
    env = {**os_environ_without_auth(), "ZKC_ZK": zk_hosts, "ZKC_ROOT": root, "ZKC_STATE_DIR": str(tmp_path / "state")}
    cluster = start_cluster(env, tmp_path / "logs")
    zk = make_client(ZkSettings(hosts=zk_hosts, root=root))
    layout = ZkLayout(root)
    try:
        browser.get(cluster.base + "/")
        wait_until(lambda: browser.execute_script("return document.body.dataset.ready === '1'"), 30, "first paint")
        wait_until(lambda: "controller c1" in browser.find_element("id", "controller").text, 30, "the controller shown")
        wait_until(lambda: browser.find_element("id", "live").text == "live", 30, "the event stream connected")
        browser.find_element("id", "token").send_keys(TOKEN)

        # created from the CLI, it appears without a reload
        specs = tmp_path / "tasks.yaml"
        specs.write_text("".join(f"- id: web-{i}\n  pipeline: {{kind: noop}}\n" for i in range(6)))
        subprocess.run(ZKCTL + ["task", "create", "-f", str(specs)], env=cluster.env, check=True, cwd=REPO,
                       capture_output=True, timeout=60)
        owners = wait_until(lambda: (o := _owners_on_page(browser)) and len(o) == 6
                            and all(v not in ("", "-") for v in o.values()) and o, 45,
                            "the six tasks on the page, each with an owner")
        _shot(browser, "running")

        # paused from the page: the spec in ZooKeeper says PAUSED
        browser.find_element("css selector", 'tr[data-task="web-0"] button.pause').click()
        wait_until(lambda: decode_task(zk.get(layout.task("web-0"))[0], layout.task("web-0")).state == "PAUSED", 20,
                   "web-0 PAUSED in ZooKeeper")
        wait_until(lambda: browser.execute_script(
            "const b = document.querySelector('tr[data-task=\"web-0\"] td.spec'); return b && b.textContent === 'PAUSED'"),
            20, "the page to show web-0 PAUSED")

        # a broker killed: its tasks move to the other, on the page
        victim = max(("b1", "b2"), key=lambda b: sum(1 for v in owners.values() if v == b))
        survivor = "b2" if victim == "b1" else "b1"
        moving = sorted(t for t, o in owners.items() if o == victim and t != "web-0")
        assert moving, owners
        cluster.kill(victim)
        wait_until(lambda: all(_owners_on_page(browser).get(t) == survivor for t in moving), 60,
                   f"{moving} to move to {survivor} on the page")
        _shot(browser, "after-kill")
        shutil.copy(ARTIFACTS / "console-after-kill.png", tmp_path / "console-after-kill.png")

        # maintenance mode, turned on from the CLI: the page says so, and why, without a reload
        subprocess.run(ZKCTL + ["maintenance", "on", "--reason", "swapping a disk"], env=cluster.env, check=True,
                       cwd=REPO, capture_output=True, timeout=60)
        wait_until(lambda: "swapping a disk" in browser.find_element("id", "maintenance").text, 30, "the maintenance banner")
        assert browser.find_element("id", "maintenance").is_displayed()
        subprocess.run(ZKCTL + ["maintenance", "off"], env=cluster.env, check=True, cwd=REPO, capture_output=True,
                       timeout=60)
        wait_until(lambda: not browser.find_element("id", "maintenance").is_displayed(), 30, "the banner gone")
    finally:
        cluster.stop()
        try:
            delete_tree(zk, root)
        finally:
            zk.stop()
            zk.close()
