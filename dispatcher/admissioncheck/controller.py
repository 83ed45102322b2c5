"""mkd as Kueue's AdmissionCheck controller (``mkd.dev/dispatcher``): the dispatcher's Kueue mode.

Kueue keeps doing quota, priority, preemption and fair sharing; mkd does what MultiKueue does once a
Workload's quota is reserved. This part watches AdmissionChecks, ClusterQueues, LocalQueues, ResourceFlavors
and Workloads on the manager and stands between intake and the engine (:meth:`KueueChecks.view`, intake's
``lens``): a Job whose managedBy is MultiKueue's reaches the engine only when its ClusterQueue lists a check
of mkd's and none of MultiKueue's, and it reaches it *suspended* until Kueue has reserved quota for its
Workload with mkd's check Pending or Ready (released). Its generation, as the engine sees it, moves only
when that changes, so the engine claims, places on a cluster where the flavors Kueue assigned fit
(``QueueingState.assigned``), takes the worker copy off when Kueue evicts, as it does for any Job suspended on
the manager. mkd's own queueing is off in this mode (no ClusterQueue quota of mkd's: Kueue's). The check's state follows the Workload row (:meth:`KueueChecks.sync_checks`, every ``sync_seconds``):
``Ready`` once the agent accepted the Job, ``Retry`` with the reason when its cluster was lost or it was
refused after running (at once) or when no cluster fits for ``no_fit_retry_seconds`` (Kueue then releases
the quota and requeues it), ``Rejected`` when mkd can never run it (invalid, or out of attempts). mkd writes
only its check's entry of ``status.admissionChecks`` (a merge patch holding the resourceVersion it read,
so a concurrent write of Kueue's is never overwritten) and the ``Active`` condition of its AdmissionChecks.
A Workload Kueue admitted before mkd ever claimed its Job was placed by another controller (MultiKueue,
before the ClusterQueue moved): mkd leaves it with that controller until it ends. A ClusterQueue listing
checks of both controllers is refused: a Warning Event on each Job names the other controller, and mkd sets
no state, so neither dispatches (MultiKueue waits for every other check to be Ready first).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from dispatcher import workload as wl
from dispatcher.admissioncheck import kueueview as kv
from dispatcher.db.models import workloads as workloads_table
from dispatcher.engine.loop import Engine, JobChange
from federation import labels
from federation.clock import Clock
from federation.errors import Conflict, FederationError, NotFound
from federation.kinds.base import JobKind
from federation.kube import Kube, Resource

log = logging.getLogger(__name__)

EPOCH = datetime(2020, 1, 1, tzinfo=UTC)
CONFLICT_REASON = "ConflictingAdmissionChecks"
LEFT_REASON = "LeftWithOtherController"
Who = str
"""``mkd``, ``multikueue`` (its ClusterQueue's check is MultiKueue's, or MultiKueue placed it before the
ClusterQueue moved), ``both`` (refused) or ``none`` (no dispatching check: not mkd's)."""


class KueueChecks:
    """See the module docstring. One per dispatcher in Kueue mode."""

    def __init__(self, kube: Kube, engine: Engine, sessions: async_sessionmaker[AsyncSession], clock: Clock, *,
                 kinds: Mapping[str, JobKind], sync_seconds: float, no_fit_retry_seconds: float,
                 changed: Callable[[], None] | None = None) -> None:
        self.kube = kube
        self.engine = engine
        self.sessions = sessions
        self.clock = clock
        self.kinds = kinds
        self.sync_seconds = sync_seconds
        self.no_fit_retry_seconds = no_fit_retry_seconds
        self.changed = changed
        """Called when what a ClusterQueue's checks say may have changed (the handover book recounts)."""
        self.controllers: dict[str, str] = {}
        self.checks: dict[str, dict[str, Any]] = {}
        self.cqs: dict[str, dict[str, Any]] = {}
        self.lqs: dict[tuple[str, str], str] = {}
        self.flavors: dict[str, dict[str, Any]] = {}
        self.workloads: dict[str, dict[str, Any]] = {}
        """Job uid → its Workload object (the controller owner's uid)."""
        self.views: dict[str, kv.WorkloadView] = {}
        self.jobs: dict[str, tuple[JobKind, dict[str, Any]]] = {}
        """Jobs whose managedBy is MultiKueue's, as intake last saw them (mkd's or maybe mkd's later)."""
        self.emitted: dict[str, tuple[int, bool]] = {}
        """Job uid → (generation, suspended) last handed to the engine."""
        self.told: set[tuple[str, str]] = set()
        self.listed: set[str] = set()

    # --- intake's lens ------------------------------------------------------------------------------

    def cluster_queue_of(self, uid: str, obj: Mapping[str, Any] | None) -> str | None:
        view = self.views.get(uid)
        if view is not None and view.cluster_queue:
            return view.cluster_queue
        namespace = str(wl.meta(obj or {}).get("namespace") or (view.namespace if view else ""))
        queue = view.queue_name if view is not None and view.queue_name else str(
            (wl.meta(obj or {}).get("labels") or {}).get(labels.QUEUE_NAME) or "")
        return self.lqs.get((namespace, queue)) if queue else None

    def who(self, uid: str, obj: Mapping[str, Any] | None) -> tuple[Who, str | None]:
        """Who dispatches this Job, and its ClusterQueue."""
        cq = self.cluster_queue_of(uid, obj)
        serving = kv.serving(self.cqs.get(cq) if cq else None, self.controllers)
        view = self.views.get(uid)
        if view is not None and view.checks:  # Kueue's list for this Workload, newer than a queue just changed
            serving = kv.serving_checks(view.checks, self.controllers)
        if (serving in ("mkd", "both") and uid not in self.engine.known and view is not None
                and (view.admitted or view.finished)):
            return "multikueue", cq  # admitted before mkd saw it: placed by the controller the queue had then
        return serving, cq

    def view(self, kind: JobKind, obj: Mapping[str, Any], deleted: bool) -> Mapping[str, Any] | None:
        """The Job as the engine is to see it, or None when it is not mkd's (see the module docstring)."""
        uid = wl.uid_of(obj)
        if deleted:
            self.jobs.pop(uid, None)
            self.emitted.pop(uid, None)
            return obj
        known = uid in self.engine.known
        if kind.managed_by(obj) != labels.MULTIKUEUE and not known:
            self.jobs.pop(uid, None)
            return None
        self.jobs[uid] = (kind, dict(obj))
        who, cq = self.who(uid, obj)
        if not known and (who != "mkd" or not self._synced(uid)):
            if who == "both" and cq:
                self._tell_both(kind, obj, cq)
            return None
        virtual, gen, suspended = self._virtual(kind, uid, obj)
        self.emitted[uid] = (gen, suspended)
        return virtual

    def _synced(self, uid: str) -> bool:
        """Kueue has made this Job's Workload and copied its ClusterQueue's checks onto it: only then is it
        claimed, so a Job created just after its queue's checks changed is judged by the checks Kueue gave it."""
        view = self.views.get(uid)
        return view is not None and bool(view.checks)

    def _virtual(self, kind: JobKind, uid: str, obj: Mapping[str, Any]) -> tuple[dict[str, Any], int, bool]:
        view = self.views.get(uid)
        cq = self.cluster_queue_of(uid, obj)
        mine = kv.my_checks(self.cqs.get(cq) if cq else None, self.controllers)
        if view is not None and not mine:  # the queue moved away: the checks it carries still say
            mine = [n for n in view.checks if self.controllers.get(n) == kv.CONTROLLER]
        released = view is not None and kv.released(view, mine)
        gen = _generation(view, released)
        before = self.emitted.get(uid)
        if before is not None:  # kept while nothing changes; grows at each change, within one second too
            gen = before[0] if before[1] == (not released) else max(gen, before[0] + 1)
        virtual = kind.with_suspended(obj, not released)
        virtual["metadata"] = {**wl.meta(virtual), "generation": gen}
        if released and view is not None:
            self.engine.queueing.assigned[uid] = kv.pod_scheduling(view, self.flavors)
        else:
            self.engine.queueing.assigned.pop(uid, None)
        return virtual, gen, not released

    def _reconsider(self, uid: str) -> None:
        """Hand the engine this Job again when what it is to see of it changed."""
        held = self.jobs.get(uid)
        if held is None:
            return
        kind, obj = held
        known = uid in self.engine.known
        who, cq = self.who(uid, obj)
        if not known and (who != "mkd" or not self._synced(uid)):
            if who == "both" and cq:
                self._tell_both(kind, obj, cq)
            return
        virtual, gen, suspended = self._virtual(kind, uid, obj)
        if self.emitted.get(uid) == (gen, suspended):
            return
        self.emitted[uid] = (gen, suspended)
        self.engine.inbox.put_nowait(JobChange(kind, virtual))

    def _tell_both(self, kind: JobKind, obj: Mapping[str, Any], cq: str) -> None:
        uid = wl.uid_of(obj)
        if (uid, cq) in self.told:
            return
        self.told.add((uid, cq))
        names = kv.check_names(self.cqs.get(cq) or {})
        mine = [n for n in names if self.controllers.get(n) == kv.CONTROLLER]
        theirs = [n for n in names if self.controllers.get(n) == kv.MULTIKUEUE]
        message = (f"ClusterQueue {cq} lists admission checks of both {kv.CONTROLLER} ({', '.join(mine)}) and "
                   f"{kv.MULTIKUEUE} ({', '.join(theirs)}); mkd refuses to dispatch this {kind.name} beside "
                   f"{kv.MULTIKUEUE} and sets no state on its check, so neither runs it: remove one of the "
                   "checks from the ClusterQueue")
        log.warning("%s/%s: %s", wl.meta(obj).get("namespace"), wl.meta(obj).get("name"), message)
        involved = {"apiVersion": kind.api_version, "kind": kind.name, "metadata": wl.meta(obj)}
        task = asyncio.get_running_loop().create_task(self.kube.event(
            involved, type="Warning", reason=CONFLICT_REASON, message=message, component="mkd-dispatcher"))
        task.add_done_callback(lambda t: None)

    def classify(self, kind: JobKind, obj: Mapping[str, Any]) -> tuple[str, str | None] | None:
        """For the handover book: (controller, shadow policy) of a Job whose managedBy is MultiKueue's;
        the shadow policy (``ClusterQueue/<name>``) when MultiKueue's check serves its ClusterQueue."""
        if kind.managed_by(obj) != labels.MULTIKUEUE:
            return None
        uid = wl.uid_of(obj)
        if uid in self.engine.known:
            return kv.CONTROLLER, None
        who, cq = self.who(uid, obj)
        if who == "mkd":
            return kv.CONTROLLER, None
        if who == "multikueue":
            served_by_mk = kv.serving(self.cqs.get(cq) if cq else None, self.controllers) == "multikueue"
            return kv.MULTIKUEUE, (f"ClusterQueue/{cq}" if served_by_mk else None)
        if who == "both":
            return f"{kv.MULTIKUEUE}+{kv.CONTROLLER} (refused)", None
        return f"{kv.MULTIKUEUE} (no dispatching check)", None

    # --- informers ----------------------------------------------------------------------------------

    async def watch(self, res: Resource) -> None:
        """One informer per Kueue type (a side task; a type not served is looked for again)."""
        while not await self.kube.served(res):
            await self.clock.sleep(10.0)
        async for event in self.kube.informer(res):
            self._apply(res, event.object, event.type == "DELETED")
        self.listed.add(res.plural)  # (never reached: informers do not end)

    def _apply(self, res: Resource, obj: Mapping[str, Any], deleted: bool) -> None:
        md = wl.meta(obj)
        name = str(md.get("name") or "")
        if res.plural == "workloads":
            view = kv.parse_workload(obj)
            if view.job_uid is None:
                return
            if deleted:
                if self.workloads.get(view.job_uid, {}).get("metadata", {}).get("uid") == view.uid:
                    self.workloads.pop(view.job_uid, None)
                    self.views.pop(view.job_uid, None)
            else:
                self.workloads[view.job_uid] = dict(obj)
                self.views[view.job_uid] = view
            self._reconsider(view.job_uid)
            return
        if res.plural == "admissionchecks":
            if deleted:
                self.controllers.pop(name, None)
                self.checks.pop(name, None)
            else:
                self.controllers[name] = str((obj.get("spec") or {}).get("controllerName") or "")
                self.checks[name] = dict(obj)
        elif res.plural == "clusterqueues":
            if deleted:
                self.cqs.pop(name, None)
            else:
                self.cqs[name] = dict(obj)
        elif res.plural == "localqueues":
            key = (str(md.get("namespace") or ""), name)
            if deleted:
                self.lqs.pop(key, None)
            else:
                self.lqs[key] = str((obj.get("spec") or {}).get("clusterQueue") or "")
        elif res.plural == "resourceflavors":
            if deleted:
                self.flavors.pop(name, None)
            else:
                self.flavors[name] = dict(obj)
        for uid in list(self.jobs):  # what a queue's checks say changed for every Job it holds
            self._reconsider(uid)
        if self.changed is not None:
            self.changed()

    # --- what mkd writes ----------------------------------------------------------------------------

    async def mark_active(self) -> None:
        """``Active=True`` on every AdmissionCheck whose controllerName is mkd's, as long as this runs."""
        while True:
            for name, obj in list(self.checks.items()):
                if self.controllers.get(name) != kv.CONTROLLER:
                    continue
                conds = kv.active_conditions(obj, self.clock.now())
                if conds is None:
                    continue
                patch = {"metadata": {"resourceVersion": wl.meta(obj).get("resourceVersion")},
                         "status": {"conditions": conds}}
                try:
                    self.checks[name] = await self.kube.patch(kv.ADMISSION_CHECKS, name, patch, subresource="status")
                except (Conflict, NotFound):
                    pass  # its informer brings the newer version; tried again then
            await self.clock.sleep(self.sync_seconds)

    async def sync_checks(self) -> None:
        """Every ``sync_seconds``: the state of mkd's check on each released Workload, from its row."""
        while True:
            await self.sync_once()
            await self.clock.sleep(self.sync_seconds)

    async def sync_once(self) -> int:
        """One pass of :meth:`sync_checks`; returns the checks written."""
        todo = {uid: v for uid, v in self.views.items() if uid in self.engine.known and v.quota_reserved}
        if not todo:
            return 0
        t = workloads_table
        async with self.sessions() as s:
            rows = {r.uid: r for r in await s.execute(
                sa.select(t.c.uid, t.c.state, t.c.cluster, t.c.reason, t.c.attempt).where(t.c.uid.in_(list(todo))))}
        written = 0
        now = self.clock.now()
        for uid, view in todo.items():
            row = rows.get(uid)
            cq = view.cluster_queue
            mine = kv.my_checks(self.cqs.get(cq) if cq else None, self.controllers) or [
                n for n in view.checks if self.controllers.get(n) == kv.CONTROLLER]
            check = view.check(mine)
            if row is None or check is None or not kv.released(view, mine):
                continue
            desired = self.desired(row, check, view, now)
            if desired is None:
                continue
            obj = self.workloads.get(uid)
            if obj is None:
                continue
            new = kv.with_check_state(obj, check.name, desired[0], desired[1], now)
            if new is None:
                continue
            patch = {"metadata": {"resourceVersion": view.resource_version}, "status": {"admissionChecks": new}}
            try:
                got = await self.kube.patch(kv.WORKLOADS, view.name, patch, view.namespace, subresource="status")
            except (Conflict, NotFound):
                continue  # Kueue wrote first: its informer brings that version, judged next pass
            except FederationError as exc:
                log.warning("could not set %s's check on Workload %s/%s: %s", kv.CONTROLLER, view.namespace,
                            view.name, exc)
                continue
            self._apply(kv.WORKLOADS, got, False)
            log.info("Workload %s/%s: check %s %s (%s)", view.namespace, view.name, check.name, desired[0],
                     desired[1])
            written += 1
        return written

    def desired(self, row: Any, check: kv.Check, view: kv.WorkloadView,
                now: datetime) -> tuple[kv.CheckState, str] | None:
        """The state and message mkd's check should have, from the Workload's row; None: leave it."""
        state, cluster, reason = str(row.state), row.cluster, str(row.reason or "")
        if state == "running" and cluster:
            return "Ready", f'placed on worker cluster "{cluster}" by mkd (attempt {row.attempt})'
        if state == "placed" and cluster:
            return "Pending", f'sent to worker cluster "{cluster}"; waiting for its agent to accept it'
        if state == "rejected" or (state == "failed" and reason.startswith("gave up")):
            return "Rejected", reason or "mkd cannot run this Job"
        if state == "pending":
            if check.state == "Ready":  # it ran and lost its cluster (or was refused): Kueue requeues it
                return "Retry", reason or "the worker cluster was lost"
            since = max(filter(None, (view.reserved_since, check.since)), default=None)
            waited = (now - since).total_seconds() if since else 0.0
            if reason and waited >= self.no_fit_retry_seconds:
                return "Retry", f"no worker cluster fits after {int(waited)}s: {reason}"
            return "Pending", reason or "waiting for a worker cluster"
        return None


def _generation(view: kv.WorkloadView | None, released: bool) -> int:
    """The Job's generation as the engine sees it in Kueue mode, from the Workload alone (what a restarted
    dispatcher computes): it grows each time Kueue reserves quota, evicts or releases it (the QuotaReserved and
    Evicted conditions' times, in seconds), an eviction above a reservation and a release above both within
    one second. :meth:`KueueChecks._virtual` also keeps it growing across changes of one second."""
    if view is None:
        return 1
    times = [t for t in (view.reserved_since, view.evicted_since) if t is not None]
    if not times:
        return 1
    seconds = max(1, int((max(times) - EPOCH).total_seconds()))
    return 4 * seconds + (2 if view.evicted else 0) + (1 if released else 0)
