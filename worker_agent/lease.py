"""Fencing on the agent: hold a lease renewed by the dispatcher; stop the Jobs before it runs out.

Every heartbeat the dispatcher handles is answered with a :class:`~federation.messages.Lease` naming that
heartbeat (its ``sent_at``). The lease runs from the moment the agent *sent* that heartbeat, measured on the
agent's monotonic clock, so a delayed grant or a clock offset between the machines never lengthens it. When no
renewal arrives, the watchdog suspends every Job this agent placed (``JobKind.with_suspended`` via a merge
patch, marked with ``mkd.dev/fenced``) ``stop_before`` seconds before the lease ends, so the pods are gone by
the time the dispatcher, which waits for the lease plus a margin after the last heartbeat it granted, places
them elsewhere. A fenced agent creates nothing new (a Place is refused as temporary). When a grant arrives
again the agent sends an Inventory; the dispatcher's Resync then deletes what was placed elsewhere meanwhile,
and the Jobs it still lists are resumed (:meth:`LeaseKeeper.resume`).
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from typing import Any

from federation import labels
from federation.clock import Clock
from federation.errors import FederationError, NotFound
from federation.kinds.base import JobKind
from federation.kinds.pod import POD
from federation.kube import Kube, resource_for
from federation.messages import Heartbeat, Lease
from federation.retry import capped
from worker_agent import leaserecord
from worker_agent.cache import Key, ObjectCache, key_of
from worker_agent.reports import placement_of

log = logging.getLogger(__name__)


def _fence_patch(kind: JobKind, job: Mapping[str, Any], fenced: bool) -> dict[str, Any]:
    """The kind's suspend (or resume) merge patch with the fenced mark set (or removed)."""
    patch = kind.suspend_patch(job, fenced)
    metadata = patch.setdefault("metadata", {})
    metadata.setdefault("annotations", {})[labels.FENCED_ANNOTATION] = "true" if fenced else None
    return patch


