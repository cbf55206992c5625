"""Cluster-wide commands: ``status``, ``broker list|shutdown``, ``group describe``, ``rebalance``, ``watch``."""

from __future__ import annotations

import time
from typing import Any

import click

from cli.common import Ctx, LazyCommand, LazyGroup, UserError, clip, complete_names, pass_ctx, table, to_dict, when
from cli.progress import waiting
from controller.protocol.cluster.roll_plan import DEFAULT_WARMUP_S, DEFAULT_WAVE, MAX_WARMUP_S, MAX_WAVE
from controller.protocol.records.codecs import to_jsonable

WAIT_HELP = "wait until it is done (bounded by --timeout); exit 1 if it is not"


def session_text(session: dict[str, Any] | None) -> str:
    """A broker's session as one cell: ``ready 9.8s`` (its start took that), ``starting 4s`` (for that long),
    ``lazy``, ``failed``; empty for a runner without one."""
    if not session:
        return ""
    state = str(session.get("state", "?"))
    if state == "ready" and isinstance(session.get("startup_s"), (int, float)):
        return f"ready {session['startup_s']:.1f}s"
    if state == "starting" and isinstance(session.get("since"), (int, float)):
        return f"starting {max(0.0, time.time() - session['since']):.0f}s"
    return state


@click.command("status")
@click.option("--full", is_flag=True, help="count every task's spec, owner and status (reads O(tasks) znodes)")
@pass_ctx
def status(ctx: Ctx, full: bool) -> None:
    """The controller, brokers, groups and tasks at a glance.

    Task counts come from the active controller's summary (seconds old at most) unless --full, or there is no
    controller, or the summary is stale: then every task is read, and the output says so."""
    st = ctx.admin().status(full=full)
    if ctx.json_out:
        ctx.emit(to_dict(st))
        return
    m = st.maintenance
    if m and m.get("on"):
        click.echo(
            f"MAINTENANCE MODE since {when(m['since'])} (by {m['by']}): {m['reason']}"
            " -- nothing moves; tasks of lost brokers wait"
        )
    c = st.controller
    if c:
        click.echo(f"Controller: {c['controller_id']} on {c['host']} (epoch {c['epoch']}, since {when(c['since'])})")
    else:
        click.echo(
            f"Controller: none active (last epoch {st.controller_epoch if st.controller_epoch is not None else '-'})"
        )
    click.echo(f"\nBrokers ({len(st.brokers)}):")
    if st.brokers:
        click.echo(
            table(
                ["ID", "EPOCH", "GROUP", "HOST", "PID", "RUNNER", "SESSION", "CAP", "RACK", "TASKS", "SHUTDOWN"],
                [
                    [
                        b.broker_id,
                        b.epoch,
                        b.group,
                        b.host,
                        b.pid,
                        b.runner,
                        session_text(b.session),
                        b.capacity,
                        b.rack,
                        b.tasks,
                        "requested" if b.shutting_down else "",
                    ]
                    for b in st.brokers
                ],
            )
        )
    click.echo(f"\nGroups ({len(st.groups)}):")
    if st.groups:
        click.echo(
            table(
                [
                    "GROUP",
                    "STATE",
                    "GEN",
                    "PROTOCOL",
                    "ASSIGNOR",
                    "LEADER",
                    "MEMBERS",
                    "MOVING",
                    "WAITING",
                    "IMBALANCE",
                    "REASON",
                ],
                [
                    [
                        g.group,
                        g.state or f"? {clip(g.error, 30)}",
                        g.generation,
                        g.protocol,
                        g.assignor,
                        g.leader,
                        len(g.members),
                        g.moving,
                        g.deferred,
                        "-" if g.imbalance is None else g.imbalance,
                        clip(g.reason, 40),
                    ]
                    for g in st.groups
                ],
            )
        )
    for g in st.groups:
        for line in g.ignored:
            click.echo(f"group {g.group}: ignoring member {clip(line, 160)}")
        if g.starting:
            click.echo(f"group {g.group}: tasks still starting on {clip(', '.join(g.starting), 160)}")
    t = st.tasks
    states = ", ".join(f"{k} {v}" for k, v in t["by_state"].items()) or "none"
    if t["by_status"] is None:
        runs = "see --full"
    else:
        runs = ", ".join(f"{k} {v}" for k, v in t["by_status"].items()) or "none"
    longest = f", longest {max(0.0, time.time() - t['unassigned_oldest']):.0f}s" if t.get("unassigned_oldest") else ""
    click.echo(
        f"\nTasks: {t['total']} (spec: {states}; reported: {runs}; UNASSIGNED {t['unowned']}{longest}"
        + (f"; invalid {t['invalid']}" if t["invalid"] else "")
        + (f"; deleting {t['deleting']}" if t["deleting"] else "")
        + ")"
    )
    if st.source == "summary":
        click.echo(
            f"(counts from the controller's summary, {st.summary_age:.1f}s old; UNASSIGNED: not in an assignment)"
        )
    else:
        click.echo(f"(counts from a full read of every task: {st.fallback or 'asked for'})")
    pending = {k: v for k, v in st.pending.items() if v}
    if pending:
        click.echo("Pending admin requests: " + ", ".join(f"{k} {v}" for k, v in pending.items()))


