"""Read-only answers about queues for ``mkctl`` and the HTTP API: positions, usage, and "why".

Two sources answer the same questions. The ``*_from_db`` functions take a session (and never
commit, like every query function) and read what the dispatcher recorded: pending rows with their
ClusterQueue and order (priority, queue time, claim order), the quota placed Workloads hold, and
the history row that says which step holds a Workload. :func:`cluster_queue_status` and
:func:`local_queue_status` compute, from a running dispatcher's memory, the ``status`` Kueue writes
on a ClusterQueue and a LocalQueue (``dispatcher.queueing.status_writer`` writes them to the manager).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from decimal import Decimal
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from dispatcher.db.models import events, workloads
from dispatcher.queueing.catalog import Catalog
from dispatcher.queueing.quota import ZERO
from dispatcher.queueing.scheduler import Queues
from dispatcher.queueing.state import HOLDING, usage_from_json
from federation.podset import format_quantity

STEPS = {
    "LocalQueueDoesNotExist": "queue", "ClusterQueueDoesNotExist": "queue", "NamespaceNotAdmitted": "queue",
    "FlavorNotFound": "queue", "Stopped": "queue", "QuotaNotReserved": "quota", "NoFittingCluster": "placement",
}


# --- from the database ----------------------------------------------------------------------


async def pending_from_db(session: AsyncSession, *, cluster_queue: str | None = None,
                          namespace: str | None = None, local_queue: str | None = None) -> list[dict[str, Any]]:
    """Pending Workloads in admission order with ``position_in_cluster_queue`` and
    ``position_in_local_queue`` (1-based, as Kueue's visibility API counts them from 0 + 1).
    Filters: a ClusterQueue, or a LocalQueue (``namespace`` + ``local_queue``)."""
    w = workloads
    result = await session.execute(
        sa.select(w.c.uid, w.c.namespace, w.c.name, w.c.kind, w.c.queue, w.c.cluster_queue, w.c.priority,
                  w.c.queued_at, w.c.created_at, w.c.queue_seq, w.c.reason)
        .where(w.c.state == "pending", w.c.suspended.is_(False)))
    rows = [dict(r._mapping) for r in result]
    rows.sort(key=lambda r: (-r["priority"], r["queued_at"] or r["created_at"], r["queue_seq"]))
    in_cq: dict[str | None, int] = {}
    in_lq: dict[tuple[str, str], int] = {}
    out = []
    for r in rows:
        cq = r["cluster_queue"]
        in_cq[cq] = in_cq.get(cq, 0) + 1
        lq = (r["namespace"], r["queue"])
        in_lq[lq] = in_lq.get(lq, 0) + 1
        r["position_in_cluster_queue"] = in_cq[cq]
        r["position_in_local_queue"] = in_lq[lq]
        r["queued_at"] = r["queued_at"] or r["created_at"]
        if cluster_queue is not None and cq != cluster_queue:
            continue
        if local_queue is not None and (r["queue"] != local_queue or (namespace and r["namespace"] != namespace)):
            continue
        if namespace is not None and r["namespace"] != namespace:
            continue
        out.append(r)
    return out


async def queues_from_db(session: AsyncSession) -> list[dict[str, Any]]:
    """Per ClusterQueue seen in the records: pending and admitted counts and the quota in use."""
    w = workloads
    out: dict[str, dict[str, Any]] = {}
    result = await session.execute(sa.select(w.c.cluster_queue, w.c.state, w.c.usage, w.c.suspended)
                                   .where(w.c.cluster_queue.is_not(None),
                                          w.c.state.in_(("pending", *HOLDING))))
    for r in result:
        q = out.setdefault(r.cluster_queue, {"name": r.cluster_queue, "pending": 0, "admitted": 0, "usage": {}})
        if r.state == "pending":
            q["pending"] += 0 if r.suspended else 1
            continue
        q["admitted"] += 1
        for fr, amount in usage_from_json(r.usage).items():
            q["usage"][fr] = q["usage"].get(fr, ZERO) + amount
    for q in out.values():
        q["usage"] = {f"{f}/{res}": format_quantity(v, res) for (f, res), v in sorted(q["usage"].items())}
    return sorted(out.values(), key=lambda q: q["name"])


async def why_from_db(session: AsyncSession, ref: str) -> dict[str, Any] | None:
    """Which step holds one Workload (``namespace/name`` or uid), in words; None when unknown."""
    w = workloads
    if "/" in ref:
        ns, _, name = ref.partition("/")
        where = sa.and_(w.c.namespace == ns, w.c.name == name)
    else:
        where = w.c.uid == ref
    row = (await session.execute(sa.select(w).where(where).order_by(w.c.created_at.desc()).limit(1))).first()
    if row is None:
        return None
    r = dict(row._mapping)
    out: dict[str, Any] = {"workload": f"{r['namespace']}/{r['name']}", "uid": r["uid"], "state": r["state"],
                           "cluster_queue": r["cluster_queue"], "queue": r["queue"], "priority": r["priority"],
                           "priority_source": r["priority_source"]}
    state = r["state"]
    if state == "pending" and r["suspended"]:
        out.update(step="suspended", message="suspended on the manager cluster; queued once resumed")
    elif state == "pending":
        last = (await session.execute(
            sa.select(events.c.reason, events.c.message, events.c.at)
            .where(events.c.workload_uid == r["uid"], events.c.type == "pending")
            .order_by(events.c.id.desc()).limit(1))).first()
        word = last.reason if last is not None else ""
        out.update(step=STEPS.get(word, "queued"), reason=word,
                   message=r["reason"] or (last.message if last is not None else "")
                   or "waiting for its turn: nothing has held it yet")
        mine = [p for p in await pending_from_db(session) if p["uid"] == r["uid"]]
        if mine:
            out.update(position_in_cluster_queue=mine[0]["position_in_cluster_queue"],
                       position_in_local_queue=mine[0]["position_in_local_queue"])
    elif state in HOLDING:
        out.update(step="admitted", message=f"admitted: {state} on cluster {r['cluster']}"
                   + (f", quota in ClusterQueue {r['cluster_queue']}" if r["cluster_queue"] else ""))
    else:
        out.update(step=state, message=r["reason"] or state)
    return out


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
