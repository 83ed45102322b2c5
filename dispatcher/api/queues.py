"""The Queues view: every queue name Workloads carry, their Workloads per state and admitted requests,
and, once Kueue's ClusterQueues exist on the manager, each ClusterQueue's quota against the quota its
admitted Workloads hold (read from the engine's queueing state, ``dispatcher/queueing``). Without any
ClusterQueue ``configured`` is False and the view says "queues not configured": queue names are
recorded and Workloads are admitted without quota.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import sqlalchemy as sa

from dispatcher.api import models as m
from dispatcher.db.models import workloads
from federation.errors import Invalid

ADMITTED = ("placed", "running")


def _fr(key: Any) -> str:
    flavor, resource = key
    return f"{flavor}/{resource}"


def cluster_queues(queueing: Any, pending_by_queue: dict[str, int]) -> list[m.ClusterQueueItem]:
    """Each ClusterQueue's nominal quota and held usage (flavor/resource), from the engine's quota tree."""
    from federation.podset import format_quantity

    catalog = getattr(queueing, "catalog", None)
    tree = getattr(getattr(queueing, "queues", None), "tree", None)
    if catalog is None or tree is None:
        return []
    local_to_cq = {name: lq.cluster_queue for (_, name), lq in catalog.local_queues.items()}
    out = []
    for name, cq in sorted(catalog.cluster_queues.items()):
        node = tree.queues.get(name)
        nominal = dict(node.nominal) if node is not None else {}
        usage = dict(node.usage) if node is not None else {}
        pending = sum(n for q, n in pending_by_queue.items() if local_to_cq.get(q) == name)
        out.append(m.ClusterQueueItem(
            name=name, cohort=cq.cohort, pending=pending,
            quota={_fr(k): format_quantity(v, k[1]) for k, v in sorted(nominal.items())},
            usage={_fr(k): format_quantity(v, k[1]) for k, v in sorted(usage.items()) if v}))
    return out


async def queue_page(session: Any, queueing: Any = None) -> m.QueuePage:
    from federation.podset import format_quantity, parse_quantity

    counts: dict[str, dict[str, int]] = {}
    for queue, state, n in await session.execute(
            sa.select(workloads.c.queue, workloads.c.state, sa.func.count()).group_by(workloads.c.queue,
                                                                                      workloads.c.state)):
        counts.setdefault(str(queue), {})[str(state)] = int(n)
    admitted: dict[str, dict[str, Decimal]] = {}
    for queue, requests in await session.execute(
            sa.select(workloads.c.queue, workloads.c.requests).where(workloads.c.state.in_(ADMITTED))):
        total = admitted.setdefault(str(queue), {})
        for name, amount in (requests or {}).items():
            try:
                total[name] = total.get(name, Decimal(0)) + parse_quantity(amount, name)
            except (ValueError, Invalid, ArithmeticError):
                continue
    items = [m.QueueItem(name=q, workloads=counts[q],
                         requests_admitted={k: format_quantity(v, k) for k, v in sorted(admitted.get(q, {}).items())},
                         quota=None)
             for q in sorted(counts)]
    catalog = getattr(queueing, "catalog", None)
    configured = bool(catalog is not None and catalog.cluster_queues)
    pending = {q: c.get("pending", 0) for q, c in counts.items()}
    return m.QueuePage(configured=configured, items=items,
                       cluster_queues=cluster_queues(queueing, pending) if configured else [])
