"""The user documentation names only what exists: every relative link and image in README.md and docs/*.md
points at a file of the repository (and its anchor at a heading of that file, by GitHub's slug), and every
``zkctl ...`` line in a code block (or in `inline code`) names existing commands and options of the click tree in ``cli.main``.

Pure: reads the Markdown files and walks the click tree; nothing connects, nothing runs.

How a ``zkctl`` line is read: the text after ``zkctl`` up to a shell pipe (`` | ``), ``&&``, ``;``, a closing
``)`` of ``$(...)`` or a ``#`` comment; ``[...]`` and ``(...)`` mark optional parts and are dropped; a word
with ``|`` in it lists alternatives (``on|off|status``, ``--to-earliest|--to-latest``), each of which must
exist; upper-case words and what follows an option that takes a value are arguments."""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from pathlib import Path

import click
import pytest

from cli.common import LazyGroup, with_output
from cli.main import cli

REPO = Path(__file__).resolve().parents[3]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]

FENCE = re.compile(r"^\s*(```|~~~)")
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
INLINE_CODE = re.compile(r"(`+)(.+?)\1")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
ZKCTL = re.compile(r"(?:^|(?<=[\s/;&|(\"'=]))zkctl(?=\s|$|[)\"'])")


@dataclass(frozen=True)
class Problem:
    doc: str
    line: int
    what: str

    def __str__(self) -> str:
        return f"{self.doc}:{self.line}: {self.what}"


# ---- Markdown -----------------------------------------------------------------------------------------------
def split_blocks(text: str) -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
    """(prose lines, code-block lines), each with its 1-based line number."""
    prose: list[tuple[int, str]] = []
    code: list[tuple[int, str]] = []
    fence: str | None = None
    for number, line in enumerate(text.splitlines(), 1):
        opened = FENCE.match(line)
        if fence is None and opened:
            fence = opened.group(1)
        elif fence is not None and opened and opened.group(1) == fence:
            fence = None
        elif fence is not None:
            code.append((number, line))
        else:
            prose.append((number, line))
    return prose, code


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: its rendered text lower-cased, punctuation dropped, spaces to '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link shows its text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML tags
    text = text.lower()
    kept = "".join(c for c in text if c in " -_" or unicodedata.category(c)[0] in "LNM")
    return kept.replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every heading's slug, repeated headings numbered as GitHub numbers them (-1, -2, ...)."""
    seen: dict[str, int] = {}
    out: set[str] = set()
    prose, _ = split_blocks(text)
    for _, line in prose:
        m = HEADING.match(line)
        if not m:
            continue
        slug = github_slug(m.group(2))
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def check_links(doc: Path, text: str, repo: Path = REPO) -> list[Problem]:
    """Every relative link of the doc's prose names an existing file or folder in the repository, and its
    anchor (if any) a heading of the Markdown file it names."""
    problems: list[Problem] = []
    name = doc.relative_to(repo).as_posix() if doc.is_relative_to(repo) else doc.name
    prose, _ = split_blocks(text)
    for number, line in prose:
        for m in LINK.finditer(INLINE_CODE.sub("", line)):
            target = m.group(1)
            if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE):  # http:, https:, mailto:
                continue
            path_part, _, anchor = target.partition("#")
            path = (doc.parent / path_part).resolve() if path_part else doc.resolve()
            if not path.is_relative_to(repo.resolve()):
                problems.append(Problem(name, number, f"link {target!r} leaves the repository"))
                continue
            if path_part and not path.exists():
                problems.append(Problem(name, number, f"link {target!r}: no such file"))
                continue
            if anchor and path.suffix == ".md" and anchor not in anchors(path.read_text() if path_part else text):
                problems.append(Problem(name, number, f"link {target!r}: no heading with anchor #{anchor}"))
    return problems


# ---- zkctl lines --------------------------------------------------------------------------------------------
def zkctl_invocations(code_line: str) -> list[str]:
    """The argument text of each ``zkctl`` call on a line of a code block."""
    out = []
    code_line = re.split(r"(?:^|\s)#", code_line, maxsplit=1)[0]  # a shell comment
    for m in ZKCTL.finditer(code_line):
        rest = code_line[m.end() :]
        rest = re.split(r"\s\|\s|&&|;|\)\"", rest, maxsplit=1)[0]
        out.append(rest)
    return out


