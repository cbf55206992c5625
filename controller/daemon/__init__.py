"""The controller daemon: election with epoch fencing, one event thread, and the kazoo layer that feeds
the sans-IO group coordinators and carries out their decisions.

One ``Controller`` (``core``) owns the event thread, the activation (token, epoch, fenced writer,
context) and the dispatch; it owns one part per concern, each a class in its own module with its handlers,
given what it needs and the controller only as a ``host.Host``:

* ``election.Election`` — win ``/controller``, bump the epoch, give the seat up, connection states;
* ``loading.FailoverLoad`` — the failover load and the background watch armer;
* ``brokers.BrokerTracker`` — registrations and controlled shutdown;
* ``tasks.TaskTracker`` — task specs and their watches, deletions, statuses, admin requests (rebalance,
  reassign);
* ``groups.GroupDriver`` — the group coordinators' inputs and the fenced writes of their decisions;
* ``grants.TaskGrants`` — handing a task's znodes to its assignee's identity;
* ``roll.RollDriver`` — the planned roll (``/admin/roll``), advanced after every event;
* ``operations.OperatorSettings`` — settings, maintenance mode, moves in flight, automatic maintenance;
* ``context`` — the configuration and the in-memory context the parts share; ``watchers`` — the
  callbacks kazoo's thread runs (they only enqueue).
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
from controller.daemon.task_watch import DELETE_BATCH_TASKS, DELETE_LINGER_S

__all__ = [
    "Controller",
    "ControllerConfig",
    "ControllerContext",
    "BrokerRecord",
    "BrokerDelta",
    "LoadMethod",
    "LOAD_METHODS",
    "default_controller_id",
    "ARM_WATCH_CHUNK",
    "DELETE_BATCH_TASKS",
    "DELETE_LINGER_S",
    "get_sequential",
]
