"""The controller daemon: election with epoch fencing, one event thread, and the kazoo layer that feeds
the sans-IO group coordinators and carries out their decisions.

One ``Controller`` (``core``) owns the event thread, the context and the dispatch; it is composed of one
part per concern, each in its own module with its handlers:

* ``election`` — win ``/controller``, bump the epoch, resign, connection states;
* ``loading`` — the failover load and the background watch armer;
* ``brokers`` — registrations and controlled shutdown;
* ``tasks`` — task specs, deletions, statuses, admin requests (rebalance, reassign);
* ``groups`` — the group coordinators' inputs and the fenced writes of their decisions;
* ``context`` — the configuration and the in-memory context the parts share.
"""

from controller.daemon.context import (
           LOAD_METHODS,
           BrokerDelta,
           BrokerRecord,
           ControllerConfig,
           ControllerContext,
           LoadMethod,
)
from controller.daemon.core import Controller, default_controller_id
from controller.daemon.loading import ARM_WATCH_CHUNK, get_sequential
from controller.daemon.tasks import DELETE_BATCH_TASKS, DELETE_LINGER_S

__all__ = ["Controller", "ControllerConfig", "ControllerContext", "BrokerRecord", "BrokerDelta", "LoadMethod",
           "LOAD_METHODS", "default_controller_id", "ARM_WATCH_CHUNK", "DELETE_BATCH_TASKS", "DELETE_LINGER_S",
           "get_sequential"]
