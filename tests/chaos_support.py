"""What the chaos tests of both tiers share: the fault kinds an in-process run draws (every default kind but the
rolling bounce, which needs broker processes)."""

from __future__ import annotations

from broker_sim.chaos import DEFAULT_FAULT_KINDS

IN_PROCESS_KINDS = tuple(k for k in DEFAULT_FAULT_KINDS if k != "rolling-bounce")
