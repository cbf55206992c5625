"""The web console in a real headless Chromium, against a real ZooKeeper, controller, no-op broker
processes and ``zkctl api run``: a task created with ``zkctl task create`` appears without a reload, the
page pauses it (the spec is PAUSED in ZooKeeper), and a broker killed with SIGKILL has its tasks move on
the page. Screenshots of the run are kept under ``test-artifacts/`` (one is in the README)."""

from __future__ import annotations

import shutil
import subprocess
import urllib.request
from pathlib import Path

import pytest

from controller.protocol.tasks.spec import decode_task
from tests.api_support import REPO, TOKEN, ZKCTL, ApiCluster, running_api
from tests.browser_support import chromium, missing, quit_browser
from tests.waiting import wait_until

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
        " tr.querySelector('td.owner').textContent.trim(), tr.querySelector('td.state').textContent.trim()])"
    )
    return {t: owner for t, owner, _state in rows}


def _shot(driver, name: str) -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / f"console-{name}.png"
    driver.save_screenshot(str(path))
    return path


def test_console_live_create_pause_and_broker_kill(browser, zk_hosts, tmp_path):
    with running_api(zk_hosts, tmp_path, "console") as (cluster, zk, layout):
        browser.get(cluster.base + "/")
        wait_until(lambda: browser.execute_script("return document.body.dataset.ready === '1'"), 30, "first paint")
        wait_until(lambda: "controller c1" in browser.find_element("id", "controller").text, 30, "the controller shown")
        wait_until(lambda: browser.find_element("id", "live").text == "live", 30, "the event stream connected")
        browser.find_element("id", "token").send_keys(TOKEN)

        # created from the CLI, it appears without a reload
        specs = tmp_path / "tasks.yaml"
        specs.write_text("".join(f"- id: web-{i}\n  pipeline: {{kind: noop}}\n" for i in range(6)))
        subprocess.run(
            ZKCTL + ["task", "create", "-f", str(specs)],
            env=cluster.env,
            check=True,
            cwd=REPO,
            capture_output=True,
            timeout=60,
        )
        owners = wait_until(
            lambda: (
                (o := _owners_on_page(browser)) and len(o) == 6 and all(v not in ("", "-") for v in o.values()) and o
            ),
            45,
            "the six tasks on the page, each with an owner",
        )
        _shot(browser, "running")

        # paused from the page: the spec in ZooKeeper says PAUSED
        browser.find_element("css selector", 'tr[data-task="web-0"] button.pause').click()
        wait_until(
            lambda: decode_task(zk.get(layout.task("web-0"))[0], layout.task("web-0")).state == "PAUSED",
            20,
            "web-0 PAUSED in ZooKeeper",
        )
        wait_until(
            lambda: browser.execute_script(
                "const b = document.querySelector('tr[data-task=\"web-0\"] td.spec'); return b && b.textContent === 'PAUSED'"
            ),
            20,
            "the page to show web-0 PAUSED",
        )

        # a broker killed: its tasks move to the other, on the page
        victim = max(("b1", "b2"), key=lambda b: sum(1 for v in owners.values() if v == b))
        survivor = "b2" if victim == "b1" else "b1"
        moving = sorted(t for t, o in owners.items() if o == victim and t != "web-0")
        assert moving, owners
        cluster.kill(victim)
        wait_until(
            lambda: all(_owners_on_page(browser).get(t) == survivor for t in moving),
            60,
            f"{moving} to move to {survivor} on the page",
        )
        _shot(browser, "after-kill")
        shutil.copy(ARTIFACTS / "console-after-kill.png", tmp_path / "console-after-kill.png")

        # maintenance mode, turned on from the CLI: the page says so, and why, without a reload
        subprocess.run(
            ZKCTL + ["maintenance", "on", "--reason", "swapping a disk"],
            env=cluster.env,
            check=True,
            cwd=REPO,
            capture_output=True,
            timeout=60,
        )
        wait_until(
            lambda: "swapping a disk" in browser.find_element("id", "maintenance").text, 30, "the maintenance banner"
        )
        assert browser.find_element("id", "maintenance").is_displayed()
        subprocess.run(
            ZKCTL + ["maintenance", "off"], env=cluster.env, check=True, cwd=REPO, capture_output=True, timeout=60
        )
        wait_until(lambda: not browser.find_element("id", "maintenance").is_displayed(), 30, "the banner gone")


XSS = "<img src=x onerror=\"window.__xss=(window.__xss||0)+1;document.title='XSS:'+localStorage.getItem('zkc-token')\">"


