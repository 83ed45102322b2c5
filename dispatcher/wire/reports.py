"""The report subscriber: agents' Reports and heartbeats from MQTT into the engine's inbox.

Subscribes to ``<root>/+/reports`` and ``<root>/+/presence`` on a persistent session (Reports
sent while the dispatcher was away are delivered when it comes back) and follows each agent's
numbered report stream (``dispatcher.wire.streams``): Reports a broker dropped lead to a Resync. Every payload's seal is
checked first (``dispatcher.clusters.identity``: a registered cluster's key, the clock window, no repeats); payloads are decoded with
``federation.messages``: a message holds one Report or a batch of them (``messages.Reports``: one seal
and one decode for all, each Report then handled in order as if it came alone). A refused payload, or a
Report whose cluster differs from the topic's, is logged and dropped (an agent may only speak for its own
cluster).
"""

from __future__ import annotations

import asyncio
import logging

from dispatcher.clusters.leases import LeaseDesk
from dispatcher.engine.loop import Engine, ReportIn, ResyncDue
from dispatcher.settings import DispatcherSettings
from federation import chunks, messages, topics
from federation.clock import Clock
from federation.errors import Invalid, Transport
from federation.mqtt import LinkHealth, MqttLink
from federation.refusals import refused

log = logging.getLogger(__name__)


class ReportSubscriber:
    def __init__(self, settings: DispatcherSettings, engine: Engine, clock: Clock, *, client_id: str) -> None:
        self.settings = settings
        self.engine = engine
        self.clock = clock
        self.client_id = client_id
        self.refused = 0
        self.received = 0
        self.messages = 0
        """Broker messages taken (a batch of Reports is one)."""
        self.inventories = chunks.Assembler()
        self.subscribed = asyncio.Event()
        self.leases: LeaseDesk | None = None
        """Set once the first subscription is in place: the outbox waits for it, so that no agent answers
        a Command before anyone listens (the persistent session covers later reconnects)."""

    async def run(self) -> None:
        root = self.settings.mqtt.topic_root
        health = self.health = LinkHealth(self.settings.mqtt, self.clock)
        while True:
            try:
                async with MqttLink(self.settings.mqtt, client_id=self.client_id) as link:
                    await link.subscribe(topics.all_reports(root), topics.all_presence(root))
                    log.info("listening to the agents' Reports and presence under %s/", root)
                    self.subscribed.set()
                    self.engine.listening_since = self.clock.monotonic()  # re-sends wait for queued answers
                    health.connected_now()
                    self.engine.streams.forget()  # whatever was dropped while away shows as streams met part-way
                    async for msg in link.messages():
                        self.accept(msg.topic, msg.payload, retained=msg.retain)
            except Transport as exc:
                health.failed(exc)
                delay = health.next_delay()
                log.warning("report link down (%s); reconnecting in %.1fs", exc, delay)
                await self.clock.sleep(delay)

    def accept(self, topic: str, payload: bytes, *, retained: bool = False) -> None:
        root = self.settings.mqtt.topic_root
        if not payload:
            return  # a cleared retained presence message
        self.messages += 1
        try:
            where = topics.parse(topic, root)
            opened = self.engine.identity.open(where.cluster, where.channel, topic, payload, self.clock.now())
        except (Invalid, messages.MessageRefused) as exc:  # a refused seal was counted by its reason
            self.refused += 1
            log.warning("refused message on %s: %s", topic, exc)
            return
        try:
            reports = messages.decode_reports(opened.body)
        except messages.MessageRefused as exc:
            self.refused += 1
            refused("invalid")
            log.warning("refused message on %s: %s", topic, exc)
            return
        batch = len(reports) > 1 or opened.body.startswith(messages.REPORTS_PREFIX)
        if batch and (where.channel != "reports" or any(r.stream != opened.stream or r.n == 0 for r in reports)):
            self.refused += 1
            refused("malformed")
            log.warning("refused a batch of %d Reports on %s: a batch goes on the reports topic, every Report "
                        "numbered on the stream its seal names", len(reports), topic)
            return
        if batch:
            self.engine.identity.batches(where.cluster, opened.stream)
        for report in reports:
            self._one(where.cluster, topic, report, opened.n, retained)

    def _one(self, cluster: str, topic: str, report: messages.Accepted | messages.Rejected | messages.Status
             | messages.Heartbeat | messages.Inventory, sealed_n: int, retained: bool) -> None:
        if getattr(report, "cluster", cluster) != cluster:
            self.refused += 1
            refused("wrong_cluster")
            log.warning("refused %s on %s: it claims to come from cluster %s", report.type, topic,
                        report.cluster)
            return
        if sealed_n == 0 and not (isinstance(report, messages.Heartbeat) and not report.online):
            self.refused += 1
            refused("malformed")
            log.warning("refused %s on %s: only a will message may be sealed unnumbered", report.type, topic)
            return
        self.received += 1
        # a retained presence replayed on subscribe is not part of the live stream
        if not retained and self.engine.streams.seen(cluster, report.stream, report.n, self.clock.monotonic()):
            self.engine.inbox.put_nowait(ResyncDue(cluster, lost=False))
        if isinstance(report, messages.Inventory):
            whole = self.inventories.add(report, self.clock.monotonic())
            if whole is None:
                return  # only the whole Inventory is answered (federation.chunks)
            report = whole
        item = ReportIn(report, self.clock.now())
        if self.leases is not None and isinstance(report, messages.Heartbeat):
            self.leases.offer(item)  # the Lease goes out without waiting for the engine (dispatcher/clusters/leases.py)
        self.engine.inbox.put_nowait(item)
