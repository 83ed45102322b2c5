"""What the agent tells the dispatcher: Status per placement, Accepted/Rejected, Inventory and Heartbeats.

``Outbox`` queues reports and a few sender coroutines publish them on the current MQTT link (QoS 1),
each taking what is waiting as one batch message; while the link is down they wait, so nothing sent
during a reconnect is lost.
``seq`` numbers come from ``worker_agent.seq.Sequencer``: strictly increasing across agent
restarts (a report epoch kept in the worker cluster, never a clock), so the dispatcher's
"drop a Status whose seq is not newer" rule holds.
``Reporter`` follows the owned jobs: every change of ``.status`` becomes a Status report
carrying it whole, ``finished`` from the JobKind, ``gone`` when the job is deleted. (A Kubeflow ``Created``
status is held by the apply loop, not here: a job whose pods run within moments has its Created and Running
written, and so reported, together; ``worker_agent.apply``.)
``capacity`` sums allocatable over Ready nodes minus the requests of non-terminal pods.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import uuid
from collections import Counter, deque
from collections.abc import Callable, Mapping
from decimal import Decimal
from typing import Any

import orjson

from federation import chunks, labels
from federation.clock import Clock, SystemClock, Timer
from federation.errors import Invalid, Transport
from federation.kinds.base import JobKind
from federation.messages import (
    MAX_BATCH_BYTES,
    MAX_NODES_REPORTED,
    MAX_PAYLOAD_BYTES,
    MAX_REPORTS_PER_MESSAGE,
    Accepted,
    Capacity,
    Heartbeat,
    Inventory,
    JobRef,
    MessageRefused,
    NodeFree,
    NodeTaint,
    PlacementKey,
    Rejected,
    ReportBase,
    Status,
    encode_numbered,
    encode_reports,
)
from federation.mqtt import MqttLink
from federation.podset import Resources, add, format_resources, parse_resources, pod_requests, scale, sub
from federation.policy import PolicySettings
from federation.retry import Backoff
from federation.tasks import park, wake_first
from worker_agent.cache import ObjectCache
from worker_agent.seq import Sequencer

log = logging.getLogger(__name__)

TERMINAL_PHASES = ("Succeeded", "Failed")
RETRY_PAUSE = 0.2
"""Seconds a sender first waits after a failed publish on a link that is still up, before the next try
(doubling, with jitter, up to ``RETRY_PAUSE_MAX`` while publishes keep failing)."""
RETRY_PAUSE_MAX = 2.0


MESSAGES_IN_FLIGHT = 4
"""Batches of Reports awaiting their PUBACK at once, at most (heartbeats go outside this limit). What is
queued while they are out goes as the next batch: a burst of Reports becomes a few messages instead of one
per sender. A few, not one: a PUBACK takes a broker round trip, and one slow message must not hold the rest."""

_Item = list[Any]
"""[topic, report, retain]: a list, so a queued Status can be replaced in its place."""


def _alone(item: _Item) -> bool:
    """A retained Report or a heartbeat is never batched: the presence topic holds one heartbeat."""
    return bool(item[2]) or isinstance(item[1], Heartbeat)


def _status_key(report: Status | Accepted | Rejected) -> tuple[str, int, int]:
    p = report.placement
    return p.workload_uid, p.attempt, p.epoch


class Outbox:
    """Reports waiting for the link; several senders publish at once.

    Each Report is numbered as it goes out (``ReportBase.stream`` / ``n``): the stream is the
    current link, a new random id on every attach, so the dispatcher can tell a lost Report
    (a hole in ``n`` that does not fill) from one still in flight. The Reports waiting when a sender
    is free go as one message (``federation.messages.Reports``), at most ``max_in_flight`` such
    messages awaiting their PUBACK at once; ``seal`` (the agent's
    ``federation.signing`` sealer) signs each message once, with the stream and the number of its last
    Report. Heartbeats go first and alone.
    """

    def __init__(self, *, limit: int = 200_000, seal: Callable[[str, bytes, str, int], bytes] | None = None,
                 max_in_flight: int = MESSAGES_IN_FLIGHT, accept_hold: float = 0.0,
                 clock: Clock | None = None) -> None:
        self._seal = seal
        self.clock = clock or SystemClock()
        """What a sender waits on between publishes that fail on a live link."""
        self.max_in_flight = max_in_flight
        self.accept_hold = accept_hold
        """Seconds an Accepted waits for its placement's first Status (``put``); 0: it goes at once."""
        self._held: dict[tuple[str, int, int], _Item] = {}
        """placement -> its Accepted, held (not in ``_items`` yet)."""
        self._held_order: deque[tuple[float, tuple[str, int, int], _Item]] = deque()
        """(when it goes, placement, item) in the order held: the hold is one length, so the first is due first."""
        self._held_timer: Timer | None = None
        self.folded = 0
        """Accepteds never sent: their placement's Status went instead."""
        self._in_flight = 0
        """Batches of Reports published and not acknowledged yet (heartbeats not counted)."""
        self._items: deque[_Item] = deque()
        self._limit = limit
        self._queued_status: dict[tuple[str, int, int], _Item] = {}
        """placement -> its Status still waiting in ``_items``: a newer one takes its place (``put``)."""
        self.coalesced = 0
        self._beat: _Item | None = None
        """The newest heartbeat not yet published: it goes before every queued Report (``put_heartbeat``)."""
        self._waiters: deque[asyncio.Future[None]] = deque()
        """Senders with nothing to do, parked; ``_wake`` lets one go (not all: no herd on every Report)."""
        self._link: MqttLink | None = None
        self._linked = asyncio.Event()
        self.sent = 0
        """Reports published (heartbeats included)."""
        self.messages = 0
        """MQTT messages they went in (``sent`` / ``messages``: Reports per message)."""
        self.stream = ""
        self._n = 0

    def put(self, topic: str, report: ReportBase, *, retain: bool = False) -> None:
        """Queue ``report``. A Status carries the Job's whole ``.status``, so one for a placement whose
        previous Status is still waiting replaces that one in its place in the queue: under a backlog the
        dispatcher gets the newest status sooner and nothing in between is lost but superseded states."""
        if self._held:
            if isinstance(report, Status):
                if self._held.pop(_status_key(report), None) is not None:
                    self.folded += 1  # the Status goes instead: it says the copy exists
            elif isinstance(report, Inventory):
                self.release_held()  # what the agent holds is listed after what it answered
            elif isinstance(report, Accepted | Rejected):
                self._release(_status_key(report))  # an answer of the same placement goes after it
        if isinstance(report, Status):
            key = _status_key(report)
            waiting = self._queued_status.get(key)
            if waiting is not None:
                waiting[1] = report
                self.coalesced += 1
                return
        item: _Item = [topic, report, retain]
        if self.accept_hold > 0 and isinstance(report, Accepted) and not retain:
            self._hold(_status_key(report), item)
            return
        self._queue(item)
        if isinstance(report, Status):
            self._queued_status[_status_key(report)] = item

    def _hold(self, key: tuple[str, int, int], item: _Item) -> None:
        """Keep an Accepted back for ``accept_hold`` seconds: a Job whose pods start within moments has its first
        Status follow, and that Status alone tells the dispatcher what both did (one Report, one decision and one
        row update fewer per Job). The dispatcher's re-send of an unanswered Place is 30 s away."""
        now = self.clock.monotonic()
        self._held[key] = item
        self._held_order.append((now + self.accept_hold, key, item))
        if self._held_timer is None:
            self._held_timer = self.clock.call_later(self._held_order[0][0] - now, self._release_due)

    def _release(self, key: tuple[str, int, int]) -> None:
        item = self._held.pop(key, None)
        if item is not None:
            self._queue(item)

    def _release_until(self, until: float) -> None:
        """Send the Accepteds due by ``until`` in the order held; entries already sent or folded are dropped."""
        order = self._held_order
        while order and (order[0][0] <= until or self._held.get(order[0][1]) is not order[0][2]):
            _, key, item = order.popleft()
            if self._held.get(key) is item:
                del self._held[key]
                self._queue(item)

    def _release_due(self) -> None:
        self._held_timer = None
        now = self.clock.monotonic()
        self._release_until(now)
        if self._held_order:
            self._held_timer = self.clock.call_later(self._held_order[0][0] - now, self._release_due)

    def release_held(self) -> None:
        """Every held Accepted goes now, in the order held (a stopping agent, an Inventory)."""
        self._release_until(math.inf)
        if self._held_timer is not None:
            self._held_timer.cancel()
            self._held_timer = None

    def held(self) -> int:
        return len(self._held)

    def _queue(self, item: _Item) -> None:
        if len(self._items) >= self._limit:  # bounded: the oldest goes (as a full deque would drop it)
            self._forget(self._items.popleft())
        self._items.append(item)
        self._wake()

    def _forget(self, item: _Item) -> None:
        if isinstance(item[1], Status) and self._queued_status.get(_status_key(item[1])) is item:
            del self._queued_status[_status_key(item[1])]

    def put_heartbeat(self, topic: str, heartbeat: Heartbeat) -> None:
        """Queue a heartbeat (retained) ahead of every Report, replacing one still waiting: the lease a
        heartbeat earns runs from when it was queued (``worker_agent.lease``), so it must not wait behind a
        backlog, and an older heartbeat says nothing the newer one does not."""
        self._beat = [topic, heartbeat, True]
        self._wake()

    def _take(self) -> _Item:
        if self._beat is not None:
            item, self._beat = self._beat, None
            return item
        item = self._items.popleft()
        self._forget(item)
        return item

    def _put_back(self, item: _Item) -> None:
        if isinstance(item[1], Heartbeat):
            if self._beat is None:  # unless a newer one was queued meanwhile
                self._beat = item
        elif isinstance(item[1], Status) and _status_key(item[1]) in self._queued_status:
            pass  # a newer Status of the same placement is queued: it says everything this one did
        else:
            self._items.appendleft(item)
            if isinstance(item[1], Status):
                self._queued_status[_status_key(item[1])] = item
        self._wake()

    @staticmethod
    def new_stream() -> str:
        return uuid.uuid4().hex[:16]

    def attach(self, link: MqttLink | None, *, stream: str | None = None) -> None:
        """``stream``: the id the link's will message was sealed with (a new one when None)."""
        if link is not None and link is not self._link:
            self.stream, self._n = stream or self.new_stream(), 0
        self._link = link
        if link is None:
            self._linked.clear()
        else:
            self._linked.set()

    def _take_batch(self) -> tuple[list[_Item], bytes] | None:
        """The Reports waiting for the same topic, numbered and encoded in queue order as one batch
        (``federation.messages.Reports``: at most ``MAX_REPORTS_PER_MESSAGE`` and about ``MAX_BATCH_BYTES``);
        None when what was waiting cannot be sent at all (logged and dropped)."""
        taken: list[_Item] = []
        parts: list[bytes] = []
        size = 0
        while self._items and len(taken) < MAX_REPORTS_PER_MESSAGE:
            item = self._items[0]
            if taken and (item[0] != taken[0][0] or _alone(item) or _alone(taken[0])):
                break  # one topic per message; a retained Report (presence) goes alone
            try:
                part = encode_numbered(item[1], self.stream, self._n + 1)
            except MessageRefused as exc:  # can never be sent (above the payload limit): not a crash
                self._forget(self._items.popleft())
                log.error("dropping a %s Report that cannot be sent: %s", type(item[1]).__name__, exc)
                continue
            if taken and size + len(part) > MAX_BATCH_BYTES:
                break  # the next message starts with it (its number is not used yet)
            self._forget(self._items.popleft())
            self._n += 1
            taken.append(item)
            parts.append(part)
            size += len(part) + 1
        if not taken:
            return None
        if _alone(taken[0]):
            return taken, parts[0]  # a single Report, as the dispatcher reads the presence topic
        return taken, encode_reports(parts)

    async def run_sender(self) -> None:
        """One sender; runs until cancelled. The heartbeat goes first and alone; the Reports waiting go
        as one batch (``_take_batch``). A failed publish is put back for the next link, in order."""
        backoff = Backoff(RETRY_PAUSE, RETRY_PAUSE_MAX)
        while True:
            while not self._sendable():
                await self._park()
            await self._linked.wait()
            link = self._link
            if link is None or not self._sendable():
                continue
            beat, reports = self._beat, int(self._beat is None)
            if beat is not None:
                item, self._beat = beat, None
                try:
                    payload = encode_numbered(item[1], self.stream, self._n + 1)
                except MessageRefused as exc:
                    log.error("dropping a heartbeat that cannot be sent: %s", exc)
                    continue
                self._n += 1
                batch = [item]
            else:
                taken = self._take_batch()
                if taken is None:
                    continue
                batch, payload = taken
                if self._sendable():
                    self._wake()  # more than one message's worth waits and a slot is free: another sender
            topic, retain = batch[0][0], batch[0][2]
            if self._seal is not None:
                payload = self._seal(topic, payload, self.stream, self._n)
            self._in_flight += reports
            try:
                await link.publish(topic, payload, retain=retain)
                backoff.succeeded()
                self.sent += len(batch)
                self.messages += 1
            except (Transport, RuntimeError) as exc:
                for item in reversed(batch):
                    self._put_back(item)
                if link.alive:
                    # Timed out on a link that is still up (a silent partition the keepalive has not
                    # noticed, or one that already healed): keep publishing on it. Detaching here left the
                    # agent mute after a heal, because only a new link attaches again. If the link is in
                    # fact dead, its keepalive ends it and the link loop detaches it.
                    log.info("publish failed (%s); trying again on the same link", exc)
                    await backoff.wait(self.clock)
                    continue
                if self._link is link:
                    self.attach(None)
                log.info("publish failed (%s); waiting for the link", exc)
            finally:
                self._in_flight -= reports
                self._wake()  # a slot is free: what queued meanwhile goes as the next batch

    async def _park(self) -> None:
        await park(self._waiters, self._wake)  # woken, then cancelled before it ran: the wake-up goes to another sender

    def _wake(self) -> None:
        wake_first(self._waiters)

    def _sendable(self) -> bool:
        """A heartbeat waits (it goes first, outside the limit), or Reports wait and a batch may start."""
        return self._beat is not None or (bool(self._items) and self._in_flight < self.max_in_flight)

    def pending(self) -> int:
        return len(self._items) + (self._beat is not None)


