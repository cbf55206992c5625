"""The checkpoint root decided in one place and scoped by the cluster, the sink paths a spec may name, and the
checks a broker makes of a storage request read from ZooKeeper. Pure."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from controller.protocol.tasks.spec import SpecError, parse_spec
from controller.protocol.tasks.storage import (
    StorageError,
    StorageRequest,
    addressed_broker,
    check_data_path,
    checkpoint_root,
    cluster_dir,
    validate_request,
)

REPO = Path(__file__).resolve().parents[4]


def test_the_root_is_the_option_then_the_environment_then_the_state_dir_made_absolute_and_scoped() -> None:
    env = {"ZKC_CHECKPOINT_ROOT": "/mnt/ck"}
    assert checkpoint_root("/data/ck", env, ".zkc", "/zkc", "/home/op") == "/data/ck/zkc"
    assert checkpoint_root(None, env, ".zkc", "/zkc", "/home/op") == "/mnt/ck/zkc"
    assert checkpoint_root(None, {}, "state", "/prod/east", "/srv") == "/srv/state/checkpoints/prod+east"
    assert checkpoint_root("rel/ck", {}, "x", "/", "/srv") == "/srv/rel/ck/_root"
    assert checkpoint_root("hdfs://nn/ck/", {}, "x", "/zkc", "/srv") == "hdfs://nn/ck/zkc"
    for bad in ("/", "  "):
        with pytest.raises(StorageError):
            checkpoint_root(bad, {}, "x", "/zkc", "/")


def test_two_cluster_roots_never_share_a_directory() -> None:
    """Cluster A's purge of ``orders`` must not reach cluster B's ``orders`` on the same state dir."""
    roots = ["/", "/zkc", "/a", "/a/b", "/a.b", "/a-b", "/zkc2", "/A"]
    dirs = [cluster_dir(r) for r in roots]
    assert len(set(dirs)) == len(dirs) and all("/" not in d and d not in ("", ".", "..") for d in dirs)
    a = checkpoint_root(None, {}, "/srv/state", "/clusterA", "/")
    b = checkpoint_root(None, {}, "/srv/state", "/clusterB", "/")
    assert a != b and not a.startswith(b + "/") and not b.startswith(a + "/")


@pytest.mark.parametrize(
    "path", ["out", "/", "..", " ", "", "./out", "/data/../etc", "/data/x ", "file:out", "hdfs://nn"]
)
def test_relative_and_degenerate_sink_paths_are_refused_with_what_to_write(path: str) -> None:
    with pytest.raises(ValueError, match="absolute path"):
        check_data_path("sink path", path)


@pytest.mark.parametrize("path", ["/data/out", "file:///data/out", "hdfs://nn:8020/data/out", "s3a://bucket/out"])
def test_absolute_sink_paths_and_urls_are_kept(path: str) -> None:
    assert check_data_path("sink path", path) == path


def test_a_spec_with_a_relative_sink_is_refused_at_create() -> None:
    spec = {
        "id": "rel",
        "pipeline": {
            "kind": "spark",
            "source": {"type": "files", "format": "json", "path": "/data/in", "schema": "id LONG"},
            "sink": {"type": "files", "format": "parquet", "path": "out"},
        },
    }
    with pytest.raises(SpecError, match="relative: each broker would resolve it in its own directory"):
        parse_spec(spec)


def _req(**kw: object) -> StorageRequest:
    base: dict[str, object] = {"request_id": "r", "kind": "offsets", "task_id": "t", "requested": 100.0}
    base["deadline"] = 130.0
    base.update(kw)
    return StorageRequest(**base)  # type: ignore[arg-type]


def test_a_request_read_from_zookeeper_is_checked_before_anything_is_done() -> None:
    assert validate_request(_req(), "t", 110.0) is None
    assert "unknown kind" in str(validate_request(_req(kind="rm -rf"), "t", 110.0))
    assert "names task" in str(validate_request(_req(), "other", 110.0))
    assert "deadline has passed" in str(validate_request(_req(), "t", 131.0))
    assert "out of bounds" in str(validate_request(_req(deadline=10**9), "t", 110.0))
    assert "reset target" in str(validate_request(_req(kind="reset", target="sideways", spec_version=1), "t", 110.0))
    assert "batch id" in str(validate_request(_req(kind="reset", target="batch", spec_version=1), "t", 110.0))
    assert "spec version" in str(validate_request(_req(kind="reset", target="earliest"), "t", 110.0))
    assert "lines" in str(validate_request(_req(kind="logs", tail=10**6), "t", 110.0))


def test_the_owner_is_asked_then_the_last_broker_then_anyone() -> None:
    assert addressed_broker("b1", "b2", ["b1", "b2"]) == "b1"
    assert addressed_broker("b1", "b2", ["b2"]) == "b2"
    assert addressed_broker(None, "b2", ["b3"]) is None
    assert addressed_broker(None, None, []) is None


def test_no_admin_or_api_module_opens_a_file_and_no_module_reads_the_state_dir_at_import() -> None:
    """The admin library and the API never open a checkpoint (the broker does); nothing reads ZKC_STATE_DIR
    when it is imported (a broker's --state-dir would not be seen)."""
    token_file = REPO / "controller" / "api" / "auth.py"  # reads the API token's file, not a checkpoint
    for pkg in ("controller/admin", "controller/api"):
        for path in (p for p in (REPO / pkg).rglob("*.py") if p != token_file):
            tree = ast.parse(path.read_text())
            for node in ast.walk(tree):
                if isinstance(node, ast.Call):
                    name = ast.unparse(node.func)
                    assert name not in ("open", "os.open", "shutil.rmtree", "os.listdir", "os.scandir"), (path, name)
                    assert not name.endswith((".read_bytes", ".write_bytes", ".unlink", ".iterdir")), (path, name)
    for path in [*(REPO / "controller").rglob("*.py"), *(REPO / "broker_sim").rglob("*.py")]:
        tree = ast.parse(path.read_text())
        for node in tree.body:  # module level only: inside a function it is read when called
            if isinstance(node, (ast.Assign, ast.AnnAssign, ast.Expr)):
                assert "ZKC_STATE_DIR" not in ast.unparse(node), path
