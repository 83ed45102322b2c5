"""The lease desk: an agent's heartbeat answered with a Lease without waiting behind the engine.

Every heartbeat the report subscriber takes is also offered here (``offer``, never blocks). The
desk's one task (``run``, under the dispatcher's Supervisor) takes what came in since its last turn,
keeps the latest heartbeat per cluster, writes each cluster's ``lease_until`` in one small
transaction (never moved back: :func:`dispatcher.db.queries.extend_lease`), and only after that
commit publishes each signed Lease straight on the outbox publisher's MQTT link (QoS 1). So a grant
never outlives what a restarted or standby dispatcher reads from ``clusters.lease_until``, and a
Place batch in the engine (seconds on a loaded machine) no longer delays it. Only the active
dispatcher grants (``Leadership.active``); a cluster with no row yet (its first heartbeat) and a
desk whose write or publish failed leave the grant to the engine's own path (``ClusterHealth``),
which still answers every heartbeat it handles unless this desk already granted that very one.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from dispatcher.batch import ReportIn
from dispatcher.db import queries as q
from federation import messages, topics

if TYPE_CHECKING:
    from dispatcher.engine import Engine

log = logging.getLogger(__name__)


class LeaseDesk:
    def __init__(self, engine: Engine, publish: Callable[[str, bytes], Awaitable[None]],
                 active: Callable[[], bool]) -> None:
        self.engine = engine
        self.publish = publish
        self.active = active
        self.pending: dict[str, ReportIn] = {}
        self.wake = asyncio.Event()
        self.grants = 0

    def offer(self, item: ReportIn) -> None:
        hb = item.report
        if isinstance(hb, messages.Heartbeat) and hb.online:
            self.pending[hb.cluster] = item  # coalesced: the latest heartbeat per cluster is answered
            self.wake.set()

    async def run(self) -> None:
        while True:
            await self.wake.wait()
            self.wake.clear()
            taken, self.pending = self.pending, {}
            if taken and self.active():
                await self.grant(list(taken.values()))

    async def grant(self, items: list[ReportIn]) -> None:
        """Persist then publish a Lease for each heartbeat (see the module docstring)."""
        e, seconds = self.engine, self.engine.settings.lease_seconds
        ends = {it.report.cluster: it.received_at + timedelta(seconds=seconds) for it in items}
        async with e.sessions.begin() as s:
            known = {name for name, end in ends.items() if await q.extend_lease(s, name, end)}
        out: list[tuple[str, bytes]] = []
        answered: dict[str, datetime] = {}
        for item in items:
            hb = item.report
            assert isinstance(hb, messages.Heartbeat)
            if hb.cluster not in known:
                continue  # no row yet: the engine's batch creates it and grants
            end, earlier = ends[hb.cluster], e.lease_until.get(hb.cluster)
            e.lease_until[hb.cluster] = max(end, earlier) if earlier is not None else end
            topic = topics.commands(hb.cluster, e.settings.mqtt.topic_root)
            lease = messages.Lease(cluster=hb.cluster, epoch=e.epoch, heartbeat_sent_at=hb.sent_at,
                                   seconds=seconds, sent_at=e.clock.now())
            out.append((topic, e.identity.seal(topic, messages.encode(lease), epoch=e.epoch, n=e.outbox_ids.next())))
            answered[hb.cluster] = hb.sent_at
        await asyncio.gather(*(self.publish(topic, payload) for topic, payload in out))
        e.leases_granted.update(answered)  # only once published: a failed publish leaves it to the engine
        self.grants += len(out)
