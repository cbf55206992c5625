"""The simulation's brokers spread over broker farm processes (``broker_sim.sim.farm``), so that a hundred of
them neither share the controller's interpreter nor starve each other's heartbeats; the faults are then
carried out inside the farms."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from broker_sim.sim.farm import Farm, FarmError, task_digest
from broker_sim.sim.simulation_types import NotConverged, SimOptions
from controller.protocol.records.task_records import RunInterval


class FarmBrokers:
    """The simulation's brokers spread over broker farm processes: broker ``i`` lives in farm ``i % n``."""

    def __init__(
        self,
        opts: SimOptions,
        hosts: str,
        root: str,
        task_ids: list[str],
        ids: list[str],
        logs: Path,
        halts: Counter[str],
        echo: Callable[[str], None],
    ) -> None:
        o = opts
        #: the simulation's count of brokers halted at their fence deadline, updated from the farms' answers
        self.halts = halts
        self.echo = echo
        self.expected_digest = task_digest(task_ids)
        self.home: dict[str, Farm] = {}
        self.farms: list[Farm] = []
        self.pool = ThreadPoolExecutor(max_workers=max(1, o.farms), thread_name_prefix="sim-farm-poll")
        proxies = o.use_proxies or o.scenario in ("expire-session", "pause-broker", "partition-broker")
        try:
            for k in range(o.farms):
                mine = ids[k :: o.farms]
                self.farms.append(
                    Farm(
                        hosts,
                        root,
                        ids=mine,
                        session_timeout=o.session_timeout_s,
                        protocol=o.protocol,
                        assignor=o.assignor,
                        start_latency=o.start_latency_s,
                        stop_latency=o.stop_latency_s,
                        static=o.static_membership,
                        proxies=proxies,
                        metrics_interval=o.metrics_interval_s,
                        log_path=logs / f"farm-{k}.log",
                        wait_ready=False,
                    )
                )
                for bid in mine:
                    self.home[bid] = self.farms[-1]
            for f in self.farms:
                f.wait_ready()
        except FarmError as exc:
            self.close()
            raise NotConverged(f"a broker farm did not start: {exc}") from None

    def _farm(self, bid: str) -> Farm:
        if bid not in self.home:  # a new broker: the next farm in turn
            index = int(bid.rsplit("-", 1)[1]) if bid.rsplit("-", 1)[-1].isdigit() else len(self.home)
            self.home[bid] = self.farms[index % len(self.farms)]
        return self.home[bid]

    def start(self, bid: str) -> None:
        self._farm(bid).call("start", id=bid)

    def call(self, bid: str, cmd: str, timeout: float | None = None, seconds: float | None = None) -> Any:
        kw: dict[str, Any] = {"id": bid}
        if timeout is not None:
            kw["within"] = timeout
        if seconds is not None:
            kw["seconds"] = seconds
        wait = (timeout or 0.0) + (seconds or 0.0) + 120.0
        return self._farm(bid).call(cmd, timeout=wait, **kw).get("ok")

    def running(self) -> tuple[dict[str, int], int, float | None]:
        """Tasks running per broker, a digest of which, and when the last of them started: every farm is
        asked at once (one after the other, a poll took four farms' answers end to end)."""
        counts: dict[str, int] = {}
        digest = 0
        starts: list[float] = []
        for r in self.pool.map(lambda f: f.call("running"), self.farms):
            counts.update(r["counts"])
            if r.get("last_start") is not None:
                starts.append(r["last_start"])
            digest = (digest + r["digest"]) % (1 << 64)
            for bid, n in r["halts"].items():
                if n > self.halts[bid]:
                    self.echo(f"  {bid} halted at its fence deadline; its farm restarted it")
                    self.halts[bid] = n
        return counts, digest, max(starts, default=None)

    def intervals(self) -> list[RunInterval]:
        out: list[RunInterval] = []
        for f in self.farms:
            out += [RunInterval(**i) for i in f.call("intervals", timeout=300.0)["intervals"]]
        return out

    def close(self) -> None:
        for f in self.farms:
            f.close()
        self.pool.shutdown(wait=False)
