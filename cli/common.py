"""What every ``zkctl`` command shares: the context object, the one-line user error, error translation,
commands loaded when first used, tables and time formatting. Commands parse and print; ``controller.admin``
does the work.

Light on purpose: ``zkctl --version`` and ``zkctl --help`` import this module and nothing that talks to
ZooKeeper (kazoo, pydantic, the admin library are imported by the commands that use them)."""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from controller.protocol.cluster.layout import ZkLayout
from controller.protocol.errors import ZkcError

if TYPE_CHECKING:  # kazoo and what builds on it are imported by the commands that talk to ZooKeeper
    from kazoo.client import KazooClient

    from controller.admin import AdminClient
    from controller.zk.client import ZkSettings


class UserError(click.ClickException, ZkcError):
    """A mistake by the operator or a missing resource: printed as one line, exit code 1."""

    exit_code = 1

    def show(self, file: Any = None) -> None:
        click.echo(f"Error: {self.format_message()}", err=True)


def _one_line(text: str) -> str:
    return " ".join(text.split())


def user_message(exc: BaseException) -> str | None:
    """The one-line message for an exception that is the operator's problem, or None for a bug."""
    if isinstance(exc, ZkcError):
        return _one_line(str(exc)) if exc.user_facing else None
    # kazoo's errors, if kazoo was imported at all (a command that never imported it cannot have raised one)
    handler, errors = sys.modules.get("kazoo.handlers.threading"), sys.modules.get("kazoo.exceptions")
    if handler is not None and isinstance(exc, handler.KazooTimeoutError):
        return "ZooKeeper did not answer in time (is it running? check --zk / ZKC_ZK)"
    if errors is not None and isinstance(exc, errors.KazooException):
        detail = str(exc).strip()
        return f"ZooKeeper error: {type(exc).__name__}{': ' + _one_line(detail) if detail else ''}"
    return None


@dataclass(frozen=True)
class LazyCommand:
    """A command imported the first time it is used: the module and attribute that define it, and the first
    sentence of its help, which ``--help`` lists without importing it (a test keeps the two in step).

    ``optional``: the module may be absent (the command is then not offered) or broken (a stand-in command
    reports why, instead of taking every other command down)."""

    module: str
    attribute: str
    summary: str
    optional: bool = False

    def placeholder(self, name: str) -> click.Command:
        """A command that is only its help, to list it as click lists the real one."""
        return click.Command(name, help=self.summary, short_help=self.summary)

    def available(self) -> bool:
        return not self.optional or importlib.util.find_spec(self.module) is not None

    def load(self, name: str) -> click.Command | None:
        if not self.optional:
            command = getattr(importlib.import_module(self.module), self.attribute)
            assert isinstance(command, click.Command), (self.module, self.attribute)
            return command
        try:
            module = importlib.import_module(self.module)
        except ModuleNotFoundError as exc:
            if exc.name == self.module:
                return None
            error = f"{type(exc).__name__}: {exc}"
        except Exception as exc:  # a module with a bug must not take zkctl down
            error = f"{type(exc).__name__}: {exc}"
        else:
            command = getattr(module, self.attribute, None)
            if isinstance(command, click.Command):
                return command
            error = f"{self.module} defines no click command named {self.attribute!r}"
        return unavailable(name, error)


def unavailable(name: str, error: str) -> click.Command:
    """A stand-in for a command whose module cannot be imported: it says why (one line, exit 1)."""

    @click.command(
        name,
        context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
        help=f"(unavailable: {error})",
    )
    def stand_in() -> None:
        raise UserError(f"zkctl {name} is unavailable: {error}")

    return stand_in


class LazyGroup(click.Group):
    """A group whose commands may be ``LazyCommand``s: imported when invoked (or asked for their own help),
    listed by ``--help`` from their summary."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lazy: dict[str, LazyCommand] = {}

    def add_lazy(self, name: str, command: LazyCommand) -> None:
        if command.available():
            self.lazy[name] = command

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(self.commands) | set(self.lazy))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in self.lazy:
            command = self.lazy[cmd_name].load(cmd_name)  # kept: the summary stays what --help lists
            if command is not None:
                self.add_command(command, cmd_name)
        command = super().get_command(ctx, cmd_name)
        return with_output(command) if command is not None else None

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """As click lists commands, but a command not imported yet is listed from its summary."""
        names = self.list_commands(ctx)
        loaded = {n: self.commands[n] for n in names if n in self.commands}
        names = [n for n in names if n in self.lazy or not loaded[n].hidden]
        if not names:
            return
        limit = formatter.width - 6 - max(len(n) for n in names)
        rows = [
            (n, (loaded[n] if n in loaded else self.lazy[n].placeholder(n)).get_short_help_str(limit)) for n in names
        ]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


class ZkctlGroup(LazyGroup):
    """The root group: library errors that are the operator's problem become one line and exit code 1."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except Exception as exc:
            message = user_message(exc)
            if message is None:
                raise
            raise UserError(message) from None