def test_nothing_a_broker_writes_runs_in_the_page(browser, zk_hosts, tmp_path):
    """Script put into every field the console shows (statuses, errors, metrics, brokers, groups, maintenance)
    is shown as text; a state outside the enumeration is shown as "invalid"; and the page's
    Content-Security-Policy refuses inline script even where the page itself would insert it."""
    import time

    from controller.protocol.records import codecs, task_records
    from controller.protocol.records.admin_records import MaintenanceInfo
    from controller.protocol.records.group_messages import GroupStateInfo
    from controller.protocol.records.task_records import LastFailure, OwnerInfo, TaskStatus

    with running_api(zk_hosts, tmp_path, "xss", brokers=("b1",)) as (cluster, zk, layout):
        assert (
            cluster.request(
                "POST",
                "/api/v1/tasks",
                [
                    {"id": "x-1", "group": "nobody", "pipeline": {"kind": "noop"}},
                    {"id": "x-2", "group": "nobody", "pipeline": {"kind": "noop"}},
                ],
            ).status
            == 201
        )
        session = task_records.session_hex(zk.client_id[0])
        zk.create(
            layout.task_owner("x-1"), codecs.encode(OwnerInfo(broker=XSS, generation=1)), ephemeral=True, makepath=True
        )
        zk.create(
            layout.status("x-1"),
            codecs.encode(
                TaskStatus(
                    broker=XSS,
                    state=XSS,
                    generation=1,
                    updated=time.time(),
                    error=XSS,
                    session=session,
                    last_failure=LastFailure(error=XSS, kind=XSS, at=time.time(), restarts=3, trace=XSS + "\n  at x"),
                    metrics={
                        "rows": XSS,
                        "processed_rows_per_s": XSS,
                        "input_rows_per_s": XSS,
                        "backlog_files": XSS,
                        "rate_history": [XSS, 5, None, 10, -1, "20", {"x": 1}],
                    },
                )
            ),
            makepath=True,
        )
        zk.create(
            layout.status("x-2"),
            codecs.encode(TaskStatus(broker=XSS, state=XSS, generation=1, updated=time.time() - 99, error=XSS)),
            makepath=True,
        )
        hostile_group = codecs.encode(
            GroupStateInfo(state=XSS, generation=1, join_generation=1, controller_epoch=1, protocol=XSS, leader=XSS)
        )
        if zk.exists(layout.group_state("nobody")):
            zk.set(layout.group_state("nobody"), hostile_group)
        else:
            zk.create(layout.group_state("nobody"), hostile_group, makepath=True)
        zk.set(
            layout.maintenance,
            codecs.encode(MaintenanceInfo(on=True, reason=XSS, by=XSS, since=time.time(), offline=(XSS,))),
        )
        browser.get(cluster.base + "/")
        browser.find_element("id", "token").send_keys(TOKEN)
        wait_until(lambda: browser.execute_script("return document.body.dataset.ready === '1'"), 30, "first paint")
        wait_until(
            lambda: browser.execute_script("return !!document.querySelector('tr[data-task=\"x-1\"] td.error')"),
            30,
            "x-1 on the page",
        )
        wait_until(lambda: XSS in browser.find_element("id", "maintenance").text, 30, "the banner, as text")
        time.sleep(1.5)  # a window for a wrong change to show (nothing to wait for when all goes right)
        assert browser.execute_script("return window.__xss === undefined"), "script from ZooKeeper ran"
        assert not browser.title.startswith("XSS"), browser.title
        row = browser.execute_script(
            "const tr = document.querySelector('tr[data-task=\"x-1\"]'); return [tr.querySelector('td.state').textContent,"
            " tr.querySelector('td.error').textContent, tr.querySelectorAll('img').length]"
        )
        assert row[0] in ("invalid", "STALE", "UNASSIGNED"), row
        assert row[1] == XSS and row[2] == 0, row
        # the figures: "invalid" where they are not numbers, a sparkline drawn from the two valid rates only
        figures = browser.execute_script(
            "const tr = document.querySelector('tr[data-task=\"x-1\"]'); const line = tr.querySelector('td.rate svg polyline');"
            " return [tr.querySelector('td.rate').textContent, tr.querySelector('td.backlog').textContent,"
            " line ? line.getAttribute('points').split(' ').length : 0]"
        )
        assert figures[0].startswith("invalid") and XSS not in figures[0], figures
        assert figures[1] == "invalid" and figures[2] == 2, figures
        assert browser.execute_script("return document.querySelectorAll('img').length") == 0
        # why it failed: a click on its error opens its last failure, every field as text
        browser.execute_script("document.querySelector('tr[data-task=\"x-1\"] td.error').click()")
        wait_until(
            lambda: browser.execute_script("return !document.getElementById('failure').hidden"), 30, "the failure"
        )
        failure = browser.execute_script(
            "return [document.getElementById('failure-summary').textContent,"
            " document.getElementById('failure-trace').textContent,"
            " document.getElementById('failure').querySelectorAll('img').length]"
        )
        assert XSS in failure[0] and "3 restart(s)" in failure[0], failure
        assert failure[1] == XSS + "\n  at x" and failure[2] == 0, failure
        assert browser.execute_script("return window.__xss === undefined"), "script from a failure ran"
        _shot(browser, "failure")
        # the policy itself: markup the page would insert still cannot run inline script; the browser reports
        # the handler it refused (when the image fails to load), which is when the handler would have run
        browser.execute_script(
            "document.addEventListener('securitypolicyviolation', e => { window.__csp_refused = e.violatedDirective; });"
            "document.body.insertAdjacentHTML('beforeend', '<img src=x onerror=\"window.__csp_broken=1\">')"
        )
        refused = wait_until(
            lambda: browser.execute_script("return window.__csp_refused || window.__csp_broken === 1"),
            30,
            "the inline handler refused by the page's Content-Security-Policy",
        )
        assert browser.execute_script("return window.__csp_broken === undefined"), "inline script ran: no CSP"
        assert str(refused).startswith("script-src"), refused
        _shot(browser, "hostile-fields")


