"""The handover book: what a platform team needs to move Jobs between controllers, observed by intake.

Policies and namespace labels come from informers (``policies`` / ``namespaces`` tasks); ``flush`` writes the
records and counts to SQL every ``flush_seconds``. The admission webhook asks ``decide``.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from dispatcher import workload as wl
from dispatcher.db.models import events, handover_counts, handover_jobs
from dispatcher.handover import policy as hp
from dispatcher.placement import ClusterView, choose
from dispatcher.queueing.api import Selector, parse_selector
from federation import labels
from federation.clock import Clock
from federation.errors import FederationError, Invalid, NotFound, Temporary
from federation.kinds.base import JobKind
from federation.kube import NAMESPACES, Kube, Resource, resource_for

log = logging.getLogger(__name__)

POLICIES = Resource(hp.GROUP, hp.VERSION, hp.PLURAL, hp.KIND, namespaced=False)
WEBHOOK_CONFIGURATIONS = Resource("admissionregistration.k8s.io", "v1", "mutatingwebhookconfigurations",
                                  "MutatingWebhookConfiguration", namespaced=False)
WEBHOOK_NAME = "handover.mkd.dev"
"""The name of mkd's webhook inside its MutatingWebhookConfiguration (deploy/components/handover-webhook)."""
OPT_IN_LABEL = "handover.mkd.dev/enabled"
"""The namespace label the shipped webhook configuration selects (value ``true``)."""
EVENT_TYPE = "handover"
"""The ``events.type`` of what the book records about policies (``RoutesNothing``, ``Routing``)."""
ROUTES_NOTHING = "RoutesNothing"
ROUTING = "Routing"


def controller_of(kind: JobKind, job: Mapping[str, Any]) -> str:
    """Who runs ``job``: its managedBy, or the kind's own controller (marked default) when unset."""
    value = kind.managed_by(job)
    return value if value else f"{kind.controller} (default)"


_Seen = tuple[str, str, str]
"""(namespace, kind, controller) of a Job: a few distinct values, each held once (:meth:`HandoverBook._group`)."""


