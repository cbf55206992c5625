"""Fault injection: how each fault kind of the schedule is begun against the run's brokers, controllers
and ZooKeeper, and what ends it. ``INJECTORS`` is the table of kinds, one entry each: a new kind is one
function and one entry here (and, in ``schedule``, its weight and how long it lasts); the player and the
checks do not change.

An injector receives the run through a small Protocol of the members it uses (``ChaosCluster``, the run
as ``begin`` sees it, is all of them), begins its fault and returns what ends it (called ``duration``
later), or None when nothing is left to undo. When the engine refuses the fault now (its target process
already gone, no active controller, ZooKeeper refusing the write) it raises ``FaultRefused`` with the engine's message, having changed nothing: the fault is recorded as
not injected and the run is judged without it (``broker_sim.sim.injection``)."""

from __future__ import annotations

import json
import logging
import signal
import threading
import time
import zlib
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from kazoo.exceptions import KazooException

from broker_sim.chaos.schedule import GROUP, ChaosOptions, Fault, broker_id, task_id
from broker_sim.chaos.write_stall import WriteStall
from broker_sim.sim.injection import FaultRefused
from controller.admin import AdminClient, AdminError
from controller.protocol.cluster.layout import ZkLayout
from controller.protocol.group.rules import protocols_for
from controller.protocol.records import codecs, group_messages
from controller.protocol.tasks.spec import NoopPipeline, TaskSpec
from controller.zk.client import ZkSettings, make_client

if TYPE_CHECKING:
    from kazoo.client import KazooClient

    from broker_sim.chaos.ensemble import ChaosEnsemble
    from broker_sim.chaos.processes import ChaosProcess
    from broker_sim.sim.netproxy import NetProxy
    from broker_sim.worker import Worker
    from controller.daemon import Controller
    from controller.zk.server import ZooKeeperServer

log = logging.getLogger(__name__)

End = Callable[[], None]


# ---- what each fault reaches of the run -----------------------------------------------------------------
# One small Protocol per injector (or family of injectors), of exactly the members it uses; ChaosCluster,
# the run as ``begin`` sees it, is all of them together.
class Options(Protocol):
    copts: ChaosOptions


class Brokers(Options, Protocol):
    """The run's brokers: in this process (``workers``) or as processes (``broker_procs``)."""

    workers: dict[str, Worker]
    broker_procs: dict[str, ChaosProcess]


class BrokerProxies(Protocol):
    proxies: dict[str, NetProxy]


class BrokerLifecycle(Brokers, Protocol):
    """A broker stopped and started again."""

    def new_broker(self, bid: str) -> None: ...

    def broker_gone(self, bid: str, died_at: float | None) -> None: ...


class BrokerKill(BrokerLifecycle, Protocol):
    def kill(self, bid: str) -> None: ...


class BrokerFreeze(Brokers, BrokerProxies, Protocol):
    pauses: dict[str, threading.Event]


class StopWedge(Brokers, BrokerProxies, Protocol):
    #: wedged-stop faults whose broker ran a task as it was cut off: each must end in a halt (a broker with
    #: nothing to stop has no stop to hang in, and fences without one)
    wedged_busy: int

    def runs_tasks(self, bid: str) -> bool: ...


class Bounce(BrokerLifecycle, Protocol):
    def leave(self, bid: str) -> None: ...

    def controlled_shutdown(self, bid: str, timeout: float = 60.0) -> bool: ...

    def sleep(self, seconds: float) -> bool:
        """Wait ``seconds``; True if the run is stopping meanwhile."""
        ...

    def wait_stable(self, timeout: float) -> bool: ...


class Controllers(Options, Protocol):
    """The run's controllers: in this process (``controllers``) or as processes (``ctl_procs``)."""

    controllers: list[Controller]
    ctl_procs: dict[str, ChaosProcess]

    def active_controller_id(self) -> str | None: ...


class ControllerKill(Controllers, Protocol):
    def new_controller(self) -> str: ...


class ControllerFreeze(Controllers, Protocol):
    ctl_proxies: dict[str, NetProxy]
    write_stalls: dict[str, WriteStall]


class SingleServer(Protocol):
    server: ZooKeeperServer | None