class LeaseKeeper:
    """The agent's side of fencing.

    Resuming is level-triggered (:meth:`LeaseKeeper.resume_loop`): the listing of the last Resync is kept
    until the lease runs out again, and any copy it lists that is still (or again) marked ``mkd.dev/fenced``
    is resumed as soon as the lease holds and its record is current: a fence patch still in flight when the
    Resync came, a sweep of the fencer landing after the resume, or a Resync handled before the record was
    written no longer leave a Job suspended for good. A sweep stops fencing once the lease holds again.

    At start the agent has no grant: it keeps its Jobs for ``startup_grace`` seconds and fences them
    if no grant came by then. An agent process that is down or hung (frozen, stuck in a call) cannot stop
    anything itself, so every renewal is also written into the worker cluster (``worker_agent.leaserecord``,
    :meth:`LeaseKeeper.record_loop`), where the fencer (``worker_agent.fencer``), a process of its own,
    stops the Jobs when the record runs out. A renewal written after the record had run out asks for a
    Resync as a renewal after fencing does: the fencer may have suspended Jobs meanwhile.
    """

    def __init__(self, kube: Kube, caches: Mapping[str, ObjectCache], kinds: Mapping[str, JobKind], *,
                 origin: str, clock: Clock, startup_grace: float, stop_before: float,
                 on_regained: Callable[[], None] | None = None, record_in: tuple[str, str] | None = None) -> None:
        self.kube = kube
        self.record_in = record_in
        """(namespace, cluster) of the lease record the fencer reads; None: not written (tests)."""
        self.recorded: leaserecord.Held | None = None
        """The record as last written (or found at start)."""
        self.caches = caches
        self.kinds = kinds  # the agent's live map: kinds adopted later are fenced too
        self.origin = origin
        self.clock = clock
        self.stop_before = stop_before
        self.on_regained = on_regained
        self.until = clock.monotonic() + startup_grace + stop_before
        """Monotonic time the lease ends (before any grant: Jobs are stopped after the start-up grace)."""
        self.granted_once = False
        self.fenced = False
        self.resume_failed = False
        """A Resync came while the lease was out: the next renewal asks for another one."""
        self.fenced_jobs = 0
        self._sent: OrderedDict[datetime, float] = OrderedDict()
        self._changed = asyncio.Event()
        self._record_due = asyncio.Event()
        self._regain_due = False
        """A renewal after fencing: the Resync is asked for once the record is written (``record_loop``)."""
        self.expected: set[tuple[str, int]] | None = None
        """(workload uid, attempt) listed by the last Resync handled while the lease held; None once it ran out."""
        self._owed: set[tuple[str, Key]] = set()
        """(plural, key) of copies seen marked fenced that a Resync may list: what ``resume_loop`` looks at."""
        self._resume_due = asyncio.Event()

    # --- the lease ------------------------------------------------------------------------------

    def heartbeat_sent(self, hb: Heartbeat) -> None:
        """Called as a heartbeat is queued: a grant for it runs from now."""
        self._sent[hb.sent_at] = self.clock.monotonic()
        while len(self._sent) > 256:
            self._sent.popitem(last=False)

    def granted(self, lease: Lease) -> bool:
        """A renewal; False when it names a heartbeat this agent does not know (then it changes nothing)."""
        sent = self._sent.get(lease.heartbeat_sent_at)
        if sent is None:
            return False
        until = sent + lease.seconds
        self.stop_before = min(self.stop_before, lease.seconds / 4)  # a short lease (tests) still leaves time to run
        late = self.clock.monotonic() - sent
        if late > lease.seconds / 2:  # where the time goes, when renewals come too late to be of use
            log.info("lease renewal came %.1fs after its heartbeat was queued (lease %gs); the dispatcher granted "
                     "it %.1fs after the heartbeat was made", late, lease.seconds,
                     (lease.sent_at - lease.heartbeat_sent_at).total_seconds())
        if until > self.until or not self.granted_once:
            self.until = max(self.until, until) if self.granted_once else until
            self.granted_once = True
            self._changed.set()
            self._record_due.set()
            if self._owed:
                self._resume_due.set()
        # Ask for a Resync when the lease comes back after fencing, and again when the Resync that answered
        # came too late to resume anything (the lease had run out again): fenced Jobs are never left behind.
        if (self.fenced or self.resume_failed) and self.holds():
            log.warning("lease renewed after it ran out; asking the dispatcher for a Resync before resuming")
            self.fenced = False
            self.resume_failed = False
            if self.record_in is not None:  # asked once the renewal is recorded: a Resync resumes only then
                self._regain_due = True
                self._record_due.set()
            elif self.on_regained is not None:
                self.on_regained()
        return True

    def holds(self) -> bool:
        """Whether the agent may run and start Jobs now (the lease has more than ``stop_before`` left)."""
        return self.clock.monotonic() < self.until - self.stop_before

    def recorded_now(self) -> bool:
        """Whether the lease record in the worker cluster is current (always, when none is written)."""
        if self.record_in is None:
            return True
        return self.recorded is not None and self.recorded.ends > self.clock.now()

    def remaining(self) -> float:
        return self.until - self.clock.monotonic()

    async def run(self) -> None:
        """The watchdog: fence every owned Job once the lease is about to run out."""
        while True:
            left = self.until - self.stop_before - self.clock.monotonic()
            if left > 0 or self.fenced:
                self._changed.clear()
                wait = min(max(left, 0.05), 1.0) if not self.fenced else 1.0
                try:
                    await asyncio.wait_for(self._changed.wait(), timeout=wait)
                except TimeoutError:
                    pass
                continue
            self.fenced = True
            self.lease_lost()
            n = await self.fence_all()
            log.error("no lease renewal from the dispatcher: suspended %d Jobs before the lease ran out "
                      "(they are resumed when a Resync lists them again)", n)

    async def record_loop(self) -> None:
        """Write each renewal into the worker cluster for the fencer (``worker_agent.leaserecord``)."""
        if self.record_in is None:
            return
        namespace, cluster = self.record_in
        known = False
        failures = 0
        while True:
            await self._record_due.wait()
            self._record_due.clear()
            # measured at one instant: a write delayed (or frozen) after this cannot lengthen the record. It
            # ends half-way between the agent's own fencing and the lease's end: a live agent stops its Jobs
            # first (a renewal that is merely late spares them the fencer), a hung one still stops in time.
            now = self.clock.now()
            seconds = leaserecord.hold_seconds(self.remaining() - self.stop_before / 2)
            if seconds <= 0:
                self._ask_resync(lapsed=False)
                continue
            try:
                if not known:
                    self.recorded = await leaserecord.fetch(self.kube, namespace, cluster)
                    known = True
                before = self.recorded
                self.recorded = await leaserecord.write(self.kube, namespace, cluster, origin=self.origin,
                                                        renewed=now, seconds=seconds)
            except FederationError as exc:
                failures += 1
                delay = capped(failures, 0.2, 5.0)
                log.warning("could not record the lease in Lease %s/%s (%s); retrying in %.1fs (the fencer "
                            "stops the Jobs when the recorded one runs out)", namespace,
                            leaserecord.record_name(cluster), exc, delay)
                await self.clock.sleep(delay)
                self._record_due.set()
                continue
            failures = 0
            self.record_written()
            lapsed = before is not None and before.ends <= now
            if lapsed:
                assert before is not None
                log.warning("the recorded lease had run out (at %s): the fencer may have suspended Jobs; asking "
                            "the dispatcher for a Resync before resuming", before.ends.isoformat())
            self._ask_resync(lapsed=lapsed)

    def _ask_resync(self, *, lapsed: bool) -> None:
        """One Inventory (the dispatcher answers with a Resync) per renewal after fencing or a lapsed record."""
        if (lapsed or self._regain_due) and self.on_regained is not None:
            self._regain_due = False
            self.on_regained()

    # --- stopping and resuming ------------------------------------------------------------------

    def lease_lost(self) -> None:
        """The lease ran out: the last Resync's listing resumes nothing any more (the dispatcher may place
        those Jobs elsewhere); only a Resync handled after a renewal does."""
        self.expected = None

    def record_written(self) -> None:
        """The lease record is current again: copies a Resync listed before it was can be resumed now."""
        if self._owed:
            self._resume_due.set()

    def job_seen(self, plural: str, job: Mapping[str, Any]) -> None:
        """Every copy the job informer delivers: one marked fenced (by this agent or the fencer) is owed a
        resume, once a Resync lists it and the lease holds."""
        annotations = (job.get("metadata") or {}).get("annotations") or {}
        if annotations.get(labels.FENCED_ANNOTATION) == "true":
            self._owed.add((plural, key_of(job)))
            self._resume_due.set()

    def _owned(self) -> Iterable[tuple[JobKind, dict[str, Any]]]:
        for kind in self.kinds.values():
            cache = self.caches.get(resource_for(kind).plural)
            if cache is None:
                continue
            for key in cache.keys():
                job = cache.get(key)
                if job is None:
                    continue
                meta = job.get("metadata") or {}
                if (meta.get("labels") or {}).get(labels.ORIGIN) == self.origin and placement_of(job) is not None:
                    yield kind, job

    async def fence_all(self) -> int:
        done = 0
        for kind, job in list(self._owned()):
            meta = job.get("metadata") or {}
            if kind.is_suspended(job) or kind.finished(job) is not None:
                continue
            if self.holds():  # renewed while sweeping: the rest keep running (a Resync resumes the fenced)
                log.warning("lease renewed during the fencing sweep (%d suspended): the rest keep running", done)
                break
            try:
                await self._fence(kind, job)
                done += 1
            except NotFound:
                continue
            except FederationError as exc:  # keep going: every other Job must still stop
                log.error("could not suspend %s %s/%s: %s", kind.name, meta.get("namespace"), meta.get("name"), exc)
        self.fenced_jobs += done
        return done

    async def fence_late_copy(self, kind: JobKind, job: Mapping[str, Any]) -> dict[str, Any] | None:
        """A copy whose create was answered after the lease ran out: the agent stalled (frozen, starved)
        between its lease check and the create, the watchdog's sweep may have come before the copy existed,
        and the dispatcher may have placed the Job elsewhere meanwhile. Stopped like a swept one (a Resync
        that still lists it resumes it): the copy as patched, or None when it is gone (a pod group's pod is
        deleted, as the sweep deletes it). A failure to stop it is raised."""
        meta = job.get("metadata") or {}
        log.warning("%s %s/%s was created after the lease ran out (the agent stalled between its lease check and "
                    "the create): fenced at once", kind.name, meta.get("namespace"), meta.get("name"))
        try:
            fenced = await self._fence(kind, job)
        except NotFound:
            return None
        self.fenced_jobs += 1
        return fenced

    async def _fence(self, kind: JobKind, job: Mapping[str, Any]) -> dict[str, Any] | None:
        """Stop one copy: the fence patch (the copy as patched), or a pod group deleted (None)."""
        meta = job.get("metadata") or {}
        if kind.name == POD.name:  # a Pod cannot be suspended: the pod group's pods are deleted
            await self._delete_group(kind, meta)
            return None
        return await self._patch(kind, meta, _fence_patch(kind, job, True))

    async def _delete_group(self, kind: JobKind, meta: Mapping[str, Any]) -> None:
        """Stop a placed pod group: its other pods (the lead's children), then the lead pod. The dispatcher places
        the group again, elsewhere or here, once the lease has run out (nothing of it is left to resume)."""
        res = resource_for(kind)
        ns = str(meta.get("namespace") or "")
        cache = self.caches.get(res.plural)
        children = cache.select(ns, f"{labels.OWNER_UID}={meta.get('uid')}") if cache is not None else []
        for child in children:
            try:
                await self.kube.delete(res, str((child.get("metadata") or {}).get("name")), ns)
            except NotFound:
                pass
        try:
            await self.kube.delete(res, str(meta.get("name")), ns)
        except NotFound:
            pass

    async def _patch(self, kind: JobKind, meta: Mapping[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
        """Patch a Job and keep the answer in the cache at once: the informer may lag behind this write, and
        a resume decided from a copy that does not show the fence yet would leave the Job suspended."""
        res = resource_for(kind)
        patched = await self.kube.patch(res, str(meta["name"]), patch, meta.get("namespace"))
        self.job_seen(res.plural, patched)  # before upsert, which shrinks it to its header
        cache = self.caches.get(res.plural)
        if cache is not None:
            cache.upsert(patched)
        return patched

    async def resume(self, expected: set[tuple[str, int]]) -> int:
        """After a Resync: Jobs this agent (or the fencer) fenced that the dispatcher still expects run again,
        once the lease holds and is recorded: with the record out of date the fencer would stop them again.
        The listing is kept: ``resume_loop`` resumes what is fenced later or could not be resumed now."""
        if not self.holds():
            self.expected = None
            self.resume_failed = True
            return 0
        self.expected = set(expected)
        for kind, job in list(self._owned()):
            if ((job.get("metadata") or {}).get("annotations") or {}).get(labels.FENCED_ANNOTATION) == "true":
                self._owed.add((resource_for(kind).plural, key_of(job)))
        done = await self._resume_owed()
        if done:
            log.info("lease held again: resumed %d Jobs the dispatcher still expects here", done)
        return done

    async def resume_loop(self) -> None:
        """Level-triggered resume: whenever a fenced copy is seen, the lease is renewed or the record written,
        every copy still marked fenced that the last Resync listed is resumed, while the lease holds."""
        while True:
            await self._resume_due.wait()
            self._resume_due.clear()
            try:
                done = await self._resume_owed()
            except FederationError as exc:
                log.warning("could not resume fenced Jobs (%s); retrying in 1s", exc)
                await self.clock.sleep(1.0)
                self._resume_due.set()
                continue
            if done:
                log.info("resumed %d fenced Jobs the last Resync listed (fenced after it, or the lease record "
                         "was not current when it came)", done)

    async def _resume_owed(self) -> int:
        """Resume the owed copies the last Resync listed; keep those that must wait for the lease or record."""
        done = 0
        kinds = {resource_for(k).plural: k for k in self.kinds.values()}
        for plural, key in list(self._owed):
            kind, cache = kinds.get(plural), self.caches.get(plural)
            job = cache.get(key) if cache is not None else None
            meta = (job or {}).get("metadata") or {}
            if kind is None or job is None or (meta.get("annotations") or {}).get(labels.FENCED_ANNOTATION) != "true":
                self._owed.discard((plural, key))  # gone, or resumed already
                continue
            p = placement_of(job)
            if self.expected is None or p is None or (p.workload_uid, p.attempt) not in self.expected:
                if self.expected is not None:
                    self._owed.discard((plural, key))  # not listed: the Resync deleted it (a later one lists it)
                continue
            if not self.holds() or not self.recorded_now():
                self.resume_failed = True  # the next renewal asks for a Resync as well
                continue  # kept: resumed once renewed and recorded
            patch = _fence_patch(kind, job, False)
            try:
                await self._patch(kind, meta, patch)
                done += 1
            except NotFound:
                pass
            self._owed.discard((plural, key))
        return done
