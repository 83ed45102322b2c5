"""The Queues view: every queue name Workloads carry, their Workloads per state and admitted requests.

Quotas come from the queueing package (ClusterQueues, cohorts) once it is configured; until then
``configured`` is False and the view says "queues not configured": queue names are recorded and
Workloads are placed in arrival order.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import sqlalchemy as sa

from dispatcher.api import models as m
from dispatcher.db.models import workloads
from federation.errors import Invalid

ADMITTED = ("placed", "running")


async def queue_page(session: Any) -> m.QueuePage:
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
    return m.QueuePage(configured=False, items=items)
