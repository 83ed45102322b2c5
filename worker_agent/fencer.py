"""The fencer: stops an agent's Jobs when the agent's recorded lease runs out, from a process of its own.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Awaitable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from federation import labels
from federation.clock import Clock, SystemClock
from federation.errors import FederationError, NotFound
from federation.kinds.base import JobKind
from federation.kinds.pod import POD
from federation.kinds.registry import KINDS
from federation.kube import JOBS, PODS, Kube, Resource, resource_for
from federation.tasks import Supervisor
from worker_agent import leaserecord
from worker_agent.fencermetrics import FencerServer
from worker_agent.reconcilers.jobset import JOBSETS
from worker_agent.reports import placement_of
from worker_agent.settings import FencerSettings

log = logging.getLogger(__name__)


@dataclass
class Swept:
    """What one sweep did."""

    suspended: int = 0
    children_suspended: int = 0
    pods_deleted: int = 0
    failures: Counter[str] = field(default_factory=Counter)
    """Calls that failed, by reason: ``list``, ``suspend``, ``delete``."""

    @property
    def failed(self) -> int:
        return self.failures.total()

    def __bool__(self) -> bool:
        return bool(self.suspended or self.children_suspended or self.pods_deleted or self.failed)


def _controller_uid(obj: dict[str, Any]) -> str | None:
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("controller"):
            return str(ref.get("uid"))
    return None


CHILD_SUSPEND: dict[str, Any] = {"spec": {"suspend": True}}
"""How a child the agent made (a batch Job, a JobSet) is suspended."""


def _fenced(patch: dict[str, Any]) -> dict[str, Any]:
    """A copy's suspend patch (``JobKind.suspend_patch``) with the fenced mark."""
    patch.setdefault("metadata", {}).setdefault("annotations", {})[labels.FENCED_ANNOTATION] = "true"
    return patch


KINDS_RECHECK_SECONDS = 60.0
"""While the record is current, how often the fencer lists the kinds it fences again (readiness: a role
that lost a kind shows within a minute, not at the next sweep when it matters)."""


