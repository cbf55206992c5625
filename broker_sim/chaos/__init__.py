"""Chaos runs: a seeded schedule of faults against a live cluster, then an independent verdict.

``make_schedule(opts)`` turns a seed into a fault schedule (same seed and options, same schedule; it is
printed before the run starts). :class:`ChaosRun` plays it against N brokers, two or more controller
candidates and an embedded ZooKeeper of its own, samples ``/controller_epoch`` and
``/groups/<g>/state`` all along, and once the last fault is over checks four invariants:

1. no task ever had two running owners (the checker's interval overlap, see ``broker_sim.sim.checker``);
2. within ``convergence_bound_s`` of the last fault, every RUNNING task runs on exactly one live broker,
   as ZooKeeper shows it (owner znode held by a live broker's session, status RUNNING by that broker,
   no deletion pending) and, for in-process brokers, as the workers themselves show it — and it stays
   so for a hold period;
3. the controller epoch and every group generation never go down (over all samples);
4. once the faults stop, no group stays out of Stable at one generation longer than the rebalance
   timeout plus the scheduled rebalance delay (plus the sampling slack), and the group ends Stable.

Faults (``FAULT_KINDS``): broker kill (kill -9 of a process broker; an in-process kill closes the
session at once), session expiry (the broker's network silent past the session timeout, via its
``NetProxy``), broker freeze (SIGSTOP/SIGCONT; in process: threads and network frozen), short network
partition, controller kill (kill -9 / stop) and freeze (SIGSTOP; in process: a ``before_write`` stall
with the controller's network silenced), ZooKeeper stop/start (the run's own server: SIGKILL, then a
restart on the same data), rolling bounce (every broker in turn: controlled shutdown or a plain stop,
then back), task create/delete storms (through the admin client, as an operator would).

Process brokers run ``python -m broker_sim.chaos broker``: the same :class:`~broker_sim.worker.Worker`
as ``zkctl broker run --runner noop``, whose runner also appends every start and stop to a journal file
(one line each, written before a start and after a stop), so that the run windows of a process that was
killed -9 are known exactly. Process controllers are real ``zkctl controller run`` processes.

Hostile members, on request: "ghost-member" (a member znode with no broker behind it, on a session of its own)
and "rewritten-report" (a live member's report overwritten with absurd fields). A placement sampler adds
invariant 9 (no task placed longer than the rebalance timeout without a running owner while its group says
Stable), 10 (no ghost given work) and 11 (a member whose report was rewritten reports validly again).

A harness that cannot inject a kind names it in ``ChaosOptions.leave_out``: the schedule never draws it,
and the run prints it, with why, before the schedule (``left_out``).

The package, one job a module: ``schedule`` (the pure, seeded schedule), ``faults`` (the table of kinds:
how each is injected and ended), ``player`` (the schedule played in time), ``processes`` (process brokers,
their journal, process controllers), ``checks`` (the sampler and the checks of the live cluster),
``verdicts`` (the invariants' verdicts over what was recorded, pure), ``sinks`` (pipeline specs and what a
sink holds), ``summary`` (the report), ``run`` (``ChaosRun`` and ``run_chaos``).
"""

from broker_sim.chaos.processes import JournalRunner, read_journal
from broker_sim.chaos.run import ChaosRun, run_chaos
from broker_sim.chaos.schedule import (
    DEFAULT_FAULT_KINDS,
    EXCLUSIVE,
    FAULT_KINDS,
    GROUP,
    ChaosOptions,
    Fault,
    broker_id,
    left_out,
    make_schedule,
    task_id,
)
from broker_sim.chaos.sinks import committed_files, pipeline_spec, sink_ids
from broker_sim.chaos.summary import ChaosSummary, Placement, Sample, Verdict, format_summary

__all__ = [
    "ChaosOptions",
    "ChaosRun",
    "ChaosSummary",
    "DEFAULT_FAULT_KINDS",
    "EXCLUSIVE",
    "FAULT_KINDS",
    "Fault",
    "GROUP",
    "JournalRunner",
    "Placement",
    "Sample",
    "Verdict",
    "broker_id",
    "committed_files",
    "format_summary",
    "left_out",
    "make_schedule",
    "pipeline_spec",
    "read_journal",
    "run_chaos",
    "sink_ids",
    "task_id",
]
