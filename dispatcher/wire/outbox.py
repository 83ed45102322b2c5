"""The outbox publisher: drains unsent Command rows to MQTT, marking each sent after the broker's ack.

Rows hold Commands unsigned (a Place already encrypted to its cluster); they are signed as they are published
(``Sealing``, ``dispatcher.clusters.identity.OutboxSealing``). The rows taken together for one agent that opens batches
go as one message of Commands (``federation.messages.encode_commands``: one signature, one broker message); a
Resync, and everything to an agent of an earlier version, goes alone.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime, timedelta
from typing import Protocol

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from dispatcher.db import mapped
from dispatcher.db.queries import outbox as outbox_q
from dispatcher.settings import DispatcherSettings
from dispatcher.wire.freshrows import FreshRows
from federation import messages
from federation.clock import Clock
from federation.errors import DatabaseUnavailable, Transport
from federation.mqtt import LinkHealth, MqttLink
from federation.retry import Backoff
from federation.signing import peek
from federation.tasks import TaskSet

log = logging.getLogger(__name__)


_RESYNC = b'{"v":1,"type":"resync"'


class Sealing(Protocol):
    """How the publisher signs rows (the engine's identity, epoch and outbox ids; ``dispatcher.app``)."""

    def rows(self, topic: str, rows: list[tuple[int, bytes]]) -> bytes:
        """One signed message carrying ``rows`` (id, Command bytes) to the cluster of ``topic``."""

    def batches(self, topic: str) -> bool:
        """Whether the agent of ``topic``'s cluster opens batches of Commands."""


class Publisher:
    """A round reads up to ``outbox_batch_size`` unsent rows in id order, publishes them all at once
    (QoS 1; many in flight on one connection) and, once every PUBACK is in, marks them sent in one
    transaction. A crash or a lost connection between publish and mark means the round is published
    again: delivery is at least once, and the (workload, attempt, spec version, epoch) identifiers in
    every Command make the repeat harmless on the agent. Rows are never marked sent without an ack.
    A database outage keeps the broker link: the publisher backs off (the one
    :class:`~federation.retry.Backoff`) and carries on with the acknowledged ids it still has to mark.
    """
    def __init__(self, settings: DispatcherSettings, sessions: async_sessionmaker[AsyncSession], clock: Clock,
                 wake: asyncio.Event, *, client_id: str, seal: Sealing,
                 fresh: FreshRows | None = None,
                 unanswered: dict[tuple[str, int], float] | None = None) -> None:
        self.settings = settings
        self.seal = seal
        self.messages = 0
        """MQTT messages published for rows (``sent`` / ``messages``: Commands per message)."""
        self.sessions = sessions
        self.clock = clock
        self.wake = wake
        self.client_id = client_id
        self.sent = 0
        self.rounds = 0
        self._last_purge = 0.0
        self.fresh = fresh if fresh is not None else FreshRows(settings.outbox_memory_bytes)
        self.unanswered = unanswered if unanswered is not None else {}
        self._scanned: set[int] = set()
        self._last_scan: float | None = None
        """When the database was last looked at for rows left unsent (``drain_once``), on ``clock.monotonic``."""
        self._startup = True
        self._stopping = False
        self._inflight: dict[int, asyncio.Task[None]] = {}
        self._acked: list[int] = []
        self._failed: list[BaseException] = []
        self._db = Backoff(0.1, settings.outage_retry_max_seconds)
        self._db_down_since: float | None = None
        self.publishes = TaskSet("outbox", on_error=self.publish_failed)
        """The QoS 1 publishes in flight (one task each); ``Dispatcher.start_tasks`` makes it the
        Supervisor's, so a crashed publish is counted on the ``outbox`` task."""

    async def run(self) -> None:
        health = self.health = LinkHealth(self.settings.mqtt, self.clock)
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
        self._link = link
        self._inflight = {}
        self._acked = []
        self._failed = []
        self._last_mark = self.clock.monotonic()
        try:
            while True:
                self.wake.clear()
                try:
                    with mapped():
                        started = await self.drain_once(link)
                except DatabaseUnavailable as exc:
                    await self._database_down(exc)
                    continue
                if self._db_down_since is not None:
                    log.info("outbox: database reachable again after %.1fs", self.clock.monotonic() - self._db_down_since)
                    self._db_down_since = None
                self._db.succeeded()
                if started:
                    await asyncio.sleep(0)  # let the publishes just started go out
                    continue
                if not self._inflight and not self._acked:
                    await self._maybe_purge()
                wait = 0.02 if self._acked else self.settings.outbox_poll_seconds
                try:
                    await asyncio.wait_for(self.wake.wait(), timeout=wait)
                except TimeoutError:
                    pass
        finally:
            await self.publishes.cancel_all()

    async def _database_down(self, exc: BaseException) -> None:
        if self._db_down_since is None:
            self._db_down_since = self.clock.monotonic()
            log.warning("outbox: database unreachable (%s: %s); retrying until it is back",
                        type(exc).__name__, str(exc)[:300])
        await self.clock.sleep(self._db.failed())

    async def _one(self, row_ids: list[int], topic: str, payload: bytes) -> None:
        try:
            await self._link.publish(topic, payload)
            self._acked.extend(row_ids)
            self.messages += 1
        except Transport as exc:  # the link broke: expected, the round is published again after reconnecting
            self._failed.append(exc)
        finally:  # anything else fails the task: logged and counted by the task set, then handed to publish_failed
            for row_id in row_ids:
                self._inflight.pop(row_id, None)
            self.wake.set()

    def _messages(self, rows: list[tuple[int, str, bytes]]) -> list[tuple[str, list[int], bytes]]:
        """Rows as the messages that carry them, signed (``Sealing``): for a cluster that takes batches
        (``Sealing.batches``) its rows in order as batches of up to ``MAX_COMMANDS_PER_MESSAGE`` and about
        ``MAX_BATCH_BYTES``; a Resync always alone (published again, the same message: a repeat the agent
        refuses, never a stale Resync applied after a later Place); a row an earlier version stored signed,
        as it is. Per cluster the messages keep the rows' order."""
        out: list[tuple[str, list[int], bytes]] = []
        groups: dict[str, tuple[list[tuple[int, bytes]], list[int]]] = {}  # topic -> (rows, [bytes])
        takes: dict[str, bool] = {}

        def flush(topic: str) -> None:
            group = groups.pop(topic, None)
            if group is not None:
                out.append((topic, [row_id for row_id, _ in group[0]], self.seal.rows(topic, group[0])))

        for row_id, topic, payload in rows:
            if peek(payload) is not None:  # signed when queued (an earlier version): as it is
                flush(topic)
                out.append((topic, [row_id], payload))
                continue
            batching = takes.get(topic)
            if batching is None:
                batching = takes[topic] = self.seal.batches(topic)
            if not batching or payload.startswith(_RESYNC):
                flush(topic)
                out.append((topic, [row_id], self.seal.rows(topic, [(row_id, payload)])))
                continue
            group = groups.get(topic)
            if group is not None and (len(group[0]) >= messages.MAX_COMMANDS_PER_MESSAGE
                                      or group[1][0] + len(payload) > messages.MAX_BATCH_BYTES):
                flush(topic)
                group = None
            if group is None:
                group = groups[topic] = ([], [0])
            group[0].append((row_id, payload))
            group[1][0] += len(payload) + 1
        for topic in list(groups):
            flush(topic)
        return out

    async def settle(self, within: float) -> None:
        """Stopping: start nothing more, let the publishes in flight be acknowledged (within ``within``
        seconds) and mark sent what was; a restarted dispatcher would publish those rows again."""
        self._stopping = True
        if self._inflight:
            await asyncio.wait(set(self._inflight.values()), timeout=within)
        if not self._acked:
            return
        try:
            await self._mark()
        except Exception as exc:  # the stop goes on: what is not marked is published again, harmlessly
            log.warning("stopping: %d acknowledged outbox rows not marked sent (%s: %s); they go again after a "
                        "restart", len(self._acked), type(exc).__name__, str(exc)[:200])

    async def publish_now(self, topic: str, payload: bytes) -> None:
        """Publish on the outbox's link outside any row (the lease desk's Leases); Transport while it is down."""
        link = getattr(self, "_link", None)
        if link is None:
            raise Transport("the outbox link is not up yet")
        await link.publish(topic, payload)

    def publish_failed(self, name: str, exc: BaseException) -> None:
        """A publish failed in a way the link does not explain: the drain loop raises it (the outbox task
        fails and its Supervisor restarts it; the row stays unsent and is published again)."""
        self._failed.append(exc)
        self.wake.set()

    async def drain_once(self, link: MqttLink) -> int:
        """Start publishing what is waiting and mark acknowledged rows sent; returns rows started.

        Publishing is pipelined: up to ``outbox_batch_size`` Commands are in flight, a new one starts
        as soon as a slot frees up, and acknowledged rows are marked sent in batches (every 20 ms or
        500 rows). Rows the engine just committed come from memory (``fresh``); when there are none
        and nothing is in flight, unsent rows are read from the database (left by a crash, a lost
        connection or another dispatcher), at most once per ``outbox_poll_seconds`` unless the last
        look filled a page (``_scan_due``). After (re)connecting, the unsent rows below the first fresh
        one (a predecessor's: ids grow with the epoch) go first, so the order of Commands holds across
        a restart. A row a scan already published is skipped when it also shows up in ``fresh``.
        """
        if self._failed:
            await self._mark()  # what was acknowledged before the link broke stays acknowledged
            first, self._failed = self._failed[0], []
            raise first
        if self._acked and (len(self._acked) >= 500 or self.clock.monotonic() - self._last_mark >= 0.02
                            or not self._inflight):
            await self._mark()
        room = 0 if self._stopping else self.settings.outbox_batch_size - len(self._inflight)
        rows: list[tuple[int, str, bytes]] = []
        idle = not self._inflight and not self._acked  # a scan must not see rows not yet marked
        if room > 0 and self._startup:
            # After (re)connecting, first everything unsent ahead of this engine's fresh rows: a predecessor's
            # rows (left by a crash or a stop) carry lower ids, and its Place must not follow this engine's
            # Delete for the same attempt. The fresh rows wait until that scan comes back empty.
            if idle:
                rows = await self._scan(room, before=None, below=self.fresh.first_id())
                if not rows:
                    self._startup = False
        if not rows and not self._startup and room > 0:
            if self.fresh:
                rows = await self._take_fresh(room)
            elif idle and self._scan_due():  # only rows old enough not to be fresh ones: another dispatcher's, or
                # left by a crash
                rows = await self._scan(room, before=self.clock.now() - timedelta(
                    seconds=self.settings.outbox_poll_seconds))
                # a full page may have more behind it: the next look comes as soon as these are out
                self._last_scan = None if len(rows) >= room else self.clock.monotonic()
        for topic, row_ids, payload in self._messages(rows):
            task = self.publishes.spawn(self._one(row_ids, topic, payload), name=f"publish-{row_ids[0]}")
            for row_id in row_ids:
                self._inflight[row_id] = task
        if rows:
            self.rounds += 1
        return len(rows)

    def _scan_due(self) -> bool:
        """Whether to look for rows left unsent: at most once per ``outbox_poll_seconds`` (they are only taken once
        that old, and an idle publisher wakes that often anyway), not each time a busy one has marked its last
        Commands and has no fresh ones (~30 transactions a second at 100 Commands a second)."""
        last = self._last_scan
        return last is None or self.clock.monotonic() - last >= self.settings.outbox_poll_seconds

    async def _scan(self, room: int, *, before: datetime | None, below: int | None = None) -> list[tuple[int, str, bytes]]:
        """Unsent rows from the database in id order (``outbox_q.unsent``), remembered as scanned."""
        async with self.sessions() as s:
            rows = [(r.id, r.topic, r.payload) for r in await outbox_q.unsent(s, room, before=before, below=below)]
        if len(self._scanned) > 100_000:
            self._scanned.clear()
        self._scanned.update(r[0] for r in rows)
        return rows

    async def _take_fresh(self, room: int) -> list[tuple[int, str, bytes]]:
        """Fresh rows in order, while in-flight slots and the unanswered-Place budget last.

        Each Place is answered at once by its agent; Mosquitto drops QoS 1 messages for a subscriber
        with more than ``max_queued_messages`` waiting, so at most ``max_unanswered_places`` Places
        may wait for an answer (an entry expires after ``place_resend_seconds``). Rows queued without
        their bytes (past ``outbox_memory_bytes``) have them read back from the database first; the
        rows leave ``fresh`` only once that read succeeded, so an outage loses none of them.
        """
        now = self.clock.monotonic()
        expiry = self.settings.place_resend_seconds
        if len(self.unanswered) >= self.settings.max_unanswered_places:
            for stale in [k for k, t in self.unanswered.items() if now - t > expiry]:
                del self.unanswered[stale]
        budget = self.settings.max_unanswered_places - len(self.unanswered)
        chosen: list[tuple[int, str, bytes | None, tuple[str, int] | None]] = []
        taken = 0
        for row_id, topic, payload, key in self.fresh:
            if len(chosen) >= room or (key is not None and budget <= 0):
                break
            taken += 1
            if row_id in self._scanned or row_id in self._inflight:
                continue
            if key is not None:
                budget -= 1
            chosen.append((row_id, topic, payload, key))
        missing = [row_id for row_id, _, payload, _ in chosen if payload is None]
        stored: dict[int, bytes] = {}
        if missing:  # the engine only appends meanwhile: the first ``taken`` rows stay the same
            async with self.sessions() as s:
                stored = await outbox_q.payloads(s, missing)
        self.fresh.drop(taken)
        out: list[tuple[int, str, bytes]] = []
        for row_id, topic, payload, key in chosen:
            body = payload if payload is not None else stored.get(row_id)
            if body is None:  # gone from the table: sent and purged by an earlier round
                continue
            if key is not None:
                self.unanswered[key] = now
            out.append((row_id, topic, body))
        return out

    async def _mark(self) -> None:
        done, self._acked = self._acked, []
        self._last_mark = self.clock.monotonic()
        if done:
            try:
                async with self.sessions.begin() as s:
                    await outbox_q.mark_sent(s, done, self.clock.now())
            except BaseException:
                self._acked[:0] = done  # still acknowledged: marked on the next try
                raise
            self.sent += len(done)

    async def _maybe_purge(self) -> None:
        keep = self.settings.outbox_retention_seconds
        if self.clock.monotonic() - self._last_purge < 60:
            return
        self._last_purge = self.clock.monotonic()
        try:
            with mapped():
                async with self.sessions.begin() as s:
                    n = await outbox_q.purge_sent(s, self.clock.now() - timedelta(seconds=keep))
        except DatabaseUnavailable:
            return  # housekeeping: the next purge catches up
        if n:
            log.debug("purged %d sent outbox rows", n)