# ---- output: ONE option, on every command ----------------------------------------------------------
#: ``-o`` formats: ``text`` the human form, ``wide`` the human form with more columns (where a command has
#: them), ``json`` and ``yaml`` the same data machine-readable, ``name`` the ids one per line
OUTPUT_FORMATS = ("text", "wide", "json", "yaml", "name")
MACHINE_FORMATS = ("json", "yaml", "name")
_OUTPUT_KEY = "zkctl.output"
#: the keys, in order, that name a thing in a command's JSON output (``-o name`` prints them)
NAME_KEYS = ("task_id", "broker_id", "member_id", "controller_id", "group", "id", "name", "path")


def _set_output(ctx: click.Context, param: click.Parameter, value: Any) -> None:
    """Record the format where every command finds it: the context tree's shared ``meta``, and the ``Ctx``."""
    if value is None or value is False:
        return
    fmt = "json" if param.name == "json_alias" else str(value)
    ctx.meta[_OUTPUT_KEY] = fmt
    obj = ctx.find_object(Ctx)
    if obj is not None:
        obj.set_output(fmt)


def output_format(ctx: click.Context | None = None) -> str:
    """The ``-o`` format of the running command (``text`` if none was given)."""
    ctx = ctx or click.get_current_context(silent=True)
    return str(ctx.meta.get(_OUTPUT_KEY, "text")) if ctx is not None else "text"


def output_params() -> list[click.Parameter]:
    """``-o/--output FORMAT`` and its alias ``--json``: the one definition, given to every command (before or
    after the command's name, the last one given wins)."""
    return [
        click.Option(
            ["-o", "--output"],
            type=click.Choice(OUTPUT_FORMATS),
            default=None,
            expose_value=False,
            callback=_set_output,
            help="output format: text, wide (more columns), json, yaml, name (ids one per line)",
        ),
        click.Option(
            ["--json", "json_alias"],
            is_flag=True,
            default=False,
            expose_value=False,
            callback=_set_output,
            help="same as -o json",
        ),
    ]


def with_output(command: click.Command) -> click.Command:
    """Give ``command`` and every command under it the output options and a whole summary (idempotent)."""
    if not getattr(command, "_zkctl_output", False):
        names = {o for p in command.params for o in getattr(p, "opts", ())}
        if not names & {"-o", "--output", "--json"}:
            command.params.extend(output_params())
        if command.short_help is None and command.help:  # click's default cuts the summary at ~45 characters
            command.short_help = first_sentence(command.help)
        command._zkctl_output = True  # type: ignore[attr-defined]
    if isinstance(command, click.Group):
        for sub in command.commands.values():
            with_output(sub)
    return command


def first_sentence(text: str) -> str:
    """The first sentence of a help text, whole, on one line."""
    text = _one_line(text.split("\n\n", 1)[0])
    for match in re.finditer(r"[.!?](?=\s|$)", text):
        if not re.search(r"\b(e\.g|i\.e|etc|vs)\.$", text[: match.end()]):
            return text[: match.end()]
    return text


def names_of(obj: Any) -> list[str]:
    """The ids in a command's JSON output, for ``-o name``: of each element of a list, of each element of the
    one list a dict holds, or of the dict itself."""
    if isinstance(obj, (list, tuple)):
        return [n for item in obj for n in names_of(item)[:1]]
    if isinstance(obj, dict):
        for key in NAME_KEYS:
            if isinstance(obj.get(key), str):
                return [obj[key]]
        lists = [v for v in obj.values() if isinstance(v, list) and v]
        if len(lists) == 1:
            return names_of(lists[0])
        for key in ("tasks", "rows", "brokers", "groups", "candidates", "nodes", "children"):
            if isinstance(obj.get(key), list):
                return names_of(obj[key])
    if isinstance(obj, str):
        return [obj]
    return []