class Ensemble(Protocol):
    #: the run's own ensemble (``--ensemble 3``), else None
    ensemble: ChaosEnsemble | None


class QuorumLoss(Ensemble, Options, Protocol):
    #: per quorum loss: how long after the quorum was back every task ran again (None: not within the bound)
    quorum_returns: list[float | None]

    def tasks_running_within(self, timeout: float) -> float | None:
        """Seconds until every RUNNING task runs on exactly one live broker (None: not within ``timeout``)."""
        ...


class Operator(Protocol):
    @property
    def admin_ops(self) -> AdminClient: ...


class Maintenance(Operator, Protocol):
    maintenance_windows: list[list[float | None]]


class ZkReader(Protocol):
    admin: KazooClient
    layout: ZkLayout


class GhostMember(ZkReader, Options, Protocol):
    ghosts: list[str]

    def settings(self, hosts: str | None = None) -> ZkSettings: ...


class ReportRewrite(ZkReader, Brokers, Protocol):
    rewritten: dict[str, float]


class ChaosCluster(
    BrokerKill,
    BrokerFreeze,
    StopWedge,
    Bounce,
    ControllerKill,
    ControllerFreeze,
    SingleServer,
    QuorumLoss,
    Maintenance,
    GhostMember,
    ReportRewrite,
    Protocol,
):
    """What a fault reaches of a chaos run: its brokers and controllers (processes, or in this process)
    with their proxies, its ZooKeeper, and the operations that stop, replace or wait for them."""


Injector = Callable[[ChaosCluster, Fault], "End | None"]


# ---- brokers ------------------------------------------------------------------------------------------
def kill_broker(run: BrokerKill, f: Fault) -> End:
    """kill -9 of a process broker (an in-process one closes its session at once); back after the fault."""
    if run.copts.process_brokers:
        run.broker_gone(f.target, _live_process(run.broker_procs, f.target).kill9())
    else:
        if f.target not in run.workers:
            raise FaultRefused(f"broker {f.target} is not running (it is down already)")
        run.kill(f.target)
    return lambda: run.new_broker(f.target)


def cut_off_broker(run: BrokerProxies, f: Fault) -> End:
    """The broker's network silent for the fault's duration: a partition, or past the session (an expiry)."""
    proxy = run.proxies[f.target]
    proxy.partition()
    return _reconnect(proxy)


def freeze_broker(run: BrokerFreeze, f: Fault) -> End:
    """SIGSTOP of a process broker (SIGCONT at the end); in process: its threads and its network frozen."""
    if run.copts.process_brokers:
        return _stop_process(_live_process(run.broker_procs, f.target))
    if f.target not in run.workers:
        raise FaultRefused(f"broker {f.target} is not running (it is down already)")
    pause = run.pauses[f.target]
    proxy = run.proxies[f.target]
    pause.set()
    proxy.partition()
    reconnect = _reconnect(proxy)

    def thaw() -> None:
        reconnect()
        pause.clear()

    return thaw


def wedge_stops(run: StopWedge, f: Fault) -> End:
    """Its runner's stops hang from now on, and it is cut off: the fence's stops hang, so it must halt (exit
    75, or an in-process kill) before its session expires; the supervisor restarts it."""
    if run.copts.process_brokers:
        proc = _live_process(run.broker_procs, f.target)
        if not proc.signal(signal.SIGUSR2, group=False):
            raise FaultRefused(f"broker {f.target}'s process {proc.pid} is gone: no signal delivered")
    else:
        if f.target not in run.workers:
            raise FaultRefused(f"broker {f.target} is not running (it is down already)")
        run.workers[f.target].runner.wedge(True)  # type: ignore[attr-defined]  # the no-op runner's hook
    end = cut_off_broker(run, f)
    if run.runs_tasks(f.target):
        run.wedged_busy += 1
    return end


