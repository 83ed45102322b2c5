"""Intake: list and watch one JobKind across the manager cluster and feed the engine what matters.

One task per kind (and per namespace when ``namespaces`` is set). A kind whose CRD is not
served yet is re-checked every ``kind_recheck_seconds`` and picked up when it appears. The first
list after start-up fills the Job cache and turns Workloads whose Job vanished while the
dispatcher was away into deletions (that first list is the informer's: one list at start); once every
kind is listed, the listed Jobs' conditions are checked against their Workloads (dispatcher/engine/heal.py). The
informer's events are filtered here, without touching the database: a Job whose managedBy is not ``kueue.x-k8s.io/multikueue`` and
that mkd never claimed is ignored (never written to; one that names a Kueue queue but has no managedBy gets a
Warning Event saying so and how to fix it, ``dispatcher/intake/unclaimed.py``); for a claimed Job only a new generation,
a managedBy change, a deletion timestamp or the deletion itself are passed on — the MODIFIED
events caused by mkd's own status writes are not, and those echoes (the resourceVersion the kube
writer's write returned) do not even refresh the Job cache: the writer remembers what it wrote. When the
write's answer came first, as it nearly always does, the echo is told from the watch line without decoding
it (``KubeWriter.echo_line``).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import sys
from collections.abc import Callable, Mapping
from typing import Any

from dispatcher import workload as wl
from dispatcher.engine.loop import Engine, Heal, JobChange
from dispatcher.intake.podgroups import SELECTOR as POD_SELECTOR
from dispatcher.intake.podgroups import PodGroups, not_gated
from federation import labels
from federation.clock import Clock
from federation.errors import Temporary
from federation.kinds.base import JobKind
from federation.kinds.pod import POD
from federation.kube import Kube, resource_for

log = logging.getLogger(__name__)
TOLD_MAX = 100_000
"""Jobs remembered as told they name a queue but not mkd's managedBy (the oldest forgotten beyond)."""


def relevant(kind: JobKind, engine: Engine, obj: Mapping[str, Any], deleted: bool) -> bool:
    """Whether a watch event needs the engine; updates the Job cache for claimed Jobs."""
    uid = sys.intern(wl.uid_of(obj))  # one string per uid across the engine's maps
    claimed = uid in engine.known
    managed_by = kind.managed_by(obj)
    if not claimed and managed_by != labels.MULTIKUEUE and not (deleted and "spec" not in obj):
        return False  # (a deletion found by a relist carries a stub without spec: it may be mkd's, pass it)
    if deleted:
        # A Job deleted before its claim was decided: the ADDED event may still wait in the engine's
        # inbox (or be held through an outage). The deletion must follow it, or the claim would place
        # a Job that no longer exists.
        return True
    previous = engine.cache.head(uid)
    if previous is None or not claimed:
        if claimed:
            engine.cache[uid] = dict(obj)
        return True
    if (wl.generation_of(obj) != previous.generation or previous.managed_by != managed_by
            or wl.being_deleted(obj) != previous.deleting):
        engine.cache[uid] = dict(obj)
        engine.writer.superseded(uid)  # a change held for the write in flight is older than this one
        return True
    # mkd's own status write coming back needs no new copy in the cache: the kube writer tells it, and
    # remembers what it wrote (the cache's copy of a Job mkd writes is read for its spec and metadata only)
    if not engine.writer.defer(uid, dict(obj)):
        engine.cache[uid] = dict(obj)
    return False


