"""Fault injection: how each fault kind of the schedule is begun against the run's brokers,
controllers and ZooKeeper, and what ends it. A new kind (or a new target) is one branch here; the
schedule and the checks do not change."""

from __future__ import annotations

import logging
import signal
import threading
import time
from typing import Callable

from broker_sim.chaos.schedule import Fault, broker_id, task_id
from controller.admin import AdminClient, AdminError
from controller.protocol.taskspec import NoopPipeline, TaskSpec

log = logging.getLogger(__name__)


class Faults:
    """Beginning and ending the schedule's faults."""

    # ---- faults: begin and end --------------------------------------------------------------------
    def _begin(self, f: Fault) -> Callable[[], None] | None:
        """Inject ``f``; return what ends it (called ``f.duration`` later), if anything."""
        o = self.copts
        if f.kind == "kill-broker":
            if o.process_brokers:
                proc = self.broker_procs[f.target]
                self._broker_gone(f.target, proc.kill9())
            else:
                self.kill(f.target)
            return lambda: self.new_broker(f.target)
        if f.kind in ("expire-broker", "partition-broker"):
            proxy = self.proxies[f.target]
            proxy.partition()
            return lambda: (proxy.reset(), proxy.heal())
        if f.kind == "freeze-broker":
            if o.process_brokers:
                proc = self.broker_procs[f.target]
                proc.signal(signal.SIGSTOP)
                proc.frozen = True

                def thaw() -> None:
                    proc.frozen = False
                    proc.signal(signal.SIGCONT)
                return thaw
            w = self.workers[f.target]
            proxy = self.proxies[f.target]
            w.frozen.set()
            proxy.partition()
            return lambda: (proxy.reset(), proxy.heal(), w.frozen.clear())
        if f.kind == "wedged-stop":
            # its runner's stops hang from now on, and it is cut off: the fence's stops hang, so it must halt
            # (exit 75, or an in-process kill) before its session expires; the supervisor restarts it
            if o.process_brokers:
                self.broker_procs[f.target].signal(signal.SIGUSR2, group=False)
            else:
                self.workers[f.target].runner.wedge(True)
            proxy = self.proxies[f.target]
            proxy.partition()
            return lambda: (proxy.reset(), proxy.heal())
        if f.kind == "maintenance":
            self.admin_ops.set_maintenance(True, f"chaos {f.at:.2f}")
            window = [time.time(), None]
            self.maintenance_windows.append(window)

            def maintenance_off() -> None:
                window[1] = time.time()
                self.admin_ops.set_maintenance(False, "chaos: over")
            return maintenance_off
        if f.kind == "kill-controller":
            cid = self.active_controller_id()
            if o.process_brokers:
                proc = self.ctl_procs.pop(cid, None) if cid else None
                if proc is None:
                    raise RuntimeError("no active controller process to kill")
                proc.kill9()
            else:
                ctl = next((c for c in self.controllers if c.id == cid), None)
                if ctl is None:
                    raise RuntimeError("no active controller to kill")
                self.controllers.remove(ctl)
                ctl.stop()
            return lambda: self.new_controller() and None
        if f.kind == "freeze-controller":
            cid = self.active_controller_id()
            if cid is None:
                raise RuntimeError("no active controller to freeze")
            if o.process_brokers:
                proc = self.ctl_procs[cid]
                proc.signal(signal.SIGSTOP)
                proc.frozen = True

                def thaw_ctl() -> None:
                    proc.frozen = False
                    proc.signal(signal.SIGCONT)
                return thaw_ctl
            ctl = next(c for c in self.controllers if c.id == cid)
            proxy = self.ctl_proxies[cid]
            stall = threading.Event()
            limit = f.duration + 10.0
            ctl.before_write = lambda: stall.wait(limit)  # the event thread stops at its next write
            proxy.partition()

            def resume() -> None:
                proxy.reset()
                proxy.heal()
                ctl.before_write = None
                stall.set()
            return resume
        if f.kind == "zk-restart":
            assert self.server is not None
            self.server.kill()
            return lambda: self.server.start(timeout=60) and None
        if f.kind == "rolling-bounce":
            self._bounce(f)
            return None
        if f.kind == "task-storm":
            admin = AdminClient(self.admin, self.layout)
            if f.create:
                admin.create_tasks([TaskSpec(id=task_id(f.prefix, i), pipeline=NoopPipeline(kind="noop")) for i in range(f.create)])
            for t in f.delete:
                try:
                    admin.delete_task(t)
                except AdminError:
                    pass  # already gone
            return None
        raise ValueError(f"unknown fault kind {f.kind!r}")

    def _bounce(self, f: Fault) -> None:
        """Every broker in turn leaves (controlled shutdown or plain stop), stays away 1 s, comes back;
        the next one goes once the group is Stable again (bounded by the rebalance timeout)."""
        o = self.copts
        for i in range(o.brokers):
            bid = broker_id(i)
            if o.process_brokers:
                proc = self.broker_procs.get(bid)
                if proc is not None:
                    if f.controlled:
                        proc.terminate(o.rebalance_timeout_s + o.session_timeout_s + 5)
                        self._broker_gone(bid, time.time())
                    else:
                        self._broker_gone(bid, proc.kill9())
            else:
                if bid in self.workers:
                    if f.controlled:
                        self.controlled_shutdown(bid, timeout=o.rebalance_timeout_s + o.session_timeout_s + 5)
                    else:
                        self.leave(bid)
            if self._stop.wait(1.0):
                return
            self.new_broker(bid)
            self._wait_stable(o.rebalance_timeout_s + o.session_timeout_s)

    def _wait_stable(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        time.sleep(0.3)  # let the change be noticed before looking for Stable
        while time.monotonic() < deadline and not self._stop.is_set():
            s = self.samples[-1] if self.samples else None
            if s is not None and s.state == "Stable" and time.time() - s.t < 1.0:
                return True
            self._stop.wait(0.1)
        return False
