"""The README's by-hand quickstart, pasted line by line into a shell in an empty directory, runs a task and
stops everything it started.

The lines are the README's own, fed one at a time to one ``bash`` process as a user pastes them; two things
differ: ZooKeeper's port (a free one instead of 2181, which another server may hold) and the virtualenv the
first line activates (a stand-in that puts this interpreter's ``zkctl`` on the PATH)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import psutil

from controller.zk.server import free_port
from tests.cli_support import ZKCTL, until

REPO = Path(__file__).resolve().parents[3]
SECTION = "## By hand, in ten lines"


def quickstart_lines() -> list[str]:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    assert SECTION in text, f"README.md has no section {SECTION!r}"
    block = text.split(SECTION, 1)[1].split("```sh\n", 1)[1].split("```", 1)[0]
    return [line for line in block.splitlines() if line.strip()]


class PastedShell:
    """One ``bash`` reading its commands from a pipe; each line is sent, then waited for by a marker echo."""

    def __init__(self, cwd: Path, env: dict[str, str]) -> None:
        self.out = cwd / "shell.out"
        self.proc = subprocess.Popen(
            ["bash"],
            cwd=cwd,
            env=env,
            stdin=subprocess.PIPE,
            stdout=self.out.open("w"),
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.sent = 0

    def paste(self, line: str, timeout: float = 90.0) -> str:
        """Run one line; return what it printed."""
        assert self.proc.stdin is not None
        self.sent += 1
        marker = f"@@done-{self.sent}"
        start = len(self.output())
        self.proc.stdin.write(f"{line}\necho {marker} $?\n")
        self.proc.stdin.flush()
        until(lambda: marker in self.output(), timeout=timeout, what=f"the line {line!r} to finish")
        printed = self.output()[start:]
        return printed.split(marker, 1)[0]

    def output(self) -> str:
        return self.out.read_text(errors="replace")

    def close(self) -> int:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        return self.proc.wait(30)


def test_the_by_hand_quickstart_runs_a_task_and_stops_everything(tmp_path):
    lines = quickstart_lines()
    assert len(lines) <= 10, lines
    port = free_port()
    pasted = []
    for line in lines:
        if line.startswith(". .venv/bin/activate"):
            (tmp_path / ".venv" / "bin").mkdir(parents=True)
            (tmp_path / ".venv" / "bin" / "activate").write_text(f'PATH="{Path(sys.executable).parent}:$PATH"\n')
        if line.startswith("zkctl zk start"):
            line = line.replace("zkctl zk start", f"zkctl zk start --port {port}", 1)
        pasted.append(line.replace("127.0.0.1:2181", f"127.0.0.1:{port}"))
    assert any(f"ZKC_ZK=127.0.0.1:{port}" in line for line in pasted), "the quickstart no longer exports ZKC_ZK"

    env = {k: v for k, v in os.environ.items() if not k.startswith("ZKC_")}
    env["PYTHONPATH"] = str(REPO)
    shell = PastedShell(tmp_path, env)
    zk_pid: int | None = None
    pids: list[int] = []
    try:
        for line in pasted:
            if line.startswith("zkctl status"):
                # a person reads what the line before printed first; the broker needs a moment to take the task
                until(lambda: "RUNNING" in _task_list(tmp_path, env, port), timeout=60, what="the task to be RUNNING")
            printed = shell.paste(line)
            if "=$!" in line:  # a process sent to the background: its pid, to stop it should the test fail
                pids.append(int(shell.paste("echo $!")))
            if line.startswith("zkctl zk start"):
                zk_pid = int(re.search(r"\(pid (\d+)", printed).group(1))  # type: ignore[union-attr]
            if line.startswith("zkctl task create"):
                assert "Created 1 task: hello" in printed, printed
            if line.startswith("zkctl status"):
                assert re.search(r"^hello\s+default\s+RUNNING\s+noop\s+b1\s", printed, re.MULTILINE), printed
        assert shell.close() == 0, shell.output()
        assert "Traceback" not in shell.output(), shell.output()
        assert "ZooKeeper stopped" in shell.output(), shell.output()
        assert len(pids) == 2 and zk_pid is not None
        for pid in [*pids, zk_pid]:
            assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE, pid
        assert "controlled shutdown complete" in (tmp_path / "broker.log").read_text()
    finally:
        for pid in pids + ([zk_pid] if zk_pid else []):
            _kill(pid)
        if shell.proc.poll() is None:
            shell.proc.kill()
            shell.proc.wait(10)


def _task_list(cwd: Path, env: dict[str, str], port: int) -> str:
    p = subprocess.run(
        [ZKCTL, "--zk", f"127.0.0.1:{port}", "task", "list"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    return p.stdout


def _kill(pid: int) -> None:
    """Stop a process the quickstart started and left running (only when the test failed), by its pid."""
    try:
        proc = psutil.Process(pid)
        proc.kill()
        proc.wait(10)
    except (psutil.NoSuchProcess, psutil.TimeoutExpired):
        pass