def _find_option(commands: list[click.Command], ctx: click.Context, name: str) -> click.Option | None:
    for command in commands:
        for param in command.get_params(ctx):
            if isinstance(param, click.Option) and name in (*param.opts, *param.secondary_opts):
                return param
    return None


def _subcommand(group: click.Group, ctx: click.Context, name: str) -> click.Command | None:
    """The subcommand, loaded without changing the group: a lazy command stays lazy for the tests after this
    one (``get_command`` would import it into the group for good)."""
    if isinstance(group, LazyGroup) and name not in group.commands and name in group.lazy:
        loaded = group.lazy[name].load(name)
        command = with_output(loaded) if loaded is not None else None  # as get_command attaches -o to each
    else:
        command = group.get_command(ctx, name)
    if command is not None and (command.help or "").startswith("(unavailable:"):
        raise AssertionError(f"zkctl {name} cannot be imported: {command.help}")
    return command


def check_zkctl_args(args: str, root: click.Group = cli) -> list[str]:
    """What is wrong with one ``zkctl`` call's arguments: unknown commands and unknown options."""
    words = re.sub(r"[\[\]()]", " ", args).split()
    ctx = click.Context(root, info_name="zkctl")
    current: list[click.Command] = [root]
    path = ["zkctl"]
    problems: list[str] = []
    i = 0
    while i < len(words):
        word = words[i]
        i += 1
        if word in ("...", "-", "--", "|") or word.startswith(("$", "<", "'", '"', "{")):
            continue
        alternatives = [w for w in word.split("|") if w]
        if word.startswith("-") and not re.match(r"^-\d", word):
            takes_value = False
            for alt in alternatives:
                name = alt.split("=", 1)[0]
                option = _find_option(current, ctx, name)
                if option is None and re.fullmatch(r"-[a-zA-Z]{2,}", name):  # -vv
                    option = _find_option(current, ctx, name[:2])
                if option is None:
                    problems.append(f"{' '.join(path)}: no option {name}")
                    continue
                takes_value = not (option.is_flag or option.count) and "=" not in alt
            if takes_value and i < len(words):
                i += 1  # its value
            continue
        groups = [c for c in current if isinstance(c, click.Group)]
        if not groups or not re.fullmatch(r"[a-z][a-z0-9-]*", alternatives[0]):
            continue  # an argument (ID, NAME=VALUE, a path, a number)
        chosen: list[click.Command] = []
        for alt in alternatives:
            found = [c for g in groups if (c := _subcommand(g, ctx, alt)) is not None]
            if not found:
                problems.append(f"{' '.join(path)}: no command {alt}")
            chosen.extend(found)
        if not chosen:
            break  # the rest cannot be checked against anything
        current = chosen
        path.append(word)
    return problems


def check_commands(doc: Path, text: str, repo: Path = REPO) -> list[Problem]:
    name = doc.relative_to(repo).as_posix() if doc.is_relative_to(repo) else doc.name
    prose, code = split_blocks(text)
    spans = [(number, m.group(2)) for number, line in prose for m in INLINE_CODE.finditer(line)]
    problems = []
    for number, line in code + spans:
        for args in zkctl_invocations(line):
            problems += [Problem(name, number, f"{p} (in `zkctl{args}`)") for p in check_zkctl_args(args)]
    return problems


# ---- the docs ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.relative_to(REPO).as_posix())
def test_links_name_existing_files_and_anchors(doc):
    problems = check_links(doc, doc.read_text(encoding="utf-8"))
    assert not problems, "\n".join(map(str, problems))


#: docs whose zkctl lines are known to be wrong, with the mistake; strict: the test fails once they are right,
#: so that the entry goes
KNOWN_WRONG: dict[str, str] = {}


@pytest.mark.parametrize(
    "doc",
    [
        pytest.param(d, marks=pytest.mark.xfail(strict=True, reason=KNOWN_WRONG[name]))
        if (name := d.relative_to(REPO).as_posix()) in KNOWN_WRONG
        else d
        for d in DOCS
    ],
    ids=lambda p: p.relative_to(REPO).as_posix(),
)
def test_zkctl_lines_name_existing_commands_and_options(doc):
    problems = check_commands(doc, doc.read_text(encoding="utf-8"))
    assert not problems, "\n".join(map(str, problems))