def rolling_bounce(run: Bounce, f: Fault) -> None:
    """Every broker in turn leaves (controlled shutdown or plain stop), stays away 1 s, comes back; the next
    one goes once the group is Stable again (bounded by the rebalance timeout). Over when this returns."""
    o = run.copts
    for i in range(o.brokers):
        bid = broker_id(i)
        if o.process_brokers:
            proc = run.broker_procs.get(bid)
            if proc is not None:
                if f.controlled:
                    proc.terminate(o.rebalance_timeout_s + o.session_timeout_s + 5)
                    run.broker_gone(bid, proc.reap_group())
                else:
                    run.broker_gone(bid, proc.kill9())
        elif bid in run.workers:
            if f.controlled:
                run.controlled_shutdown(bid, timeout=o.rebalance_timeout_s + o.session_timeout_s + 5)
            else:
                run.leave(bid)
        if run.sleep(1.0):
            return
        run.new_broker(bid)
        run.wait_stable(o.rebalance_timeout_s + o.session_timeout_s)


# ---- controllers --------------------------------------------------------------------------------------
def kill_controller(run: ControllerKill, f: Fault) -> End:
    """kill -9 (in process: a stop) of the active controller; a new candidate starts after the fault."""
    cid = run.active_controller_id()
    if run.copts.process_brokers:
        proc = run.ctl_procs.pop(cid, None) if cid else None
        if proc is None:
            raise FaultRefused(f"no active controller process of this run to kill (/controller names {cid})")
        proc.kill9()
    else:
        ctl = next((c for c in run.controllers if c.id == cid), None)
        if ctl is None:
            raise FaultRefused(f"no active controller of this run to kill (/controller names {cid})")
        run.controllers.remove(ctl)
        ctl.stop()

    def new_candidate() -> None:
        run.new_controller()

    return new_candidate


def freeze_controller(run: ControllerFreeze, f: Fault) -> End:
    """SIGSTOP of the active controller's process; in process: its event thread stalls at its next write and
    its network goes silent."""
    cid = run.active_controller_id()
    if cid is None:
        raise FaultRefused("no active controller to freeze")
    if run.copts.process_brokers:
        proc = run.ctl_procs.get(cid)
        if proc is None:  # /controller still names one we killed: its session has not expired yet
            raise FaultRefused(f"the active controller {cid} is one this run killed (its session has not expired)")
        return _stop_process(proc)
    ctl = next((c for c in run.controllers if c.id == cid), None)
    if ctl is None:
        raise FaultRefused(f"the active controller {cid} is one this run stopped (its session has not expired)")
    proxy = run.ctl_proxies[cid]
    stall = threading.Event()
    limit = f.duration + 10.0

    def stall_write() -> None:  # the event thread stops at its next write
        stall.wait(limit)

    run.write_stalls[cid].hold(stall_write)
    proxy.partition()
    reconnect = _reconnect(proxy)

    def resume() -> None:
        reconnect()
        run.write_stalls[cid].release()
        stall.set()

    return resume


# ---- the cluster --------------------------------------------------------------------------------------
def restart_zookeeper(run: SingleServer, f: Fault) -> End:
    """SIGKILL of the run's own ZooKeeper server, started again on the same data after the fault."""
    server = run.server
    assert server is not None
    server.kill()

    def start_again() -> None:
        server.start(timeout=60)

    return start_again


# ---- the ensemble ---------------------------------------------------------------------------------------
def _ensemble(run: Ensemble) -> ChaosEnsemble:
    if run.ensemble is None:
        raise FaultRefused("the run has no ensemble of its own (--ensemble 3)")
    return run.ensemble


def kill_zk_server(run: Ensemble, f: Fault) -> End:
    """SIGKILL of the ensemble's leader (or of a follower, drawn by the fault's time); started again, on the
    same data, after the fault. Refused while no server is in that role (an election under way)."""
    ens = _ensemble(run)
    sid = ens.pick(f.target, int(f.at * 1000))
    ens.kill(sid)
    log.warning("chaos: ZooKeeper server %d (%s) killed", sid, f.target)
    return lambda: ens.restart([sid])


def lose_quorum(run: QuorumLoss, f: Fault) -> End:
    """Two of three servers killed (the leader and a follower) for longer than a session: nobody can renew a
    session meanwhile. At the end both start again; every task must then run again within the convergence
    bound of the quorum's return (measured here, judged by verdict 12)."""
    ens = _ensemble(run)
    victims = [ens.pick("leader"), ens.pick("follower", int(f.at * 1000))]
    for sid in victims:
        ens.kill(sid)
    log.warning("chaos: ZooKeeper servers %s killed: the quorum is lost", victims)

    def quorum_back() -> None:
        ens.restart(victims)
        run.quorum_returns.append(run.tasks_running_within(run.copts.convergence_bound_s))

    return quorum_back