# ---- brokers --------------------------------------------------------------------------------------
@click.group("broker", cls=LazyGroup)
def broker() -> None:
    """Brokers (workers): list them, shut one down, or run one here."""


broker.add_lazy(
    "run", LazyCommand("cli.run", "broker_run", "Run a broker: register, join the group, run the assigned pipelines.")
)


@broker.command("list")
@pass_ctx
def broker_list(ctx: Ctx) -> None:
    """Live brokers with their epoch (the registration's czxid) and the tasks they hold."""
    views = ctx.admin().brokers()
    if ctx.json_out:
        ctx.emit(to_dict(views))
        return
    if not views:
        click.echo("No live brokers.")
        return
    click.echo(
        table(
            [
                "ID",
                "EPOCH",
                "GROUP",
                "HOST",
                "PID",
                "RUNNER",
                "SESSION",
                "CAP",
                "RACK",
                "INSTANCE",
                "TASKS",
                "LOAD",
                "CPU%",
                "RSS",
                "SHUTDOWN",
                "SINCE",
                "CHECKPOINTS",
            ],
            [
                [
                    b.broker_id,
                    b.epoch,
                    b.group,
                    b.host,
                    b.pid,
                    b.runner,
                    session_text(b.session),
                    b.capacity,
                    b.rack,
                    b.instance_id,
                    b.tasks,
                    *load_columns(b.load),
                    "requested" if b.shutting_down else "",
                    when(b.since),
                    clip(b.checkpoint_root, 80) if b.checkpoint_root else "-",
                ]
                for b in views
            ],
        )
    )


def load_columns(load: dict[str, Any] | None) -> list[str]:
    """LOAD (the sum of its tasks' load shares), CPU% (of one core) and RSS of a broker's load report."""
    if not load:
        return ["", "", ""]
    cpu, rss = load.get("cpu_percent"), load.get("rss_mb")
    return [
        f"{load.get('load', 0):.2f}",
        "" if cpu is None else f"{cpu:.0f}",
        "" if rss is None else f"{rss:.0f}M",
    ]


