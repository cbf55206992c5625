"""The standalone Spark masters of a master URL, and an unreachable one refused saying what to do."""

from __future__ import annotations

import socket

import pytest

from broker_sim.runners.spark_session import SparkSetupError, check_master_reachable, standalone_masters


# ---- the Spark master ----------------------------------------------------------------------------------------
def test_an_unreachable_standalone_master_is_refused_with_what_to_do() -> None:
    assert standalone_masters("local[2]") == [] and standalone_masters("spark://m1:7077,m2:7078") == [
        ("m1", 7077),
        ("m2", 7078),
    ]
    with pytest.raises(SparkSetupError, match="not host:port"):
        standalone_masters("spark://nohost")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: a refused connection
        with pytest.raises(SparkSetupError, match=r"cannot reach the Spark master .* start it"):
            check_master_reachable(f"spark://127.0.0.1:{port}", timeout=2)
        check_master_reachable("local[1]")  # nothing to reach
