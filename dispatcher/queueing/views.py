"""Queue figures: positions of pending Workloads from the database, and the status Kueue writes.

:func:`pending_from_db` takes a session (and never commits, like every query function) and reads
the pending rows with their ClusterQueue and order (priority, queue time, claim order): the read
model (``dispatcher.readmodel``) answers every admin surface with it. :func:`cluster_queue_status`
and :func:`local_queue_status` compute, from a running dispatcher's memory, the ``status`` Kueue
writes on a ClusterQueue and a LocalQueue (``dispatcher.queueing.watcher`` writes them to the manager).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from decimal import Decimal
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from dispatcher.db.models import workloads
from dispatcher.queueing.catalog import Catalog
from dispatcher.queueing.quota import ZERO
from dispatcher.queueing.scheduler import Queues
from federation.podset import format_quantity

STEPS = {
    "LocalQueueDoesNotExist": "queue", "ClusterQueueDoesNotExist": "queue", "NamespaceNotAdmitted": "queue",
    "FlavorNotFound": "queue", "Stopped": "queue", "QuotaNotReserved": "quota", "NoFittingCluster": "placement",
}


# --- from the database ----------------------------------------------------------------------


async def pending_from_db(session: AsyncSession, *, cluster_queue: str | None = None,
                          namespace: str | None = None, local_queue: str | None = None,
                          uid: str | None = None) -> list[dict[str, Any]]:
    """Pending Workloads in admission order with ``position_in_cluster_queue`` and
    ``position_in_local_queue`` (1-based, as Kueue's visibility API counts them from 0 + 1).
    Filters: a ClusterQueue, or a LocalQueue (``namespace`` + ``local_queue``), or one Workload (``uid``).
    The positions are numbered in the database (window functions over every pending row), so a filtered
    list reads only its own rows."""
    w = workloads
    queued = sa.func.coalesce(w.c.queued_at, w.c.created_at)
    order = (w.c.priority.desc(), queued, w.c.queue_seq)
    ranked = (sa.select(w.c.uid, w.c.namespace, w.c.name, w.c.kind, w.c.queue, w.c.cluster_queue, w.c.priority,
                        queued.label("queued_at"), w.c.queue_seq, w.c.reason,
                        sa.func.row_number().over(partition_by=w.c.cluster_queue, order_by=order)
                        .label("position_in_cluster_queue"),
                        sa.func.row_number().over(partition_by=(w.c.namespace, w.c.queue), order_by=order)
                        .label("position_in_local_queue"))
              .where(w.c.state == "pending", w.c.suspended.is_(False))).subquery()
    r = ranked.c
    stmt = sa.select(ranked).order_by(r.priority.desc(), r.queued_at, r.queue_seq)
    if cluster_queue is not None:
        stmt = stmt.where(r.cluster_queue == cluster_queue)
    if local_queue is not None:
        stmt = stmt.where(r.queue == local_queue)
    if namespace is not None:
        stmt = stmt.where(r.namespace == namespace)
    if uid is not None:
        stmt = stmt.where(r.uid == uid)
    result = await session.execute(stmt)
    keys = tuple(result.keys())  # once, not per row: 10,000 pending rows are read whole
    return [dict(zip(keys, row, strict=True)) for row in result]


# --- from a running dispatcher's memory ------------------------------------------------------


def _flavor_usage(cq_name: str, catalog: Catalog, usage: Mapping[tuple[str, str], Decimal],
                  nominal: bool) -> list[dict[str, Any]]:
    cq = catalog.cluster_queues[cq_name]
    out = []
    for group in cq.resource_groups:
        for fq in group.flavors:
            resources = []
            for res in group.covered:
                total = usage.get((fq.name, res), ZERO)
                item: dict[str, Any] = {"name": res, "total": format_quantity(total, res)}
                if nominal:
                    quota = fq.resources.get(res)
                    item["borrowed"] = format_quantity(max(total - (quota.nominal if quota else ZERO), ZERO), res)
                resources.append(item)
            out.append({"name": fq.name, "resources": resources})
    return out


def _active(catalog: Catalog, cq_name: str) -> dict[str, str]:
    cq = catalog.cluster_queues[cq_name]
    missing = [f for f in cq.flavor_names() if f not in catalog.flavors]
    if cq.stop_policy != "None":
        return {"status": "False", "reason": "Stopped", "message": f"Can't admit new workloads: stopPolicy {cq.stop_policy}"}
    if missing:
        return {"status": "False", "reason": "FlavorNotFound",
                "message": f"Can't admit new workloads: references missing ResourceFlavor(s): {', '.join(missing)}"}
    return {"status": "True", "reason": "Ready", "message": "Can admit new workloads"}


def cluster_queue_status(queues: Queues, name: str, now: datetime) -> dict[str, Any]:
    """The ``status`` Kueue writes on a ClusterQueue (pending/reserving/admitted, flavors, Active)."""
    catalog = queues.catalog
    usage: dict[tuple[str, str], Decimal] = {}
    admitted = 0
    for a in queues.admitted.values():
        if a.cq == name:
            admitted += 1
            for fr, amount in a.usage.items():
                usage[fr] = usage.get(fr, ZERO) + amount
    pending = sum(1 for e in queues.entries.values() if e.cq == name)
    active = _active(catalog, name)
    return {"pendingWorkloads": pending, "reservingWorkloads": admitted, "admittedWorkloads": admitted,
            "flavorsReservation": _flavor_usage(name, catalog, usage, True),
            "flavorsUsage": _flavor_usage(name, catalog, usage, True),
            "conditions": [{"type": "Active", **active, "lastTransitionTime": now.strftime("%Y-%m-%dT%H:%M:%SZ")}]}


def local_queue_status(queues: Queues, namespace: str, name: str, now: datetime) -> dict[str, Any]:
    """The ``status`` Kueue writes on a LocalQueue."""
    catalog = queues.catalog
    lq = catalog.local_queues[(namespace, name)]
    usage: dict[tuple[str, str], Decimal] = {}
    admitted = 0
    for a in queues.admitted.values():
        if a.namespace == namespace and a.queue == name:
            admitted += 1
            for fr, amount in a.usage.items():
                usage[fr] = usage.get(fr, ZERO) + amount
    pending = sum(1 for e in queues.entries.values() if e.namespace == namespace and e.queue == name)
    status: dict[str, Any] = {"pendingWorkloads": pending, "reservingWorkloads": admitted, "admittedWorkloads": admitted}
    if lq.cluster_queue in catalog.cluster_queues:
        flavors = _flavor_usage(lq.cluster_queue, catalog, usage, False)
        status["flavorsReservation"] = flavors
        status["flavorsUsage"] = flavors
        active = _active(catalog, lq.cluster_queue)
        if lq.stop_policy != "None":
            active = {"status": "False", "reason": "Stopped", "message": f"LocalQueue is stopped ({lq.stop_policy})"}
    else:
        active = {"status": "False", "reason": "ClusterQueueDoesNotExist",
                  "message": f"Can't submit new workloads to clusterQueue: {lq.cluster_queue} does not exist"}
    status["conditions"] = [{"type": "Active", **active, "lastTransitionTime": now.strftime("%Y-%m-%dT%H:%M:%SZ")}]
    return status