@broker.command("describe")
@click.argument("broker_id", shell_complete=complete_names("broker"))
@pass_ctx
def broker_describe(ctx: Ctx, broker_id: str) -> None:
    """One live broker: its registration, where it keeps checkpoints, the tasks it holds and its measured load
    (CPU, memory, each task's load share)."""
    views = [b for b in ctx.admin().brokers() if b.broker_id == broker_id]
    if not views:
        raise UserError(f"no live broker {clip(broker_id, 200)!r}")
    b = views[0]
    if ctx.json_out:
        ctx.emit(to_dict(b))
        return
    rows = [
        ("Broker", b.broker_id),
        ("Epoch", b.epoch),
        ("Group", b.group),
        ("Host", b.host),
        ("Pid", b.pid),
        ("Runner", b.runner),
        ("Session", session_text(b.session)),
        ("Capacity", b.capacity),
        ("Rack", b.rack),
        ("Instance", b.instance_id),
        ("Checkpoints", b.checkpoint_root or "- (answers no storage requests)"),
        ("Tasks", b.tasks),
        ("Shutdown", "requested" if b.shutting_down else "-"),
        ("Since", when(b.since)),
    ]
    if b.error:
        rows.append(("Error", b.error))
    load = b.load or {}
    if b.load is None:
        rows.append(("Load", "not reported"))
    else:
        load_, cpu, rss = load_columns(b.load)
        mem = load.get("memory_percent")
        rows.append(("Load", f"{load_} (sum of its tasks' load shares)"))
        rows.append(("CPU", f"{cpu or '-'}% of one core (with its child processes)"))
        rows.append(("Memory", f"{rss or '-'} resident" + ("" if mem is None else f", {mem:.1f}% of the host")))
        shares = sorted(load.get("tasks", {}).items(), key=lambda kv: (-kv[1], kv[0]))
        rows.append(("Task loads", ", ".join(f"{t} {v:.2f}" for t, v in shares) or "none reported"))
        if load.get("problems"):
            rows.append(("Repaired", "; ".join(load["problems"])))
    width = max(len(k) for k, _ in rows) + 1
    click.echo("\n".join(f"{k + ':':<{width}} {clip(str(v if v is not None else '-'), 600)}" for k, v in rows))


@broker.command("shutdown")
@click.argument("broker_id", shell_complete=complete_names("broker"))
@click.option("--wait", is_flag=True, help=WAIT_HELP)
@click.option("--timeout", type=click.FloatRange(min=0), default=60.0, show_default=True, help="seconds, with --wait")
@pass_ctx
def broker_shutdown(ctx: Ctx, broker_id: str, wait: bool, timeout: float) -> None:
    """Controlled shutdown: move the broker's tasks away; the broker exits once it holds none."""
    with waiting(f"waiting for {broker_id} to hand over its tasks", timeout, "moved", wait, ctx.json_out) as p:
        req = ctx.admin().shutdown_broker(broker_id, wait=timeout if wait else 0.0, progress=p)
    if wait and not req.done:
        raise UserError(f"broker {broker_id} still holds tasks after {timeout:g}s")
    human = (
        f"Broker {broker_id} holds no tasks any more"
        if req.done
        else f"Controlled shutdown of {broker_id} {'already ' if req.already_pending else ''}requested"
    )
    ctx.emit(to_dict(req), "\n".join([human] + [f"note: {n}" for n in req.notes]))


def _roll_line(st: Any) -> str:
    if st is None:
        return "No roll was asked for."
    step = min(st.step + 1, len(st.order))
    batch = ", ".join(st.batch_now())
    where = f"step {step}/{len(st.order)}" + (f" ({batch})" if batch else "")
    why = f": {st.reason}" if st.reason else ""
    return f"Roll of group {st.group}: {st.phase}, {where}, {st.moves} task moves so far{why}"