def isolate_zk_server(run: Ensemble, f: Fault) -> End:
    """The leader (or a follower) cut off from its peers, both ways, while its clients still reach it: it
    stops serving (no quorum), its clients must renew their sessions through the others or fence by their
    deadline."""
    ens = _ensemble(run)
    sid = ens.pick(f.target, int(f.at * 1000))
    ens.isolate(sid)
    log.warning("chaos: ZooKeeper server %d (%s) cut off from its peers", sid, f.target)
    return lambda: ens.rejoin(sid)


def maintenance(run: Maintenance, f: Fault) -> End:
    """Maintenance mode on for the fault's duration; its window is kept for the 'nothing moves' verdict."""
    run.admin_ops.set_maintenance(True, f"chaos {f.at:.2f}")
    window: list[float | None] = [time.time(), None]
    run.maintenance_windows.append(window)

    def maintenance_off() -> None:
        window[1] = time.time()
        run.admin_ops.set_maintenance(False, "chaos: over")

    return maintenance_off


def task_storm(run: Operator, f: Fault) -> None:
    """Tasks created and deletions requested through the admin library, as an operator would."""
    admin = run.admin_ops
    if f.create:
        admin.create_tasks(
            [TaskSpec(id=task_id(f.prefix, i), pipeline=NoopPipeline(kind="noop")) for i in range(f.create)]
        )
    for t in f.delete:
        try:
            admin.delete_task(t)
        except AdminError:
            pass  # already gone


# ---- hostile members -------------------------------------------------------------------------------------
#: a generation (and epoch) no real group reaches: 2^72, past any 64-bit counter
ABSURD = 2**72
#: a ghost's generation: huge, yet within the bounds a report is held to, so only "no broker behind it" refuses it
GHOST_GENERATION = 2**40


def ghost_member(run: GhostMember, f: Fault) -> End:
    """A member znode with no broker behind it, ephemeral on a session of its own (any client on an open
    root, or a buggy broker), at a huge generation that still decodes (``GHOST_GENERATION``): it claims the
    tasks the target broker was assigned ("claims") or nothing ("nothing"). Its session ends with the fault,
    and the znode with it."""
    member = f"ghost-{int(f.at * 1000)}"
    claimed: tuple[str, ...] = ()
    if f.variant == "claims":
        try:
            data, _ = run.admin.get(run.layout.group_assignment(GROUP, f.target))
            claimed = codecs.decode(group_messages.Assignment, data).assigned
        except Exception:
            claimed = ()  # the target has no assignment now: the ghost claims nothing
    body = codecs.to_jsonable(
        group_messages.JoinRequest(
            member_id=member,
            join_generation=GHOST_GENERATION,
            generation=GHOST_GENERATION,
            protocols=protocols_for(run.copts.protocol),
            assignors=("cooperative-sticky",),
            owned=claimed,
            incarnation=member,
        )
    )
    body["version"] = codecs.SCHEMA_VERSION
    client = make_client(run.settings())
    try:
        client.create(run.layout.group_member(GROUP, member), _raw(body), ephemeral=True)
    except Exception:
        client.stop()
        client.close()
        raise
    run.ghosts.append(member)
    log.warning("chaos: ghost member %s claims %s", member, list(claimed) or "nothing")

    def vanish() -> None:
        client.stop()  # the session ends: ZooKeeper removes the ghost's znode
        client.close()

    return vanish


