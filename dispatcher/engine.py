"""The dispatcher's decision loop: Job changes and Reports in, one database transaction per batch.

Intake and the report subscriber put items into one inbox; the engine takes whatever has piled
up (up to ``batch_size``), decides everything in one transaction — claims, spec changes,
deletions, accepted / rejected / status Reports, heartbeats, and a placement round — and only
after the commit tells the world: it wakes the outbox publisher and hands condition, status and
Event writes to the :class:`~dispatcher.kubewriter.KubeWriter`. One engine task owns the
decisions, so the changes of one Job are applied serially in arrival order; writes to the
manager cluster run in parallel across Jobs. A batch that fails is retried from the database's
state (the in-memory capacity book and claimed-uid set are rebuilt first); on the second
failure its items are handled one by one so one bad item cannot block the rest.
"""

from __future__ import annotations

import asyncio
import logging
import re
import socket
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from dispatcher import workload as wl
from dispatcher.db import queries as q
from dispatcher.kubewriter import JobKey, KubeWriter
from dispatcher.placement import CapacityBook, Need, choose
from dispatcher.settings import DispatcherSettings
from dispatcher.streams import StreamBook
from federation import labels, messages, topics
from federation.clock import Clock
from federation.errors import Invalid, NotFound
from federation.kinds.base import JobKind
from federation.kinds.registry import KINDS, by_name
from federation.podset import parse_quantity

log = logging.getLogger(__name__)
_DIGITS = re.compile(r"(?<![-\w])[0-9.]+[a-zA-Z]*")  # figures, not the digits in cluster names


@dataclass(frozen=True)
class JobChange:
    """A manager Job was added / changed (``deleted`` False) or is gone (True)."""

    kind: JobKind
    obj: dict[str, Any]
    deleted: bool = False


@dataclass(frozen=True)
class ReportIn:
    report: messages.Accepted | messages.Rejected | messages.Status | messages.Inventory | messages.Heartbeat
    received_at: datetime


@dataclass(frozen=True)
class Tick:
    """Time passed: retry pending Workloads, check heartbeat ages, look for lost Reports."""


@dataclass(frozen=True)
class ResyncDue:
    """Reports from ``cluster`` may have been lost: send it a Resync (see ``dispatcher.streams``).

    ``lost`` False: only a stream met part-way (routine when this dispatcher starts or reconnects)."""

    cluster: str
    lost: bool = True


Item = JobChange | ReportIn | Tick | ResyncDue


@dataclass
class _Batch:
    now: datetime
    w: dict[str, dict[str, Any]] = field(default_factory=dict)           # workload rows, mutable copies
    w_updates: dict[str, dict[str, Any]] = field(default_factory=dict)
    p: dict[tuple[str, int], dict[str, Any]] = field(default_factory=dict)
    p_updates: dict[tuple[str, int], dict[str, Any]] = field(default_factory=dict)
    events: list[dict[str, Any]] = field(default_factory=list)
    outbox: list[dict[str, Any]] = field(default_factory=list)
    after: list[Callable[[], object]] = field(default_factory=list)
    notes: list[tuple[str, str]] = field(default_factory=list)            # (event type, uid) for observers
    placement_due: bool = False
    resync: set[str] = field(default_factory=set)                        # clusters sent a Resync this batch
    place_keys: dict[int, tuple[str, int]] = field(default_factory=dict)  # outbox id -> Place's placement

    def set_w(self, uid: str, **values: Any) -> None:
        self.w[uid].update(values)
        self.w_updates.setdefault(uid, {}).update(values)

    def set_p(self, key: tuple[str, int], **values: Any) -> None:
        self.p[key].update(values)
        self.p_updates.setdefault(key, {}).update(values)

    def event(self, uid: str | None, type_: str, *, cluster: str | None = None, reason: str = "",
              message: str = "") -> None:
        self.events.append({"workload_uid": uid, "at": self.now, "type": type_, "cluster": cluster,
                            "reason": reason[:128], "message": message})
        if uid is not None:
            self.notes.append((type_, uid))


def _key(row: Mapping[str, Any]) -> JobKey:
    return JobKey(row["uid"], row["kind"], row["namespace"], row["name"])


