"""``zkctl completion bash|zsh|fish``: the shell completion script, click's own (commands, options, and the
task, broker and group names read from ZooKeeper)."""

from __future__ import annotations

import click

#: the environment variable click's completion scripts call ``zkctl`` with
COMPLETE_VAR = "_ZKCTL_COMPLETE"


@click.command("completion")
@click.argument("shell", type=click.Choice(["bash", "zsh", "fish"]))
def completion(shell: str) -> None:
    """Print the shell completion script for SHELL (bash, zsh or fish).

    \b
    bash: eval "$(zkctl completion bash)" in ~/.bashrc
    zsh:  eval "$(zkctl completion zsh)" in ~/.zshrc
    fish: zkctl completion fish > ~/.config/fish/completions/zkctl.fish"""
    from click.shell_completion import get_completion_class

    root = click.get_current_context().find_root()
    cls = get_completion_class(shell)
    assert cls is not None  # click knows the three shells the Choice allows
    click.echo(cls(root.command, {}, "zkctl", COMPLETE_VAR).source())
