"""The lease desk: an agent's heartbeat answered with a Lease without waiting behind the engine.

Every heartbeat the report subscriber takes is also offered here (``offer``, never blocks). The desk's one
task (``run``, under the dispatcher's Supervisor) waits ``lease_linger_seconds`` once woken, takes what
came in since its last turn, keeps the latest heartbeat per cluster, writes their ``lease_until`` in one
statement with the time each heartbeat was received (``last_heartbeat``; neither ever moved back:
:func:`dispatcher.db.queries.clusters.extend_leases`), and only after that commit publishes each signed Lease straight
on the outbox publisher's MQTT link (QoS 1). So a grant never outlives what a restarted or standby dispatcher
reads from ``clusters.lease_until``, and a Place batch in the engine (seconds on a loaded machine) no longer
delays it. Only the active dispatcher grants (``Leadership.active``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import TYPE_CHECKING

from dispatcher.db import mapped
from dispatcher.db.queries import clusters as cluster_q
from dispatcher.engine.batch import ReportIn
from federation import messages, topics
from federation.errors import DatabaseUnavailable, Transport
from federation.retry import Backoff

if TYPE_CHECKING:
    from dispatcher.engine.loop import Engine

log = logging.getLogger(__name__)


class LeaseDesk:
    """**One Lease per heartbeat.** Who answers a heartbeat is decided when it is offered, before the engine
    can see it: the desk takes every heartbeat of a cluster the engine has granted a lease to before (a
    cluster row exists), and claims it in ``Engine.leases_granted`` at once, so the engine's own path
    (``ClusterHealth``) skips it; the engine answers only the heartbeats the desk did not take (a cluster's
    first, whose batch creates its row). A claimed heartbeat whose write or publish fails is tried again
    by the desk (backoff) until it is answered or a newer heartbeat of the cluster replaces it, never
    handed back: the engine may have passed it already, and both answering it sent two identical Leases.
    """
    def __init__(self, engine: Engine, publish: Callable[[str, bytes], Awaitable[None]],
                 active: Callable[[], bool]) -> None:
        self.engine = engine
        self.publish = publish
        self.active = active
        self.pending: dict[str, ReportIn] = {}
        self.wake = asyncio.Event()
        self.grants = 0
        self.linger = engine.settings.lease_linger_seconds

    def offer(self, item: ReportIn) -> None:
        """Take ``item`` (claimed at once, see :class:`LeaseDesk`) when the desk is to answer it."""
        hb = item.report
        if not isinstance(hb, messages.Heartbeat) or not hb.online:
            return
        e = self.engine
        if hb.cluster not in e.lease_until or not self.active():
            return  # the engine answers it: its batch records a cluster heard for the first time
        claimed = e.leases_granted.get(hb.cluster)
        if claimed is not None and claimed >= hb.sent_at:
            return  # a newer heartbeat is answered already (or being answered): its lease runs longer
        e.leases_granted[hb.cluster] = hb.sent_at
        self.pending[hb.cluster] = item  # coalesced: the latest heartbeat per cluster is answered
        self.wake.set()

    async def run(self) -> None:
        backoff = Backoff(0.1, 5.0)
        while True:
            await self.wake.wait()
            if self.linger:
                # real time on purpose, as the engine's batch linger: heartbeats arriving together share one
                # transaction (a lease runs for lease_seconds; a fraction of a second later costs nothing)
                await asyncio.sleep(self.linger)
            self.wake.clear()
            taken, self.pending = self.pending, {}
            if not taken or not self.active():
                continue  # a standby grants nothing (and losing the leadership ends the process)
            try:
                with mapped():
                    left = await self.grant(list(taken.values()))
            except DatabaseUnavailable as exc:
                left = list(taken.values())
                log.warning("lease desk: database unreachable (%s); granting again shortly", exc)
            except Exception:
                self._again(list(taken.values()))
                raise  # a bug: the Supervisor logs and restarts the task; the claims stay pending
            if left:
                self._again(left)
                await backoff.wait(self.engine.clock)
                self.wake.set()
            else:
                backoff.succeeded()

    def _again(self, items: list[ReportIn]) -> None:
        """Keep claimed heartbeats for the next turn, unless a newer one of the cluster came meanwhile."""
        for item in items:
            self.pending.setdefault(item.report.cluster, item)  # type: ignore[union-attr]

    async def grant(self, items: list[ReportIn]) -> list[ReportIn]:
        """Persist then publish a Lease for each heartbeat (see :class:`LeaseDesk`); returns those that
        could not be answered now (no cluster row, or the publish failed)."""
        e, seconds = self.engine, self.engine.settings.lease_seconds
        ends = {it.report.cluster: it.received_at + timedelta(seconds=seconds) for it in items}  # type: ignore[union-attr]
        heard = {it.report.cluster: it.received_at for it in items}  # type: ignore[union-attr]
        async with e.sessions.begin() as s:
            # one statement for the turn, rows locked by name as the engine locks the rows of the heartbeats
            # it takes: two transactions locking the same rows in two orders deadlock (PostgreSQL fails one)
            known = await cluster_q.extend_leases(s, {name: (end, heard[name]) for name, end in ends.items()})
        out: list[tuple[ReportIn, str, bytes]] = []
        left: list[ReportIn] = []
        for item in items:
            hb = item.report
            assert isinstance(hb, messages.Heartbeat)
            if hb.cluster not in known:
                left.append(item)  # its row is gone (deregistered): the engine's next batch writes it again
                continue
            end, earlier = ends[hb.cluster], e.lease_until.get(hb.cluster)
            e.lease_until[hb.cluster] = max(end, earlier) if earlier is not None else end
            topic = topics.commands(hb.cluster, e.settings.mqtt.topic_root)
            lease = messages.Lease(cluster=hb.cluster, epoch=e.epoch, heartbeat_sent_at=hb.sent_at,
                                   seconds=seconds, sent_at=e.clock.now())
            out.append((item, topic, e.identity.seal(topic, messages.encode(lease), epoch=e.epoch,
                                                     n=e.outbox_ids.next())))
        results = await asyncio.gather(*(self.publish(topic, payload) for _, topic, payload in out),
                                       return_exceptions=True)
        for (item, _, _), result in zip(out, results, strict=True):
            if isinstance(result, Transport):
                left.append(item)  # the link is down: published once it is back
            elif isinstance(result, BaseException):
                raise result
            else:
                self.grants += 1
        if len(left) < len(items):
            log.debug("lease desk granted %d of %d", len(items) - len(left), len(items))
        return left
