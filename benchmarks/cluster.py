"""A benchmark cluster on a shared ZooKeeper: T tasks in G groups, controllers (in this process or as
``zkctl controller run`` processes) and a broker farm (``broker_sim.sim.farm``) in a child process."""

from __future__ import annotations

import logging
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.common import REPO
from broker_sim.sim.farm import Farm
from controller.admin import ensure_layout, wait_for
from controller.daemon import Controller, ControllerConfig, LoadMethod
from controller.protocol.cluster.layout import ZkLayout
from controller.protocol.group.vocabulary import GroupConfig
from controller.protocol.records import codecs, registration_records
from controller.protocol.records.group_messages import GroupStateInfo
from controller.protocol.records.payload_validation import PayloadError
from controller.protocol.tasks.spec import NoopPipeline, TaskSpec
from controller.zk.client import ZkSettings, make_client
from controller.zk.io import get_many

# B2's extra row splits 10,000 tasks into groups of this size (one group's join result carries every
# task's descriptor, every member's owned list and the previous assignment: ~1 MB at 10,000 tasks, which
# only fits since payloads over 64 KiB are zlib-compressed).
TASKS_PER_GROUP_SPLIT = 2500


def groups_for(tasks: int) -> int:
    return max(1, math.ceil(tasks / TASKS_PER_GROUP_SPLIT))


class ErrorLog(logging.Handler):
    """Collects ERROR records of the controller's event thread (an event that raised)."""

    def __init__(self) -> None:
        super().__init__(level=logging.ERROR)
        self.records: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if record.exc_info and record.exc_info[1] is not None:
            text += f": {type(record.exc_info[1]).__name__}: {record.exc_info[1]}"
        if len(self.records) < 100:
            self.records.append(text)


class Cluster:
    def __init__(
        self,
        hosts: str,
        tasks: int,
        brokers: int,
        groups: int = 1,
        name: str = "bench",
        session_timeout_s: float = 30.0,
        rebalance_timeout_s: float = 60.0,
        log_dir: Path | None = None,
    ) -> None:
        self.hosts = hosts
        self.tasks = tasks
        self.brokers = brokers
        self.groups = groups
        self.root = f"/{name}-{tasks}x{brokers}-{int(time.time() * 1000) % 10**8}"
        self.layout = ZkLayout(self.root)
        self.settings = ZkSettings(hosts=hosts, root=self.root, session_timeout_s=session_timeout_s)
        self.group_config = GroupConfig(rebalance_timeout_s=rebalance_timeout_s, default_assignor="cooperative-sticky")
        self.admin = make_client(self.settings)
        ensure_layout(self.admin, self.layout)
        self.task_ids = [f"task-{i:05d}" for i in range(tasks)]
        self.group_names = ["default"] if groups <= 1 else [f"g{j}" for j in range(groups)]
        self.controllers: list[Controller] = []
        self.procs: list[subprocess.Popen] = []
        self.farm: Farm | None = None
        self.log_dir = log_dir
        self.errors = ErrorLog()
        logging.getLogger("controller.daemon.event_thread").addHandler(self.errors)

    def group_of(self, i: int) -> str:
        return self.group_names[i % len(self.group_names)]

    def create_tasks(self) -> float:
        t0 = time.monotonic()
        pending = []
        for lo in range(0, self.tasks, 500):
            tx = self.admin.transaction()
            for i in range(lo, min(self.tasks, lo + 500)):
                tx.create(
                    self.layout.task(self.task_ids[i]),
                    TaskSpec(id=self.task_ids[i], group=self.group_of(i), pipeline=NoopPipeline(kind="noop")).encode(),
                )
            pending.append(tx.commit_async())
        for p in pending:
            res = p.get(timeout=120)
            bad = [r for r in res if isinstance(r, Exception)]
            if bad:
                raise RuntimeError(f"creating tasks failed: {bad[0]!r}")
        return time.monotonic() - t0

    # ---- controllers ---------------------------------------------------------------------------------
    def start_controller(self, cid: str = "ctl-0", load: LoadMethod = "multiread") -> Controller:
        cfg = ControllerConfig(cid, self.settings, self.group_config, load=load)
        ctl = Controller(cfg).start()
        self.controllers.append(ctl)
        return ctl

    def spawn_controller(self, cid: str) -> subprocess.Popen:
        """``zkctl controller run`` as a child process (its own session and interpreter)."""
        cmd = [
            str(Path(sys.executable).with_name("zkctl")),
            "--zk",
            self.hosts,
            "--zk-root",
            self.root,
            "controller",
            "run",
            "--id",
            cid,
            "--session-timeout",
            str(self.settings.session_timeout_s),
            "--rebalance-timeout",
            str(self.group_config.rebalance_timeout_s),
            "--default-assignor",
            "cooperative-sticky",
        ]
        log = open(self.log_dir / f"{cid}.log", "ab") if self.log_dir else subprocess.DEVNULL
        proc = subprocess.Popen(
            cmd,
            cwd=REPO,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        self.procs.append(proc)
        return proc

    def active_controller_id(self) -> str | None:
        try:
            data, _ = self.admin.get(self.layout.controller)
            return codecs.decode(registration_records.ControllerInfo, data).controller_id
        except Exception:
            return None

    # ---- brokers --------------------------------------------------------------------------------------
    def start_farm(self, **kw: Any) -> Farm:
        log = self.log_dir / f"farm-{self.root.strip('/')}.log" if self.log_dir else None
        self.farm = Farm(
            self.hosts,
            self.root,
            self.brokers,
            session_timeout=self.settings.session_timeout_s,
            groups=self.groups,
            log_path=log,
            **kw,
        )
        return self.farm

    def group_states(self) -> list[GroupStateInfo | None]:
        out = []
        for _g, res in zip(
            self.group_names, get_many(self.admin, [self.layout.group_state(g) for g in self.group_names])
        ):
            try:
                out.append(codecs.decode(GroupStateInfo, res[0]) if res else None)
            except PayloadError:
                out.append(None)
        return out

    def stable(self) -> bool:
        states = self.group_states()
        return all(s is not None and s.state == "Stable" for s in states)

    def farm_converged(self) -> bool:
        assert self.farm is not None
        st = self.farm.call("status")
        return (
            st["distinct"] == self.tasks
            and st["dupes"] == 0
            and st["running"] == self.tasks
            and st["max"] - st["min"] <= 1
        )

    def wait_converged(self, timeout: float, interval: float = 0.25) -> float | None:
        t0 = time.monotonic()
        ok = wait_for(lambda: self.farm_converged() and self.stable(), timeout, interval)
        return time.monotonic() - t0 if ok else None

    # ---- teardown -------------------------------------------------------------------------------------
    def close(self) -> None:
        if self.farm is not None:
            self.farm.close()
        for c in self.controllers:
            try:
                c.stop()
            except Exception:
                pass
        for p in self.procs:
            stop_process(p)
        logging.getLogger("controller.daemon.event_thread").removeHandler(self.errors)
        try:
            self.admin.stop()
            self.admin.close()
        except Exception:
            pass


def stop_process(p: subprocess.Popen, timeout: float = 20.0) -> None:
    """SIGTERM our child by its pid, then SIGKILL if it lingers."""
    if p.poll() is not None:
        return
    try:
        os.kill(p.pid, signal.SIGTERM)
        p.wait(timeout)
    except subprocess.TimeoutExpired:
        os.kill(p.pid, signal.SIGKILL)
        p.wait(10)
    except ProcessLookupError:
        pass
