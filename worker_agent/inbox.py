"""The agent's inbox: Commands from the dispatcher turned into worker Jobs, exactly once in effect.

Per workload the newest applied ``(attempt, epoch, spec_version)`` lives on the worker Job itself
(labels ``PLACEMENT_ATTEMPT`` / ``EPOCH``, annotation ``SPEC_VERSION_ANNOTATION``), so an agent
restart loses nothing: the index is rebuilt from the job informers, and a Command racing the
first list finds the Job by its AlreadyExists. A repeat re-sends Accepted; an older attempt, or an
older epoch for the same attempt, is Rejected as stale; a newer spec version replaces the Job's
spec (suspend / resume / an edit), through ``JobKind.update_for_worker``: the worker's metadata and
what its API server generated immutably (a batch Job's selector and labels) are kept. Place creates the namespace when allowed, stamps origin / workload /
placement / kind labels and clears managedBy (or sets a delegate operator's value). Delete
deletes the Job with Background propagation (children go by GC). Resync deletes owned Jobs the
dispatcher no longer expects, checking the origin label first. Commands for one workload are
handled in arrival order; different workloads in parallel.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from federation import chunks, flavorstamp, labels
from federation.clock import Clock, SystemClock
from federation.errors import (
    AlreadyExists,
    Conflict,
    FederationError,
    Invalid,
    NotFound,
    Permanent,
    Temporary,
)
from federation.kinds.base import JobKind
from federation.kinds.registry import by_name
from federation.kube import NAMESPACES, Kube, Resource, resource_for
from federation.messages import (
    REJECTED_LEASE_EXPIRED,
    Ask,
    Delete,
    InventoryItem,
    Lease,
    MessageRefused,
    Place,
    PlacementKey,
    Resync,
    decode_command,
)
from federation.retry import Backoff
from federation.tasks import TaskSet
from worker_agent import foreign
from worker_agent.cache import ObjectCache, Stored
from worker_agent.lease import LeaseKeeper
from worker_agent.policy import Policy, PolicySettings, describe
from worker_agent.reports import Reporter, job_ref, placement_of, spec_version_of

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Applied:
    """What the worker cluster holds for one workload."""

    kind: str
    namespace: str
    name: str
    attempt: int
    epoch: int
    spec_version: int

    @classmethod
    def of(cls, kind: str, job: Mapping[str, Any]) -> Applied | None:
        placement = placement_of(job)
        if placement is None:
            return None
        meta = job.get("metadata") or {}
        return cls(kind, str(meta.get("namespace")), str(meta.get("name")), placement.attempt, placement.epoch,
                   spec_version_of(job))


CREATED_KEPT = 4096
"""Copies remembered for ``Inbox.created_echo``: their echoes come within moments; one forgotten is decoded."""


@dataclass(frozen=True)
class NewCopy:
    """A copy the inbox created, as its watch echo would show it (``Inbox.created``)."""

    applied: Applied
    placement: PlacementKey


def new_copy(kind: str, created: Mapping[str, Any]) -> tuple[int, NewCopy] | None:
    """What the watch echo of the copy just ``created`` would tell (``Inbox.created_echo``), by its version: nothing
    beyond the create's answer when it has no status (no Status to report) and is not fenced (nothing to resume);
    else None (its echo is decoded)."""
    meta = created.get("metadata") or {}
    rv = str(meta.get("resourceVersion") or "")
    applied = Applied.of(kind, created)
    placement = placement_of(created)
    if created.get("status") or not rv.isdigit() or applied is None or placement is None or \
            (meta.get("annotations") or {}).get(labels.FENCED_ANNOTATION) == "true":
        return None
    return int(rv), NewCopy(applied, placement)


class Inbox:
    def __init__(self, kube: Kube, caches: Mapping[str, ObjectCache], reporter: Reporter, *, origin: str,
                 kinds: Mapping[str, JobKind], delegate: Mapping[str, str], create_namespaces: bool,
                 policy: Policy | None = None, clock: Clock | None = None) -> None:
        self.clock = clock or SystemClock()
        """What a Command retried after a temporary failure waits on."""
        self.policy = policy or Policy(PolicySettings())
        """Where Jobs may land and what their pods may do (``worker_agent.policy``), checked before creating."""
        self.kube = kube
        self.caches = caches
        self.reporter = reporter
        self.origin = origin
        self.kinds = dict(kinds)
        self.delegate = dict(delegate)
        self.create_namespaces = create_namespaces
        self.workloads: dict[str, Applied] = {}
        self.deleted: dict[str, tuple[int, int]] = {}
        """workload uid -> (attempt, epoch) of the last Delete applied (refuses late Places)."""
        self._locks: dict[str, asyncio.Lock] = {}
        self.foreign: dict[str, str] = {}
        """JobKind name -> why its jobs are refused here (another controller reconciles them too)."""
        self._known_namespaces: set[str] = set()
        self.tasks = TaskSet("inbox")
        """The Commands being handled, one task each: a crash outside a Command's own error handling is
        logged and counted (the agent's Supervisor makes it the ``mqtt`` task's), never dropped."""
        self.highest_epoch = 0
        self._arrivals = 0
        self.admission: Callable[[str], contextlib.AbstractAsyncContextManager[None]] | None = None
        """Around creating a new Job of a kind (by name): waits while the agent is behind on the Jobs it has
        (``ApplyLoop.admission``); None: never waits."""
        self.lease: LeaseKeeper | None = None
        self.report_again: Callable[[JobKind, dict[str, Any]], None] | None = None
        """How a Resync has an expected job's status reported again (the agent's; None: the watched status)."""
        """Fencing (worker_agent.lease): set by the agent; None in tests that do not fence."""
        self.asks: Callable[[Ask], None] | None = None
        """Where Asks go (worker_agent.podanswers); None: they are ignored."""
        self._resyncs = chunks.Assembler()
        self.resynced = asyncio.Event()
        """Set each time a Resync from the current dispatcher has been carried out."""
        self._resync_arrival: dict[str, int] = {}
        """chunk id -> arrival number of the first part of a Resync sent in parts."""
        self.place_arrival: dict[str, int] = {}
        """workload uid -> arrival number of its newest Place. A Resync describes the dispatcher's view
        when it was sent: a Job whose Place arrived after the Resync is newer than it, never garbage."""
        self.created: dict[int, NewCopy] = {}
        """resourceVersion -> the copy this inbox created at that version with no status and not fenced, until its
        watch echo comes (``created_echo``): the newest ``CREATED_KEPT``."""

    # --- the index, fed by the job watchers -------------------------------------------------------
    def job_seen(self, kind: str, job: Mapping[str, Any], *, deleted: bool = False) -> None:
        if ((job.get("metadata") or {}).get("labels") or {}).get(labels.ORIGIN) != self.origin:
            return
        applied = Applied.of(kind, job)
        if applied is None:
            return
        self._seen(str(((job.get("metadata") or {}).get("labels") or {})[labels.WORKLOAD_UID]), applied, deleted)

    def created_echo(self, rv: int) -> None:
        """The copy created at version ``rv`` (``created``) once its watch echo has come: ``job_seen`` of it, which
        the echo needs no decoding for (it is the version the create's answer brought)."""
        made = self.created.pop(rv, None)
        if made is not None:
            self._seen(made.placement.workload_uid, made.applied, False)

    def _seen(self, uid: str, applied: Applied, deleted: bool) -> None:
        current = self.workloads.get(uid)
        if deleted:
            if current is not None and (current.attempt, current.epoch) <= (applied.attempt, applied.epoch):
                del self.workloads[uid]
            return
        if current is None or (applied.attempt, applied.epoch, applied.spec_version) >= (
                current.attempt, current.epoch, current.spec_version):
            self.workloads[uid] = applied

    # --- receiving ---------------------------------------------------------------------------------
    def receive(self, payload: bytes) -> None:
        """Decode and dispatch one Command; handling runs in the background, ordered per workload."""
        try:
            command = decode_command(payload)
        except MessageRefused as exc:
            log.warning("refused command: %s", exc)
            return
        if isinstance(command, Lease):
            if self.lease is not None:
                self.lease.granted(command)
            return
        if isinstance(command, Ask):
            if self.asks is not None:
                self.asks(command)
            return
        key = command.placement.workload_uid if isinstance(command, Place | Delete) else "__resync__"
        self._arrivals += 1
        arrival = self._arrivals
        if isinstance(command, Resync) and command.chunk.parts > 1:
            # a Resync in parts is acted on only whole; it was built before its first part arrived
            first = self._resync_arrival.setdefault(command.chunk.id, arrival)
            whole = self._resyncs.add(command, time.monotonic())
            if whole is None:
                if len(self._resync_arrival) > 64:
                    self._resync_arrival.pop(next(iter(self._resync_arrival)))
                return
            self._resync_arrival.pop(command.chunk.id, None)
            command, arrival = whole, first
        if isinstance(command, Place):
            self.place_arrival[key] = self._arrivals
            if len(self.place_arrival) > 20_000:  # only Places newer than a Resync in flight matter
                horizon = self._arrivals - 10_000
                self.place_arrival = {u: a for u, a in self.place_arrival.items() if a > horizon}
        lock = self._locks.setdefault(key, asyncio.Lock())
        self._spawn(self._handle(lock, key, command, arrival), f"{command.type}/{key}")

    def _spawn(self, coro: Any, key: str) -> None:
        self.tasks.spawn(coro, name=key)

    async def _handle(self, lock: asyncio.Lock, key: str, command: Place | Delete | Resync, arrival: int) -> None:
        async with lock:
            backoff = Backoff(0.2, 5.0)
            for attempt in range(5):
                try:
                    if isinstance(command, Place):
                        await self.place(command)
                    elif isinstance(command, Delete):
                        await self.delete(command)
                    else:
                        await self.resync(command, arrival=arrival)
                    break
                except Temporary as exc:
                    log.info("command %s for %s: %s (try %d)", command.type, key, exc, attempt + 1)
                    if attempt == 4:
                        self._gave_up(command, f"the worker cluster kept failing: {exc}")
                    else:
                        await backoff.wait(self.clock, exc.delay)
                except Exception as exc:
                    log.exception("command %s for %s failed", command.type, key)
                    self._gave_up(command, f"{type(exc).__name__}: {exc}")
                    break
        if not lock.locked() and key in self._locks and self._locks[key] is lock:
            del self._locks[key]

    def _gave_up(self, command: Place | Delete | Resync, message: str) -> None:
        """Tell the dispatcher a Place could not be carried out now, so it can retry or go elsewhere."""
        if isinstance(command, Place):
            self.reporter.rejected(command.placement, command.spec_version, "AgentError", message,
                                   permanent=False)

    async def drain(self) -> None:
        """Wait for the commands being handled (tests and shutdown)."""
        await self.tasks.wait()

    # --- Place -------------------------------------------------------------------------------------
    def _stale(self, placement: PlacementKey, current: Applied) -> str | None:
        if placement.attempt < current.attempt:
            return (f"placement attempt {placement.attempt} is older than attempt {current.attempt} "
                    "already applied on this cluster")
        if placement.attempt == current.attempt and placement.epoch < current.epoch:
            return (f"dispatcher epoch {placement.epoch} is older than epoch {current.epoch} that already "
                    f"placed attempt {current.attempt}")
        return None

    async def place(self, cmd: Place) -> None:
        """Carry out a Place; a new Job waits first for the agent to have room for it (``admission``), before
        anything is checked, so the checks hold when it is created."""
        if self.admission is not None and cmd.placement.workload_uid not in self.workloads:
            async with self.admission(cmd.job.kind):
                await self._place(cmd)
            return
        await self._place(cmd)

    async def _place(self, cmd: Place, *, again: bool = False) -> None:
        p = cmd.placement
        uid = p.workload_uid
        try:
            by_name(cmd.job.kind)
        except Invalid as exc:
            self.reporter.rejected(p, cmd.spec_version, "UnsupportedKind", exc.message)
            return
        kind = self.kinds.get(cmd.job.kind)
        if kind is not None and kind.name in self.foreign:
            self.reporter.rejected(p, cmd.spec_version, foreign.REASON, self.foreign[kind.name])
            return
        if kind is None:
            self.reporter.rejected(p, cmd.spec_version, "KindNotServed",
                                   f"{cmd.job.kind} is not served by this cluster (its CRD is not installed); "
                                   "install the CRD or place the job elsewhere", permanent=False)
            return
        if self.lease is not None and not self.lease.holds():
            self.reporter.rejected(p, cmd.spec_version, REJECTED_LEASE_EXPIRED,
                                   "this agent has no lease from the dispatcher (fenced): it starts nothing new",
                                   permanent=False)
            return
        cmd = self._mapped(cmd)
        violations = self.policy.check(cmd.manifest, cmd.job.namespace)
        if violations:
            self.reporter.rejected(p, cmd.spec_version, "PolicyViolation",
                                   f"this cluster's policy refuses {cmd.job.kind} {cmd.job.namespace}/{cmd.job.name}: "
                                   + describe(violations))
            return
        gone = self.deleted.get(uid)
        if gone is not None and (p.attempt, p.epoch) <= gone:
            self.reporter.rejected(p, cmd.spec_version, "Deleted",
                                   f"placement attempt {p.attempt} was deleted on this cluster")
            return
        current = self.workloads.get(uid)
        if current is not None:
            stale = self._stale(p, current)
            if stale:
                self.reporter.rejected(p, cmd.spec_version, "Stale", stale)
                return
            if p.attempt > current.attempt:
                await self._delete_job(current)  # a new attempt replaces the old copy
                self.workloads.pop(uid, None)
            elif cmd.spec_version <= current.spec_version and p.epoch == current.epoch:
                self.reporter.accepted(p, current.spec_version)  # a repeat: no-op
                return
            else:
                await self._update(kind, cmd, current)
                return
        errors = kind.validate(cmd.manifest)
        if errors:
            first = errors[0]
            self.reporter.rejected(p, cmd.spec_version, "Invalid",
                                   "; ".join(e.message for e in errors[:5]) or first.message)
            return
        body = self._body(kind, cmd)
        ns = cmd.job.namespace
        if not await self._ensure_namespace(ns):
            self.reporter.rejected(p, cmd.spec_version, "NamespaceMissing",
                                   f"namespace {ns!r} does not exist on this cluster and the agent is "
                                   "configured not to create namespaces; create it or place elsewhere",
                                   permanent=False)
            return
        res = resource_for(kind)
        try:
            created = await self.kube.create(res, body, ns)
        except AlreadyExists:
            existing = await self.kube.get(res, cmd.job.name, ns)
            found = Applied.of(kind.name, existing)
            ours = ((existing.get("metadata") or {}).get("labels") or {}).get(labels.ORIGIN) == self.origin
            if not ours or found is None or placement_of(existing) is None or \
                    (placement_of(existing) or p).workload_uid != uid:
                self.reporter.rejected(p, cmd.spec_version, "NameTaken",
                                       f"{kind.name} {ns}/{cmd.job.name} already exists on this cluster and "
                                       "does not belong to this workload", permanent=False)
                return
            if again:  # an older copy is still going away (finalizers): retry later with backoff
                raise Temporary(f"{kind.name} {ns}/{cmd.job.name} from an older attempt is still terminating",
                                delay=1.0) from None
            self.workloads[uid] = found
            self.caches[res.plural].upsert(existing)
            await self._place(cmd, again=True)  # decide again against what is really there
            return
        except Invalid as exc:
            self.reporter.rejected(p, cmd.spec_version, "Invalid", exc.message)
            return
        except Permanent as exc:
            self.reporter.rejected(p, cmd.spec_version, exc.reason, exc.message, permanent=False)
            return
        if self.lease is not None and not self.lease.holds():  # held at the check, ran out before the answer
            fenced = await self.lease.fence_late_copy(kind, created)
            if fenced is None:  # gone (a pod group's pod): refused as a fenced agent refuses, the Place goes again
                self.reporter.rejected(p, cmd.spec_version, REJECTED_LEASE_EXPIRED,
                                       "the lease ran out while the agent created this Job: it was removed again",
                                       permanent=False)
                return
            created = fenced
        made = new_copy(kind.name, created)
        stored = self.caches[res.plural].upsert(created)
        self.workloads[uid] = Applied(kind.name, ns, cmd.job.name, p.attempt, p.epoch, cmd.spec_version)
        if made is not None and stored is not Stored.HELD:  # HELD: its echo came first, and was decoded
            self.created[made[0]] = made[1]
            if len(self.created) > CREATED_KEPT:
                del self.created[next(iter(self.created))]
        self.reporter.accepted(p, cmd.spec_version)

    def _mapped(self, cmd: Place) -> Place:
        """The Place with the worker namespace the policy maps the manager namespace to."""
        target = self.policy.target_namespace(cmd.job.namespace)
        if target == cmd.job.namespace:
            return cmd
        meta = {**(cmd.manifest.get("metadata") or {}), "namespace": target}
        return cmd.model_copy(update={"job": cmd.job.model_copy(update={"namespace": target}),
                                      "manifest": {**cmd.manifest, "metadata": meta}})

    def _body(self, kind: JobKind, cmd: Place) -> dict[str, Any]:
        p = cmd.placement
        stamp = {labels.ORIGIN: self.origin, labels.WORKLOAD_UID: p.workload_uid,
                 labels.PLACEMENT_ATTEMPT: str(p.attempt), labels.EPOCH: str(p.epoch),
                 labels.JOB_KIND: kind.name}
        body = kind.prepare_for_worker(cmd.manifest, stamp=stamp, managed_by=self.delegate.get(kind.name))
        flavorstamp.stamp(body, cmd.pod_scheduling)  # the quota's flavors: nodeSelector, tolerations
        meta = body.setdefault("metadata", {})
        meta["name"] = cmd.job.name
        meta["namespace"] = cmd.job.namespace
        meta["annotations"] = {**(meta.get("annotations") or {}),
                               labels.SPEC_VERSION_ANNOTATION: str(cmd.spec_version), labels.CREATED_BY: self.origin}
        return body

    async def _update(self, kind: JobKind, cmd: Place, current: Applied) -> None:
        res = resource_for(kind)
        p = cmd.placement
        version = max(cmd.spec_version, current.spec_version)
        backoff = Backoff(0.01, 0.1)  # client-go's RetryOnConflict: a few quick re-reads, apart by a little
        for attempt in range(5):
            if attempt:
                await backoff.wait(self.clock)
            existing = await self.kube.get(res, current.name, current.namespace)
            if cmd.spec_version > current.spec_version:  # suspend, resume, an edit: as the kind allows
                body = kind.update_for_worker(existing, self._body(kind, cmd))
            else:  # same spec, newer epoch: only the fencing label moves
                body = {**existing, "metadata": {**existing["metadata"],
                                                 "labels": {**(existing["metadata"].get("labels") or {}),
                                                            labels.EPOCH: str(p.epoch)}}}
            body["metadata"]["resourceVersion"] = existing["metadata"].get("resourceVersion")
            body["metadata"]["annotations"] = {**(body["metadata"].get("annotations") or {}),
                                               labels.SPEC_VERSION_ANNOTATION: str(version)}
            try:
                updated = await self.kube.replace(res, body, current.namespace)
            except Conflict:
                continue
            except Invalid as exc:
                self.reporter.rejected(p, cmd.spec_version, "Invalid", exc.message)
                return
            self.caches[res.plural].upsert(updated)
            self.workloads[p.workload_uid] = Applied(kind.name, current.namespace, current.name, p.attempt,
                                                     p.epoch, version)
            self.reporter.accepted(p, version)
            return
        raise Conflict(f"{kind.name} {current.namespace}/{current.name} kept changing", delay=0.5)

    async def _ensure_namespace(self, ns: str) -> bool:
        if ns in self._known_namespaces:
            return True
        try:
            await self.kube.get(NAMESPACES, ns)
        except NotFound:
            if not self.create_namespaces:
                return False
            try:
                await self.kube.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace",
                                                    "metadata": {"name": ns,
                                                                 "labels": self.policy.namespace_labels()}})
            except AlreadyExists:
                pass
        self._known_namespaces.add(ns)
        return True

    # --- another controller on the same job --------------------------------------------------------
    def refuse_foreign(self, kind: JobKind, job: Mapping[str, Any], child: Mapping[str, Any]) -> None:
        """``child`` shows another controller runs ``job`` too (``worker_agent.foreign``): refuse the job
        (in the background, in order with the workload's Commands) and every later one of its kind."""
        meta, child_meta = job.get("metadata") or {}, child.get("metadata") or {}
        text = foreign.message(kind.name, kind.controller, str(meta.get("namespace")), str(meta.get("name")),
                               str(child.get("kind") or "an object"), str(child_meta.get("name")),
                               self.reporter.cluster)
        self.foreign.setdefault(kind.name, text)
        placement = placement_of(job)
        if placement is None:
            return
        key = placement.workload_uid
        lock = self._locks.setdefault(key, asyncio.Lock())
        self._spawn(self._refuse(lock, kind, dict(job), placement, text), f"refuse/{placement.workload_uid}")

    async def _refuse(self, lock: asyncio.Lock, kind: JobKind, job: dict[str, Any], placement: PlacementKey,
                      text: str) -> None:
        async with lock:
            log.error("%s", text)
            self.reporter.rejected(placement, spec_version_of(job), foreign.REASON, text)
            try:
                await self.kube.event(job, type="Warning", reason=foreign.REASON, message=text, component="mkd-agent")
            except FederationError as exc:
                log.warning("could not record the %s Event: %s", foreign.REASON, exc)
            applied = Applied.of(kind.name, job)
            current = self.workloads.get(placement.workload_uid)
            if applied is not None and (current is None or (current.attempt, current.epoch) == (applied.attempt,
                                                                                                 applied.epoch)):
                await self._delete_job(applied)
                self.workloads.pop(placement.workload_uid, None)

    # --- Delete and Resync -------------------------------------------------------------------------
    async def _delete_job(self, applied: Applied) -> None:
        kind = self.kinds.get(applied.kind) or by_name(applied.kind)
        res = resource_for(kind)
        cached = self.caches[res.plural].header((applied.namespace, applied.name))
        if cached is not None and ((cached.get("metadata") or {}).get("labels") or {}).get(
                labels.ORIGIN) != self.origin:
            return  # never delete what another origin (or a user) owns
        try:
            await self.kube.delete(res, applied.name, applied.namespace, propagation="Background")
        except NotFound:
            pass

    async def delete(self, cmd: Delete) -> None:
        p = cmd.placement
        current = self.workloads.get(p.workload_uid)
        self.deleted[p.workload_uid] = max(self.deleted.get(p.workload_uid, (0, 0)), (p.attempt, p.epoch))
        if current is None or p.attempt < current.attempt:
            self.reporter.status(p, {}, None, gone=True)  # nothing of this attempt runs here
            return
        stale = self._stale(p, current)
        if stale:
            self.reporter.rejected(p, 0, "Stale", stale)
            return
        await self._delete_job(current)
        self.workloads.pop(p.workload_uid, None)  # the watcher's DELETED event may have removed it already
        res = resource_for(self.kinds.get(current.kind) or by_name(current.kind))
        cached = self.caches[res.plural].header((current.namespace, current.name))
        if cached is None:
            self.reporter.status(p, {}, None, gone=True)
        # otherwise the watcher's DELETED event reports gone with the last status

    async def resync(self, cmd: Resync, *, arrival: int | None = None) -> None:
        """Delete owned Jobs the dispatcher does not expect; report the expected ones again.

        ``arrival`` is the Resync's place in the order Commands were received (None: now); a Job whose
        Place arrived later than that was placed after the dispatcher built this Resync and is kept.
        """
        arrival = self._arrivals if arrival is None else arrival
        if cmd.epoch < self.highest_epoch:
            log.info("ignoring resync from epoch %d (seen %d)", cmd.epoch, self.highest_epoch)
            return
        self.highest_epoch = cmd.epoch
        expected = {(k.workload_uid, k.attempt) for k in cmd.expected}
        for kind_name, kind in self.kinds.items():
            res = resource_for(kind)
            cache = self.caches[res.plural]
            for key in cache.keys():
                job = cache.get(key)
                if job is None:
                    continue
                job_labels = (job.get("metadata") or {}).get("labels") or {}
                if job_labels.get(labels.ORIGIN) != self.origin:
                    continue  # checked before anything is deleted
                placement = placement_of(job)
                if placement is None:
                    continue
                if (placement.workload_uid, placement.attempt) in expected:
                    if self.report_again is not None:
                        self.report_again(kind, job)
                    else:
                        self.reporter.job_changed(kind, job, force=True)
                    continue
                if self.place_arrival.get(placement.workload_uid, 0) > arrival:
                    continue  # placed after this Resync was built
                applied = Applied.of(kind_name, job)
                if applied is not None:
                    log.info("garbage: %s %s/%s (workload %s attempt %d) is not expected", kind_name,
                             applied.namespace, applied.name, placement.workload_uid, placement.attempt)
                    await self._delete_job(applied)
                    self.workloads.pop(placement.workload_uid, None)
        if self.lease is not None:
            await self.lease.resume(expected)
        self.resynced.set()

    async def inventory_items(self, resources: Mapping[str, Resource]) -> list[InventoryItem]:
        """What this agent runs, listed from the API server (complete even before the informers sync)."""
        items: list[InventoryItem] = []
        for kind_name, res in resources.items():
            kind = self.kinds[kind_name]
            try:
                listed = await self.kube.list(res, label_selector=labels.origin_selector(self.origin))
            except (NotFound, FederationError) as exc:
                log.info("inventory: cannot list %s: %s", res.plural, exc)
                continue
            for job in listed.items:
                placement = placement_of(job)
                if placement is None:
                    continue
                self.job_seen(kind_name, job)
                items.append(InventoryItem(placement=placement, spec_version=spec_version_of(job),
                                           job=job_ref(kind, job),
                                           last_seq=self.reporter.last_seq.get(placement.workload_uid, 0)))
        return items