def placement_of(job: Mapping[str, Any]) -> PlacementKey | None:
    job_labels = (job.get("metadata") or {}).get("labels") or {}
    uid, attempt, epoch = (job_labels.get(labels.WORKLOAD_UID), job_labels.get(labels.PLACEMENT_ATTEMPT, "0"),
                           job_labels.get(labels.EPOCH, "0"))
    try:
        return _placement(uid, attempt, epoch)
    except TypeError:  # a label value that is not a string (not from an API server): not remembered
        return _placement.__wrapped__(uid, attempt, epoch)


@functools.lru_cache(maxsize=8192)
def _placement(uid: Any, attempt: Any, epoch: Any) -> PlacementKey | None:
    """The PlacementKey of a Job's labels, remembered: every watch event and status write of a Job reads it
    (~5 a Job), and validating a new frozen PlacementKey cost more than the rest of the reading."""
    if uid is None:
        return None
    try:
        return PlacementKey(workload_uid=uid, attempt=int(attempt), epoch=int(epoch))
    except ValueError:  # (a label that is not a number; pydantic's ValidationError is one too)
        return None


def spec_version_of(job: Mapping[str, Any]) -> int:
    annotations = (job.get("metadata") or {}).get("annotations") or {}
    try:
        return int(annotations.get(labels.SPEC_VERSION_ANNOTATION, "0"))
    except ValueError:
        return 0


