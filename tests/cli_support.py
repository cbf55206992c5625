"""``zkctl`` as the CLI tests of both tiers call it: in-process (click's CliRunner, the program named as
installed) or as the installed program in a subprocess; what a user error must look like; waiting for a
condition; stopping a process we started (by its pid)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner, Result

from cli.main import cli
from tests.waiting import wait_until


def invoke(args: list[str], env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(cli, args, env=env, prog_name="zkctl")


ZKCTL = shutil.which("zkctl", path=str(Path(sys.executable).parent)) or "zkctl"


# ---- helpers ----------------------------------------------------------------------------------------
def assert_user_error(result, *needles: str) -> str:
    """Exit 1, one line on stderr starting with 'Error:', no traceback, nothing on stdout."""
    assert result.exit_code == 1, (result.exit_code, result.output, result.exception)
    assert isinstance(result.exception, SystemExit), result.exception  # not an unexpected exception
    lines = result.stderr.strip().splitlines()
    # a --wait command's progress lines may come first (plain lines, as stderr is no terminal here)
    assert all(re.match(r"^\[\s*\d+\.\ds\] waiting for .*: \d+/\d+ ", line) for line in lines[:-1]), lines
    err = lines[-1] if lines else ""
    assert err.startswith("Error: "), err
    assert "Traceback" not in result.output and result.stdout == ""
    for n in needles:
        assert n in err, (n, err)
    return err


def zkctl(env: dict[str, str], *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([ZKCTL, *args], env=env, capture_output=True, text=True, timeout=timeout)


def ok(env: dict[str, str], *args: str, timeout: float = 60) -> str:
    p = zkctl(env, *args, timeout=timeout)
    assert p.returncode == 0, (args, p.returncode, p.stdout, p.stderr)
    assert "Traceback" not in p.stderr, p.stderr
    return p.stdout


def ok_json(env: dict[str, str], *args: str, timeout: float = 60):
    return json.loads(ok(env, "--json", *args, timeout=timeout))


def until(predicate, timeout: float = 20.0, what: str = "condition") -> None:
    """``tests.waiting.wait_until`` with this module's defaults (kept for its many callers)."""
    wait_until(predicate, timeout, what)


def stop_process(p: subprocess.Popen) -> None:
    """Stop a process we started, by its pid: SIGTERM, then SIGKILL."""
    if p.poll() is None:
        os.kill(p.pid, signal.SIGTERM)
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            os.kill(p.pid, signal.SIGKILL)
            p.wait(10)


def write_specs(path: Path, *ids: str) -> Path:
    path.write_text("\n".join(f"- id: {t}\n  pipeline: {{kind: noop}}" for t in ids) + "\n")
    return path
