"""``zkctl`` in-process, as the CLI tests of both tiers call it (click's CliRunner, the program named as installed)."""

from __future__ import annotations

from click.testing import CliRunner, Result

from cli.main import cli


def invoke(args: list[str], env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(cli, args, env=env, prog_name="zkctl")