def render(obj: Any, fmt: str) -> str:
    """``obj`` (JSON-compatible data) as ``fmt``: json (one line, sorted keys), yaml, or name (ids, one per line)."""
    if fmt == "yaml":
        import yaml

        return yaml.safe_dump(json.loads(json.dumps(obj, default=str)), sort_keys=True).rstrip("\n")
    if fmt == "name":
        return "\n".join(printable(n, lines=False) for n in names_of(json.loads(json.dumps(obj, default=str))))
    return json.dumps(obj, sort_keys=True, default=str)


#: the least wait for a session once the command has imported what it needs
MIN_SESSION_WAIT_S = 1.0
#: how long ``controller run``, ``broker run`` and ``api run`` wait for a session unless told (see Ctx.patient)
LONG_RUNNING_CONNECT_S = 10.0


@dataclass
class Ctx:
    hosts: str
    root: str
    json_out: bool  # a machine-readable format (-o json|yaml|name): commands print data, not prose
    verbose: int
    state_dir: Path
    auth: str | None = field(default=None, repr=False)  # digest credentials: never printed
    output: str = "text"  # the -o format
    connect_timeout: float = 3.0  # seconds for a session to ZooKeeper (--connect-timeout)
    connect_timeout_given: bool = False  # by --connect-timeout or ZKC_CONNECT_TIMEOUT
    long_running: bool = False  # a process that waits for ZooKeeper to come (see patient)
    _client: Any = field(default=None, repr=False)
    _connecting: Any = field(default=None, repr=False)  # the event of a session start_client began
    #: when the command began (monotonic): the connect timeout counts from there, as the operator counts it
    _connect_began: float = field(default_factory=time.monotonic, repr=False)
    _admins: list[Any] = field(default_factory=list, repr=False)

    @property
    def layout(self) -> ZkLayout:
        return ZkLayout(self.root)

    @property
    def settings(self) -> ZkSettings:
        from controller.zk.client import settings_from_env

        return settings_from_env(hosts=self.hosts, root=self.root, auth=self.auth)

    def patient(self) -> None:
        """A long-running process (controller, broker, API server) is often started beside a ZooKeeper still
        starting: unless told otherwise it waits ``LONG_RUNNING_CONNECT_S`` for its session, not 3 s."""
        if not self.connect_timeout_given:
            self.connect_timeout = max(self.connect_timeout, LONG_RUNNING_CONNECT_S)
        self.long_running = True

    @property
    def session_wait(self) -> float:
        """How long to wait for a session: the connect timeout less the share kept to say why it failed."""
        from cli.connect import MAX_PROBE_S, PROBE_SHARE

        return max(0.1, self.connect_timeout - min(MAX_PROBE_S, PROBE_SHARE * self.connect_timeout))

    def unreachable(self, probes: Any = None) -> UserError:
        """The error for a session that did not come: refused, unknown host or no answer, with the hint."""
        from cli.connect import diagnose, explain

        budget = max(0.05, self.connect_timeout - self.session_wait)
        return UserError(explain(self.hosts, probes or diagnose(self.hosts, budget), self.connect_timeout))

    def new_client(self, settings: ZkSettings | None = None) -> KazooClient:
        """A connected kazoo client (the caller stops it), or a one-line UserError if ZooKeeper is unreachable."""
        from controller.zk.client import make_client

        settings = settings or self.settings  # a bad credential source is its own error, not "cannot connect"
        try:
            client = make_client(settings, connect=False)
            connecting = client.start_async()
        except Exception as exc:
            raise UserError(f"cannot connect to ZooKeeper at {self.hosts}: {exc or type(exc).__name__}") from None
        return self._await(client, connecting)

    def _await(self, client: KazooClient, connecting: Any) -> KazooClient:
        """``client`` once its session is up, within the connect timeout; else the reason why not. kazoo's
        stop waits for its connection thread, which a server that accepts and never answers holds for the
        session timeout: that stop runs on its own thread, not in the operator's way."""
        from cli.connect import EARLY_PROBE_S, diagnose, hopeless

        # counted from the start of the command (it imported its libraries meanwhile), and at least
        # MIN_SESSION_WAIT_S from now: a session about to come up on a machine that was slow to import
        now = time.monotonic()
        deadline = max(self._connect_began + self.session_wait, now + MIN_SESSION_WAIT_S)
        connecting.wait(min(EARLY_PROBE_S, deadline - now))
        probes = None
        if not client.connected and not self.long_running:
            # nothing listens there, or the name does not resolve: no use waiting out the timeout
            probes = diagnose(self.hosts, EARLY_PROBE_S)
            if not hopeless(probes):
                probes = None
        if not client.connected and probes is None:
            connecting.wait(max(0.0, deadline - time.monotonic()))
        if client.connected:
            return client

        def stop() -> None:
            client.stop()
            client.close()

        threading.Thread(target=stop, name="zk-client-stop", daemon=True).start()
        raise self.unreachable(probes)

    def start_client(self) -> None:
        """Start connecting now and return at once: kazoo's connection thread sets the session up while the
        command imports the libraries it needs (the admin library, the task-spec models); ``client()`` then
        waits for it. A ZooKeeper further away than loopback answers while we import, not after."""
        if self._client is not None:
            return
        from controller.zk.client import make_client

        settings = self.settings  # a bad credential source is its own error, not "cannot connect"
        try:
            client = make_client(settings, connect=False)
            self._connecting = client.start_async()
        except Exception as exc:
            raise UserError(f"cannot connect to ZooKeeper at {self.hosts}: {exc or type(exc).__name__}") from None
        self._client = client

    def client(self) -> KazooClient:
        if self._client is None:
            self._client = self.new_client()
        elif self._connecting is not None:  # started by start_client: wait for the session as kazoo's start() does
            connecting, self._connecting = self._connecting, None
            client, self._client = self._client, None
            self._client = self._await(client, connecting)
        return self._client

    def admin(self) -> AdminClient:
        """The admin library on this session; refused (``no zkcontroller cluster at ...``) for a root that was
        never set up (``zkctl init`` sets one up)."""
        self.start_client()
        from controller.admin import AdminClient  # imported while the session is being set up

        self.require_root()
        admin = AdminClient(self.client(), self.layout)
        self._admins.append(admin)
        return admin

    def require_root(self) -> None:
        """Refuse a root that no ``zkctl init`` (nor controller, nor broker) ever set up: a typo in
        ``--zk-root`` must not create an empty cluster that nobody serves, nor read as one with no tasks."""
        from controller.admin.roots import missing_root_message

        message = missing_root_message(self.client(), self.layout, self.hosts)
        if message is not None:
            raise UserError(message)

    def close(self) -> None:
        unreadable = sorted({p for a in self._admins for p in a.unreadable})
        if unreadable:  # the output above is complete but for these: say so, never silently
            click.echo(
                f"warning: {len(unreadable)} znode(s) not readable with these credentials (NoAuth): "
                + ", ".join(unreadable[:10])
                + (" ..." if len(unreadable) > 10 else ""),
                err=True,
            )
        self._admins.clear()
        self._connecting = None
        if self._client is not None:
            try:
                self._client.stop()
                self._client.close()
            finally:
                self._client = None

    def set_output(self, fmt: str) -> None:
        self.output = fmt
        self.json_out = fmt in MACHINE_FORMATS

    @property
    def wide(self) -> bool:
        return self.output == "wide"

    def emit(self, obj: Any, human: str | None = None) -> None:
        """Print ``obj`` as ``-o`` asks (json, yaml, name), else the human text (JSON when there is none)."""
        if self.json_out:
            text = render(obj, self.output)
            if text:
                click.echo(text)
        elif human is None:
            click.echo(json.dumps(obj, indent=2, sort_keys=True, default=str))
        else:
            click.echo(printable(human))


