"""The engine's shared state and the decisions every part of it makes: commands, requeue, reject.

:class:`EngineCore` holds what the engine's parts share — settings, the session factory, the Job
cache, the capacity book, the fencing epoch, the outbox ids — and the few actions more than one
part takes: queueing a Place / Delete / Resync Command, requeueing or rejecting a Workload, marking
a placement accepted, loading rows into a batch and flushing the batch's updates. The parts
(:mod:`dispatcher.engine.jobchanges`, :mod:`dispatcher.engine.answers`, :mod:`dispatcher.clusters.health`,
:mod:`dispatcher.engine.rounds`) build on it; :class:`dispatcher.engine.loop.Engine` combines them and owns the loop.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any, cast

import orjson
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from dispatcher import workload as wl
from dispatcher.clusters.identity import Identity
from dispatcher.clusters.policycheck import PolicyGate
from dispatcher.db.queries import clusters as cluster_q
from dispatcher.db.queries import outbox as outbox_q
from dispatcher.db.queries import placements as placement_q
from dispatcher.db.queries import workloads as workload_q
from dispatcher.engine import transitions
from dispatcher.engine.batch import Batch, Item, JobsOf, PlacementRow, WorkloadRow, engine_inbox, job_key
from dispatcher.intake.jobcache import JobCache
from dispatcher.mirror import conditions as jc
from dispatcher.mirror.kubewriter import KubeWriter
from dispatcher.placement import CapacityBook, Need
from dispatcher.queueing.state import QueueingState
from dispatcher.settings import DispatcherSettings
from dispatcher.states import P
from dispatcher.wire.freshrows import FreshRows
from dispatcher.wire.streams import StreamBook
from federation import chunks, labels, messages, topics
from federation.clock import Clock
from federation.errors import Invalid
from federation.kinds.base import JobKind
from federation.podset import parse_quantity
from federation.retry import Backoff
from federation.sealing import NoKey

EXHAUSTED = "PlacementAttemptsExhausted"
"""The reason of a Workload mkd gave up placing (state failed), its event row and its Job's conditions."""
GAVE_UP = "gave up after "
"""How such a Workload's reason begins (what dispatcher/engine/heal.py reads it by)."""
EDIT_REFUSED = "the latest edit was not sent"
log = logging.getLogger("dispatcher.engine")  # the engine's parts log as the engine (one logger to tune)


def _size(value: Any) -> int:
    return len(orjson.dumps(value))


def oversize_problem(obj: Mapping[str, Any], exc: messages.MessageRefused) -> Invalid:
    """The problem of a Job too large for a Command, naming the field that makes it large: the path
    descends while one child holds at least half of its parent's bytes."""
    path, node = "", obj
    while isinstance(node, Mapping | list) and node:
        total = _size(node)
        children = node.items() if isinstance(node, Mapping) else enumerate(node)
        key, child = max(children, key=lambda kv: _size(kv[1]))
        if _size(child) * 2 < total:
            break
        path = f"{path}[{key}]" if isinstance(node, list) else f"{path}.{key}" if path else str(key)
        node = child
    where = path or "metadata.name"
    return Invalid(where, f"the Job does not fit in one Command ({exc.message}); {where} is {_size(node)} bytes",
                   fix=f"keep the Job under {messages.MAX_PAYLOAD_BYTES // 1024} KiB: move bulky data into a ConfigMap "
                       "or a volume and refer to it")


def unsendable_problem(obj: Mapping[str, Any], exc: messages.MessageRefused) -> Invalid:
    """Why a Place cannot be sent: the Job is too large, or its cluster has no key to seal it to."""
    if isinstance(exc, NoKey):
        return Invalid("cluster", exc.message, fix=f"register cluster {exc.cluster} again "
                                                   f"(`mkctl clusters register {exc.cluster} --public-key ...`)")
    return oversize_problem(obj, exc)