class Fencer:
    """One worker cluster's fencer.

    The agent suspends its Jobs itself when the dispatcher stops renewing its lease (``worker_agent.lease``),
    but an agent process that hangs (SIGSTOP, a deadlock, a node under memory pressure) does nothing while
    the dispatcher, after the lease and its margin, places those Jobs elsewhere. The fencer runs next to
    it (``mkctl fencer``, its own Deployment in ``deploy/worker``), shares nothing with it but the worker
    cluster, and reads the Lease the agent writes at every renewal (``worker_agent.leaserecord``). Once
    ``renewTime + leaseDurationSeconds`` has passed on the fencer's clock it sweeps, and sweeps again every
    ``sweep_seconds`` while the record stays out of date:

    - every placed copy of the agent's origin that is not finished is suspended the way its kind allows
      (``JobKind.suspend_patch``: Kubeflow ``runPolicy.suspend``, ``spec.suspend`` of a batch Job, JobSet,
      TrainJob; a LeaderWorkerSet scaled to zero groups) and marked ``mkd.dev/fenced``, so the agent resumes it
      only once a Resync lists it again;
    - what the (hung) agent's own reconcilers made under a copy, known by its ``mkd.dev/created-by``
      annotation (``worker_agent.foreign``), is stopped too: its pods are deleted, its batch Jobs suspended
      (the Job controller then removes their pods), its JobSets suspended and their Jobs too. Children made
      by live controllers (an operator a kind is delegated to, the cluster's Job controller) are left to
      them: they stop when their copy is suspended.

    The fencer never resumes anything: that is the agent's, after a renewal and a Resync. With no record at
    all (an agent that never held a lease here) it waits.
    """

    def __init__(self, kube: Kube, *, cluster: str, namespace: str, origin: str, clock: Clock | None = None,
                 poll_seconds: float = 2.0, sweep_seconds: float = 10.0, concurrency: int = 8,
                 kinds: Sequence[JobKind] = KINDS) -> None:
        self.kube = kube
        self.kinds = tuple(kinds)
        """What it fences: mkd's kinds and those its ``kinds_file`` declares."""
        self.cluster = cluster
        self.namespace = namespace
        self.origin = origin
        self.clock = clock or SystemClock()
        self.poll_seconds = poll_seconds
        self.sweep_seconds = sweep_seconds
        self._limit = asyncio.Semaphore(concurrency)
        self.sweeps = 0
        self.suspended = 0
        """Placed copies suspended, and (``children_suspended``) Jobs and JobSets under them."""
        self.children_suspended = 0
        self.pods_deleted = 0
        self.failures: Counter[str] = Counter()
        """Failed calls by reason: ``record`` (reading the lease record), ``list``, ``suspend``, ``delete``."""
        self.held: leaserecord.Held | None = None
        """The record as last read (None: none, or not read yet)."""
        self.record_error: str | None = "lease record not read yet"
        self.kinds_error: str | None = "fenced kinds not listed yet"
        self._kinds_listed: float | None = None
        self._last_sweep: float | None = None
        self._waiting_logged = False

    def missing(self) -> str | None:
        """Readiness: None once the last read of the record and the last listing of the kinds worked."""
        return "; ".join(e for e in (self.record_error, self.kinds_error) if e) or None

    def seconds_left(self) -> float | None:
        """Seconds until the record as last read runs out (negative: out by that much); None: no record."""
        return None if self.held is None else (self.held.ends - self.clock.now()).total_seconds()

    async def list_kinds(self) -> None:
        """List every kind it fences (the agent's copies) to learn that it can, for readiness."""
        self._kinds_listed = self.clock.monotonic()
        _, errors = await self._copies(Swept())
        self.kinds_error = f"cannot list {', '.join(errors)}" if errors else None

    async def run(self) -> None:
        while True:
            await self.clock.sleep(await self.check())

    async def check(self) -> float:
        """Read the record, sweep when it ran out; returns how long to wait before the next check."""
        if (self.kinds_error is not None or self._kinds_listed is None
                or self.clock.monotonic() - self._kinds_listed >= KINDS_RECHECK_SECONDS):
            await self.list_kinds()
        try:
            held = await leaserecord.fetch(self.kube, self.namespace, self.cluster)
        except FederationError as exc:
            self.record_error = f"cannot read the lease record: {exc}"
            self.failures["record"] += 1
            log.warning("cannot read the agent's lease record %s/%s: %s", self.namespace,
                        leaserecord.record_name(self.cluster), exc)
            return self.poll_seconds
        self.record_error, self.held = None, held
        if held is None:
            if not self._waiting_logged:
                log.info("no lease record %s/%s yet: nothing to fence until the agent holds a lease",
                         self.namespace, leaserecord.record_name(self.cluster))
                self._waiting_logged = True
            return self.poll_seconds
        left = (held.ends - self.clock.now()).total_seconds()
        if left > 0:
            self._last_sweep = None
            return min(left, self.poll_seconds)  # wake at the end itself, re-reading a renewal first
        now = self.clock.monotonic()
        if self._last_sweep is None or now - self._last_sweep >= self.sweep_seconds:
            self._last_sweep = now
            swept = await self.sweep()
            self.sweeps += 1
            self.suspended += swept.suspended
            self.children_suspended += swept.children_suspended
            self.pods_deleted += swept.pods_deleted
            self.failures.update(swept.failures)
            if swept:
                log.error("the agent of %s has not renewed its lease (recorded until %s): suspended %d Jobs and "
                          "%d of their child Jobs, deleted %d pods%s; the agent resumes what the dispatcher "
                          "still expects here once its lease is renewed", self.cluster, held.ends.isoformat(),
                          swept.suspended, swept.children_suspended, swept.pods_deleted,
                          f", {swept.failed} calls failed (retried next sweep)" if swept.failed else "")
        return self.poll_seconds

    async def sweep(self) -> Swept:
        """Stop every running Job of the origin (copies first, then what runs under the agent's own)."""
        swept = Swept()
        copies, errors = await self._copies(swept)
        self._kinds_listed = self.clock.monotonic()
        self.kinds_error = f"cannot list {', '.join(errors)}" if errors else None
        await self._all(self._suspend(resource_for(kind), job, _fenced(kind.suspend_patch(job, True)), swept,
                                      fenced=True)
                        for kind, job in copies if kind.name != POD.name and not kind.is_suspended(job))
        # a Pod cannot be suspended: a placed pod group's lead pod is deleted (its other pods are its children)
        await self._all(self._delete_pod(job, swept) for kind, job in copies if kind.name == POD.name)
        for ns in sorted({str(job["metadata"].get("namespace")) for _, job in copies}):
            roots = {str(job["metadata"]["uid"]) for _, job in copies if job["metadata"].get("namespace") == ns}
            await self._stop_children(ns, roots, swept)
        return swept

    async def _copies(self, swept: Swept) -> tuple[list[tuple[JobKind, dict[str, Any]]], list[str]]:
        """The origin's placed copies that are not finished, and the kinds that could not be listed."""
        copies: list[tuple[JobKind, dict[str, Any]]] = []
        errors: list[str] = []
        for kind in self.kinds:
            try:
                listed = await self.kube.list(resource_for(kind), label_selector=labels.origin_selector(self.origin))
            except NotFound:
                continue  # the kind is not installed here
            except FederationError as exc:  # one kind unreadable (a role missing it): stop every other one
                swept.failures["list"] += 1
                errors.append(resource_for(kind).plural)
                log.error("could not list %s to fence them: %s", resource_for(kind).plural, exc)
                continue
            copies += [(kind, job) for job in listed.items
                       if placement_of(job) is not None and kind.finished(job) is None]
        return copies, errors

    async def _stop_children(self, ns: str, roots: set[str], swept: Swept) -> None:
        by_owner: dict[str, list[tuple[Resource, dict[str, Any]]]] = {}
        for res in (PODS, JOBS, JOBSETS):
            try:
                items = (await self.kube.list(res, ns)).items
            except NotFound:
                continue
            except FederationError as exc:
                swept.failures["list"] += 1
                log.error("could not list %s in %s to stop what runs under the agent: %s", res.plural, ns, exc)
                continue
            for obj in items:
                owner = _controller_uid(obj)
                if owner is not None:
                    by_owner.setdefault(owner, []).append((res, obj))
        todo: list[Awaitable[None]] = []
        frontier, seen = list(roots), set(roots)
        while frontier:
            uid = frontier.pop()
            for res, obj in by_owner.get(uid, []):
                meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}
                if (meta.get("annotations") or {}).get(labels.CREATED_BY) != self.origin:
                    continue  # another controller's (alive: it stops them when their owner is suspended)
                if res is PODS:
                    phase = (obj.get("status") or {}).get("phase")
                    if phase not in ("Succeeded", "Failed") and not meta.get("deletionTimestamp"):
                        todo.append(self._delete_pod(obj, swept))
                    continue
                if not spec.get("suspend"):
                    todo.append(self._suspend(res, obj, CHILD_SUSPEND, swept, fenced=False))
                if res is JOBSETS and str(meta.get("uid")) not in seen:  # its Jobs: the JobSet's controller is the agent
                    seen.add(str(meta.get("uid")))
                    frontier.append(str(meta.get("uid")))
        await self._all(todo)

    async def _all(self, calls: Iterable[Awaitable[None]]) -> None:
        async def limited(call: Awaitable[None]) -> None:
            async with self._limit:
                await call
        await asyncio.gather(*(limited(c) for c in calls))

    async def _suspend(self, res: Resource, obj: dict[str, Any], patch: dict[str, Any], swept: Swept, *,
                       fenced: bool) -> None:
        meta = obj.get("metadata") or {}
        try:
            await self.kube.patch(res, str(meta.get("name")), patch, meta.get("namespace"))
        except NotFound:
            return
        except FederationError as exc:  # keep going: every other Job must still stop
            swept.failures["suspend"] += 1
            log.error("could not suspend %s %s/%s: %s", res.kind, meta.get("namespace"), meta.get("name"), exc)
            return
        if fenced:
            swept.suspended += 1
        else:
            swept.children_suspended += 1

    async def _delete_pod(self, pod: dict[str, Any], swept: Swept) -> None:
        meta = pod.get("metadata") or {}
        try:
            await self.kube.delete(PODS, str(meta.get("name")), meta.get("namespace"))
        except NotFound:
            return
        except FederationError as exc:
            swept.failures["delete"] += 1
            log.error("could not delete pod %s/%s: %s", meta.get("namespace"), meta.get("name"), exc)
            return
        swept.pods_deleted += 1