class HandoverBook:
    """What a platform team needs to move Jobs between controllers. One per dispatcher; ``observe`` is called
    from intake's tasks.

    Intake shows the book every Job event of every supported kind (``observe``; cheap, in memory). The book
    keeps:

    - **counts**: Jobs per controller (their managedBy, or ``<kind's controller> (default)`` when unset),
      namespace and kind: ``mkctl handover status`` and the ``mkd_manager_jobs`` gauge;
    - **shadow records**: for each Job of another controller that a HandoverPolicy selects, what mkd would
      have done with it: accepted or refused by mkd's own validation (and why), its queue, the cluster it
      would have been placed on now (or why none), without writing anything to the Job. ``mkctl handover
      report`` answers "is it safe to route this namespace?" from them;
    - **warnings**: a Job in a policy's scope whose managedBy no known controller claims
      (``example.com/other``) gets one Warning Event from mkd, once (remembered in the database);
    - **reach**: a Route policy the webhook can never act on (no MutatingWebhookConfiguration carries
      mkd's webhook, or none of the namespaces the policy selects matches the webhook's namespaceSelector,
      the opt-in label ``handover.mkd.dev/enabled=true``) gets a Warning Event ``RoutesNothing`` saying which,
      and an ``events`` row that ``mkctl handover status`` shows, once per change.
    """

    def __init__(self, kube: Kube, sessions: async_sessionmaker[AsyncSession], clock: Clock, *,
                 kinds: Iterable[JobKind], views: Callable[[], list[ClusterView]], heartbeat_timeout: float,
                 extra_controllers: Iterable[str] = (), flush_seconds: float = 5.0) -> None:
        self.kube = kube
        self.sessions = sessions
        self.clock = clock
        self.kinds = {k.name: k for k in kinds}
        self.views = views
        self.heartbeat_timeout = heartbeat_timeout
        self.flush_seconds = flush_seconds
        self.known_controllers = {k.controller for k in self.kinds.values()} | {labels.MULTIKUEUE} | set(
            extra_controllers)
        self.policies: dict[str, hp.Policy] = {}
        self.policy_objects: dict[str, dict[str, Any]] = {}
        self.policy_errors: dict[str, str] = {}
        self.unreached: dict[str, str] = {}
        """Route policy -> why the webhook can never route its Jobs, as last said (absent: it can)."""
        self.namespace_labels: dict[str, dict[str, str]] = {}
        self.jobs: dict[str, _Seen] = {}
        """uid -> its group; the manager's every Job (100,000 of them), so the groups are shared."""
        self._groups: dict[_Seen, _Seen] = {}
        self._groups_limit = 1000
        self._todo: dict[str, tuple[JobKind, dict[str, Any]]] = {}
        self._gone: set[str] = set()
        self._recorded: set[str] = set()
        self._warned: set[str] = set()
        self.policies_served = False
        self._rescan = False
        self.classify: Callable[[JobKind, Mapping[str, Any]], tuple[str, str | None] | None] | None = None
        """Kueue mode (dispatcher/admissioncheck): who dispatches a Job whose managedBy is MultiKueue's (mkd's
        check or MultiKueue's, by its ClusterQueue) and, for MultiKueue's, the ``ClusterQueue/<name>`` whose
        Jobs get shadow records; None: by managedBy alone."""

    # --- what intake sees ------------------------------------------------------------------------

    def observe(self, kind: JobKind, obj: Mapping[str, Any], deleted: bool) -> None:
        uid = wl.uid_of(obj)
        if not uid:
            return
        if deleted:
            self.jobs.pop(uid, None)
            self._todo.pop(uid, None)
            if uid in self._recorded:
                self._gone.add(uid)
            return
        md = wl.meta(obj)
        managed_by = kind.managed_by(obj)  # (read once: intake shows the book every event of every Job)
        controller = managed_by if managed_by else f"{kind.controller} (default)"  # as controller_of says
        classified = self.classify(kind, obj) if self.classify is not None else None
        if classified is not None:
            controller = classified[0]
        self.jobs[sys.intern(uid)] = self._group((str(md.get("namespace") or ""), kind.name, controller))
        shadowed = classified is not None and classified[1] is not None
        if (shadowed or (managed_by != labels.MULTIKUEUE and self.policies and kind.name in self.kinds)) \
                and uid not in self._recorded:  # (a kind without managedBy is handed over by its queue label)
            self._todo[uid] = (kind, dict(obj))

    def recount(self) -> None:
        """What decides each Job's controller changed (a ClusterQueue's checks): every Job is looked at again
        at the next flush."""
        self._rescan = True

    def counts(self) -> Counter[tuple[str, str, str]]:
        """(namespace, kind, controller) → Jobs on the manager now."""
        return Counter(self.jobs.values())

    def _group(self, seen: _Seen) -> _Seen:
        group = self._groups.get(seen)
        if group is None:
            if len(self._groups) >= self._groups_limit:  # namespaces come and go: forget groups no Job is in
                self._groups = {g: g for g in self.jobs.values()}
                self._groups_limit = max(1000, 2 * len(self._groups))
            group = self._groups[seen] = seen
        return group

    # --- the webhook's question ------------------------------------------------------------------

    def decide(self, kind: str, namespace: str, name: str, job_labels: Mapping[str, str]) -> hp.Decision:
        return hp.decide(self.policies.values(), kind=kind, namespace=namespace, name=name,
                         namespace_labels=self.namespace_labels.get(namespace, {}), job_labels=job_labels)

    def _selecting(self, kind: str, namespace: str, job_labels: Mapping[str, str]) -> hp.Policy | None:
        ns_labels = self.namespace_labels.get(namespace, {})
        chosen = sorted((p for p in self.policies.values() if p.selects(kind, ns_labels, job_labels)),
                        key=lambda p: p.name)
        return chosen[0] if chosen else None

    # --- informers -------------------------------------------------------------------------------

    async def watch_policies(self) -> None:
        """HandoverPolicies, while their CRD is served (re-checked every ``flush_seconds`` until it is)."""
        while not await self._served(POLICIES):
            await self.clock.sleep(max(self.flush_seconds, 5.0))
        self.policies_served = True
        async for event in self.kube.informer(POLICIES):
            name = str(wl.meta(event.object).get("name") or "")
            if event.type == "DELETED":
                self.policies.pop(name, None)
                self.policy_objects.pop(name, None)
                self.policy_errors.pop(name, None)
                log.info("HandoverPolicy %s deleted", name)
                continue
            try:
                parsed = hp.parse(event.object, self.kinds)
            except Invalid as exc:
                self.policies.pop(name, None)
                if self.policy_errors.get(name) != str(exc):
                    self.policy_errors[name] = str(exc)
                    log.warning("HandoverPolicy %s is ignored: %s", name, exc)
                    await self._event(event.object, "Warning", "InvalidPolicy", f"ignored: {exc}")
                continue
            self.policy_errors.pop(name, None)
            self.policy_objects[name] = dict(event.object)
            if self.policies.get(name) != parsed:
                self.policies[name] = parsed
                log.info("HandoverPolicy %s: %s%s", name, parsed.mode,
                         f" {parsed.percent}%" if parsed.mode == "Route" else "")
                self._recheck_scope()

    async def watch_namespaces(self) -> None:
        async for event in self.kube.informer(NAMESPACES):
            name = str(wl.meta(event.object).get("name") or "")
            if event.type == "DELETED":
                self.namespace_labels.pop(name, None)
            else:
                got = wl.meta(event.object).get("labels") or {}
                self.namespace_labels[name] = {str(k): str(v) for k, v in got.items()}

    def _recheck_scope(self) -> None:
        """A new or wider policy: Jobs seen before it may be in scope now; the next flush lists them."""
        self._rescan = True

    async def _served(self, res: Resource) -> bool:
        try:
            return await self.kube.served(res)
        except Temporary:
            return False

    async def _event(self, involved: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
        try:
            await self.kube.event(involved, type="Warning" if type_ == "Warning" else "Normal", reason=reason,
                                  message=message, component="mkd-dispatcher")
        except FederationError as exc:
            log.warning("could not write the %s Event: %s", reason, exc)

    # --- shadow records and counts ---------------------------------------------------------------

    async def run(self) -> None:
        """Evaluate what intake queued and write records and counts, every ``flush_seconds``."""
        async with self.sessions() as s:
            self._warned = set((await s.execute(
                sa.select(handover_jobs.c.uid).where(handover_jobs.c.warned))).scalars())
            self._recorded = set((await s.execute(sa.select(handover_jobs.c.uid))).scalars())
        while True:
            await self.flush()
            await self.clock.sleep(self.flush_seconds)

    async def flush(self) -> None:
        now = self.clock.now()
        if self._rescan:
            self._rescan = False
            await self._list_all()
        todo, self._todo = self._todo, {}
        rows = []
        for kind, obj in todo.values():
            row = await self._shadow(kind, obj, now)
            if row is not None:
                rows.append(row)
        gone, self._gone = self._gone, set()
        said = await self._check_reach(now)
        async with self.sessions() as s, s.begin():
            if said:
                await s.execute(sa.insert(events), said)
            known = set((await s.execute(sa.select(handover_jobs.c.uid).where(
                handover_jobs.c.uid.in_([r["uid"] for r in rows])))).scalars()) if rows else set()
            fresh = [r for r in rows if r["uid"] not in known]
            if fresh:
                await s.execute(sa.insert(handover_jobs), fresh)
            for row in rows:  # seen before a restart forgot it was recorded: refreshed, first_seen kept
                if row["uid"] in known:
                    await s.execute(sa.update(handover_jobs).where(handover_jobs.c.uid == row["uid"]).values(
                        {k: v for k, v in row.items() if k not in ("uid", "first_seen")}))
            if gone:
                await s.execute(sa.update(handover_jobs).where(handover_jobs.c.uid.in_(gone))
                                .values(gone=True, last_seen=now))
            await s.execute(sa.delete(handover_counts))
            counts = self.counts()
            if counts:
                await s.execute(sa.insert(handover_counts), [
                    {"namespace": ns, "kind": kind, "controller": ctl, "jobs": n, "updated_at": now}
                    for (ns, kind, ctl), n in sorted(counts.items())])
        self._recorded.update(r["uid"] for r in rows)

    # --- can the webhook route what a Route policy selects? --------------------------------------------

    async def _webhook_selectors(self) -> list[Selector] | None:
        """The namespaceSelector of every webhook named ``handover.mkd.dev`` on the manager (an absent one
        selects every namespace); None when they could not be read (nothing is said then)."""
        try:
            listing = await self.kube.list(WEBHOOK_CONFIGURATIONS)
        except FederationError as exc:
            log.warning("handover: could not list MutatingWebhookConfigurations (%s); whether Route policies "
                        "reach the webhook is not checked until they can be read", exc)
            return None
        found: list[Selector] = []
        for config in listing.items:
            for hook in config.get("webhooks") or []:
                if hook.get("name") != WEBHOOK_NAME:
                    continue
                try:
                    found.append(parse_selector(hook.get("namespaceSelector"), "namespaceSelector") or Selector())
                except Invalid as exc:  # the API server refuses such a selector; say so and skip it
                    log.warning("handover: webhook %s in %s: %s", WEBHOOK_NAME, wl.meta(config).get("name"), exc)
        return found

    def why_unreached(self, policy: hp.Policy, hooks: list[Selector]) -> str | None:
        """Why the webhook can never route a Job ``policy`` selects, with the fix; None when it can."""
        if not hooks:
            return (f"no MutatingWebhookConfiguration on the manager has the {WEBHOOK_NAME} webhook, so the API "
                    "server never asks mkd about new Jobs; apply deploy/components/handover-webhook (the "
                    "production-manager overlay includes it)")
        selected = sorted(ns for ns, ns_labels in self.namespace_labels.items() if policy.namespaces.matches(ns_labels))
        if not selected:
            return None  # no namespace yet: nothing to route, nothing misconfigured
        if any(hook.matches(self.namespace_labels[ns]) for ns in selected for hook in hooks):
            return None
        shown = ", ".join(selected[:5]) + (f" and {len(selected) - 5} more" if len(selected) > 5 else "")
        return (f"the webhook is called only for namespaces its namespaceSelector matches, and none of those "
                f"this policy selects does ({shown}); opt them in: kubectl label namespace {selected[0]} "
                f"{OPT_IN_LABEL}=true")

    async def _check_reach(self, now: datetime) -> list[dict[str, Any]]:
        """Say (Event on the policy, ``events`` rows returned) when a Route policy starts or stops being
        unreachable for the webhook; once per change."""
        routes = {name: p for name, p in self.policies.items() if p.mode == "Route" and p.percent > 0}
        for name in set(self.unreached) - set(routes):
            del self.unreached[name]
        if not routes:
            return []
        hooks = await self._webhook_selectors()
        if hooks is None:
            return []
        rows = []
        for name, p in sorted(routes.items()):
            why = self.why_unreached(p, hooks)
            before = self.unreached.get(name)
            if why == before:
                continue
            involved = self.policy_objects.get(name, {"apiVersion": f"{hp.GROUP}/{hp.VERSION}", "kind": hp.KIND,
                                                      "metadata": {"name": name}})
            if why is not None:
                self.unreached[name] = why
                message = f"HandoverPolicy {name} routes nothing: {why}"
                log.warning("%s", message)
                await self._event(involved, "Warning", ROUTES_NOTHING, f"routes nothing: {why}")
                rows.append({"workload_uid": None, "at": now, "type": EVENT_TYPE, "cluster": None,
                             "reason": ROUTES_NOTHING, "message": message})
            else:
                del self.unreached[name]
                message = f"HandoverPolicy {name}: the webhook is called for the namespaces it selects again"
                log.info("%s", message)
                await self._event(involved, "Normal", ROUTING, message)
                rows.append({"workload_uid": None, "at": now, "type": EVENT_TYPE, "cluster": None,
                             "reason": ROUTING, "message": message})
        return rows

    async def _list_all(self) -> None:
        for kind in self.kinds.values():
            res = resource_for(kind)  # type: ignore[arg-type]
            try:
                if not await self.kube.served(res):
                    continue
                listing = await self.kube.list(res)
            except FederationError as exc:
                log.warning("handover: could not list %s: %s", kind.name, exc)
                self._rescan = True
                continue
            for obj in listing.items:
                self.observe(kind, obj, False)

    async def _shadow(self, kind: JobKind, obj: Mapping[str, Any], now: datetime) -> dict[str, Any] | None:
        md = wl.meta(obj)
        namespace, name = str(md.get("namespace") or ""), str(md.get("name") or "")
        job_labels = {str(k): str(v) for k, v in (md.get("labels") or {}).items()}
        classified = self.classify(kind, obj) if self.classify is not None else None
        chosen: hp.Policy | _QueueShadow | None
        if classified is not None and classified[1] is not None:  # a ClusterQueue MultiKueue's check serves
            chosen = _QueueShadow(classified[1])
        else:
            chosen = self._selecting(kind.name, namespace, job_labels)
        if chosen is None:
            log.debug("handover: %s %s/%s is in no policy's scope (namespace labels %s)", kind.name, namespace,
                      name, self.namespace_labels.get(namespace))
            return None
        controller = classified[0] if classified is not None else controller_of(kind, obj)
        warned = wl.uid_of(obj) in self._warned
        value = kind.managed_by(obj)
        if value and value not in self.known_controllers and not warned:
            await self._event(obj, "Warning", "UnknownController",
                              f"managedBy {value!r} is not a controller mkd knows of "
                              f"({', '.join(sorted(self.known_controllers))}); unless a controller for "
                              f"{value!r} runs in this cluster, nothing will run this Job "
                              f"(HandoverPolicy {chosen.name} selects it; mkd says this once)")
            self._warned.add(wl.uid_of(obj))
            warned = True
        described = await self._describe(kind, obj)
        problems = list(described.problems)
        cluster, reason = None, ""
        if problems:
            reason = wl.problem_text(problems)
        elif described.need is not None:
            decision = choose(described.need, self.views(), now=now, timeout=self.heartbeat_timeout)
            cluster, reason = decision.cluster, decision.reason
        return {"uid": wl.uid_of(obj), "namespace": namespace, "name": name, "kind": kind.name,
                "controller": controller, "policy": chosen.name, "mode": chosen.mode,
                "would_accept": not problems, "reason": reason[:4000], "queue": described.columns["queue"],
                "cluster": cluster, "warned": warned, "first_seen": now, "last_seen": now, "gone": False}

    async def _describe(self, kind: JobKind, obj: Mapping[str, Any]) -> wl.Described:
        ref = kind.runtime_ref(obj)
        runtime, problem = None, None
        if ref is not None:
            group, _, version = ref.api_version.rpartition("/")
            res = Resource(group, version, ref.plural, ref.kind, namespaced=ref.namespace is not None)
            try:
                runtime = await self.kube.get(res, ref.name, ref.namespace)
            except NotFound:
                problem = Invalid("spec.runtimeRef.name", f"{ref.kind} {ref.name!r} does not exist",
                                  fix=f"create the {ref.kind} on the manager cluster or name an existing one")
            except FederationError as exc:
                problem = Invalid("spec.runtimeRef", f"could not be read: {exc}", fix="retry later")
        # the shadow judges the Job as it would be handed over: with mkd's managedBy
        handed = _with_managed_by(kind, obj)
        return await asyncio.to_thread(wl.describe, kind, handed, runtime, problem)


class _QueueShadow:
    """Kueue mode: the shadow of a ClusterQueue served by MultiKueue's check (what mkd would do with its Jobs)."""

    mode = "Shadow"

    def __init__(self, name: str) -> None:
        self.name = name


def _with_managed_by(kind: JobKind, obj: Mapping[str, Any]) -> dict[str, Any]:
    handed = copy.deepcopy(dict(obj))
    node: dict[str, Any] = handed
    for part in kind.managed_by_path[:-1]:
        node = node.setdefault(part, {})
    node[kind.managed_by_path[-1]] = labels.MULTIKUEUE
    return handed