def job_ref(kind: JobKind, job: Mapping[str, Any]) -> JobRef:
    meta = job.get("metadata") or {}
    return JobRef(kind=kind.name, api_version=kind.api_version, namespace=str(meta.get("namespace")),
                  name=str(meta.get("name")))


def _digest(status: Mapping[str, Any]) -> int:
    """A hash of ``status`` that changes when any part of it does (order included, as ``repr``'s did): its
    JSON, about a sixth of ``repr``'s cost for a Job's status (~1 us against ~7)."""
    try:
        return hash(orjson.dumps(status))
    except TypeError:  # not JSON (a number beyond 64 bits, say): what any Python object has
        return hash(repr(status))


class Reporter:
    """Builds reports and puts them in the outbox; remembers the last status sent per placement."""

    def __init__(self, cluster: str, report_topic: str, outbox: Outbox, origin: str) -> None:
        self.cluster = cluster
        self.topic = report_topic
        self.outbox = outbox
        self.origin = origin
        self.seq = Sequencer()
        """Given its report epoch by the agent before the first Report (``worker_agent.seq``)."""
        self.last_seq: dict[str, int] = {}
        """workload uid -> last seq sent."""
        self._last_status: dict[str, tuple[int, int, int, bool]] = {}
        """workload uid -> (attempt, epoch, hash of the status last sent, whether it is finished)."""
        self._finished: dict[str, bool] = {}

    def _send(self, report: Accepted | Rejected | Status | Inventory) -> None:
        self.outbox.put(self.topic, report)

    def accepted(self, placement: PlacementKey, spec_version: int) -> None:
        seq = self.seq.next()
        self.last_seq[placement.workload_uid] = seq
        self._send(Accepted(cluster=self.cluster, placement=placement, spec_version=spec_version, seq=seq))

    def rejected(self, placement: PlacementKey, spec_version: int, reason: str, message: str, *,
                 permanent: bool = True) -> None:
        seq = self.seq.next()
        self.last_seq[placement.workload_uid] = seq
        self._send(Rejected(cluster=self.cluster, placement=placement, spec_version=spec_version, seq=seq,
                            reason=reason, message=message[:4000], permanent=permanent))

    def status(self, placement: PlacementKey, status: Mapping[str, Any], finished: str | None, *,
               gone: bool = False) -> None:
        seq = self.seq.next()
        self.last_seq[placement.workload_uid] = seq
        self._send(Status(cluster=self.cluster, placement=placement, seq=seq, status=dict(status),
                          finished=finished if finished in ("Succeeded", "Failed") else None,  # type: ignore[arg-type]
                          gone=gone))

    def job_changed(self, kind: JobKind, job: Mapping[str, Any], *, deleted: bool = False,
                    force: bool = False) -> None:
        """A watched job changed: send a Status when its ``.status`` differs from the last one sent."""
        if ((job.get("metadata") or {}).get("labels") or {}).get(labels.ORIGIN) != self.origin:
            return
        placement = placement_of(job)
        if placement is None:
            return
        uid = placement.workload_uid
        status = job.get("status") or {}
        if deleted:
            finished = kind.finished(job)
            self._last_status.pop(uid, None)
            self._finished.pop(uid, None)
            self.status(placement, status, finished.outcome if finished else None, gone=True)
            return
        fingerprint = (placement.attempt, placement.epoch, _digest(status))
        last = self._last_status.get(uid)
        if not force and last is not None and last[:3] == fingerprint:
            # the status sent last (an echo, the answer to a status write): whether it is finished was read
            # from that very status (a JobKind reads finished from .status only)
            self._finished[uid] = last[3]
            return
        finished = kind.finished(job)
        outcome = finished.outcome if finished else None
        self._finished[uid] = outcome is not None
        if not force and not status and self._new_attempt(placement):
            # a copy just created that no controller has written a status for yet: the Accepted already
            # said it exists, and an empty status mirrors nothing
            return
        self._last_status[uid] = (*fingerprint, outcome is not None)
        self.status(placement, status, outcome)

    def forget_status(self, workload_uid: str) -> None:
        """The next status of the job goes even if it is the one sent last (a Resync asked for it again)."""
        self._last_status.pop(workload_uid, None)

    def new_copy_seen(self, placement: PlacementKey) -> bool:
        """``job_changed`` for a copy with no status, without the copy (``Inbox.created_echo``): it reports nothing
        and counts the job as running, unless a Status of this attempt was sent last (then the empty status is a
        change to report: False, and the caller decodes the copy for ``job_changed``)."""
        if not self._new_attempt(placement):
            return False
        self._finished[placement.workload_uid] = False
        return True

    def _new_attempt(self, placement: PlacementKey) -> bool:
        """No Status of ``placement``'s attempt was the last one sent: an empty status of it tells nothing new."""
        last = self._last_status.get(placement.workload_uid)
        return last is None or last[:2] != (placement.attempt, placement.epoch)

    def running(self) -> int:
        """Owned jobs seen and not finished."""
        return sum(1 for done in self._finished.values() if not done)

    def inventory(self, items: list[Any]) -> None:
        for part in chunks.split(Inventory(cluster=self.cluster, items=items)):  # any size: parts under the limit
            self._send(part)


