"""The outbox publisher: drains unsent Command rows to MQTT, marking each sent after the broker's ack.

A round reads up to ``outbox_batch_size`` unsent rows in id order, publishes them all at once
(QoS 1; many in flight on one connection) and, once every PUBACK is in, marks them sent in one
transaction. A crash or a lost connection between publish and mark means the round is published
again: delivery is at least once, and the (workload, attempt, spec version, epoch) identifiers in
every Command make the repeat harmless on the agent. Rows are never marked sent without an ack.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from dispatcher.db import queries as q
from dispatcher.settings import DispatcherSettings
from federation.clock import Clock
from federation.errors import Transport
from federation.mqtt import LinkHealth, MqttLink

log = logging.getLogger(__name__)


class Publisher:
    def __init__(self, settings: DispatcherSettings, sessions: async_sessionmaker[AsyncSession], clock: Clock,
                 wake: asyncio.Event, *, client_id: str, fresh: list[tuple[int, str, bytes]] | None = None) -> None:
        self.settings = settings
        self.sessions = sessions
        self.clock = clock
        self.wake = wake
        self.client_id = client_id
        self.sent = 0
        self.rounds = 0
        self._last_purge = 0.0
        self.fresh = fresh if fresh is not None else []
        self._scanned: set[int] = set()
        self._startup = True

    async def run(self) -> None:
        health = LinkHealth(self.settings.mqtt, self.clock)
        while True:
            try:
                async with MqttLink(self.settings.mqtt, client_id=self.client_id) as link:
                    health.connected_now()
                    self._startup = True
                    await self._drain_forever(link)
            except Transport as exc:
                health.failed(exc)
                delay = health.next_delay()
                log.warning("outbox link down (%s); reconnecting in %.1fs", exc, delay)
                await self.clock.sleep(delay)

    async def _drain_forever(self, link: MqttLink) -> None:
        while True:
            self.wake.clear()
            if await self.drain_once(link):
                continue  # there may be more
            await self._maybe_purge()
            try:
                await asyncio.wait_for(self.wake.wait(), timeout=self.settings.outbox_poll_seconds)
            except TimeoutError:
                pass

    async def drain_once(self, link: MqttLink) -> int:
        """Publish one round; returns how many rows were sent.

        Rows the engine just committed come from memory (``fresh``); when there are none, unsent rows
        are read from the database (left by a crash, a lost connection or another dispatcher). A row
        a scan already published is skipped when it also shows up in ``fresh``.
        """
        limit = self.settings.outbox_batch_size
        if self.fresh:
            rows = [r for r in self.fresh[:limit] if r[0] not in self._scanned]
            del self.fresh[:limit]
        else:
            # After (re)connecting, everything unsent; later only rows old enough that they are not
            # this engine's in-flight fresh rows (rows of another dispatcher, or left by a crash).
            before = None if self._startup else self.clock.now() - timedelta(seconds=self.settings.outbox_poll_seconds)
            async with self.sessions() as s:
                rows = [(r.id, r.topic, r.payload) for r in await q.unsent(s, limit, before=before)]
            if not rows:
                self._startup = False
            if len(self._scanned) > 100_000:
                self._scanned.clear()
            self._scanned.update(r[0] for r in rows)
        if not rows:
            return 0
        results = await asyncio.gather(*(link.publish(topic, payload) for _, topic, payload in rows),
                                       return_exceptions=True)
        done = [r[0] for r, res in zip(rows, results, strict=True) if res is None]
        failed = [res for res in results if res is not None]
        if done:
            async with self.sessions.begin() as s:
                await q.mark_sent(s, done, self.clock.now())
            self.sent += len(done)
        self.rounds += 1
        if failed:
            first = failed[0]
            if isinstance(first, BaseException) and not isinstance(first, Exception):
                raise first
            raise first if isinstance(first, Transport) else Transport(f"publish failed: {first!r}")
        return len(done)

    async def _maybe_purge(self) -> None:
        keep = self.settings.outbox_retention_seconds
        if self.clock.monotonic() - self._last_purge < 60:
            return
        self._last_purge = self.clock.monotonic()
        async with self.sessions.begin() as s:
            n = await q.purge_sent(s, self.clock.now() - timedelta(seconds=keep))
        if n:
            log.debug("purged %d sent outbox rows", n)
