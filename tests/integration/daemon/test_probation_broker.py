"""A broker that registers ready, acknowledges every assignment and runs nothing, against a real ZooKeeper, a
real controller and a well-behaved broker: an in-process worker whose ZooKeeper client (its constructor's
``client``) says it created the owner znodes it never creates. The controller refuses its reports (ZooKeeper
says it holds none of them), keeps it from new work for a back-off shown in ``status`` (the tasks run on the
other broker meanwhile), tries it again after the back-off, and backs it off twice as long when it goes on."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from broker_sim.worker import Worker, WorkerConfig
from controller.admin import AdminClient, wait_for
from controller.daemon import Controller, ControllerConfig
from controller.protocol.group.rules import RECONCILE
from controller.protocol.group.vocabulary import GroupConfig
from controller.protocol.tasks.spec import parse_spec
from controller.zk.client import make_client

TASKS = [f"t{i}" for i in range(6)]


class _Done:
    """An answer already there (what a lie returns instead of a request's pending result)."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def get(self, *_args: Any, **_kwargs: Any) -> Any:
        return self.value


class _NeverTakesTx:
    """A multi whose owner znode creates and deletes are left out, answered as if they had been made (it never
    took one: its releases delete nothing)."""

    def __init__(self, tx: Any) -> None:
        self._tx = tx
        self._ops = 0
        self._lies: dict[int, Any] = {}

    def create(self, path: str, *args: Any, **kwargs: Any) -> None:
        if path.endswith("/owner"):
            self._lies[self._ops] = path
        else:
            self._tx.create(path, *args, **kwargs)
        self._ops += 1

    def delete(self, path: str, *args: Any, **kwargs: Any) -> None:
        if path.endswith("/owner"):
            self._lies[self._ops] = True
        else:
            self._tx.delete(path, *args, **kwargs)
        self._ops += 1

    def __getattr__(self, name: str) -> Any:  # check, set_data, delete: real, counted
        real = getattr(self._tx, name)

        def op(*args: Any, **kwargs: Any) -> Any:
            self._ops += 1
            return real(*args, **kwargs)

        return op

    def commit(self) -> list[Any]:
        real = iter(self._tx.commit() if len(self._lies) < self._ops else [])
        return [self._lies[i] if i in self._lies else next(real) for i in range(self._ops)]

    def commit_async(self) -> _Done:
        return _Done(self.commit())


class NeverTakes:
    """A ZooKeeper client that lies about owner znodes: their creates and deletes "succeed" and do nothing."""

    def __init__(self, client: Any) -> None:
        self._client = client

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    def create(self, path: str, *args: Any, **kwargs: Any) -> str:
        return path if path.endswith("/owner") else self._client.create(path, *args, **kwargs)

    def delete(self, path: str, *args: Any, **kwargs: Any) -> Any:
        return True if path.endswith("/owner") else self._client.delete(path, *args, **kwargs)

    def delete_async(self, path: str, *args: Any, **kwargs: Any) -> Any:
        return _Done(True) if path.endswith("/owner") else self._client.delete_async(path, *args, **kwargs)

    def create_async(self, path: str, *args: Any, **kwargs: Any) -> Any:
        return _Done(path) if path.endswith("/owner") else self._client.create_async(path, *args, **kwargs)

    def transaction(self) -> _NeverTakesTx:
        return _NeverTakesTx(self._client.transaction())


def _config(bid: str, zk_settings) -> WorkerConfig:
    return WorkerConfig(bid, zk_settings, status_interval_s=0.1, on_halt="kill", protocols=(RECONCILE,))


def _owners(zk, layout) -> dict[str, str]:
    out = {}
    for t in TASKS:
        st = zk.exists(layout.task_owner(t))
        if st is not None:
            out[t] = json.loads(zk.get(layout.task_owner(t))[0])["broker"]
    return out


def _backed_off(admin: AdminClient, member: str) -> str | None:
    (g,) = admin.status(full=True).groups
    return next((x for x in g.ignored if x.startswith(f"{member}: backed off")), None)


@pytest.mark.timeout(150)
def test_a_broker_that_acknowledges_and_runs_nothing_is_kept_from_new_work_for_a_growing_back_off(
    zk, zk_settings, layout
):
    group = GroupConfig(
        rebalance_timeout_s=3.0, backoff_refusals=3, backoff_initial_s=10.0, backoff_max_s=60.0, initial_delay_s=0.0
    )
    ctl = Controller(ControllerConfig("ctl", zk_settings, group)).start()
    workers: list[Worker] = []
    liar_client = None
    try:
        assert ctl.wait_active(15)
        admin = AdminClient(zk, layout)
        admin.update_settings({"preferred_check_s": 1.0, "max_imbalance": 0})  # work goes back to it soon
        workers.append(Worker(_config("good", zk_settings)).start())
        admin.create_tasks([parse_spec({"id": t, "pipeline": {"kind": "noop"}}) for t in TASKS])
        assert wait_for(lambda: len(_owners(zk, layout)) == len(TASKS), 30), _owners(zk, layout)

        liar_client = make_client(zk_settings, connect=False)
        workers.append(Worker(_config("liar", zk_settings), client=NeverTakes(liar_client)).start())
        assert wait_for(lambda: _backed_off(admin, "liar"), 40), admin.status(full=True).groups
        shown = _backed_off(admin, "liar")
        assert shown and "back-off 10s" in shown and "3 acknowledgements refused in a row" in shown, shown
        # meanwhile every task runs on the broker that behaves: none waits out the rebalance timeout
        assert wait_for(lambda: set(_owners(zk, layout).values()) == {"good"} and len(_owners(zk, layout)) == 6, 10)
        assert wait_for(lambda: admin.status(full=True).groups[0].state == "Stable", 10), admin.status(True).groups

        # after its back-off it is tried again, refused again, and backed off twice as long
        assert wait_for(lambda: "back-off 20s" in (_backed_off(admin, "liar") or ""), 40), admin.status(True).groups
        again = _backed_off(admin, "liar")
        assert again and re.search(r"backed off for \d+s more", again), again
        assert wait_for(lambda: set(_owners(zk, layout).values()) == {"good"} and len(_owners(zk, layout)) == 6, 10)
    finally:
        for w in workers:
            w.stop()
        ctl.stop()
