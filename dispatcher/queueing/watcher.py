"""Reads the queueing objects from the manager cluster with informers and writes their status back.

One task per object type: the five Kueue kinds (``kueue.x-k8s.io``, the preferred served version
of ``v1beta2`` / ``v1beta1``), ``scheduling.k8s.io/v1`` PriorityClasses and Namespaces (their
labels, for ``namespaceSelector``). A type that is not served (no Kueue CRDs installed) is
checked again every ``recheck_seconds``. Every change goes into the :class:`Catalog` and wakes
the engine for a placement round. The catalog is ``ready`` once every type has been listed (or
found missing): until then the scheduler admits nothing, so a restarting dispatcher never takes
a moment without ClusterQueues for open mode. ``write_status`` keeps every ClusterQueue's and
LocalQueue's ``status`` as Kueue writes it (pending / reserving / admitted counts, flavor
reservation and usage, the ``Active`` condition), patching only what changed. Writing status is side
work: a write that fails (a 403 for a missing ``patch`` on ``clusterqueues/status``, an API outage) is
reported to the service's :class:`~federation.tasks.SideWork` as ``queues/status`` (logged once per cause,
counted, shown on ``/readyz`` with the fix) and tried again, less often while it keeps failing; placement
goes on meanwhile.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from dispatcher.queueing.api import GROUP, VERSIONS
from dispatcher.queueing.catalog import Catalog
from dispatcher.queueing.scheduler import Queues
from dispatcher.queueing.views import cluster_queue_status, local_queue_status
from federation.clock import Clock
from federation.errors import FederationError, NotFound, Temporary
from federation.kube import NAMESPACES, Kube, Resource
from federation.retry import Backoff
from federation.tasks import SideWork

log = logging.getLogger("dispatcher.queueing")

KUEUE_KINDS = (("resourceflavors", "ResourceFlavor", False), ("clusterqueues", "ClusterQueue", False),
               ("localqueues", "LocalQueue", True), ("cohorts", "Cohort", False),
               ("workloadpriorityclasses", "WorkloadPriorityClass", False))
PRIORITY_CLASSES = Resource("scheduling.k8s.io", "v1", "priorityclasses", "PriorityClass", namespaced=False)


def kueue_resource(plural: str, kind: str, namespaced: bool, version: str = VERSIONS[0]) -> Resource:
    return Resource(GROUP, version, plural, kind, namespaced=namespaced)


class QueueWatcher:
    """See the module docstring. ``wake`` is called after every change (puts a Tick in the engine)."""

    def __init__(self, kube: Kube, catalog: Catalog, clock: Clock, wake: Callable[[], None], *,
                 recheck_seconds: float, side: SideWork | None = None) -> None:
        self.kube = kube
        self.side = side or SideWork(clock)
        self.catalog = catalog
        self.clock = clock
        self.wake = wake
        self.recheck_seconds = recheck_seconds
        self.types: list[tuple[str, list[Resource]]] = [
            (kind, [kueue_resource(plural, kind, ns, v) for v in VERSIONS]) for plural, kind, ns in KUEUE_KINDS]
        self.types += [("PriorityClass", [PRIORITY_CLASSES]), ("Namespace", [NAMESPACES])]
        self._pending = {kind for kind, _ in self.types}
        self.served: dict[str, Resource] = {}
        self._written: dict[tuple[str, str, str], dict[str, Any]] = {}
        catalog.ready = False

    def _listed(self, kind: str) -> None:
        self._pending.discard(kind)
        if not self._pending and not self.catalog.ready:
            self.catalog.ready = True
            log.info("queueing objects listed: %d ClusterQueues, %d LocalQueues, %d ResourceFlavors%s",
                     len(self.catalog.cluster_queues), len(self.catalog.local_queues), len(self.catalog.flavors),
                     " (open mode: no ClusterQueue, Jobs need no quota)" if self.catalog.open else "")
            self.wake()

    def problem(self) -> str | None:
        """Readiness: None once every type is listed (or found not served); else which are not, and why when a
        try failed (a refused list names the missing rule): until then the scheduler admits nothing. The
        supervisor tries each type's task again with backoff."""
        if self.catalog.ready:
            return None
        said = []
        for kind in sorted(self._pending):
            faults = self.side.of(f"queues/{kind}")
            said.append(f"{kind} ({faults[-1].message}" + (f"; fix: {faults[-1].fix})" if faults[-1].fix else ")")
                        if faults else kind)
        return "queueing objects not listed yet, no Workload is admitted until they are: " + ", ".join(said)

    async def _served(self, candidates: list[Resource]) -> Resource | None:
        for res in candidates:
            try:
                if await self.kube.served(res):
                    return res
            except Temporary as exc:
                log.warning("discovery of %s failed: %s", res.plural, exc)
        return None

    async def watch(self, kind: str) -> None:
        candidates = dict(self.types)[kind]
        res = await self._served(candidates)
        first = True
        while res is None:
            if first:
                log.info("%s is not served by the manager cluster; checking every %gs", kind, self.recheck_seconds)
                self._listed(kind)
                first = False
            await self.clock.sleep(self.recheck_seconds)
            res = await self._served(candidates)
        self.served[kind] = res
        listing = await self.kube.list(res)
        for obj in listing.items:
            self.catalog.apply(kind, obj)
        self._listed(kind)
        self.wake()
        async for event in self.kube.informer(res):
            self.catalog.apply(kind, event.object, deleted=event.type == "DELETED")
            self.wake()

    def kinds(self) -> list[str]:
        return [kind for kind, _ in self.types]

    async def write_status(self, queues: Queues, every: float) -> None:
        """Every ``every`` seconds: each ClusterQueue's and LocalQueue's status, written when it changed; while
        writes fail, less often (capped backoff up to a minute), each failure reported as ``queues/status``."""
        backoff = Backoff(every, max(every, 60.0))
        delay = every
        while True:
            await self.clock.sleep(delay)
            delay = every
            if not self.catalog.ready:
                continue
            now = self.clock.now()
            wrote, failed = False, False
            targets: list[tuple[str, str, str, dict[str, Any]]] = []
            for name in list(self.catalog.cluster_queues):
                targets.append(("ClusterQueue", "", name, cluster_queue_status(queues, name, now)))
            for ns, name in list(self.catalog.local_queues):
                targets.append(("LocalQueue", ns, name, local_queue_status(queues, ns, name, now)))
            for kind, ns, name, status in targets:
                res = self.served.get(kind)
                key = (kind, ns, name)
                old = self._written.get(key)
                if res is None or (old is not None and _same(old, status)):
                    continue
                if old is not None:  # a condition keeps its transition time while its status holds
                    for c, o in zip(status["conditions"], old["conditions"], strict=False):
                        if c["status"] == o["status"]:
                            c["lastTransitionTime"] = o["lastTransitionTime"]
                try:
                    await self.kube.patch(res, name, {"status": status}, ns or None, subresource="status")
                except NotFound:
                    continue
                except FederationError as exc:
                    self.side.failed("queues/status", exc)
                    failed = True
                    continue
                self._written[key] = status
                wrote = True
            if failed:
                delay = backoff.failed()
            elif wrote:
                backoff.succeeded()
                self.side.ok("queues/status")
            for key in [k for k in self._written if (k[0] == "ClusterQueue" and k[2] not in self.catalog.cluster_queues)
                        or (k[0] == "LocalQueue" and (k[1], k[2]) not in self.catalog.local_queues)]:
                del self._written[key]


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    def strip(s: dict[str, Any]) -> dict[str, Any]:
        return {**s, "conditions": [{k: v for k, v in c.items() if k != "lastTransitionTime"} for c in s["conditions"]]}
    return strip(a) == strip(b)