pass_ctx = click.make_pass_decorator(Ctx)


def to_dict(value: Any) -> Any:
    """``controller.admin.to_dict``: a result as JSON-compatible data. Imported when a command has its result,
    by which time it has loaded the admin library; importing it with this module would load it for all."""
    from controller.admin import to_dict as convert

    return convert(value)


def resolve_auth(source: str | None, file: str | None) -> str | None:
    """The digest credentials named by ``--zk-auth env:NAME|file:PATH`` or ``--zk-auth-file PATH`` (None:
    ZKC_AUTH / ZKC_AUTH_FILE apply). The credentials themselves are refused on the command line (they
    would show in ``ps`` and shell history), and no message ever repeats them. Processes this one starts
    inherit the source (ZKC_AUTH_FILE or ZKC_AUTH), not a command-line copy."""
    if source is not None and file is not None:
        raise click.UsageError("give --zk-auth or --zk-auth-file, not both")
    if source is None and file is None:
        return None
    from controller.protocol.cluster.acl import SecurityError, parse_credential
    from controller.zk.security import read_credential_file

    try:
        path = file if file is not None else source[len("file:") :] if source and source.startswith("file:") else None
        if path is not None:
            text = read_credential_file(path, "--zk-auth file:PATH" if file is None else "--zk-auth-file")
            os.environ["ZKC_AUTH_FILE"] = os.path.abspath(path)
            os.environ.pop("ZKC_AUTH", None)
            return text
        if source is not None and source.startswith("env:"):
            name = source[len("env:") :]
            text = os.environ.get(name, "")
            if not text:
                raise click.BadParameter(f"environment variable {name!r} is not set", param_hint="--zk-auth")
            parse_credential(text, f"environment variable {name}")
            os.environ["ZKC_AUTH"] = text
            os.environ.pop("ZKC_AUTH_FILE", None)
            return text.strip()
    except SecurityError as exc:
        raise click.BadParameter(str(exc), param_hint="--zk-auth") from None
    raise click.BadParameter(
        "takes env:NAME or file:PATH (the credentials themselves never go on the command line)", param_hint="--zk-auth"
    )