@broker.command("roll")
@click.option("--group", "group_name", default="default", show_default=True, help="the group whose brokers roll")
@click.option("--batch", type=click.IntRange(min=1), default=1, show_default=True, help="brokers down at a time")
@click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=300.0,
    show_default=True,
    help="seconds a batch may take to come back before the roll pauses itself",
)
@click.option(
    "--wave",
    type=click.IntRange(0, MAX_WAVE),
    default=DEFAULT_WAVE,
    show_default=True,
    help="at most this many tasks moving at once (0: a step's tasks all at once); at most a broker's start "
    "threads, so that no task waits behind others to start",
)
@click.option(
    "--warmup",
    type=click.FloatRange(0, MAX_WARMUP_S),
    default=DEFAULT_WARMUP_S,
    show_default=True,
    help="seconds each step's first wave waits for the brokers receiving its tasks to prepare their starts "
    "(the tasks run where they are meanwhile; 0: no wait)",
)
@click.option(
    "--move-first/--in-place",
    default=True,
    show_default=True,
    help="the first batch's tasks move away before it goes down (more moves, none down for its restart), or "
    "wait for its restart in place (fewest moves, those tasks down for the restart)",
)
@click.option("--resume", is_flag=True, help="go on with a paused roll")
@click.option("--status", "status_only", is_flag=True, help="where the roll stands")
@pass_ctx
def broker_roll(
    ctx: Ctx,
    group_name: str,
    batch: int,
    timeout: float,
    wave: int,
    warmup: float,
    move_first: bool,
    resume: bool,
    status_only: bool,
) -> None:
    """Planned roll: the controller restarts the group's brokers a batch at a time, moving each batch's tasks
    to brokers already rolled before it goes down and waiting until it is back (restarted by its supervisor,
    same id, joined, the group Stable)."""
    admin = ctx.admin()
    if status_only:
        st = admin.roll_status()
    elif resume:
        st = admin.resume_roll()
    else:
        st = admin.roll(group_name, batch=batch, timeout_s=timeout, wave=wave, warmup_s=warmup, in_place=not move_first)
    ctx.emit(to_jsonable(st) if st is not None else None, _roll_line(st))


# ---- groups ---------------------------------------------------------------------------------------
@click.group("group")
def group() -> None:
    """Worker groups."""


@group.command("list")
@pass_ctx
def group_list(ctx: Ctx) -> None:
    """Worker groups, one per line: state, generation, protocol, leader, members and runnable tasks."""
    groups = ctx.admin().describe_group(None)
    rows = [
        {
            "group": d.summary.group,
            "state": d.summary.state,
            "generation": d.summary.generation,
            "protocol": d.summary.protocol,
            "assignor": d.summary.assignor,
            "leader": d.summary.leader,
            "members": len(d.members),
            "live_members": sum(1 for m in d.members if m.live),
            "tasks": d.tasks,
        }
        for d in groups
    ]
    if ctx.json_out:
        ctx.emit(rows)
        return
    if not rows:
        click.echo("No groups.")
        return
    click.echo(
        table(
            ["GROUP", "STATE", "GENERATION", "PROTOCOL", "ASSIGNOR", "LEADER", "MEMBERS", "TASKS"],
            [
                [
                    r["group"],
                    r["state"],
                    r["generation"],
                    r["protocol"],
                    r["assignor"],
                    r["leader"],
                    f"{r['live_members']}/{r['members']}",
                    r["tasks"],
                ]
                for r in rows
            ],
        )
    )


@group.command("describe")
@click.argument("name", required=False, shell_complete=complete_names("group"))
@pass_ctx
def group_describe(ctx: Ctx, name: str | None) -> None:
    """A group's state, generation, protocol and leader; per member its join request, assignment and the
    tasks it holds (all groups without NAME)."""
    groups = ctx.admin().describe_group(name)
    if ctx.json_out:
        ctx.emit(to_dict(groups))
        return
    if not groups:
        click.echo("No groups.")
        return
    for i, d in enumerate(groups):
        s = d.summary
        if i:
            click.echo("")
        click.echo(
            f"Group {s.group}: {s.state or '?'} generation {s.generation if s.generation is not None else '-'}"
            f" (join generation {s.join_generation if s.join_generation is not None else '-'}), protocol {s.protocol or '-'},"
            f" assignor {s.assignor or '-'}, leader {s.leader or '-'}, {d.tasks} runnable tasks"
        )
        if s.reason:
            click.echo(f"  reason: {s.reason}")
        if s.error:
            click.echo(f"  error: {s.error}")
        rows = []
        for m in d.members:
            req, asg = m.request or {}, m.assignment or {}
            rows.append(
                [
                    m.member_id,
                    m.live,
                    req.get("join_generation"),
                    ",".join(req.get("protocols", ())) or None,
                    ("yes" if req.get("leaving") else ""),
                    asg.get("generation"),
                    clip(",".join(asg.get("assigned", ())), 40) if m.assignment else None,
                    clip(",".join(asg.get("revoked", ())), 30) if m.assignment else None,
                    clip(",".join(m.owns), 40),
                    asg.get("error") or (clip(m.error, 40) if m.error else None),
                ]
            )
        if rows:
            click.echo(
                table(
                    [
                        "MEMBER",
                        "LIVE",
                        "JOIN-GEN",
                        "PROTOCOLS",
                        "LEAVING",
                        "ASSIGNED-GEN",
                        "ASSIGNED",
                        "REVOKED",
                        "HOLDS",
                        "ERROR",
                    ],
                    rows,
                )
            )
        else:
            click.echo("  no members")