class EngineCore:
    """Shared state and shared actions of the engine's parts (see the module docstring)."""

    def __init__(self, settings: DispatcherSettings, sessions: async_sessionmaker[AsyncSession], kube: Any,
                 writer: KubeWriter, clock: Clock, *, cache: JobCache | None = None) -> None:
        self.settings = settings
        self.identity = Identity(settings)
        self.policies = PolicyGate()
        """The clusters' announced policies: a Job is not placed where it would be refused."""
        """The dispatcher's key (Commands are sealed as they are queued) and the clusters' keys."""
        self.sessions = sessions
        self.kube = kube
        self.writer = writer
        self.clock = clock
        self.inbox: asyncio.Queue[Item] = engine_inbox()  # heartbeats first: their Leases must not wait
        self.cache = cache if cache is not None else JobCache()
        """The claimed manager Jobs by uid, compressed (dispatcher/intake/jobcache.py)."""
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
        self.cluster_rows: dict[str, tuple[messages.Capacity, tuple[Any, ...]]] = {}
        """Per cluster, what its heartbeats last wrote to its row: the capacity (compared by identity) and
        the other fields (``ClusterHealth._heartbeat``)."""
        self.epoch = 0
        self.outbox_ids = outbox_q.OutboxIds(0)
        self.outbox_wake = asyncio.Event()
        self.fresh = FreshRows(settings.outbox_memory_bytes)
        """Outbox rows committed by this engine, handed to the publisher in memory (it need not read
        them back, within a byte budget: dispatcher/wire/freshrows.py); the database copy is what survives a crash."""
        self.observers: list[Callable[[str, str], None]] = []
        self.stale_dropped = 0
        self.unanswered: dict[tuple[str, int], float] = {}
        """Places published and not answered yet (monotonic publish time): the publisher's flow control."""
        self._resent: dict[tuple[str, int], float] = {}
        """Placements whose Place was sent again (monotonic time): the next re-send waits for its answer."""
        self.listening_since: float | None = None
        """When the Report subscription last came up (monotonic; None: not yet). Unanswered Places are
        counted from then at the earliest: answers sent while nobody listened arrive first."""
        self.batches = 0
        self._last_place = 0.0
        self.last_heartbeat: dict[str, datetime] = {}
        """Cluster -> last heartbeat recorded in the database (also by an earlier dispatcher): a lease
        was granted with it. Clusters silent since this dispatcher started are judged by it."""
        self.lease_until: dict[str, datetime] = {}
        self.leases_granted: dict[str, datetime] = {}
        """Cluster -> ``sent_at`` of the last heartbeat the lease desk answered (dispatcher/clusters/leases.py)."""
        """Cluster -> the latest end of any lease granted to its agent (recorded in SQL, across restarts)."""
        self._edit_retry: dict[tuple[str, int], float] = {}
        """Placements whose agent refused a later Command for now: (uid, attempt) -> when to send it again."""
        self.listed_shows: dict[str, int] = {}
        """uid -> which of mkd's conditions the claimed Job showed True when intake first listed it, until the
        heal pass after a start reads it (dispatcher/engine/heal.py)."""
        self.namespace_of: dict[str, str] = {}
        """uid → namespace of the known Workloads (a namespaced intake's start-up sync needs it)."""
        self.outage = Backoff(0.1, settings.outage_retry_max_seconds)
        """The one backoff of the engine's held batch while the database or the manager API is down."""
        self.outage_since: float | None = None
        self.held = 0
        """Items held in the current outage (a batch being retried; more wait in the inbox)."""
        self.parked: list[Any] = []
        self._retrying: list[Any] = []
        self._stale = False
        self._heard: tuple[dict[str, messages.Heartbeat], dict[str, datetime]] | None = None
        """The capacity book's heartbeats (and when each came) as the last committed batch left them, kept
        when a batch fails: the try that commits must see the change each of its heartbeats brings."""
        self.shared_conditions: dict[tuple[Any, ...], jc.Conditions] = {}
        """Condition lists given to the kube writer for many Jobs alike (dispatcher/engine/rounds.py ``_shared``)."""
        self.queueing = QueueingState(starvation_seconds=settings.starvation_seconds,
                                      max_attempts_per_pass=settings.max_admissions_per_pass,
                                      fair_sharing=settings.fair_sharing.enable,
                                      preemption_strategies=tuple(settings.fair_sharing.preemption_strategies),
                                      hold_seconds=settings.starvation_hold_seconds,
                                      prioritize_preemptors=settings.preemption.prioritize_preemptors)
        """Kueue objects, the pending queues and the quota held (see ``dispatcher.queueing``)."""

    async def rebuild(self) -> None:
        async with self.sessions() as s:
            # one string per uid, kind and namespace across the engine's maps (100,000 Workloads)
            known: dict[str, str] = {}
            namespace_of: dict[str, str] = {}
            for uid, kind, namespace in await workload_q.known_workloads(s):
                uid = sys.intern(uid)
                known[uid] = sys.intern(kind)
                namespace_of[uid] = sys.intern(namespace)
            self.known, self.namespace_of = known, namespace_of
            # a failed batch recorded its heartbeats in the book: start again from those heard before it
            heard = self._heard or (self.book.heartbeats, self.book.received)
            book = CapacityBook(settle_seconds=self.settings.capacity_settle_seconds,
                                heartbeats=dict(heard[0]), received=dict(heard[1]))
            totals: dict[tuple[tuple[str, str], ...], dict[str, Any]] = {}  # one per distinct requests
            for row in await placement_q.active_placements(s):
                key = tuple(sorted((row.requests or {}).items()))
                total = totals.get(key)
                if total is None:
                    total = totals[key] = {k: parse_quantity(v, k) for k, v in key}
                book.reserve(sys.intern(row.workload_uid), row.cluster, total)
                if row.accepted_at is not None:
                    book.accepted(row.workload_uid, row.accepted_at)
            clusters = await cluster_q.cluster_times(s)  # not the node lists: megabytes at 1,000 clusters
            self.book = book
            self._heard = None
            # lost as the database says: a failed batch may have marked a cluster lost in memory only
            self.lost.clear()
            for c in clusters:
                if c.lost_since is not None:
                    self.lost[c.name] = c.lost_since
                if c.last_heartbeat is not None:
                    # the lease granted with it bounds when that agent stops its Jobs, whoever granted it
                    self.last_heartbeat[c.name] = c.last_heartbeat
                if c.lease_until is not None:
                    self.lease_until[c.name] = c.lease_until
            await self.queueing.rebuild(s, self.cache, self.needs)

    async def _flush(self, s: AsyncSession, b: Batch) -> None:
        by_cols: dict[tuple[str, ...], list[dict[str, Any]]] = {}
        for uid, values in b.w_updates.items():
            by_cols.setdefault(tuple(sorted(values)), []).append({"b_uid": uid, **values})
        for rows in by_cols.values():
            await workload_q.update_workloads(s, rows)
        b.w_updates.clear()
        p_cols: dict[tuple[str, ...], list[dict[str, Any]]] = {}
        for (uid, attempt), values in b.p_updates.items():
            p_cols.setdefault(tuple(sorted(values)), []).append({"b_uid": uid, "b_attempt": attempt, **values})
        for rows in p_cols.values():
            await placement_q.update_placements(s, rows)
        b.p_updates.clear()
        jobs = JobsOf(b, self.cache)  # the batch's decoded Jobs first (each decode ~15 us)
        await self._load_podsets(s, b, self.queueing.lacking_podsets(b.w.values(), jobs, self.needs))
        self.queueing.sync(b.w.values(), jobs, self.needs)

    async def _load_podsets(self, s: AsyncSession, b: Batch, uids: list[str]) -> None:
        """The PodSets of these batch rows (loaded light, see ``_load``) whose need is not known yet,
        in one query: a restarted dispatcher knows the need of no placed Workload, nor of a pending
        one whose Job intake had not listed when ``rebuild`` ran."""
        if uids:
            for uid, podsets in (await workload_q.load_podsets(s, uids)).items():
                b.w[uid]["podsets"] = podsets

    async def _load(self, s: AsyncSession, b: Batch, uids: list[str]) -> None:
        """Workload rows and their current placements into the batch (one query for those not loaded)."""
        missing = [uid for uid in uids if uid not in b.w]
        if not missing:
            return
        rows, current = await workload_q.load_current(s, missing)
        names = workload_q.LIGHT_NAMES
        for uid, r in rows.items():
            b.w[uid] = cast(WorkloadRow, dict(zip(names, r, strict=False)))  # the Workload columns (then the placement's, p__)
        for key, p in current.items():
            b.p.setdefault(key, cast(PlacementRow, p))

    def _send_delete(self, b: Batch, row: WorkloadRow, reason: str) -> None:
        cluster = row.get("cluster")
        if not cluster or not row.get("attempt"):
            return
        key = (row["uid"], row["attempt"])
        if key in b.p and b.p[key]["state"] in placement_q.ACTIVE_PLACEMENT:
            b.set_p(key, state=P.DELETED, finished_at=b.now, reason=reason)
        cmd = messages.Delete(
            placement=messages.PlacementKey(workload_uid=row["uid"], attempt=row["attempt"], epoch=self.epoch),
            job=messages.JobRef(kind=row["kind"], api_version=row["api_version"], namespace=row["namespace"],
                                name=row["name"]),
            reason=reason, sent_at=b.now)
        self._queue(b, cluster, row["uid"], cmd)
        b.set_w(row["uid"], cluster=None)
        b.after.append(lambda: self.book.release(row["uid"]))

    def _send_place(self, b: Batch, row: Mapping[str, Any], kind: JobKind, obj: Mapping[str, Any], *,
                    attempt: int, cluster: str, spec_version: int) -> None:
        cmd = wl.place_command(kind, obj, origin=self.settings.origin, attempt=attempt, epoch=self.epoch,
                               spec_version=spec_version, now=b.now)
        scheduling = self.queueing.pod_scheduling(row["uid"])  # the flavors' nodeSelector / tolerations
        if scheduling:
            cmd = cmd.model_copy(update={"pod_scheduling": scheduling})
        self._queue(b, cluster, row["uid"], cmd)
        b.place_keys[b.outbox[-1]["id"]] = (row["uid"], attempt)

    def _queue(self, b: Batch, cluster: str, uid: str,
               cmd: messages.Place | messages.Delete | messages.Resync | messages.Lease) -> None:
        topic = topics.commands(cluster, self.settings.mqtt.topic_root)
        body = messages.encode(cmd)
        if isinstance(cmd, messages.Place):  # manifests and env values: for the cluster's agent only
            body = self.identity.seal_place(cluster, topic, body)
        row_id = self.outbox_ids.next()  # signed as published, alone or in a batch (dispatcher/wire/outbox.py)
        b.outbox.append({"id": row_id, "cluster": cluster, "topic": topic, "payload": body, "workload_uid": uid,
                         "created_at": b.now})

    def _reject(self, b: Batch, row: WorkloadRow, problems: list[Invalid], *, record: bool = True,
                reason: str = "InvalidJob") -> None:
        text = wl.problem_text(problems)
        if record:
            transitions.rejected(b, row["uid"], text)
        b.event(row["uid"], "invalid", reason=reason, message=text)
        key = job_key(row)
        conds = jc.refused(reason, text, b.now)

        def write() -> None:
            for c in conds:
                self.writer.condition(key, c)
            for p in problems:
                self.writer.event(key, "Warning", reason, p.message)
        b.after.append(write)

    def _mark_accepted(self, b: Batch, row: WorkloadRow, p: PlacementRow, cluster: str) -> None:
        uid = row["uid"]
        b.set_p((uid, p["attempt"]), state=P.SUSPENDED if row["suspended"] else P.ACCEPTED, accepted_at=b.now)
        transitions.accepted(b, row)
        b.event(uid, "accepted", cluster=cluster, message=f"attempt {p['attempt']} accepted by {cluster}")
        key = job_key(row)
        conds = jc.accepted(jc.accepted_text(cluster, p["attempt"]), b.now)
        now = b.now
        b.after.append(lambda: self.book.accepted(uid, now))
        b.after.append(lambda: self._write(key, conds, status_follows=True))  # shares its first write

    def _lose(self, b: Batch, row: WorkloadRow, attempt: int, why: str, *, fence: bool,
              requeue_reason: str | None = None) -> None:
        """A placement is lost: its worker copy, or its whole cluster, vanished. The one place that says so:
        the placement ends ``lost`` with ``why``; when the copy may still exist on a cluster that went silent
        (``fence``), a Delete goes after it, which its agent applies before anything else once it is back;
        the Workload is queued again (``requeue_reason``, else ``why``)."""
        b.set_p((row["uid"], attempt), state=P.LOST, finished_at=b.now, reason=why)
        if fence:
            self._send_delete(b, row, why)
        self._requeue(b, row, requeue_reason or why)

    def _requeue(self, b: Batch, row: WorkloadRow, reason: str, *, excluded: list[str] | None = None) -> None:
        uid = row["uid"]
        if excluded is not None:
            b.set_w(uid, excluded=excluded)
        b.after.append(lambda: self.book.release(uid))
        key = job_key(row)
        if row["attempt"] >= self.settings.max_placement_attempts:
            text = f"{GAVE_UP}{row['attempt']} placement attempts; last: {reason}"
            transitions.gave_up(b, uid, text)
            b.event(uid, "failed", reason=EXHAUSTED, message=text)
            now = b.now
            b.after.append(lambda: self._write_gave_up(key, text, now))
            return
        transitions.requeued(b, row, reason)
        b.event(uid, "requeued", message=reason)
        conds = jc.requeued("Requeued", reason, b.now)
        b.after.append(lambda: self._write(key, conds, clear=True))
        b.placement_due = True

    def _write_gave_up(self, key: Any, text: str, at: datetime) -> None:
        """A Workload mkd gave up placing, on its Job: 'failed' is final, and the Job says so as mkd's other final
        refusals do (its worker status cleared: no copy runs), instead of looking like a Job still waiting for a
        placement (Dispatched=False alone); and a Warning Event."""
        conds = [wl.condition(labels.CONDITION_DISPATCHED, False, "PlacementFailed", text, at),
                 *jc.refused(EXHAUSTED, text, at)]
        self._write(key, conds, clear=True)
        self.writer.event(key, "Warning", "PlacementFailed", text)

    def _write(self, key: Any, conds: jc.Conditions, *, clear: bool = False, status_follows: bool = False) -> None:
        """One step's conditions to the Job (they share its next write); ``clear``: its worker copy is gone
        (deleted, lost, refused), so is that copy's status (a Job requeued must not read Running);
        ``status_follows``: the worker's first status surely follows (see ``KubeWriter.condition``)."""
        for c in conds:
            self.writer.condition(key, c, status_follows=status_follows)
        if clear:
            self.writer.mirror(key, {})

    async def _resync(self, s: AsyncSession, b: Batch, cluster: str) -> list[Any]:
        """Queue a Resync listing every placement expected on ``cluster`` (call it after the batch's
        placements are flushed); returns those placements."""
        expected = await placement_q.expected_on(s, cluster)
        keys = [messages.PlacementKey(workload_uid=e.workload_uid, attempt=e.attempt, epoch=self.epoch)
                for e in expected]
        whole = messages.Resync(cluster=cluster, epoch=self.epoch, expected=keys, sent_at=b.now)
        for part in chunks.split(whole):  # above the payload limit: parts the agent acts on only whole
            self._queue(b, cluster, "", part)
        now = self.clock.monotonic()
        b.after.append(lambda: self._last_resync.__setitem__(cluster, now))  # only once it is committed
        return list(expected)

    def _take_due_resyncs(self, b: Batch) -> None:
        """Clusters whose Reports went missing get a Resync, at most once per two grace periods each."""
        now = self.clock.monotonic()
        spacing = 2 * self.settings.report_gap_grace_seconds
        for cluster in sorted(self._resync_due - b.resync):
            if now - self._last_resync.get(cluster, -1e18) < spacing:
                continue  # stays due; a later tick sends it
            b.resync.add(cluster)
            if cluster in self._resync_lost:
                log.warning("reports from %s were lost (a broker dropped them, or this dispatcher was away): "
                            "sending a resync", cluster)
            else:
                log.info("met the report stream of %s part-way (this dispatcher started or reconnected): "
                         "sending a resync", cluster)
        taken = set(b.resync)

        def sent() -> None:  # after the commit: a batch that fails and is tried again still owes them
            self._resync_due.difference_update(taken)
            self._resync_lost.difference_update(taken)
        b.after.append(sent)