def test_a_page_on_another_origin_cannot_write(browser, zk_hosts, tmp_path):
    """With no admin token, a page elsewhere that fetches (no-cors) or posts a form at the API changes
    nothing: the writes carry its Origin and Sec-Fetch-Site and are refused."""
    import http.server
    import threading

    with running_api(zk_hosts, tmp_path, "xsite", brokers=("b1",), token=None) as (cluster, zk, layout):
        site = tmp_path / "evil"
        site.mkdir()
        api = cluster.base + "/api/v1"
        (site / "index.html").write_text(f"""<!doctype html><html><body>
<form id="f" method="POST" action="{api}/brokers/b1/shutdown" target="sink"><input name="x" value="1"></form>
<iframe name="sink"></iframe>
<script>
fetch("{api}/tasks/restart?only_failed=false", {{method: "POST", mode: "no-cors"}})
  .finally(() => fetch("{api}/tasks/s-1/pause", {{method: "PUT", mode: "no-cors", body: "{{}}",
                                                  headers: {{"Content-Type": "text/plain"}}}}))
  .finally(() => {{ document.getElementById("f").submit(); document.title = "sent"; }});
</script></body></html>""")
        handler = lambda *a: http.server.SimpleHTTPRequestHandler(*a, directory=str(site))  # noqa: E731
        evil = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=evil.serve_forever, name="test-evil-site", daemon=True).start()
        try:
            assert (
                cluster.request("POST", "/api/v1/tasks", {"id": "s-1", "pipeline": {"kind": "noop"}}, token=None).status
                == 201
            )
            wait_until(lambda: zk.exists(layout.task_owner("s-1")), 30, "s-1 owned")
            version = zk.exists(layout.task("s-1")).version
            browser.get(f"http://127.0.0.1:{evil.server_address[1]}/index.html")
            wait_until(lambda: browser.title == "sent", 30, "the other site's page to send its writes")
            # its fetch POST and its form's POST reach the API and are refused before any route (a PUT cannot
            # leave a no-cors fetch): once both are counted, whatever they could have changed has been refused
            wait_until(lambda: _refused_posts(cluster) >= 2, 30, "the other site's two POSTs refused (403)")
            assert zk.exists(layout.task("s-1")).version == version, "a cross-site write changed the task"
            assert zk.exists(layout.broker("b1")) is not None and cluster.procs["b1"].poll() is None, "b1 was shut down"
        finally:
            evil.shutdown()


def _refused_posts(cluster: ApiCluster) -> float:
    """POSTs the API refused before routing them (its guard: another site, a bad host or body), from /metrics."""
    with urllib.request.urlopen(cluster.base + "/metrics", timeout=10) as r:
        text = r.read().decode()
    line = 'zkc_api_requests_total{method="POST",route="other",status="403"} '
    return sum(float(x[len(line) :]) for x in text.splitlines() if x.startswith(line))