# control characters (C0 but tab and newline, DEL, C1) and the bidirectional overrides: a string from ZooKeeper
# (a runner's error, a task id written by hand) must not drive the operator's terminal (title, colours, cursor)
_UNPRINTABLE = {c: f"\\x{c:02x}" for c in [*range(0x00, 0x09), *range(0x0B, 0x20), *range(0x7F, 0xA0)]}
_UNPRINTABLE.update({c: f"\\u{c:04x}" for c in [*range(0x202A, 0x202F), *range(0x2066, 0x206A)]})
_UNPRINTABLE_LINE = {**_UNPRINTABLE, 0x09: "\\t", 0x0A: "\\n"}


def printable(text: str, lines: bool = True) -> str:
    """``text`` with every control character shown as its escape (``\\x1b``), never sent to the terminal;
    newlines and tabs kept when ``lines``."""
    return text.translate(_UNPRINTABLE if lines else _UNPRINTABLE_LINE)


def cell(value: Any) -> str:
    if value is None or value == "" or value == ():
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (list, tuple, set, frozenset)):
        return printable(",".join(str(v) for v in value), lines=False) or "-"
    return printable(str(value), lines=False)


def clip(text: str | None, width: int = 60) -> str:
    if not text:
        return "-"
    text = printable(_one_line(text), lines=False)
    return text if len(text) <= width else text[: width - 3] + "..."


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A plain left-aligned table, like ``kubectl get`` (two spaces between columns)."""
    body = [[cell(v) for v in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in body)) if body else len(h) for i, h in enumerate(headers)]
    lines = ["  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip() for row in [list(headers)] + body]
    return "\n".join(lines)


def when(ts: float | None) -> str:
    """A wall-clock time as local ISO (seconds), with its age."""
    if not ts:
        return "-"
    age = max(0.0, time.time() - ts)
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))
    if age < 120:
        ago = f"{age:.0f}s ago"
    elif age < 7200:
        ago = f"{age / 60:.0f}m ago"
    else:
        ago = f"{age / 3600:.1f}h ago"
    return f"{stamp} ({ago})"


__all__ = [
    "UserError",
    "LazyCommand",
    "LazyGroup",
    "ZkctlGroup",
    "Ctx",
    "pass_ctx",
    "to_dict",
    "table",
    "cell",
    "clip",
    "when",
    "user_message",
]


def complete_names(kind: str) -> Callable[[click.Context, click.Parameter, str], list[str]]:
    """Shell completion of live names (``task``, ``broker`` or ``group``) read from ZooKeeper; quietly
    nothing if it cannot be reached within a second."""

    def complete(ctx: click.Context, _param: click.Parameter, incomplete: str) -> list[str]:
        from controller.zk.client import make_client, settings_from_env
        from controller.zk.layout_io import list_tasks

        params = ctx.find_root().params
        try:
            settings = settings_from_env(hosts=params.get("hosts"), root=params.get("root"))
            layout = ZkLayout(settings.root)
            parent = {"broker": layout.broker_ids, "group": layout.groups}.get(kind)
            client = make_client(settings, timeout=1.0)
        except Exception:
            return []
        try:
            names = (
                list_tasks(client, layout)
                if parent is None
                else layout.legal_children(parent, client.get_children(parent))
            )
            return sorted(n for n in names if n.startswith(incomplete))
        except Exception:
            return []
        finally:
            client.stop()
            client.close()

    return complete