async def run(settings: FencerSettings, *, stop: asyncio.Event, clock: Clock | None = None) -> None:
    """Run the fencer of ``settings.cluster_name`` until ``stop`` is set.

    It serves ``/healthz``, ``/readyz`` and ``/metrics`` on ``metrics_port`` (``worker_agent.fencermetrics``):
    ready once it has read the record (or found none) and listed every kind it fences; its counters are kept
    here (``sweeps``, ``suspended``, ``pods_deleted``, ``failures`` by reason) and read at scrape.
    """
    async with Kube.from_settings(settings.kube_settings(), clock=clock, user_agent="mkd-fencer") as kube:
        fencer = Fencer(kube, cluster=settings.cluster_name, namespace=settings.namespace, origin=settings.origin,
                        clock=clock, poll_seconds=settings.poll_seconds, sweep_seconds=settings.sweep_seconds,
                        concurrency=settings.concurrency, kinds=(*KINDS, *settings.declared_kinds()))
        async with Supervisor() as sup:
            kube.side = sup.side  # failed Events degrade, counted and on /readyz
            sup.start("fencer", fencer.run, restart=True)
            if settings.metrics_port is not None:  # /metrics, /healthz, /readyz (worker_agent/fencermetrics.py)
                server = FencerServer(fencer, settings.metrics_host, settings.metrics_port, sup.side)
                kube.on_call = server.metrics.api_call
                sup.start("metrics", server.run, side=True)
            await sup.run_until_stopped(stop)