# --- capacity ---------------------------------------------------------------------------------


def _node_ready(node: Mapping[str, Any]) -> bool:
    if (node.get("spec") or {}).get("unschedulable"):
        return False
    for condition in (node.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Ready":
            return bool(condition.get("status") == "True")
    return False


class CapacityMeter:
    """Allocatable and free capacity from the node and pod caches; pod requests cached per pod uid."""

    def __init__(self, nodes: ObjectCache, pods: ObjectCache) -> None:
        self.nodes = nodes
        self.pods = pods
        self._requests: dict[bytes, Resources] = {}

    def _pod_requests(self, shape: bytes) -> Resources:
        # keyed by what the scheduler counts, not by pod: thousands of replicas share a handful of shapes
        cached = self._requests.get(shape)
        if cached is None:
            containers, inits, overhead = orjson.loads(shape)
            spec = {"containers": containers or [], "initContainers": inits or []}
            if overhead:
                spec["overhead"] = overhead
            try:
                cached = pod_requests(spec)
            except Invalid:
                cached = {}
            if len(self._requests) > 10_000:
                self._requests.clear()
            self._requests[shape] = cached
        return cached

    def snapshot(self) -> tuple[list[dict[str, Any]], list[tuple[str, str | None, bytes]]]:
        """Nodes and pod usage taken on the event loop, so ``measure`` may run in a thread."""
        return self.nodes.values(), list(self.pods.pod_usage.values())

    def measure(self, snapshot: tuple[list[dict[str, Any]], list[tuple[str, str | None, bytes]]] | None = None,
                ) -> Capacity:
        nodes, pods = snapshot or self.snapshot()
        allocatable: Resources = {}
        per_node: dict[str, Resources] = {}
        node_shapes: dict[str, dict[str, Any]] = {}
        for node in nodes:
            if not _node_ready(node):
                continue
            try:
                alloc = parse_resources((node.get("status") or {}).get("allocatable"), "status.allocatable")
            except Invalid:
                continue
            allocatable = add(allocatable, alloc)
            per_node[str((node.get("metadata") or {}).get("name"))] = alloc
            node_shapes[str((node.get("metadata") or {}).get("name"))] = node
        used: Resources = {}
        used_on: dict[str, Resources] = {}
        # thousands of pods share a few (node, shape) pairs: one sum per pair, not one per pod
        pairs = Counter((node_name, shape) for phase, node_name, shape in pods if phase not in TERMINAL_PHASES)
        for (node_name, shape), count in pairs.items():
            req = scale(self._pod_requests(shape), count)
            used = add(used, req)
            if node_name is not None and node_name in per_node:
                used_on[node_name] = add(used_on.get(node_name, {}), req)
        free = {k: max(v, Decimal(0)) for k, v in sub(allocatable, used).items() if k in allocatable}
        largest: Resources = {}
        listed: list[NodeFree] = []
        for node_name, alloc in per_node.items():
            node_free = sub(alloc, used_on.get(node_name, {}))
            for resource, amount in node_free.items():
                if resource in alloc and amount > largest.get(resource, Decimal(-1)):
                    largest[resource] = max(amount, Decimal(0))
            if len(per_node) <= MAX_NODES_REPORTED:
                listed.append(_node_free(node_shapes[node_name], {k: max(v, Decimal(0)) for k, v in node_free.items()
                                                                  if k in alloc}, alloc))
        return Capacity(allocatable=format_resources(allocatable), free=format_resources(free),
                        largest_node_free=format_resources(largest), nodes=listed)


def _node_free(node: Mapping[str, Any], free: Resources, allocatable: Resources) -> NodeFree:
    """A node as the dispatcher's gang fit and ``mkctl why`` read it: labels, scheduling taints, free and
    allocatable figures."""
    md = node.get("metadata") or {}
    taints = [NodeTaint(key=str(t.get("key") or ""), value=str(t.get("value") or ""),
                        effect=str(t.get("effect") or "NoSchedule"))
              for t in (node.get("spec") or {}).get("taints") or [] if isinstance(t, Mapping)]
    return NodeFree(name=str(md.get("name") or ""), labels={str(k): str(v) for k, v in (md.get("labels") or {}).items()},
                    taints=taints, free=format_resources(free), allocatable=format_resources(allocatable))


HEARTBEAT_ROOM = 16_384
"""Bytes of a message's limit kept for the seal and the broker's framing when a heartbeat is sized."""
SIZE_CHECK_NODES = 200
"""A heartbeat listing fewer nodes than this is far below the message limit: not measured."""


def heartbeat(cluster: str, capacity: Capacity, *, version: str, interval: float,
              cluster_labels: Mapping[str, str], reconciled: list[str], delegated: Mapping[str, str],
              running: int, online: bool = True, policy: PolicySettings | None = None) -> Heartbeat:
    """The heartbeat; one whose node list would take it above the message limit (many nodes with many
    labels) sends the nodes without their allocatable figures, then without the node list (the totals and
    ``largest_node_free`` stay), and says so in the log."""
    def make(cap: Capacity) -> Heartbeat:
        return Heartbeat(cluster=cluster, online=online, agent_version=version, interval_seconds=interval,
                         labels=dict(cluster_labels), capacity=cap, kinds_reconciled=sorted(reconciled),
                         kinds_delegated=dict(delegated), running=running, policy=policy)

    hb = make(capacity)
    if len(capacity.nodes) < SIZE_CHECK_NODES or _fits(hb):
        return hb
    lean = make(capacity.model_copy(update={"nodes": [n.model_copy(update={"allocatable": {}})
                                                      for n in capacity.nodes]}))
    if _fits(lean):
        log.info("heartbeat: %d nodes sent without their allocatable figures (message limit)", len(capacity.nodes))
        return lean
    log.warning("heartbeat: %d nodes do not fit in one message; sending totals and largest_node_free only",
                len(capacity.nodes))
    return make(capacity.model_copy(update={"nodes": []}))


def _fits(hb: Heartbeat) -> bool:
    return len(hb.model_dump_json()) <= MAX_PAYLOAD_BYTES - HEARTBEAT_ROOM


async def sleep_or(event: asyncio.Event, seconds: float) -> None:
    """Wait until ``event`` is set or ``seconds`` (real) seconds pass."""
    try:
        await asyncio.wait_for(event.wait(), seconds)
    except TimeoutError:
        pass
