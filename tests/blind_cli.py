"""``zkctl`` run blind to a directory: ``python tests/blind_cli.py DIR ARGS...`` runs the CLI with an audit hook
that refuses every open, listing and stat of a path under DIR, as on a host that cannot reach the brokers'
checkpoints. A command that reads a checkpoint itself fails; one the brokers carry out works."""

from __future__ import annotations

import os
import sys

_EVENTS = {"open", "os.listdir", "os.scandir", "os.stat", "os.lstat"}


def _blind(root: str) -> None:
    root = os.path.realpath(root)

    def hook(event: str, args: tuple[object, ...]) -> None:
        if event in _EVENTS and args and isinstance(args[0], (str, bytes, os.PathLike)):
            path = os.fsdecode(args[0])
            if os.path.isabs(path) and (path == root or path.startswith(root + os.sep)):
                raise PermissionError(f"this process may not read {path}")

    sys.addaudithook(hook)


if __name__ == "__main__":
    _blind(sys.argv[1])
    sys.argv = ["zkctl", *sys.argv[2:]]
    from cli.main import main

    main()
