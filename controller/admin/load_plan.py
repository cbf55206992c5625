"""``zkctl rebalance --dry-run``: what the ``load-balanced`` assignor would do now, and why, read from
ZooKeeper and written nowhere. The same plan the controller's load check computes (``assignors_load.plan``),
from the same inputs: the members who hold tasks now, each task's spec, and each broker's bounded load report,
a task's figure counting only from the broker that owns it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from controller.admin.cluster import ClusterAdmin
from controller.protocol.group.assignors_load import LoadPlan, plan
from controller.protocol.group.load_balance import LoadWatch
from controller.protocol.records.group_messages import MemberMetadata
from controller.protocol.records.payload_validation import PayloadError
from controller.protocol.tasks.spec import decode_task


@dataclass(frozen=True)
class GroupLoadPlan:
    group: str
    assignor: str | None
    plan: LoadPlan

    def to_dict(self) -> dict[str, Any]:
        p = self.plan
        return {
            "group": self.group,
            "assignor": self.assignor,
            "mean": round(p.mean, 4),
            "tolerance": p.tolerance,
            "over": p.over(p.before),
            "before": {m: round(v, 4) for m, v in p.before.items()},
            "after": {m: round(v, 4) for m, v in p.after.items()},
            "moves": [{"task": mv.task, "from": mv.source, "to": mv.dest, "cost": round(mv.cost, 4)} for mv in p.moves],
            "stopped": p.stopped,
            "explain": p.explain(),
        }


def load_plans(cluster: ClusterAdmin, group: str | None = None) -> list[GroupLoadPlan]:
    """Per group (or the one named): the load-balanced plan from where its tasks run now."""
    described = cluster.describe_group(group)
    brokers = {b.broker_id: b for b in cluster.brokers()}
    reads, lay = cluster.reads, cluster.layout
    ids = reads.task_ids()
    got, _ = reads.wave([lay.task(t) for t in ids])
    specs = {}
    for t, res in zip(ids, got):
        if res is None:
            continue
        try:
            spec = decode_task(res[0], lay.task(t))
        except PayloadError:
            continue  # (a garbled spec is isolated by the controller too)
        if spec.state == "RUNNING":
            specs[t] = spec
    out = []
    for d in described:
        g = d.summary.group
        live = [m for m in d.members if m.live and m.member_id in brokers]
        members = [
            MemberMetadata(
                member_id=m.member_id,
                capacity=brokers[m.member_id].capacity or 1,
                rack=brokers[m.member_id].rack,
                leaving=brokers[m.member_id].shutting_down,
            )
            for m in live
        ]
        owns = {m.member_id: m.owns for m in live}
        watch = LoadWatch()
        watch.on_reports({b: (v.load or {}).get("tasks", {}) for b, v in brokers.items()})
        tasks = [s.descriptor() for t, s in sorted(specs.items()) if s.group == g]
        descriptors = watch.descriptors(tasks, 0.0, owns)
        out.append(GroupLoadPlan(g, d.summary.assignor, plan(members, descriptors, owns)))
    return out


__all__ = ["GroupLoadPlan", "load_plans"]
