"""The broker simulator's scenarios: a cluster started and converged, then one scripted step or a series of
them (bounce, add, kill, shut down, expire, pause, partition a broker; kill the controller; the planned roll),
each measured to the instant the cluster converged again, and the run's summary from the independent checker.

A scenario is a client of ``Simulation``'s public operations, as a test is."""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from broker_sim.sim.checker import double_ownership, downtime, moved_tasks
from broker_sim.sim.simulation_types import NotConverged, SimSummary, StepResult
from controller.protocol.records import codecs

if TYPE_CHECKING:
    from broker_sim.sim.simulator import Simulation


class Scenarios:
    """Plays ``sim.opts.scenario`` on ``sim`` (its steps recorded in ``sim.steps``)."""

    def __init__(self, sim: Simulation) -> None:
        self.sim = sim
        self.opts = sim.opts

    def run(self) -> SimSummary:
        o = self.opts
        wall0 = time.monotonic()
        self.sim.create_tasks(o.tasks)
        self.sim.start_controller("ctl-0")
        if o.scenario == "kill-controller":
            self.sim.start_controller("ctl-1")
        self.sim.start_workers([self.sim.broker_id(i) for i in range(o.brokers)])
        took = self.sim.wait_converged(balanced=True)
        if took is None:
            where = f"{o.farms} broker farm process(es)" if o.farms else "one process"
            raise NotConverged(
                f"the cluster of {o.brokers} brokers and {o.tasks} tasks did not converge within "
                f"{o.converge_timeout_s:g}s of starting ({where}; a machine too small for this many "
                "brokers fences them: try more --farms, fewer brokers or a longer --session-timeout)"
            )
        self.sim.echo(
            f"{o.brokers} brokers, {o.tasks} tasks running ({o.protocol}"
            f"{f', {o.farms} farms' if o.farms else ''}) after {took:.2f}s"
        )
        if o.settle_s:
            time.sleep(o.settle_s)
            self.sim.echo(f"  ran {o.settle_s:g}s to settle; the scenario starts")
        rebalances0 = self._rebalances()
        t_start = time.time()
        getattr(self, "_scenario_" + o.scenario.replace("-", "_"))()
        t_end = time.time()
        intervals = self.sim.all_intervals()
        overlaps = double_ownership(intervals)
        down = downtime(intervals, self.sim.task_ids, (t_start, t_end))
        summary = SimSummary(
            scenario=o.scenario,
            protocol=o.protocol,
            brokers=o.brokers,
            tasks=o.tasks,
            task_downtime_s=round(sum(down.values()), 3),
            double_ownership=len(overlaps),
            moved_tasks=moved_tasks(intervals, (t_start, t_end)),
            step_convergence_s=[
                round(s.converged_s, 3) for s in self.sim.steps if s.converged_s is not None and s.measured
            ],
            steps=[asdict(s) for s in self.sim.steps],
            rebalances=self._rebalances() - rebalances0,
            wall_s=round(time.monotonic() - wall0, 3),
            window_s=round(t_end - t_start, 3),
            overlaps=[str(x) for x in overlaps[:10]],
            farms=o.farms,
            halts=sum(self.sim.halts.values()),
        )
        if o.intervals_out:
            Path(o.intervals_out).write_text(json.dumps([codecs.to_jsonable(i) for i in intervals]))
        return summary

    def _rebalances(self) -> int:
        """Rebalances counted by every group coordinator seen so far: a controller killed or resigned keeps
        the count it had (its context is gone; the new controller's coordinator counts from zero)."""
        seen = self.sim.coordinators_seen
        for c in self.sim.controllers:
            if c.ctx is not None and "default" in c.ctx.groups:
                coord = c.ctx.groups["default"]
                seen[id(coord)] = coord  # (kept alive here, so its id is never reused)
        return sum(coord.rebalances for coord in seen.values())

    def _step(
        self,
        name: str,
        bid: str,
        action: Callable[[], object],
        gap: float = 0.0,
        back: Callable[[], object] | None = None,
        measured: bool = True,
    ) -> StepResult:
        step = StepResult(name, bid, time.time(), measured=measured)
        t0 = time.monotonic()
        action()
        if gap:
            time.sleep(gap)
        if back is not None:
            back()
        took = self.sim.wait_converged(balanced=True)
        if took is not None:
            step.detected_s = round(time.monotonic() - t0, 3)
            settled = self.sim.settled_at()
            step.converged_s = (
                step.detected_s if settled is None else round(min(max(0.0, settled - step.started), step.detected_s), 3)
            )
        self.sim.steps.append(step)
        self.sim.echo(
            f"  {name} {bid}: converged in {step.converged_s}s"
            + (f" (seen by a poll at {step.detected_s}s)" if step.detected_s is not None else "")
        )
        return step

    def _scenario_steady(self) -> None:
        time.sleep(1.0)

    def _scenario_rolling_bounce(self) -> None:
        o = self.opts
        for i in range(o.brokers):
            bid = self.sim.broker_id(i)
            leave = (
                partial(self.sim.controlled_shutdown, bid) if o.controlled_shutdown else partial(self.sim.leave, bid)
            )
            self._step("bounce", bid, leave, gap=o.restart_gap_s, back=partial(self.sim.start_worker, bid))

    def _repeated(self, step: Callable[[int], object], restore: Callable[[int], object] | None = None) -> None:
        """A one-step scenario, ``repeat`` times: between two, ``restore`` puts the cluster back (unmeasured)
        and it settles again."""
        for i in range(self.opts.repeat):
            if i:
                if restore is not None:
                    restore(i - 1)
                if self.opts.settle_s:
                    time.sleep(self.opts.settle_s)
            step(i)

    def _scenario_roll(self) -> None:
        """The controller's planned roll (``zkctl broker roll``); the harness is the brokers' supervisor: a
        broker that exits (its controlled shutdown done) is started again under the same id after the gap."""
        from controller.admin import AdminClient

        o = self.opts
        if self.sim.farms is not None:
            raise ValueError("the roll scenario runs its brokers in this process (no --farms)")
        admin = AdminClient(self.sim.admin, self.sim.layout)
        whole = StepResult("roll", "all", time.time(), measured=False)  # (starts the window: the first moves)
        self.sim.steps.append(whole)
        admin.roll(
            "default",
            batch=o.roll_batch,
            timeout_s=max(30.0, o.converge_timeout_s),
            wave=o.roll_wave,
            warmup_s=o.roll_warmup_s,
            in_place=o.roll_in_place,
        )
        deadline = time.monotonic() + o.converge_timeout_s * (o.brokers + 2)
        st = admin.roll_status()
        while time.monotonic() < deadline and st is not None and st.phase not in ("done", "paused"):
            for bid, w in list(self.sim.workers.items()):
                if w.exited.is_set():
                    step = StepResult("roll", bid, time.time(), measured=False)
                    self.sim.retire(w, graceful=True)
                    if o.restart_gap_s:
                        time.sleep(o.restart_gap_s)
                    self.sim.start_worker(bid)
                    self.sim.steps.append(step)
                    self.sim.echo(f"  roll: {bid} exited after its tasks moved; started again")
            time.sleep(0.05)
            st = admin.roll_status()
        if st is None or st.phase != "done":
            raise NotConverged(f"the roll did not finish: {st.phase + ': ' + st.reason if st else 'no roll'}")
        self.sim.roll_moves = st.moves
        took = self.sim.wait_converged(balanced=True)
        for step in self.sim.steps:
            step.converged_s = step.detected_s = None if took is None else round(time.time() - step.started, 3)
        self.sim.echo(f"  roll done: {st.moves} task moves planned")

    def _scenario_add_broker(self) -> None:
        def new(i: int) -> str:
            return self.sim.broker_id(self.opts.brokers + i)

        self._repeated(
            lambda i: self._step("add", new(i), lambda: self.sim.start_worker(new(i))),
            lambda i: self._step("restore", new(i), lambda: self.sim.controlled_shutdown(new(i)), measured=False),
        )

    def _victims(self) -> list[str]:
        """The brokers the repeats of a one-step scenario hit, drawn from the seed."""
        return [self.sim.broker_id(self.sim.rng.randrange(self.opts.brokers)) for _ in range(self.opts.repeat)]

    def _scenario_kill_broker(self) -> None:
        victims = self._victims()
        self._repeated(
            lambda i: self._step("kill", victims[i], lambda: self.sim.kill(victims[i])),
            lambda i: self._step("restore", victims[i], lambda: self.sim.start_worker(victims[i]), measured=False),
        )

    def _scenario_controlled_shutdown(self) -> None:
        victims = self._victims()
        self._repeated(
            lambda i: self._step("controlled-shutdown", victims[i], lambda: self.sim.controlled_shutdown(victims[i])),
            lambda i: self._step("restore", victims[i], lambda: self.sim.start_worker(victims[i]), measured=False),
        )

    def _scenario_kill_controller(self) -> None:
        def standby(i: int) -> None:
            self.sim.start_controller(f"ctl-{i + 2}")  # the next standby (ctl-0 ran first, ctl-1 stood by)

        self._repeated(
            lambda i: self._step("kill-controller", self._active_id(), lambda: self.sim.kill_controller()), standby
        )

    def _active_id(self) -> str:
        ctl = self.sim.active_controller()
        return ctl.config.controller_id if ctl is not None else "-"

    def _scenario_expire_session(self) -> None:
        victims = self._victims()
        self._repeated(lambda i: self._step("expire", victims[i], lambda: self.sim.expire(victims[i])))

    def _scenario_pause_broker(self) -> None:
        victims = self._victims()
        self._repeated(
            lambda i: self._step(
                "pause", victims[i], lambda: self.sim.pause(victims[i], self.opts.session_timeout_s * 1.6)
            )
        )

    def _scenario_partition_broker(self) -> None:
        victims = self._victims()
        self._repeated(
            lambda i: self._step(
                "partition", victims[i], lambda: self.sim.partition(victims[i], self.opts.session_timeout_s * 0.5)
            )
        )


def format_summary(s: SimSummary) -> str:
    lines = [
        f"scenario {s.scenario} · {s.protocol} · {s.brokers} brokers · {s.tasks} tasks",
        f"  task downtime      {s.task_downtime_s:.2f} task-seconds (over a {s.window_s:.1f}s window)",
        f"  double ownership   {s.double_ownership}",
        f"  moved tasks        {s.moved_tasks}",
        f"  rebalances         {s.rebalances}",
        f"  step convergence   {', '.join(f'{x:.2f}s' for x in s.step_convergence_s) or '-'}"
        + (f" (median {statistics.median(s.step_convergence_s):.2f}s)" if len(s.step_convergence_s) > 1 else ""),
    ]
    if s.farms:
        lines[0] += f" · {s.farms} broker farm processes"
    if s.halts:
        lines.append(f"  halted brokers     {s.halts} (restarted; the machine could not keep their sessions)")
    lines += [f"  OVERLAP {o}" for o in s.overlaps]
    return "\n".join(lines)
