"""The dispatcher's decision loop: Job changes and Reports in, one database transaction per batch.

Intake and the report subscriber put items into one inbox; the engine takes whatever has piled up (up to
``batch_size``), decides everything in one transaction — claims, spec changes, deletions, accepted / rejected
/ status Reports, heartbeats, and a placement round — and only after the commit tells the world: it wakes the
outbox publisher and hands condition, status and Event writes to the
:class:`~dispatcher.mirror.kubewriter.KubeWriter`. One engine task owns the decisions, so the changes of one Job are
applied serially in arrival order; writes to the manager cluster run in parallel across Jobs. A batch that
fails is retried from the database's state (the in-memory capacity book and claimed-uid set are rebuilt
first); on the second failure its items are handled one by one so one bad item cannot block the rest.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Iterable
from typing import Any

from dispatcher import workload as wl
from dispatcher.clusters.health import ClusterHealth
from dispatcher.db import mapped
from dispatcher.db.queries import clusters as cluster_q
from dispatcher.db.queries import epochs as epoch_q
from dispatcher.db.queries import events as event_q
from dispatcher.db.queries import outbox as outbox_q
from dispatcher.engine.adminactions import AdminAction, AdminActions
from dispatcher.engine.answers import Answers
from dispatcher.engine.batch import Batch, Heal, Item, JobChange, ReportIn, ResyncDue, Tick
from dispatcher.engine.faults import FaultHandling
from dispatcher.engine.heal import Healing
from dispatcher.engine.jobchanges import JobChanges
from dispatcher.engine.rounds import PlacementRound
from dispatcher.mirror import jobevents
from federation import messages
from federation.errors import Temporary
from federation.kinds import registry
from federation.kinds.base import JobKind

__all__ = ["Engine", "Heal", "Item", "JobChange", "ReportIn", "ResyncDue", "Tick", "supported_kinds"]
log = logging.getLogger("dispatcher.engine")


class Engine(JobChanges, Answers, ClusterHealth, AdminActions, PlacementRound, FaultHandling, Healing):
    """See the module docstring. ``observers`` are called with (event type, uid) after each commit.

    The decisions live in parts, one module each, combined here: :mod:`dispatcher.engine.jobchanges`
    (claims, edits, deletions), :mod:`dispatcher.engine.answers` (Reports), :mod:`dispatcher.clusters.health`
    (heartbeats, lost clusters), :mod:`dispatcher.engine.rounds` (the placement round), on the shared state
    and actions of :mod:`dispatcher.engine.core`; :mod:`dispatcher.engine.batch` holds the inbox items and the batch.
    New behaviour goes into the part it belongs to (or a new one), with a thin call from ``_handle``.
    """

    metrics: Any = None
    """The dispatcher's :class:`~dispatcher.api.metrics.DispatcherMetrics`, when it serves them."""

    async def start(self) -> None:
        """Take a fencing epoch and rebuild the in-memory view from the database."""
        async with self.sessions.begin() as s:
            self.epoch = await epoch_q.new_epoch(s, origin=self.settings.origin, host=socket.gethostname(),
                                           now=self.clock.now())
        self.outbox_ids = outbox_q.OutboxIds(self.epoch)
        await self.rebuild()
        await self.load_cordons()
        log.info("dispatcher epoch %d: %d Workloads known, %d placements hold capacity", self.epoch,
                 len(self.known), len(self.book.reservations))

    def sync_kind(self, kind: JobKind, present: Iterable[str], namespace: str | None = None) -> int:
        """After intake listed ``kind`` (in ``namespace``, or everywhere): Workloads whose Job vanished
        while mkd was away become deletions."""
        seen = set(present)
        gone = [uid for uid, k in self.known.items() if k == kind.name and uid not in seen
                and (namespace is None or self.namespace_of.get(uid) == namespace)]
        for uid in gone:
            self.inbox.put_nowait(JobChange(kind, {"metadata": {"uid": uid}}, deleted=True))
        return len(gone)

    async def run(self) -> None:
        while True:
            batch = [await self.inbox.get()]
            linger = self.settings.batch_linger_seconds
            if linger and self.inbox.qsize() < self.settings.batch_size:
                # real time on purpose: a batching delay, not logic a test would drive with a FakeClock
                await asyncio.sleep(linger)  # let a burst gather: one transaction for many items
            while len(batch) < self.settings.batch_size and not self.inbox.empty():
                batch.append(self.inbox.get_nowait())
            self._supersede(batch)
            if any(isinstance(i, Tick) for i in batch):
                batch.extend(self._due_parked())
            await self.handle(batch)

    async def handle(self, items: list[Item]) -> None:
        """Decide ``items``; returns once every one is decided or parked — none is ever dropped.

        See :mod:`dispatcher.engine.faults`: an outage holds the batch and retries it until the database
        (or the manager's API) is back; a failure of the items themselves is narrowed down to the one
        item by halving the batch, and that item is recorded as an error and parked.
        """
        tries = 0
        while True:
            heard = None
            try:
                with mapped():
                    if self._stale:  # a failed batch may have left the in-memory view ahead of the database
                        await self.rebuild()
                        self._stale = False
                    heard = (dict(self.book.heartbeats), dict(self.book.received))  # as committed so far
                    await self._handle(items)
            except Exception as exc:  # a batch must not kill the loop
                if heard is not None:
                    self._heard = heard  # what the book had heard before this batch (``rebuild`` starts there)
                self._stale = True
                if isinstance(exc, Temporary):  # the database (DatabaseUnavailable) or a cluster's API server
                    await self._ride_out(exc, len(items))
                    continue
                tries += 1
                if tries < 2:
                    log.warning("batch of %d items failed (%s: %s); trying again from the database's state",
                                len(items), type(exc).__name__, exc)
                    await self.clock.sleep(0.1)
                    continue
                if len(items) > 1:
                    half = len(items) // 2
                    await self.handle(items[:half])
                    await self.handle(items[half:])
                else:
                    await self._give_up(items[0], exc)
                return
            self.outage.succeeded()
            if self.outage_since is not None:
                log.warning("database / manager cluster reachable again after %.1fs; deciding the %d held items "
                            "and %d more that arrived meanwhile", self.clock.monotonic() - self.outage_since,
                            self.held, self.inbox.qsize())
                self.outage_since = None
            done = {id(i) for i in items}
            self._retrying = [p for p in self._retrying if id(p.item) not in done]
            return

    async def _ride_out(self, exc: BaseException, held: int) -> None:
        """One failed try during an outage: log the first (without a traceback per attempt), back off."""
        if self.outage_since is None:
            self.outage_since = self.clock.monotonic()
            self.held = held
            log.warning("database or manager cluster unreachable (%s: %s); holding %d items and retrying "
                        "until it is back", type(exc).__name__, str(exc)[:300], held)
        else:
            log.debug("still unreachable after %.1fs: %r", self.clock.monotonic() - self.outage_since, exc)
        await self.clock.sleep(self.outage.failed(getattr(exc, "delay", 0.0)))

    async def _handle(self, items: list[Item]) -> None:
        jobs: dict[str, JobChange] = {}
        reports: list[ReportIn] = []
        heartbeats: dict[str, ReportIn] = {}
        admin: list[AdminAction] = []
        tick = heal = False
        for item in items:
            if isinstance(item, JobChange):
                uid = wl.uid_of(item.obj)
                old = jobs.get(uid)
                jobs[uid] = item if not (old is not None and old.deleted) else old
            elif isinstance(item, ReportIn):
                if self.metrics is not None:
                    self.metrics.report_taken(item.report, item.received_at)
                if isinstance(item.report, messages.Heartbeat):
                    heartbeats[item.report.cluster] = item
                else:
                    reports.append(item)
            elif isinstance(item, AdminAction):
                admin.append(item)
            elif isinstance(item, ResyncDue):
                self._resync_due.add(item.cluster)
                if item.lost:
                    self._resync_lost.add(item.cluster)
            elif isinstance(item, Heal):
                heal = True
            else:
                tick = True
        b = Batch(now=self.clock.now())
        beats = [self._heartbeat(b, heartbeats[cluster]) for cluster in sorted(heartbeats)]
        rows = [row for row in beats if row is not None]
        if not (jobs or reports or admin or tick or heal or rows or b.events or b.outbox or b.placement_due
                or self._resync_due or self._retry_due()):
            # heartbeats that changed nothing but their time (the lease desk wrote their leases): no
            # transaction; with 1,000 clusters that is most of the idle dispatcher's batches
            self.batches += 1
            return
        async with self.sessions.begin() as s:
            await self._load(s, b, [uid for uid in jobs if uid in self.known])
            described: dict[str, wl.Described] = {}
            for uid, ch in jobs.items():
                if self._needs_description(b.w.get(uid), ch):
                    described[uid] = await self._describe(ch)
                    if len(described) % 50 == 0:
                        await asyncio.sleep(0)  # keep the loop (and the MQTT socket) responsive
            # one statement, rows locked by name as the lease desk locks them (dispatcher/clusters/leases.py)
            await cluster_q.upsert_clusters(s, rows)
            if tick:
                await self._check_clusters(s, b)
                await self._resend_unanswered(s, b)
                overdue = self.streams.overdue(self.clock.monotonic())
                self._resync_due.update(overdue)
                self._resync_lost.update(overdue)
            await self._load_podsets(s, b, [uid for uid, ch in jobs.items() if self._resumes(b.w.get(uid), ch)])
            await self._jobs(s, b, jobs, described)
            await self._reports(s, b, reports)
            await self._admin(s, b, admin)
            await self._flush(s, b)
            if heal:  # after this batch's changes, before its placement pass (dispatcher/engine/heal.py)
                await self._heal(s, b)
            if b.placement_due or tick or self._retry_due():
                await self._place(s, b)
                await self._flush(s, b)
            # last, so a Resync lists this batch's placements too: an agent deletes what it does not list
            self._take_due_resyncs(b)
            for cluster in sorted(b.resync):
                await self._resync(s, b, cluster)
                if self.metrics is not None:
                    self.metrics.resync_sent()
            await event_q.add_events(s, b.events)
            await outbox_q.add_outbox(s, b.outbox)
        self.batches += 1
        for row in b.outbox:
            self.fresh.add(row["id"], row["topic"], row["payload"], b.place_keys.get(row["id"]))
        for fn in b.after:
            fn()
        jobevents.announce(self.writer, b.w, b.events, self.cache)  # Events on the manager Jobs (dispatcher/mirror/jobevents.py)
        if self.fresh:  # new Commands, or answers that freed the publisher's unanswered-Place budget
            self.outbox_wake.set()
        for type_, uid in b.notes:
            for observer in self.observers:
                observer(type_, uid)


def supported_kinds() -> tuple[JobKind, ...]:
    return registry.kinds()