@click.command("rebalance")
@click.option(
    "--group",
    "group_name",
    default=None,
    shell_complete=complete_names("group"),
    show_default="every group",
    help="only this group",
)
@click.option("--reason", default="manual", show_default=True)
@click.option(
    "--preferred",
    is_flag=True,
    help="restore the preferred placement (the assignor's layout from scratch), in waves as the move throttle allows",
)
@click.option("--wait", is_flag=True, help="wait until every affected group is Stable at a newer generation")
@click.option("--timeout", type=click.FloatRange(min=0), default=60.0, show_default=True, help="seconds, with --wait")
@click.option(
    "--dry-run",
    is_flag=True,
    help="ask for nothing: show what the load-balanced assignor would move now, and why (which broker is over, by how much)",
)
@pass_ctx
def rebalance(
    ctx: Ctx, group_name: str | None, reason: str, preferred: bool, wait: bool, timeout: float, dry_run: bool
) -> None:
    """Ask the controller for a rebalance of one group or all of them."""
    if dry_run:
        plans = ctx.admin().load_plans(group_name)
        lines = []
        for lp in plans:
            note = "" if lp.assignor == "load-balanced" else f" (its assignor is {lp.assignor or '-'}: not applied)"
            lines += [f"Group {lp.group}: by measured load{note}"] + ["  " + line for line in lp.plan.explain()]
        ctx.emit([lp.to_dict() for lp in plans], "\n".join(lines) or "No groups.")
        return
    what = f"waiting for {'group ' + group_name if group_name else 'every group'} to be Stable with every move done"
    with waiting(what, timeout, "groups", wait, ctx.json_out) as p:
        req = ctx.admin().rebalance(
            group_name, reason=reason, wait=timeout if wait else 0.0, preferred=preferred, progress=p
        )
    if wait and not req.done:
        raise UserError(f"rebalance of {group_name or 'all groups'} not finished within {timeout:g}s")
    what = f"group {group_name}" if group_name else "all groups"
    human = f"Rebalance of {what} done" if req.done else f"Rebalance of {what} requested ({req.path.rsplit('/', 1)[1]})"
    ctx.emit(to_dict(req), "\n".join([human] + [f"note: {n}" for n in req.notes]))


@click.command("watch")
@click.option(
    "--duration", type=click.FloatRange(min=0), default=None, show_default="until Ctrl-C", help="stop after S seconds"
)
@click.option("--count", type=click.IntRange(min=1), default=None, help="stop after N events")
@pass_ctx
def watch(ctx: Ctx, duration: float | None, count: int | None) -> None:
    """Print cluster events as they happen (from ZooKeeper watches): controller changes, brokers joining
    and leaving, group state/generation changes, tasks created/deleted/paused/resumed, owner moves."""
    try:
        for e in ctx.admin().watch(duration=duration, max_events=count):
            if e is None:  # a keep-alive, only yielded when asked for one (idle_s)
                continue
            if ctx.json_out:
                if ctx.output == "yaml":
                    click.echo("---")  # one YAML document per event (json: one line per event)
                ctx.emit(to_dict(e))
            else:
                stamp = time.strftime("%H:%M:%S", time.localtime(e.time)) + f".{int(e.time * 1000) % 1000:03d}"
                click.echo(f"{stamp}  {e.kind:<14} {e.message}")
    except KeyboardInterrupt:
        pass