class Engine:
    """See the module docstring. ``observers`` are called with (event type, uid) after each commit."""

    def __init__(self, settings: DispatcherSettings, sessions: async_sessionmaker[AsyncSession], kube: Any,
                 writer: KubeWriter, clock: Clock, *, cache: dict[str, dict[str, Any]] | None = None) -> None:
        self.settings = settings
        self.sessions = sessions
        self.kube = kube
        self.writer = writer
        self.clock = clock
        self.inbox: asyncio.Queue[Item] = asyncio.Queue()
        self.cache: dict[str, dict[str, Any]] = cache if cache is not None else {}
        self.known: dict[str, str] = {}
        self.needs: dict[str, Need] = {}
        self.book = CapacityBook(settle_seconds=settings.capacity_settle_seconds)
        self.streams = StreamBook(grace=settings.report_gap_grace_seconds)
        """The agents' numbered report streams; the report subscriber feeds it, ticks read it."""
        self._resync_due: set[str] = set()
        self._resync_lost: set[str] = set()
        """Of those due, the clusters with a real hole in their stream (logged as a WARNING)."""
        self._last_resync: dict[str, float] = {}
        self.lost: dict[str, datetime] = {}
        self.epoch = 0
        self.outbox_ids = q.OutboxIds(0)
        self.outbox_wake = asyncio.Event()
        self.fresh: list[tuple[int, str, bytes, tuple[str, int] | None]] = []
        """Outbox rows committed by this engine, handed to the publisher in memory (it need not read
        them back); the database copy is what survives a crash."""
        self.observers: list[Callable[[str, str], None]] = []
        self.stale_dropped = 0
        self.unanswered: dict[tuple[str, int], float] = {}
        """Places published and not answered yet (monotonic publish time): the publisher's flow control."""
        self._resent: dict[tuple[str, int], float] = {}
        self.batches = 0
        self._last_place = 0.0

    # --- start-up -------------------------------------------------------------------------------

    async def start(self) -> None:
        """Take a fencing epoch and rebuild the in-memory view from the database."""
        async with self.sessions.begin() as s:
            self.epoch = await q.new_epoch(s, origin=self.settings.origin, host=socket.gethostname(),
                                           now=self.clock.now())
        self.outbox_ids = q.OutboxIds(self.epoch)
        await self.rebuild()
        log.info("dispatcher epoch %d: %d Workloads known, %d placements hold capacity", self.epoch,
                 len(self.known), len(self.book.reservations))

    async def rebuild(self) -> None:
        async with self.sessions() as s:
            self.known = await q.known_uids(s)
            book = CapacityBook(settle_seconds=self.settings.capacity_settle_seconds,
                                heartbeats=self.book.heartbeats, received=self.book.received)
            for row in await q.active_placements(s):
                total = {k: parse_quantity(v, k) for k, v in (row.requests or {}).items()}
                book.reserve(row.workload_uid, row.cluster, total)
                if row.accepted_at is not None:
                    book.accepted(row.workload_uid, row.accepted_at)
            self.book = book
            for c in await q.load_clusters(s):
                if c.lost_since is not None:
                    self.lost[c.name] = c.lost_since

    def sync_kind(self, kind: JobKind, present: Iterable[str]) -> int:
        """After intake listed ``kind``: Workloads whose Job vanished while mkd was away become deletions."""
        seen = set(present)
        gone = [uid for uid, k in self.known.items() if k == kind.name and uid not in seen]
        for uid in gone:
            self.inbox.put_nowait(JobChange(kind, {"metadata": {"uid": uid}}, deleted=True))
        return len(gone)

    # --- the loop ---------------------------------------------------------------------------------

    async def run(self) -> None:
        while True:
            batch = [await self.inbox.get()]
            linger = self.settings.batch_linger_seconds
            if linger and self.inbox.qsize() < self.settings.batch_size:
                # real time on purpose: a batching delay, not logic a test would drive with a FakeClock
                await asyncio.sleep(linger)  # let a burst gather: one transaction for many items
            while len(batch) < self.settings.batch_size and not self.inbox.empty():
                batch.append(self.inbox.get_nowait())
            await self.handle(batch)

    async def handle(self, items: list[Item]) -> None:
        for attempt in range(3):
            try:
                await self._handle(items)
                return
            except Exception as exc:  # a batch must not kill the loop
                log.warning("batch of %d items failed (attempt %d): %r", len(items), attempt + 1, exc,
                            exc_info=attempt > 0)
                await self.rebuild()
                await self.clock.sleep(0.2 * 2 ** attempt)
        if len(items) > 1:
            for item in items:
                await self.handle([item])
        else:
            log.error("dropping %r after repeated failures", items[0])

    async def _handle(self, items: list[Item]) -> None:
        jobs: dict[str, JobChange] = {}
        reports: list[ReportIn] = []
        heartbeats: dict[str, ReportIn] = {}
        tick = False
        for item in items:
            if isinstance(item, JobChange):
                uid = wl.uid_of(item.obj)
                old = jobs.get(uid)
                jobs[uid] = item if not (old is not None and old.deleted) else old
            elif isinstance(item, ReportIn):
                if isinstance(item.report, messages.Heartbeat):
                    heartbeats[item.report.cluster] = item
                else:
                    reports.append(item)
            elif isinstance(item, ResyncDue):
                self._resync_due.add(item.cluster)
                if item.lost:
                    self._resync_lost.add(item.cluster)
            else:
                tick = True
        b = _Batch(now=self.clock.now())
        async with self.sessions.begin() as s:
            await self._load(s, b, [uid for uid in jobs if uid in self.known])
            described: dict[str, wl.Described] = {}
            for uid, ch in jobs.items():
                if self._needs_description(b.w.get(uid), ch):
                    described[uid] = await self._describe(ch)
                    if len(described) % 50 == 0:
                        await asyncio.sleep(0)  # keep the loop (and the MQTT socket) responsive
            for hb in heartbeats.values():
                await self._heartbeat(s, b, hb)
            if tick:
                await self._check_clusters(s, b)
                await self._resend_unanswered(s, b)
                overdue = self.streams.overdue(self.clock.monotonic())
                self._resync_due.update(overdue)
                self._resync_lost.update(overdue)
            await self._jobs(s, b, jobs, described)
            await self._reports(s, b, reports)
            await self._flush(s, b)
            if b.placement_due or tick or self._retry_due():
                await self._place(s, b)
                await self._flush(s, b)
            # last, so a Resync lists this batch's placements too: an agent deletes what it does not list
            self._take_due_resyncs(b)
            for cluster in sorted(b.resync):
                await self._resync(s, b, cluster)
            await q.add_events(s, b.events)
            await q.add_outbox(s, b.outbox)
        self.batches += 1
        self.fresh.extend((row["id"], row["topic"], row["payload"], b.place_keys.get(row["id"]))
                          for row in b.outbox)
        for fn in b.after:
            fn()
        if self.fresh:  # new Commands, or answers that freed the publisher's unanswered-Place budget
            self.outbox_wake.set()
        for type_, uid in b.notes:
            for observer in self.observers:
                observer(type_, uid)

    @staticmethod
    def _needs_description(row: Mapping[str, Any] | None, ch: JobChange) -> bool:
        """Validate and compute PodSets only for a claim, or a new generation of a Job not yet placed."""
        if ch.deleted or wl.being_deleted(ch.obj) or ch.kind.managed_by(ch.obj) != labels.MULTIKUEUE:
            return False
        if row is None:
            return True
        return row["state"] in ("pending", "rejected") and wl.generation_of(ch.obj) > row["generation"]

    def _retry_due(self) -> bool:
        return self.clock.monotonic() - self._last_place >= self.settings.placement_retry_seconds

    async def _flush(self, s: AsyncSession, b: _Batch) -> None:
        by_cols: dict[tuple[str, ...], list[dict[str, Any]]] = {}
        for uid, values in b.w_updates.items():
            by_cols.setdefault(tuple(sorted(values)), []).append({"b_uid": uid, **values})
        for rows in by_cols.values():
            await q.update_workloads(s, rows)
        b.w_updates.clear()
        p_cols: dict[tuple[str, ...], list[dict[str, Any]]] = {}
        for (uid, attempt), values in b.p_updates.items():
            p_cols.setdefault(tuple(sorted(values)), []).append({"b_uid": uid, "b_attempt": attempt, **values})
        for rows in p_cols.values():
            await q.update_placements(s, rows)
        b.p_updates.clear()

    async def _describe(self, ch: JobChange) -> wl.Described:
        runtime = None
        problem = None
        ref = ch.kind.runtime_ref(ch.obj)
        if ref is not None:
            from federation.kube import Resource

            group, _, version = ref.api_version.rpartition("/")
            res = Resource(group, version, ref.plural, ref.kind, namespaced=ref.namespace is not None)
            try:
                runtime = await self.kube.get(res, ref.name, ref.namespace)
            except NotFound:
                where = f"namespace {ref.namespace}" if ref.namespace else "the manager cluster"
                problem = Invalid("spec.runtimeRef.name", f"{ref.kind} {ref.name!r} does not exist in {where}",
                                  fix=f"create the {ref.kind} on the manager cluster or name an existing one")
        return wl.describe(ch.kind, ch.obj, runtime, problem)

    async def _load(self, s: AsyncSession, b: _Batch, uids: list[str]) -> None:
        """Workload rows and their current placements into the batch (one query for those not loaded)."""
        missing = [uid for uid in uids if uid not in b.w]
        if not missing:
            return
        rows, current = await q.load_current(s, missing)
        for uid, r in rows.items():
            b.w[uid] = {k: v for k, v in r._mapping.items() if not k.startswith("p__")}
        for key, p in current.items():
            b.p.setdefault(key, p)

    # --- Job changes ------------------------------------------------------------------------------

    async def _jobs(self, s: AsyncSession, b: _Batch, jobs: dict[str, JobChange],
                    described: dict[str, wl.Described]) -> None:
        if not jobs:
            return
        claims: list[dict[str, Any]] = []
        for uid, ch in jobs.items():
            if uid in b.w:
                self._change(b, b.w[uid], ch, described.get(uid))
                continue
            d = described.get(uid)
            if d is None or not uid:
                continue
            cols = {**d.columns, "created_at": b.now, "updated_at": b.now, "state": "pending"}
            if d.problems:
                cols.update(state="rejected", reason=wl.problem_text(d.problems))
            elif cols["suspended"]:
                cols["reason"] = "suspended on the manager cluster; placed once resumed"
            claims.append(cols)
        won = await q.claim(s, claims)
        for cols in claims:
            uid = cols["uid"]
            if uid not in won:
                continue  # another dispatcher claimed it first
            ch = jobs[uid]
            d = described[uid]
            self.known[uid] = ch.kind.name
            self.cache[uid] = ch.obj
            b.w[uid] = cols
            b.event(uid, "claimed", message=f"{ch.kind.name} {cols['namespace']}/{cols['name']} claimed")
            if d.problems:
                self._reject(b, cols, d.problems, record=False)
            else:
                assert d.need is not None
                self.needs[uid] = d.need
                b.placement_due = True

    def _reject(self, b: _Batch, row: dict[str, Any], problems: list[Invalid], *, record: bool = True) -> None:
        text = wl.problem_text(problems)
        if record:
            b.set_w(row["uid"], state="rejected", reason=text, updated_at=b.now)
        b.event(row["uid"], "invalid", reason="InvalidJob", message=text)
        key = _key(row)
        cond = wl.condition(labels.CONDITION_REJECTED, True, "InvalidJob", text, b.now)

        def write() -> None:
            self.writer.condition(key, cond)
            for p in problems:
                self.writer.event(key, "Warning", "InvalidJob", p.message)
        b.after.append(write)

    def _change(self, b: _Batch, row: dict[str, Any], ch: JobChange, d: wl.Described | None) -> None:
        uid = row["uid"]
        if row["state"] == "deleted":
            return
        if ch.deleted or wl.being_deleted(ch.obj):
            self._delete(b, row, "the Job was deleted on the manager cluster")
            return
        self.cache[uid] = ch.obj
        managed_by = ch.kind.managed_by(ch.obj)
        if managed_by != labels.MULTIKUEUE:
            if row["state"] == "rejected" and row["reason"].startswith("managedBy"):
                return
            field_path = ".".join(ch.kind.managed_by_path)
            problem = Invalid(field_path, f"managedBy changed from {labels.MULTIKUEUE!r} to {managed_by!r} after "
                              "mkd claimed the Job; mkd stopped managing it",
                              fix="managedBy is immutable: delete the Job and create it again")
            self._send_delete(b, row, "managedBy changed on the manager cluster")
            b.set_w(uid, state="rejected", reason=f"managedBy changed to {managed_by!r}", cluster=None,
                    updated_at=b.now)
            b.event(uid, "rejected", reason="ManagedByChanged", message=problem.message)
            key = _key(row)
            cond = wl.condition(labels.CONDITION_REJECTED, True, "ManagedByChanged", problem.message, b.now)
            b.after.append(lambda: self.writer.condition(key, cond))
            b.after.append(lambda: self.writer.event(key, "Warning", "ManagedByChanged", problem.message))
            return
        generation = wl.generation_of(ch.obj)
        if generation <= row["generation"]:
            return
        suspended = ch.kind.is_suspended(ch.obj)
        was = row["suspended"]
        b.set_w(uid, generation=generation, suspended=suspended, updated_at=b.now)
        what = "suspended" if suspended and not was else "resumed" if was and not suspended else "updated"
        if row["state"] in ("pending", "rejected") and d is not None:
            if d.problems:
                if row["state"] != "rejected" or row["reason"] != wl.problem_text(d.problems):
                    self._reject(b, row, d.problems)
                return
            b.set_w(uid, state="pending", requests=d.columns["requests"], podsets=d.columns["podsets"],
                    reason="suspended on the manager cluster; placed once resumed" if suspended else "")
            if row["state"] == "rejected":
                key = _key(row)
                cond = wl.condition(labels.CONDITION_REJECTED, False, "Corrected", "the Job is valid now", b.now)
                b.after.append(lambda: self.writer.condition(key, cond))
            assert d.need is not None
            self.needs[uid] = d.need
            b.event(uid, what, message=f"generation {generation}")
            b.placement_due = b.placement_due or not suspended
        elif row["state"] in ("placed", "running"):
            version = row["spec_version"] + 1
            b.set_w(uid, spec_version=version)
            b.event(uid, what, cluster=row["cluster"],
                    message=f"generation {generation}: spec version {version} sent to {row['cluster']}")
            self._send_place(b, row, ch.kind, ch.obj, attempt=row["attempt"], cluster=row["cluster"],
                             spec_version=version)

    def _delete(self, b: _Batch, row: dict[str, Any], reason: str) -> None:
        uid = row["uid"]
        self._send_delete(b, row, reason)
        b.set_w(uid, state="deleted", reason=reason, updated_at=b.now)
        b.event(uid, "deleted", cluster=row.get("cluster"), message=reason)

        def forget() -> None:
            self.known.pop(uid, None)
            self.cache.pop(uid, None)
            self.needs.pop(uid, None)
            if self.book.release(uid):
                pass
            self.writer.forget(uid)
        b.after.append(forget)
        b.placement_due = True

    def _send_delete(self, b: _Batch, row: dict[str, Any], reason: str) -> None:
        cluster = row.get("cluster")
        if not cluster or not row.get("attempt"):
            return
        key = (row["uid"], row["attempt"])
        if key in b.p and b.p[key]["state"] in q.ACTIVE_PLACEMENT:
            b.set_p(key, state="deleted", finished_at=b.now, reason=reason)
        cmd = messages.Delete(
            placement=messages.PlacementKey(workload_uid=row["uid"], attempt=row["attempt"], epoch=self.epoch),
            job=messages.JobRef(kind=row["kind"], api_version=row["api_version"], namespace=row["namespace"],
                                name=row["name"]),
            reason=reason, sent_at=b.now)
        self._queue(b, cluster, row["uid"], cmd)
        b.set_w(row["uid"], cluster=None)
        b.after.append(lambda: self.book.release(row["uid"]))

    def _send_place(self, b: _Batch, row: Mapping[str, Any], kind: JobKind, obj: Mapping[str, Any], *,
                    attempt: int, cluster: str, spec_version: int) -> None:
        cmd = wl.place_command(kind, obj, origin=self.settings.origin, attempt=attempt, epoch=self.epoch,
                               spec_version=spec_version, now=b.now)
        self._queue(b, cluster, row["uid"], cmd)
        b.place_keys[b.outbox[-1]["id"]] = (row["uid"], attempt)

    def _queue(self, b: _Batch, cluster: str, uid: str, cmd: messages.Place | messages.Delete | messages.Resync) -> None:
        b.outbox.append({"id": self.outbox_ids.next(), "cluster": cluster, "topic": topics.commands(cluster, self.settings.mqtt.topic_root),
                         "payload": messages.encode(cmd), "workload_uid": uid, "created_at": b.now})

    # --- Reports ----------------------------------------------------------------------------------

    async def _reports(self, s: AsyncSession, b: _Batch, reports: list[ReportIn]) -> None:
        if not reports:
            return
        keys = [(r.report.placement.workload_uid, r.report.placement.attempt) for r in reports
                if not isinstance(r.report, messages.Inventory | messages.Heartbeat)]
        await self._load(s, b, [uid for uid, _ in keys])
        for item in reports:
            r = item.report
            if isinstance(r, messages.Inventory):
                await self._inventory(s, b, r)
                continue
            assert not isinstance(r, messages.Heartbeat)
            key = (r.placement.workload_uid, r.placement.attempt)
            self.unanswered.pop(key, None)
            row = b.w.get(key[0])
            p = b.p.get(key)
            if row is None or p is None or p["cluster"] != r.cluster:
                log.debug("report %s for an unknown or old placement %s from %s dropped", r.type, key, r.cluster)
                continue
            current = row["attempt"] == key[1] and row["state"] != "deleted"
            if isinstance(r, messages.Accepted):
                self._accepted(b, row, p, r, current)
            elif isinstance(r, messages.Rejected):
                self._rejected(b, row, p, r, current)
            else:
                self._status(b, row, p, r, current)

    def _accepted(self, b: _Batch, row: dict[str, Any], p: dict[str, Any], r: messages.Accepted,
                  current: bool) -> None:
        if not current or p["state"] != "sent":
            return
        self._mark_accepted(b, row, p, r.cluster)

    def _mark_accepted(self, b: _Batch, row: dict[str, Any], p: dict[str, Any], cluster: str) -> None:
        uid = row["uid"]
        b.set_p((uid, p["attempt"]), state="accepted", accepted_at=b.now)
        if row["state"] == "placed":
            b.set_w(uid, state="running", reason="", updated_at=b.now)
        b.event(uid, "accepted", cluster=cluster, message=f"attempt {p['attempt']} accepted by {cluster}")
        key = _key(row)
        cond = wl.condition(labels.CONDITION_DISPATCHED, True, "Placed",
                            f"placed on cluster {cluster} (attempt {p['attempt']})", b.now)
        now = b.now
        b.after.append(lambda: self.book.accepted(uid, now))
        b.after.append(lambda: self.writer.condition(key, cond))

    def _rejected(self, b: _Batch, row: dict[str, Any], p: dict[str, Any], r: messages.Rejected,
                  current: bool) -> None:
        if not current or p["state"] not in q.ACTIVE_PLACEMENT:
            return
        uid = row["uid"]
        text = f"{r.reason}: {r.message}"
        b.set_p((uid, p["attempt"]), state="rejected", reason=text, finished_at=b.now)
        b.event(uid, "rejected", cluster=r.cluster, reason=r.reason, message=r.message)
        excluded = list(row["excluded"]) + ([r.cluster] if r.permanent and r.cluster not in row["excluded"] else [])
        self._requeue(b, row, f"rejected by {r.cluster}: {text}", excluded=excluded)

    def _requeue(self, b: _Batch, row: dict[str, Any], reason: str, *, excluded: list[str] | None = None) -> None:
        uid = row["uid"]
        if excluded is not None:
            b.set_w(uid, excluded=excluded)
        b.after.append(lambda: self.book.release(uid))
        key = _key(row)
        if row["attempt"] >= self.settings.max_placement_attempts:
            text = f"gave up after {row['attempt']} placement attempts; last: {reason}"
            b.set_w(uid, state="failed", reason=text, cluster=None, updated_at=b.now)
            b.event(uid, "failed", reason="PlacementAttemptsExhausted", message=text)
            cond = wl.condition(labels.CONDITION_DISPATCHED, False, "PlacementFailed", text, b.now)
            b.after.append(lambda: self.writer.condition(key, cond))
            b.after.append(lambda: self.writer.event(key, "Warning", "PlacementFailed", text))
            return
        b.set_w(uid, state="pending", reason=reason, cluster=None, updated_at=b.now)
        b.event(uid, "requeued", message=reason)
        cond = wl.condition(labels.CONDITION_DISPATCHED, False, "Requeued", reason, b.now)
        b.after.append(lambda: self.writer.condition(key, cond))
        b.placement_due = True

    def _status(self, b: _Batch, row: dict[str, Any], p: dict[str, Any], r: messages.Status, current: bool) -> None:
        uid = row["uid"]
        if not current or r.seq <= p["last_status_seq"]:
            self.stale_dropped += 1
            return
        pkey = (uid, p["attempt"])
        b.set_p(pkey, last_status_seq=r.seq)
        if r.gone and r.finished is None:
            # A Job that vanished without an outcome (deleted on the worker): placed again. One that
            # finished and then went (TTL) is recorded as finished below.
            if p["state"] in q.ACTIVE_PLACEMENT:
                b.set_p(pkey, state="lost", finished_at=b.now, reason="the worker Job disappeared")
                self._requeue(b, row, f"the Job disappeared from {r.cluster}")
            return
        if p["state"] == "sent":  # Status before Accepted (lost or reordered): it evidently runs
            self._mark_accepted(b, row, p, r.cluster)
        if r.finished is not None and p["state"] not in ("finished", "failed"):
            outcome = "finished" if r.finished == "Succeeded" else "failed"
            b.set_p(pkey, state=outcome, finished_at=b.now)
            b.set_w(uid, state=outcome, reason=r.finished, updated_at=b.now)
            b.event(uid, outcome, cluster=r.cluster, reason=r.finished, message=_last_condition(r.status))
            b.after.append(lambda: self.book.release(uid))
            b.placement_due = True
        elif r.finished is None and p["state"] in ("sent", "accepted") and r.status.get("startTime"):
            b.set_p(pkey, state="running")
            b.event(uid, "running", cluster=r.cluster, message=f"started on {r.cluster}")
        if r.gone and not r.status:
            return  # nothing to mirror: keep the last status the manager Job shows
        key = _key(row)
        status = r.status
        b.after.append(lambda: self.writer.mirror(key, status))

    async def _resync(self, s: AsyncSession, b: _Batch, cluster: str) -> list[Any]:
        """Queue a Resync listing every placement expected on ``cluster`` (call it after the batch's
        placements are flushed); returns those placements."""
        expected = await q.expected_on(s, cluster)
        keys = [messages.PlacementKey(workload_uid=e.workload_uid, attempt=e.attempt, epoch=self.epoch)
                for e in expected]
        self._queue(b, cluster, "", messages.Resync(cluster=cluster, epoch=self.epoch, expected=keys, sent_at=b.now))
        self._last_resync[cluster] = self.clock.monotonic()
        return list(expected)

    def _take_due_resyncs(self, b: _Batch) -> None:
        """Clusters whose Reports went missing get a Resync, at most once per two grace periods each."""
        now = self.clock.monotonic()
        spacing = 2 * self.settings.report_gap_grace_seconds
        for cluster in sorted(self._resync_due - b.resync):
            if now - self._last_resync.get(cluster, -1e18) < spacing:
                continue  # stays due; a later tick sends it
            self._resync_due.discard(cluster)
            b.resync.add(cluster)
            if cluster in self._resync_lost:
                self._resync_lost.discard(cluster)
                log.warning("reports from %s were lost (a broker dropped them, or this dispatcher was away): "
                            "sending a resync", cluster)
            else:
                log.info("met the report stream of %s part-way (this dispatcher started or reconnected): "
                         "sending a resync", cluster)
        self._resync_due -= b.resync

    async def _inventory(self, s: AsyncSession, b: _Batch, r: messages.Inventory) -> None:
        have = {(i.placement.workload_uid, i.placement.attempt): i for i in r.items}
        b.resync.add(r.cluster)  # the answer to an Inventory is a Resync, sent at the end of the batch
        expected = await q.expected_on(s, r.cluster)
        resent = 0
        for e in expected:
            item = have.get((e.workload_uid, e.attempt))
            if e.state not in q.ACTIVE_PLACEMENT or (item is not None and item.spec_version >= e.spec_version):
                continue
            obj = self.cache.get(e.workload_uid)
            if obj is None:
                log.warning("cannot re-send placement %s/%s: the manager Job is not in the cache",
                            e.namespace, e.name)
                continue
            self._send_place(b, dict(e._mapping, uid=e.workload_uid), by_name(e.kind), obj, attempt=e.attempt,
                             cluster=r.cluster, spec_version=e.spec_version)
            resent += 1
        log.info("inventory from %s: %d items, %d expected, %d Place re-sent", r.cluster, len(r.items),
                 len(expected), resent)

    # --- Clusters ---------------------------------------------------------------------------------

    async def _heartbeat(self, s: AsyncSession, b: _Batch, item: ReportIn) -> None:
        hb = item.report
        assert isinstance(hb, messages.Heartbeat)
        old = self.book.heartbeats.get(hb.cluster)
        if self.book.heartbeat(hb, item.received_at):
            b.placement_due = True
        lost = hb.cluster in self.lost
        if hb.online and (old is None or not old.online or lost):
            self.lost.pop(hb.cluster, None)
            b.event(None, "cluster_online", cluster=hb.cluster, message=f"agent {hb.agent_version} online")
        elif not hb.online and (old is None or old.online):
            self.lost.setdefault(hb.cluster, item.received_at)
            b.event(None, "cluster_lost", cluster=hb.cluster, reason="Offline", message="the agent went offline")
        await q.upsert_cluster(s, {
            "name": hb.cluster, "labels": dict(hb.labels), "capacity": hb.capacity.model_dump(),
            "kinds": sorted({*hb.kinds_reconciled, *hb.kinds_delegated}), "online": hb.online,
            "agent_version": hb.agent_version[:64], "interval_seconds": hb.interval_seconds,
            "last_heartbeat": item.received_at, "lost_since": self.lost.get(hb.cluster), "updated_at": b.now})

    async def _check_clusters(self, s: AsyncSession, b: _Batch) -> None:
        timeout = timedelta(seconds=self.settings.heartbeat_timeout_seconds)
        for name, received in list(self.book.received.items()):
            if name not in self.lost and b.now - received > timeout:
                self.lost[name] = b.now
                b.event(None, "cluster_lost", cluster=name, reason="HeartbeatTimeout",
                        message=f"no heartbeat for {self.settings.heartbeat_timeout_seconds:g}s")
                hb = self.book.heartbeats[name]
                await q.upsert_cluster(s, {"name": name, "labels": dict(hb.labels),
                                           "capacity": hb.capacity.model_dump(), "kinds": [], "online": hb.online,
                                           "lost_since": b.now, "updated_at": b.now})
        limit = self.settings.worker_lost_timeout_seconds
        if limit is None:
            return
        for name, since in list(self.lost.items()):
            if b.now - since < timedelta(seconds=limit):
                continue
            for p in await q.placements_on(s, name, q.ACTIVE_PLACEMENT):
                key = (p.workload_uid, p.attempt)
                rows = await q.load_workloads(s, [p.workload_uid])
                if p.workload_uid not in rows or rows[p.workload_uid].attempt != p.attempt:
                    continue
                b.w.setdefault(p.workload_uid, dict(rows[p.workload_uid]._mapping))
                b.p.setdefault(key, dict(p._mapping))
                b.set_p(key, state="lost", finished_at=b.now, reason=f"cluster {name} lost")
                self._requeue(b, b.w[p.workload_uid], f"cluster {name} was lost for more than {limit:g}s")

    @staticmethod
    def _same_story(new: str, old: str, since: datetime, now: datetime) -> bool:
        """Only the figures changed ("most free: worker-3 has 6" → "has 4"), and recently: not worth a
        new event row and condition write on every heartbeat; refreshed at least once a minute."""
        return (_DIGITS.sub("#", new) == _DIGITS.sub("#", old)
                and (now - since).total_seconds() < 60)

    async def _resend_unanswered(self, s: AsyncSession, b: _Batch) -> None:
        wait = self.settings.place_resend_seconds
        now = self.clock.monotonic()
        resent = 0
        for r in await q.unanswered(s, b.now - timedelta(seconds=wait), self.settings.batch_size):
            key = (r.workload_uid, r.attempt)
            obj = self.cache.get(r.workload_uid)
            if obj is None or now - self._resent.get(key, -wait) < wait:
                continue
            self._resent[key] = now
            self._send_place(b, {"uid": r.workload_uid}, by_name(r.kind), obj, attempt=r.attempt,
                             cluster=r.cluster, spec_version=r.spec_version)
            resent += 1
        if resent:
            log.warning("re-sent %d Place commands not answered within %gs", resent, wait)
        if len(self._resent) > 100_000:
            self._resent.clear()

    # --- placement --------------------------------------------------------------------------------

    async def _place(self, s: AsyncSession, b: _Batch) -> None:
        self._last_place = self.clock.monotonic()
        rows = await q.pending_workloads(s, self.settings.batch_size * 4)
        if not rows:
            return
        views = {v.name: v for v in self.book.views()}
        chosen: list[tuple[dict[str, Any], str, Need, str]] = []
        waiting: list[tuple[dict[str, Any], str]] = []
        for r in rows:
            row = b.w.setdefault(r.uid, dict(r._mapping))
            if r.uid not in self.cache:
                continue  # intake has not listed it since start-up: next round
            need = self.needs.get(r.uid)
            if need is None:
                need = self.needs[r.uid] = wl.need_of(r.kind, r.podsets)
            decision = choose(need, views.values(), now=b.now, timeout=self.settings.heartbeat_timeout_seconds,
                              exclude=r.excluded)
            if decision.cluster is None:
                if decision.reason != r.reason and not self._same_story(decision.reason, r.reason, r.updated_at, b.now):
                    waiting.append((row, decision.reason))
                continue
            self.book.take(views[decision.cluster], need)
            chosen.append((row, decision.cluster, need, decision.reason))
        by_cluster: dict[str, list[str]] = {}
        for row, cluster, _, _ in chosen:
            by_cluster.setdefault(cluster, []).append(row["uid"])
        won = await q.mark_placed(s, by_cluster, b.now)
        placements = []
        for n, (row, cluster, need, why) in enumerate(chosen):
            uid = row["uid"]
            if uid not in won:
                continue
            if n % 100 == 99:
                await asyncio.sleep(0)
            attempt = won[uid]
            row.update(state="placed", attempt=attempt, cluster=cluster, reason="")
            placements.append({"workload_uid": uid, "attempt": attempt, "cluster": cluster, "epoch": self.epoch,
                               "state": "sent", "spec_version": row["spec_version"], "created_at": b.now,
                               "reason": why})
            kind = by_name(row["kind"])
            try:
                self._send_place(b, row, kind, self.cache[uid], attempt=attempt, cluster=cluster,
                                 spec_version=row["spec_version"])
            except messages.MessageRefused as exc:  # e.g. above the payload limit: cannot be sent anywhere
                b.set_w(uid, cluster=None)
                self._reject(b, row, [Invalid("metadata.name", exc.message)])
                continue
            b.event(uid, "placed", cluster=cluster, message=f"attempt {attempt} on {cluster}: {why}")
            self.book.reserve(uid, cluster, need.total)
        await q.add_placements(s, placements)
        for row, reason in waiting:
            b.set_w(row["uid"], reason=reason, updated_at=b.now)
            b.event(row["uid"], "pending", reason="NoFittingCluster", message=reason)
            key = _key(row)
            cond = wl.condition(labels.CONDITION_DISPATCHED, False, "NoFittingCluster", reason, b.now)
            b.after.append(lambda key=key, cond=cond: self.writer.condition(key, cond))  # type: ignore[misc]


def _last_condition(status: Mapping[str, Any]) -> str:
    conds = [c for c in status.get("conditions") or [] if isinstance(c, Mapping) and c.get("status") == "True"]
    if not conds:
        return ""
    last = conds[-1]
    return f"{last.get('type')}: {last.get('reason', '')} {last.get('message', '')}".strip()


def supported_kinds() -> tuple[JobKind, ...]:
    return KINDS