class Intake:
    """Watches every (kind, namespace) pair; ``ready`` is set once each has done its first list."""

    def __init__(self, kube: Kube, engine: Engine, clock: Clock, *, kinds: tuple[JobKind, ...],
                 namespaces: list[str], recheck_seconds: float) -> None:
        self.kube = kube
        self.engine = engine
        self.clock = clock
        self.kinds = kinds
        self.namespaces: list[str | None] = list(namespaces) or [None]
        self.recheck_seconds = recheck_seconds
        # Narrowing --namespaces never orphans what mkd holds: the namespaces of Jobs it already claimed
        # are still watched, for those Jobs only, until they end (their Workloads stop being live).
        self.follow_only: set[str] = set()
        self._asked = list(namespaces)
        self.ready = asyncio.Event()
        self._pending: set[tuple[str, str | None]] = set()
        self.watching: set[str] = set()
        # Sees every event of every Job, mkd's or not (the handover book counts and shadows them); set
        # once here, not in follow_claimed, which runs again when the engine has rebuilt its view.
        self.observe: Callable[[JobKind, Mapping[str, Any], bool], None] | None = None
        # Kueue mode (dispatcher/admissioncheck): the Job as the engine is to see it, or None when not mkd's
        self.lens: Callable[[JobKind, Mapping[str, Any], bool], Mapping[str, Any] | None] | None = None
        self._told: collections.OrderedDict[str, None] = collections.OrderedDict()  # uids given the Warning
        self._telling: set[asyncio.Task[None]] = set()
        self.follow_claimed()

    def follow_claimed(self) -> None:
        """Add the namespaces of claimed Jobs outside ``--namespaces``; call again once the engine has
        rebuilt its view (a standby learns what is claimed only when it becomes the active one)."""
        if self._asked:
            outside = collections.Counter(ns for ns in self.engine.namespace_of.values()
                                          if ns not in self._asked and ns not in self.follow_only)
            if outside:
                self.follow_only |= set(outside)
                self.namespaces += sorted(outside)
                log.info("following %d Jobs mkd already claimed outside --namespaces until they end "
                         "(no new Job is claimed there): %s", sum(outside.values()),
                         ", ".join(f"{ns} ({n})" for ns, n in sorted(outside.items())))
        self._pending |= {(k.name, ns) for k in self.kinds for ns in self.namespaces}

    def _listed(self, kind: JobKind, namespace: str | None) -> None:
        self._pending.discard((kind.name, namespace))
        if not self._pending and not self.ready.is_set():
            self.ready.set()
            self.engine.inbox.put_nowait(Heal())  # the listed Jobs' conditions checked (dispatcher/engine/heal.py)

    async def watch(self, kind: JobKind, namespace: str | None) -> None:
        res = resource_for(kind)  # type: ignore[arg-type]
        first = True
        while not await self._served(res):
            if first:
                log.info("%s is not served by the manager cluster (CRD not installed); checking every %gs",
                         kind.name, self.recheck_seconds)
                self._listed(kind, namespace)  # nothing to wait for
                first = False
            await self.clock.sleep(self.recheck_seconds)
        present: list[str] | None = []

        def listed() -> None:  # the informer's first list is complete (and each relist after it)
            nonlocal present
            if present is None:
                return
            gone = self.engine.sync_kind(kind, present, namespace)
            present = None
            if gone:
                log.info("%d %s Jobs in %s were deleted while the dispatcher was away", gone, kind.name,
                         namespace or "all namespaces")
            self._listed(kind, namespace)
            self.watching.add(kind.name)
            log.info("watching %s in %s", kind.name, namespace or "all namespaces")

        # One list at start, the informer's (a page at a time: never every Job of the manager whole at once).
        # Compact: the engine's JobCache holds the claimed Jobs; the informer keeps
        # no second copy of each.
        # the echoes of mkd's own status writes are told undecoded (KubeWriter.echo_line): intake has nothing to do
        # with them, and the handover book has seen each such Job as it is (its status aside) already
        # Pods: only those naming a queue, each event turned into its group's (dispatcher/intake/podgroups.py)
        groups = PodGroups() if kind.name == POD.name else None
        async for event in self.kube.informer(res, namespace, compact=True, listed=listed,
                                              echoes=self.engine.writer.echo_line,
                                              label_selector=POD_SELECTOR if groups is not None else None):
            if groups is None:
                self._event(kind, namespace, event.object, event.type == "DELETED", present)
                continue
            if event.type != "DELETED":
                self._tell_unmanaged(kind, event.object)
            for obj, deleted in groups.feed(event.object, event.type == "DELETED"):
                self._event(kind, namespace, obj, deleted, present, told=True)

    def _event(self, kind: JobKind, namespace: str | None, obj: dict[str, Any], deleted: bool,
               present: list[str] | None, *, told: bool = False) -> None:
        """One Job's watch event: listed, shown to the handover book, told why it is not claimed, and handed to
        the engine when it matters (``relevant``)."""
        if present is not None and not deleted:
            present.append(wl.uid_of(obj))
            if not self.ready.is_set():  # the start's lists: what the Jobs show, for the heal pass
                self.engine.note_listed(obj)
        if self.observe is not None and kind.name != POD.name:  # (no HandoverPolicy routes Pods)
            self.observe(kind, obj, deleted)
        if self._followed_only(namespace, obj):
            return
        seen: Mapping[str, Any] = obj
        if self.lens is not None:  # Kueue mode: the Job as the engine is to see it, or not at all
            lensed = self.lens(kind, obj, deleted)
            if lensed is None:
                return
            seen = lensed
        elif not deleted and not told:
            self._tell_unmanaged(kind, obj)
        if relevant(kind, self.engine, seen, deleted):
            self.engine.inbox.put_nowait(JobChange(kind, seen, deleted=deleted))

    def _tell_unmanaged(self, kind: JobKind, obj: Mapping[str, Any]) -> None:
        """A Job that names a Kueue queue but no managedBy gets a Warning Event saying mkd leaves it alone and
        how to have it queued (once per Job: one Event named after it, whichever process writes it; remembered here
        too, so that a Job's every change costs no request; mkd writes nothing to the Job itself)."""
        from dispatcher.intake.unclaimed import NOT_MANAGED_REASON, queued_but_unmanaged

        uid = wl.uid_of(obj)
        if uid in self._told or uid in self.engine.known:
            return
        message = not_gated(obj) if kind.name == POD.name else queued_but_unmanaged(kind, obj)
        if message is None:
            return
        self._told[uid] = None
        if len(self._told) > TOLD_MAX:
            self._told.popitem(last=False)
        involved = {"apiVersion": f"{kind.group}/{kind.version}", "kind": kind.name, "metadata": wl.meta(obj)}
        task = asyncio.get_running_loop().create_task(self.kube.event(
            involved, type="Warning", reason=NOT_MANAGED_REASON, message=f"This {kind.name} {message}",
            component="mkd-dispatcher", once=True))
        self._telling.add(task)
        task.add_done_callback(self._telling.discard)

    def _followed_only(self, namespace: str | None, obj: Mapping[str, Any]) -> bool:
        """A Job in a namespace watched only to follow what mkd already holds, that mkd does not hold."""
        return namespace in self.follow_only and wl.uid_of(obj) not in self.engine.known

    async def _served(self, res: Any) -> bool:
        try:
            return await self.kube.served(res)
        except Temporary as exc:
            log.warning("discovery of %s failed: %s", res.plural, exc)
            return False
