"""The production worker (broker): ``zkctl broker run`` runs one ``Worker``; the simulator and the
benchmarks run many in one process. See ``core`` for the lifecycle and the parts it owns (``config`` is what it
is told, ``signals`` a broker process's signal handlers)."""

from broker_sim.worker.config import WorkerConfig
from broker_sim.worker.core import Worker
from broker_sim.worker.fence import fence_margin
from broker_sim.worker.ownership import RELEASE_CHUNK
from broker_sim.worker.registration import IdentityMismatch, RegistrationConflict
from broker_sim.worker.reporting import MAX_INTERVALS_IN_ZK
from broker_sim.worker.signals import install_signal_handlers

__all__ = [
    "IdentityMismatch",
    "RegistrationConflict",
    "Worker",
    "WorkerConfig",
    "install_signal_handlers",
    "fence_margin",
    "RELEASE_CHUNK",
    "MAX_INTERVALS_IN_ZK",
]