def test_the_docs_show_zkctl_lines_at_all():
    """The command check above reads something: the README's code blocks hold zkctl calls."""
    _, code = split_blocks((REPO / "README.md").read_text(encoding="utf-8"))
    assert sum(len(zkctl_invocations(line)) for _, line in code) >= 20


# ---- the checks themselves ---------------------------------------------------------------------------------
def test_slugs_follow_github():
    assert github_slug("The demo (`make demo` = `zkctl demo`)") == "the-demo-make-demo--zkctl-demo"
    assert github_slug("B1: rolling bounce, 20 brokers") == "b1-rolling-bounce-20-brokers"
    assert github_slug("Running brokers under [systemd](https://systemd.io)") == "running-brokers-under-systemd"
    assert github_slug("snake_case and Ünïcode") == "snake_case-and-ünïcode"
    text = "# Top\n## Same\n```\n## not a heading\n```\n## Same\n"
    assert anchors(text) == {"top", "same", "same-1"}


def test_a_broken_link_or_anchor_is_found(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "other.md").write_text("# Other\n## Real section\n", encoding="utf-8")
    doc = tmp_path / "README.md"
    text = (
        "[ok](docs/other.md) [ok](docs/other.md#real-section) [ok](#here) [web](https://example.org/x)\n"
        "# Here\n"
        "[gone](docs/missing.md) [bad](docs/other.md#no-such-section) [up](../outside.md) [self](#nowhere)\n"
        "`[in code](docs/missing.md)`\n"
        "```\n[in a block](docs/missing.md)\n```\n"
    )
    problems = check_links(doc, text, repo=tmp_path)
    assert [(p.line, p.what.split(":")[0]) for p in problems] == [
        (3, "link 'docs/missing.md'"),
        (3, "link 'docs/other.md#no-such-section'"),
        (3, "link '../outside.md' leaves the repository"),
        (3, "link '#nowhere'"),
    ]


def test_existing_commands_and_options_pass():
    for args in [
        " --zk 127.0.0.1:2181 zk tree /",
        " task create -f tasks.yaml [--dry-run]",
        " maintenance on|off|status [--reason R]",
        " task reset-offsets ID --to-earliest|--to-latest|--to-batch N [--dry-run]",
        " --json sim run --brokers 4 --tasks 40 --scenario expire-session",
        " -vv controller run --id c1",
        " broker run --id b1 --runner=noop",
    ]:
        assert check_zkctl_args(args) == [], args


def test_a_missing_command_or_option_is_found():
    assert check_zkctl_args(" task frobnicate ID") == ["zkctl task: no command frobnicate"]
    assert check_zkctl_args(" frobnicate") == ["zkctl: no command frobnicate"]
    assert check_zkctl_args(" task list --no-such-flag") == ["zkctl task list: no option --no-such-flag"]
    assert check_zkctl_args(" maintenance on|of") == ["zkctl maintenance: no command of"]
    # an option belongs to the command it is given after
    root = click.Group("zkctl", params=[click.Option(["--zk"])])
    sub = click.Group("task")
    sub.add_command(click.Command("list", params=[click.Option(["--limit"], type=int)]))
    root.add_command(sub)
    assert check_zkctl_args(" --zk h:1 task list --limit 5", root) == []
    assert check_zkctl_args(" task list --zk h:1", root) == ["zkctl task list: no option --zk"]
    doc = REPO / "docs" / "example.md"
    text = (
        "```sh\nzkctl status\nZKC_ZK=h:1 zkctl brokr list && zkctl task list  # a comment --bogus\n```\n"
        "Run `zkctl task list --bogus` and `zkctl status`.\n"
    )
    assert [str(p) for p in check_commands(doc, text)] == [
        "docs/example.md:3: zkctl: no command brokr (in `zkctl brokr list `)",
        "docs/example.md:5: zkctl task list: no option --bogus (in `zkctl task list --bogus`)",
    ]
