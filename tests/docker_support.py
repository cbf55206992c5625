"""The container tests' shared parts: a Docker client (or a skip with the reason) and the image of this tree,
built once per session. Registered for every test through ``pytest_plugins`` in tests/conftest.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

import pytest

from tests.api_support import REPO

ZKCTL = [sys.executable, "-m", "cli.main"]
IMAGE = "zkcontroller:test"
BASE = os.environ.get("ZKC_BASE_IMAGE", "zkc-base:bookworm")
SETUP = "run `make docker-engine` (scripts/docker-engine.sh start) as root"


def docker_engine() -> Any:
    """A Docker client whose engine answers; the test is skipped, with the reason, where none does."""
    try:
        import docker
    except ModuleNotFoundError:
        pytest.skip("the Docker SDK is not installed (pip install 'zkcontroller[docker]')")
    try:
        client = docker.from_env(timeout=300)
        client.ping()
    except Exception as exc:
        pytest.skip(f"no Docker engine answers ({type(exc).__name__}): {SETUP}")
    return client


@pytest.fixture(scope="session")
def image() -> str:
    """The image of this tree, built once per session (on the debootstrapped base when there is one)."""
    client = docker_engine()
    args = []
    try:
        client.images.get(BASE)
        args = ["--base", BASE]
    except Exception:
        pytest.skip(f"no base image {BASE} (no registry is assumed reachable): {SETUP}")
    started = time.monotonic()
    p = subprocess.run(
        ZKCTL + ["--json", "cluster", "build", "--tag", IMAGE, *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=1500,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert p.returncode == 0, p.stdout + p.stderr
    built = json.loads(p.stdout)
    print(f"image {IMAGE}: {built['size_mb']} MB, built in {time.monotonic() - started:.0f}s")
    return IMAGE
