"""What ``mkctl handover status|report`` (and the API, later) read: query functions that take a
session and never commit."""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from dispatcher.db.models import events, handover_counts, handover_jobs

_POLICY_IN_MESSAGE = re.compile(r"^HandoverPolicy ([^\s:]+)")


async def counts(session: AsyncSession, namespace: str | None = None) -> list[dict[str, Any]]:
    """Jobs on the manager per namespace, kind and controller (as the dispatcher last counted them)."""
    query = sa.select(handover_counts).order_by(handover_counts.c.namespace, handover_counts.c.kind,
                                                handover_counts.c.controller)
    if namespace:
        query = query.where(handover_counts.c.namespace == namespace)
    return [dict(r._mapping) for r in await session.execute(query)]


async def report(session: AsyncSession, namespace: str | None = None) -> list[dict[str, Any]]:
    """Per namespace and kind, over the shadow records of Jobs still on the manager: how many Jobs of
    other controllers a policy selects, how many mkd would accept, why it would refuse the others, and
    where the accepted ones would have run."""
    query = sa.select(handover_jobs).where(handover_jobs.c.gone.is_(False))
    if namespace:
        query = query.where(handover_jobs.c.namespace == namespace)
    groups: dict[tuple[str, str], list[Any]] = defaultdict(list)
    for r in await session.execute(query):
        groups[(r.namespace, r.kind)].append(r)
    out = []
    for (ns, kind), rows in sorted(groups.items()):
        accepted = [r for r in rows if r.would_accept]
        refused = Counter(r.reason for r in rows if not r.would_accept)
        placed = Counter(r.cluster or "none fits now" for r in accepted)
        out.append({
            "namespace": ns, "kind": kind, "policies": ",".join(sorted({r.policy for r in rows})),
            "controllers": ",".join(f"{c}={n}" for c, n in sorted(Counter(r.controller for r in rows).items())),
            "jobs": len(rows), "would_accept": len(accepted), "would_refuse": len(rows) - len(accepted),
            "refusals": [{"reason": reason, "jobs": n} for reason, n in refused.most_common()],
            "would_run_on": ",".join(f"{c}={n}" for c, n in sorted(placed.items())),
            "warned": sum(1 for r in rows if r.warned),
        })
    return out


async def unreached(session: AsyncSession) -> list[dict[str, Any]]:
    """Route policies the webhook can never act on, as the dispatcher last said (``RoutesNothing``, not
    followed by ``Routing``): policy, since when, why and the fix."""
    from dispatcher.handover.book import EVENT_TYPE, ROUTES_NOTHING

    latest: dict[str, Any] = {}
    query = sa.select(events.c.at, events.c.reason, events.c.message).where(events.c.type == EVENT_TYPE)
    for r in await session.execute(query.order_by(events.c.id)):
        found = _POLICY_IN_MESSAGE.match(r.message)
        if found:
            latest[found.group(1)] = r
    return [{"policy": name, "since": r.at, "message": r.message}
            for name, r in sorted(latest.items()) if r.reason == ROUTES_NOTHING]
