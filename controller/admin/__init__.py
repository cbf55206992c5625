"""The admin library: everything the CLI (and the HTTP API) does, usable from Python and tests.

Front ends only parse and print; this package talks to ZooKeeper through the layout and the codecs:

* ``client`` — ``AdminClient``, which owns its parts: ``tasks`` (``TaskAdmin``), ``restarts``
  (``RestartAdmin``: every FAILED task restarted in one write), ``cluster`` (``ClusterAdmin``: status, brokers,
  groups, rebalance, controlled shutdown, watch) and ``operations`` (``SettingsAdmin``: maintenance mode and
  the live settings), all sharing the pipelined reads of ``reads`` (``ClusterReads``);
* ``views`` — the frozen results and ``to_dict``;
* ``inspection`` — ``zkctl zk tree|get``: decoding whatever lives at a path;
* ``watch`` — the cluster watch behind ``zkctl watch``;
* ``declarative`` — the lazily loaded validator of declarative pipeline specs;
* ``common`` — ``AdminError``, ``ensure_layout``, ``wait_for``, ``wait_watched``, ``file_request``.
"""

from kazoo.exceptions import NodeExistsError, NotEmptyError

from controller.admin.client import AdminClient
from controller.admin.common import (
    WAIT_S,
    AdminError,
    Conflict,
    NotFound,
    ensure_layout,
    wait_for,
)
from controller.admin.declarative import (
    DECLARATIVE_VALIDATOR,
    load_declarative_validator,
)
from controller.admin.inspection import ZkInspector, ZnodeView, payload_decoder, walk
from controller.admin.views import (
    AdminRequest,
    BrokerView,
    BulkRestart,
    ClusterEvent,
    ClusterStatus,
    CreateResult,
    GroupDescription,
    GroupSummary,
    MemberView,
    RestartProgress,
    SkippedRestart,
    TaskChange,
    TaskDescription,
    TaskPage,
    TaskRow,
    to_dict,
)

__all__ = [
    "AdminError",
    "NotFound",
    "Conflict",
    "ensure_layout",
    "payload_decoder",
    "ZkInspector",
    "ZnodeView",
    "walk",
    "wait_for",
    "AdminClient",
    "CreateResult",
    "TaskPage",
    "TaskRow",
    "TaskDescription",
    "TaskChange",
    "BulkRestart",
    "SkippedRestart",
    "RestartProgress",
    "AdminRequest",
    "BrokerView",
    "GroupSummary",
    "MemberView",
    "GroupDescription",
    "ClusterStatus",
    "ClusterEvent",
    "to_dict",
    "load_declarative_validator",
    "NodeExistsError",
    "NotEmptyError",
    "WAIT_S",
    "DECLARATIVE_VALIDATOR",
]