def rewrite_report(run: ReportRewrite, f: Fault) -> None:
    """One write over a live member's report (its ephemeral znode, by another client), with absurd fields:
    every generation and epoch 2^72 ("generation"), lists of 40,000 names ("huge-lists"), names that are not
    names ("bad-names"). Nothing undoes it: the member must be told, and rejoin. A target that is not a member
    now (killed, frozen past its session) is replaced by the first broker that is."""
    # the target, or (killed or away now) the first other broker that is a member: the schedule cannot know
    target = next((b for b in [f.target, *sorted(run.broker_procs or run.workers)] if _report_of(run, b)), None)
    if target is None:
        raise FaultRefused("no member has a report to rewrite")
    path = run.layout.group_member(GROUP, target)
    body = _report_of(run, target)
    assert body is not None
    if f.variant == "generation":
        body = _absurd_counters(body)
    elif f.variant == "huge-lists":
        body["owned"] = [f"task-{i:05d}" for i in range(40_000)]
        body["assignors"] = [f"assignor-{i}" for i in range(5_000)]
    else:  # bad-names
        body["member_id"] = "../brokers/ids/" + f.target
        body["owned"] = ["", "../../controller", "a/b", "x\u0000y", "é" * 300, *list(body.get("owned") or ())]
        body["instance_id"] = " not a name "
    run.admin.set(path, _raw(body))
    run.rewritten[target] = time.time()
    log.warning("chaos: %s's report rewritten (%s)", target, f.variant)


def _report_of(run: ZkReader, member: str) -> dict[str, Any] | None:
    """A member's report as plain JSON (None if it has none, or one that is not an object)."""
    try:
        data, _ = run.admin.get(run.layout.group_member(GROUP, member))
    except Exception:
        return None
    try:
        body = json.loads(zlib.decompress(data) if data[:1] != b"{" else data)
    except (ValueError, zlib.error):
        return None
    return body if isinstance(body, dict) else None


def _absurd_counters(body: dict[str, Any]) -> dict[str, Any]:
    """Every integer field that counts generations or epochs set to ``ABSURD``."""
    return {
        k: (ABSURD if ("generation" in k or "epoch" in k) and isinstance(v, int) and not isinstance(v, bool) else v)
        for k, v in body.items()
    }


def _raw(body: dict[str, Any]) -> bytes:
    """JSON as the codecs write it (compressed when large), without their checks: a hostile writer's bytes."""
    data = json.dumps(body, separators=(",", ":"), sort_keys=True).encode()
    return zlib.compress(data, 6) if len(data) > codecs.COMPRESS_ABOVE else data


def _reconnect(proxy: NetProxy) -> End:
    """What ends a silence: the connections cut (the client reconnects), then the proxy passing again."""

    def reconnect() -> None:
        proxy.reset()
        proxy.heal()

    return reconnect


def _live_process(procs: Mapping[str, ChaosProcess], name: str) -> ChaosProcess:
    """The live process of ``name``, or the engine's refusal: it is down (killed, halted, being restarted)."""
    proc = procs.get(name)
    if proc is None or not proc.alive():
        raise FaultRefused(f"{name} has no live process now (it is down already)")
    return proc


def _stop_process(proc: ChaosProcess) -> End:
    """SIGSTOP of its process group (SIGCONT at the end); refused when the process is gone by now."""
    if not proc.signal(signal.SIGSTOP):
        raise FaultRefused(f"SIGSTOP not delivered: {proc.name}'s process {proc.pid} is gone")
    proc.frozen = True

    def thaw() -> None:
        proc.frozen = False
        proc.signal(signal.SIGCONT)

    return thaw


#: every fault kind of the schedule and what injects it
INJECTORS: Mapping[str, Injector] = {
    "kill-broker": kill_broker,
    "expire-broker": cut_off_broker,
    "partition-broker": cut_off_broker,
    "freeze-broker": freeze_broker,
    "wedged-stop": wedge_stops,
    "rolling-bounce": rolling_bounce,
    "kill-controller": kill_controller,
    "freeze-controller": freeze_controller,
    "zk-restart": restart_zookeeper,
    "zk-kill-leader": kill_zk_server,
    "zk-kill-follower": kill_zk_server,
    "zk-lose-quorum": lose_quorum,
    "zk-isolate": isolate_zk_server,
    "maintenance": maintenance,
    "task-storm": task_storm,
    "ghost-member": ghost_member,
    "rewritten-report": rewrite_report,
}


def begin(run: ChaosCluster, f: Fault) -> End | None:
    """Inject ``f``; return what ends it (called ``f.duration`` later), if anything."""
    inject = INJECTORS.get(f.kind)
    if inject is None:
        raise ValueError(f"unknown fault kind {f.kind!r}")
    try:
        return inject(run, f)
    except (ProcessLookupError, KazooException) as exc:  # the kernel or ZooKeeper refused it: nothing done
        raise FaultRefused(f"{type(exc).__name__}: {exc}") from exc
