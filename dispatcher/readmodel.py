"""The one read model of every admin surface: mkctl (database and ``--server``), the HTTP API, the dashboard.

Each function takes a database session (it never commits) and, where the truth lives on the manager
cluster, its client (``kube``; None when the caller has none, and the answer then says what it could not
read): a Workload's conditions are the manager Job's own, ClusterQueues and LocalQueues are the manager's
Kueue objects, a Job mkd did not claim is explained from the manager. Every answer is plain JSON-able
dicts, the same for every surface: the API returns them as they are, mkctl prints them (reading the
database itself or the API), the dashboard renders them. Nothing here reads a running engine's memory.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from dispatcher.db import admin as dbadmin
from dispatcher.db.models import events as events_table
from dispatcher.db.models import workloads as workloads_table
from dispatcher.db.queries import listing as queries
from federation.errors import FederationError, Invalid, NotFound

STALE_INTERVALS = 3.0
"""A cluster whose last heartbeat is older than this many heartbeat intervals is stale."""
HOLDING = ("placed", "running")
ESTIMATE_ABOVE = 100_000
"""An unfiltered Workload list's total above this many rows is PostgreSQL's estimate, and says so."""
STEPS = {
    "LocalQueueDoesNotExist": "queue", "ClusterQueueDoesNotExist": "queue", "NamespaceNotAdmitted": "queue",
    "FlavorNotFound": "queue", "Stopped": "queue", "QuotaNotReserved": "quota", "NoFittingCluster": "placement",
}


PLACEMENT_KEYS = ("attempt", "cluster", "epoch", "state", "reason", "spec_version", "created_at", "accepted_at",
                  "finished_at")
LOCAL_QUEUE_KEYS = ("namespace", "name", "cluster_queue", "workloads", "pending", "admitted", "requests_admitted",
                    "defined")


class UnknownRef(LookupError):
    """A Workload reference (``--for``, ``workload=``) that names no Workload."""


def _utc(when: datetime | None) -> datetime | None:
    if when is not None and when.tzinfo is None:
        return when.replace(tzinfo=UTC)
    return when


def _row(row: Any) -> dict[str, Any]:
    out = dict(row._mapping) if hasattr(row, "_mapping") else dict(row)
    return {k: _utc(v) if isinstance(v, datetime) else v for k, v in out.items()}


# --- clusters -----------------------------------------------------------------------------------


def cluster_health(row: Mapping[str, Any], now: datetime) -> str:
    """online, stale (no heartbeat for three intervals) or offline, from the last heartbeat."""
    last = _utc(row.get("last_heartbeat"))
    if not row.get("online") or last is None:
        return "offline"
    interval = float(row.get("interval_seconds") or 10.0)
    return "stale" if (now - last).total_seconds() > STALE_INTERVALS * interval else "online"


def _used(allocatable: Mapping[str, str], free: Mapping[str, str]) -> dict[str, str]:
    from federation.podset import format_quantity, parse_quantity

    out = {}
    for name, total in allocatable.items():
        try:
            used = parse_quantity(total, name) - parse_quantity(free.get(name, "0"), name)
        except (ValueError, Invalid, ArithmeticError):
            continue
        out[name] = format_quantity(max(used, Decimal(0)), name)
    return out


def cluster_item(row: Mapping[str, Any], running: int, now: datetime) -> dict[str, Any]:
    """One cluster as every surface shows it."""
    capacity = row.get("capacity") or {}
    allocatable = dict(capacity.get("allocatable") or {})
    free = dict(capacity.get("free") or {})
    last = _utc(row.get("last_heartbeat"))
    kinds = row.get("kinds")
    kind_names: list[str] = []
    if isinstance(kinds, Mapping):
        kind_names = sorted(kinds.get("reconciled", [])) + sorted(
            f"{k}->{v}" for k, v in (kinds.get("delegated") or {}).items())
    elif isinstance(kinds, list):
        kind_names = [str(k) for k in kinds]
    return {"name": row["name"], "health": cluster_health(row, now), "cordoned": bool(row.get("cordoned")),
            "online": bool(row.get("online")), "last_heartbeat": last,
            "heartbeat_age_seconds": None if last is None else round(max(0.0, (now - last).total_seconds()), 1),
            "lost_since": _utc(row.get("lost_since")), "agent_version": row.get("agent_version") or "",
            "labels": dict(row.get("labels") or {}), "kinds": kind_names, "allocatable": allocatable,
            "free": free, "used": _used(allocatable, free), "running": running, "refused": None}


async def clusters(session: AsyncSession, now: datetime | None = None) -> list[dict[str, Any]]:
    """Every registered cluster, then senders refused for having no registered key (never clusters)."""
    now = now or datetime.now(UTC)
    rows = await queries.list_cluster_summaries(session)  # no node lists: megabytes of JSON at 1,000 clusters
    running = await dbadmin.holding_per_cluster(session)
    out = [cluster_item(_row(r), running.get(r["name"], 0), now) for r in rows]
    known = {c["name"] for c in out}
    for r in await queries.list_refusals(session):
        if r.name not in known:
            last = _utc(r.last_at)
            out.append({"name": r.name, "health": "refused", "cordoned": False, "online": False,
                        "last_heartbeat": last, "heartbeat_age_seconds": None if last is None else
                        round(max(0.0, (now - last).total_seconds()), 1), "lost_since": None, "agent_version": "",
                        "labels": {}, "kinds": [], "allocatable": {}, "free": {}, "used": {}, "running": 0,
                        "refused": f"{r.reason}, {r.count} messages"})
    return out


async def refused_senders(session: AsyncSession) -> list[dict[str, Any]]:
    """Senders refused for having no registered key (``mkctl clusters refused``), newest first."""
    return [{k: r.get(k) for k in ("name", "reason", "message", "count", "first_at", "last_at")}
            for r in (_row(x) for x in await queries.list_refusals(session))]


async def handover_status(session: AsyncSession, namespace: str | None = None) -> dict[str, Any]:
    """Jobs on the manager per namespace, kind and controller, as the dispatcher last counted them
    (``items``), and the Route policies that route nothing, with why and the fix (``warnings``)."""
    from dispatcher.handover.queries import counts, unreached

    def utc(r: Mapping[str, Any]) -> dict[str, Any]:
        return {k: _utc(v) if isinstance(v, datetime) else v for k, v in r.items()}

    return {"items": [utc(r) for r in await counts(session, namespace)],
            "warnings": [utc(w) for w in await unreached(session)]}


async def handover_report(session: AsyncSession, namespace: str | None = None) -> list[dict[str, Any]]:
    """What mkd would do with the Jobs of other controllers a HandoverPolicy selects (the shadow report)."""
    from dispatcher.handover.queries import report

    return list(await report(session, namespace))


# --- workloads ----------------------------------------------------------------------------------


def workload_item(row: Any) -> dict[str, Any]:
    """One Workload with its current placement: the row shape of every list and of ``show``."""
    r = _row(row)
    return {k: r.get(k) for k in (
        "uid", "namespace", "name", "kind", "queue", "priority", "state", "reason", "cluster", "attempt",
        "placement_state", "epoch", "suspended", "pinned", "labels", "requests", "created_at", "updated_at",
        "accepted_at", "finished_at")} | {"labels": dict(r.get("labels") or {}),
                                          "requests": dict(r.get("requests") or {}),
                                          "suspended": bool(r.get("suspended")), "reason": r.get("reason") or ""}


async def workloads(session: AsyncSession, f: dbadmin.WorkloadFilter = dbadmin.WorkloadFilter(), *,
                    limit: int = 5000, offset: int = 0) -> list[dict[str, Any]]:
    return [workload_item(r) for r in await dbadmin.list_workloads(session, f, limit=limit, offset=offset)]


async def workload_total(session: AsyncSession, f: dbadmin.WorkloadFilter = dbadmin.WorkloadFilter(), *,
                         estimate_above: int = ESTIMATE_ABOVE) -> dict[str, Any]:
    """How many Workloads match ``f``: ``total``, and ``total_estimated`` True when it is PostgreSQL's estimate
    of the table's rows rather than a count (an unfiltered list of more than ``estimate_above`` Workloads:
    counting a million rows takes longer than the page itself). Filtered totals are always counted."""
    if not any((f.namespace, f.name, f.kind, f.queue, f.cluster, f.state, f.labels)):
        estimate = await dbadmin.estimated_workloads(session)
        if estimate is not None and estimate > estimate_above:
            return {"total": estimate, "total_estimated": True}
    return {"total": await dbadmin.count_workloads(session, f), "total_estimated": False}


def event_item(row: Any) -> dict[str, Any]:
    r = _row(row)
    return {k: r.get(k) for k in ("id", "at", "type", "cluster", "reason", "message", "workload_uid", "namespace",
                                  "name", "kind")} | {"reason": r.get("reason") or "", "message": r.get("message") or ""}


async def events(session: AsyncSession, *, ref: str | None = None, cluster: str | None = None,
                 type_: str | None = None, after_id: int = 0, limit: int = 500) -> list[dict[str, Any]]:
    """History rows across every Workload and Cluster, oldest first; ``ref`` narrows to one Workload."""
    uid = None
    if ref:
        uid = await dbadmin.find_workload_uid(session, ref)
        if uid is None:
            raise UnknownRef(ref)
    rows = await dbadmin.list_events(session, workload_uid=uid, cluster=cluster, type_=type_, after_id=after_id,
                                     limit=limit)
    return [event_item(r) for r in rows]


async def job_conditions(kube: Any, w: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    """The manager Job's own ``status.conditions`` (mkd's MultiCluster* and the worker's mirrored ones);
    None when there is no manager client to ask, [] when the Job is gone."""
    if kube is None:
        return None
    from federation.kinds.registry import by_name
    from federation.kube import resource_for

    try:
        job = await kube.get(resource_for(by_name(str(w["kind"]))),  # type: ignore[arg-type]
                             str(w["name"]), str(w["namespace"]))
    except NotFound:
        return []
    except (FederationError, LookupError, ValueError):
        return None
    meta = job.get("metadata") or {}
    if w.get("uid") and meta.get("uid") not in (None, w["uid"]):
        return []  # a newer Job of the same name: not this Workload's
    return [dict(c) for c in (job.get("status") or {}).get("conditions") or [] if isinstance(c, Mapping)]


async def workload(session: AsyncSession, ref: str, kube: Any = None, now: datetime | None = None
                   ) -> dict[str, Any] | None:
    """One Workload: the list's row, its spec summary, every placement attempt, its history, the manager
    Job's conditions (``conditions`` None: no manager client to read them) and why it is where it is. A Pod of
    a pod group names its group's Workload (queued under the group's first pod's name; needs ``kube``)."""
    uid = await dbadmin.find_workload_uid(session, ref)
    if uid is None and (group := await _group_ref(kube, ref)):
        uid = await dbadmin.find_workload_uid(session, group)
    if uid is None:
        return None
    found = await queries.show_workload(session, uid)
    if found is None:
        return None
    w = _row(found.workload)
    rows = await dbadmin.list_workloads(session, dbadmin.WorkloadFilter(namespace=w["namespace"], name=w["name"]),
                                        limit=50)
    item = next((workload_item(r) for r in rows if r.uid == uid), workload_item(w))
    placements = [{k: row.get(k) for k in PLACEMENT_KEYS} for row in (_row(p) for p in found.placements)]
    history = [event_item({**_row(e), "namespace": w["namespace"], "name": w["name"], "kind": w["kind"]})
               for e in found.events]
    return {**item, "api_version": w.get("api_version") or "", "generation": w.get("generation") or 0,
            "spec_version": w.get("spec_version") or 1, "cluster_queue": w.get("cluster_queue"),
            "excluded": list(w.get("excluded") or []), "podsets": list(w.get("podsets") or []),
            "conditions": await job_conditions(kube, w), "placements": placements, "events": history,
            "why": await _why(session, w, placements, kube, now or datetime.now(UTC))}


async def unclaimed(kube: Any, namespace: str, name: str) -> str | None:
    """Who manages a Job of the manager cluster that mkd did not claim; None: no such Job (or no client)."""
    if kube is None:
        return None
    from dispatcher.intake.unclaimed import explain

    return await explain(kube, namespace, name)


# --- queues -------------------------------------------------------------------------------------


async def _kueue_objects(kube: Any) -> dict[str, list[dict[str, Any]]] | None:
    """ClusterQueues and LocalQueues from the manager (the preferred served version); None: not readable."""
    if kube is None:
        return None
    from dispatcher.queueing.api import VERSIONS
    from dispatcher.queueing.watcher import kueue_resource

    out: dict[str, list[dict[str, Any]]] = {}
    for plural, kind, namespaced in (("clusterqueues", "ClusterQueue", False), ("localqueues", "LocalQueue", True)):
        out[kind] = []
        for version in VERSIONS:
            res = kueue_resource(plural, kind, namespaced, version)
            try:
                if not await kube.served(res):
                    continue
                out[kind] = list((await kube.list(res)).items)
            except FederationError:
                return None
            break
    return out


def _quota_of(cq: Any) -> dict[str, str]:
    from federation.podset import format_quantity

    out = {}
    for group in cq.resource_groups:
        for fq in group.flavors:
            for res, quota in sorted(fq.resources.items()):
                out[f"{fq.name}/{res}"] = format_quantity(quota.nominal, res)
    return out


async def queues(session: AsyncSession, kube: Any = None) -> dict[str, Any]:
    """ClusterQueues and LocalQueues with their Workloads. ``source`` says where the list of queues came
    from: ``manager`` (every ClusterQueue and LocalQueue defined there, none with Workloads left out) or
    ``records`` (no manager client: only the queues Workloads were recorded in). ``configured`` False:
    no ClusterQueue exists, Workloads are admitted in arrival order without quota (open mode)."""
    from dispatcher.queueing.catalog import Catalog
    from dispatcher.queueing.state import usage_from_json
    from federation.podset import format_quantity, parse_quantity

    w = workloads_table
    per_cq: dict[str, dict[str, Any]] = {}
    per_lq: dict[tuple[str, str], dict[str, Any]] = {}
    usage: dict[str, dict[tuple[str, str], Decimal]] = {}
    admitted_requests: dict[tuple[str, str], dict[str, Decimal]] = {}
    # counts by GROUP BY (a big federation's every row is never loaded); only admitted rows are read whole
    counted = await session.execute(
        sa.select(w.c.namespace, w.c.queue, w.c.cluster_queue, w.c.state, w.c.suspended, sa.func.count())
        .group_by(w.c.namespace, w.c.queue, w.c.cluster_queue, w.c.state, w.c.suspended))
    for namespace, queue, cluster_queue, state, suspended, n in counted:
        lq = per_lq.setdefault((namespace, queue), {
            "namespace": namespace, "name": queue, "cluster_queue": cluster_queue, "workloads": {},
            "pending": 0, "admitted": 0, "defined": None})
        if cluster_queue and not lq["cluster_queue"]:
            lq["cluster_queue"] = cluster_queue
        lq["workloads"][state] = lq["workloads"].get(state, 0) + n
        waiting = n if state == "pending" and not suspended else 0
        lq["pending"] += waiting
        lq["admitted"] += n if state in HOLDING else 0
        if cluster_queue is not None:
            cq = per_cq.setdefault(cluster_queue, {"name": cluster_queue, "pending": 0, "admitted": 0})
            cq["pending"] += waiting
            cq["admitted"] += n if state in HOLDING else 0
    admitted = await session.execute(sa.select(w.c.namespace, w.c.queue, w.c.cluster_queue, w.c.usage, w.c.requests)
                                     .where(w.c.state.in_(HOLDING)))
    for r in admitted:
        total = admitted_requests.setdefault((r.namespace, r.queue), {})
        for name, amount in (r.requests or {}).items():
            try:
                total[name] = total.get(name, Decimal(0)) + parse_quantity(amount, name)
            except (ValueError, Invalid, ArithmeticError):
                continue
        if r.cluster_queue is not None:
            held = usage.setdefault(r.cluster_queue, {})
            for fr, amount in usage_from_json(r.usage).items():
                held[fr] = held.get(fr, Decimal(0)) + amount
    for key, lq in per_lq.items():
        lq["requests_admitted"] = {k: format_quantity(v, k) for k, v in sorted(admitted_requests.get(key, {}).items())}
    objects = await _kueue_objects(kube)
    source = "records" if objects is None else "manager"
    cohorts: dict[str, str | None] = {}
    quotas: dict[str, dict[str, str]] = {}
    if objects is not None:
        catalog = Catalog()
        for kind in ("ClusterQueue", "LocalQueue"):
            for obj in objects[kind]:
                catalog.apply(kind, obj)
        for name, defined in catalog.cluster_queues.items():
            per_cq.setdefault(name, {"name": name, "pending": 0, "admitted": 0})
            cohorts[name] = defined.cohort
            quotas[name] = _quota_of(defined)
        for (kind, name), problem in catalog.problems.items():
            if kind == "ClusterQueue":  # defined, but Kueue's rules refuse it: shown with why
                per_cq.setdefault(name, {"name": name, "pending": 0, "admitted": 0})["problem"] = problem
                quotas.setdefault(name, {})
        for (ns, name), lq_obj in catalog.local_queues.items():
            entry = per_lq.setdefault((ns, name), {
                "namespace": ns, "name": name, "cluster_queue": lq_obj.cluster_queue, "workloads": {},
                "pending": 0, "admitted": 0, "requests_admitted": {}})
            entry["cluster_queue"] = lq_obj.cluster_queue
        for key, entry in per_lq.items():
            entry["defined"] = key in catalog.local_queues
    cluster_queues = []
    for name in sorted(per_cq):
        q = per_cq[name]
        held = usage.get(name, {})
        cluster_queues.append({"name": name, "cohort": cohorts.get(name), "quota": quotas.get(name, {}),
                               "usage": {f"{f}/{res}": format_quantity(v, res) for (f, res), v in sorted(held.items())
                                         if v},
                               "pending": q["pending"], "admitted": q["admitted"],
                               "defined": None if objects is None else name in quotas, "problem": q.get("problem")})
    configured = bool(quotas) if objects is not None else any(r["cluster_queue"] for r in per_lq.values())
    local_queues = [{k: per_lq[key].get(k) for k in LOCAL_QUEUE_KEYS} for key in sorted(per_lq)]
    return {"source": source, "configured": configured, "cluster_queues": cluster_queues, "local_queues": local_queues}


async def pending(session: AsyncSession, *, cluster_queue: str | None = None, namespace: str | None = None,
                  queue: str | None = None) -> list[dict[str, Any]]:
    """Pending Workloads in admission order with ``position_in_cluster_queue`` and ``position_in_local_queue``
    (1-based); filters: a ClusterQueue, a namespace, a LocalQueue name (the Job's queue label)."""
    from dispatcher.queueing.views import pending_from_db

    # the times come in UTC already (UtcDateTime): every row is returned as read
    return await pending_from_db(session, cluster_queue=cluster_queue, namespace=namespace, local_queue=queue)


# --- why ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Fit:
    cluster: str
    verdict: str   # "fits", "wait" (room may come), "never" (no node can ever hold a pod)
    text: str
    largest: Decimal = Decimal(0)  # for "never": the most this cluster could ever give (the headline names the best)


def _views(rows: Sequence[Mapping[str, Any]]) -> list[tuple[Mapping[str, Any], Any]]:
    from dispatcher.placement import ClusterView, NodeView, _parse

    out = []
    for r in rows:
        cap = r.get("capacity") or {}
        nodes = [NodeView(str(n.get("name") or ""), dict(n.get("labels") or {}),
                          tuple((str(t.get("key") or ""), str(t.get("value") or ""), str(t.get("effect") or "NoSchedule"))
                                for t in n.get("taints") or []), _parse(n.get("free") or {}, "nodes.free"))
                 for n in cap.get("nodes") or []]
        kinds = r.get("kinds")
        kind_set: frozenset[str] | None = None
        if isinstance(kinds, Mapping):
            kind_set = frozenset(kinds.get("reconciled") or []) | frozenset((kinds.get("delegated") or {}).keys())
        out.append((r, ClusterView(name=str(r["name"]), online=bool(r.get("online")),
                                   last_heartbeat=_utc(r.get("last_heartbeat")),
                                   allocatable=_parse(cap.get("allocatable") or {}, "allocatable"),
                                   free=_parse(cap.get("free") or {}, "free"),
                                   largest_node_free=_parse(cap.get("largest_node_free") or {}, "largest_node_free"),
                                   kinds=kind_set or None, labels=dict(r.get("labels") or {}), nodes=nodes)))
    return out


def _fit_one(need: Any, row: Mapping[str, Any], view: Any) -> _Fit:
    """Per-pod fit on the cluster's nodes first (each pod against the node allocatable, then free), then
    the cluster's totals."""
    from dispatcher.placement import OPTIONAL, fit_nodes, node_allows, q
    from dispatcher.placement import _parse as parse_res
    from federation.podset import format_quantity, shortfall

    cap = row.get("capacity") or {}
    node_alloc = {str(n.get("name") or ""): parse_res(n.get("allocatable") or {}, "nodes.allocatable")
                  for n in cap.get("nodes") or []}
    if view.nodes and need.podsets:
        for ps in need.podsets:
            allowed = [n for n in view.nodes if node_allows(ps, n)]
            if not allowed:
                return _Fit(view.name, "never", f"no node matches the {ps.name} pods' node selector, affinity and "
                                                 "tolerations")
            for res, amount in sorted(ps.requests.items()):
                if amount <= 0 or res in OPTIONAL:
                    continue
                known = [node_alloc[n.name].get(res, Decimal(0)) for n in allowed if node_alloc.get(n.name)]
                biggest = max(known, default=None)
                bound = biggest if biggest is not None else view.allocatable.get(res, Decimal(0))
                if amount > bound:
                    what = "largest node" if biggest is not None else "the whole cluster"
                    return _Fit(view.name, "never", f"no node has {q(amount, res)} for a {ps.name} pod ({what}: "
                                                     f"{format_quantity(bound, res)})", bound)
        misfit = fit_nodes(need, view.nodes)
        if misfit is not None:
            return _Fit(view.name, "wait", misfit)
    else:
        for podset, requests in need.pods:
            for res, amount in sorted(requests.items()):
                if amount <= 0 or res in OPTIONAL:
                    continue
                if amount > view.allocatable.get(res, Decimal(0)):
                    have = view.allocatable.get(res, Decimal(0))
                    return _Fit(view.name, "never", f"no node has {q(amount, res)} for a {podset} pod (the whole "
                                                     f"cluster: {format_quantity(have, res)})", have)
                largest = view.largest_node_free.get(res)
                if largest is not None and amount > largest:
                    return _Fit(view.name, "wait", f"no node with {q(amount, res)} free for a {podset} pod "
                                                    f"(largest free: {format_quantity(largest, res)})")
    relevant = {k: v for k, v in need.total.items() if v > 0 and not (k in OPTIONAL and k not in view.allocatable)}
    short = shortfall(relevant, view.free)
    if short:
        never = [k for k, v in relevant.items() if v > view.allocatable.get(k, Decimal(0))]
        lack = ", ".join(q(v, k) for k, v in sorted(short.items()))
        if never:
            return _Fit(view.name, "never", "needs " + ", ".join(q(relevant[k], k) for k in sorted(never))
                        + " in all; the cluster has " + ", ".join(
                            q(view.allocatable.get(k, Decimal(0)), k) for k in sorted(never)))
        return _Fit(view.name, "wait", f"lacks {lack} free")
    return _Fit(view.name, "fits", "has room now")


def explain_room(w: Mapping[str, Any], cluster_rows: Sequence[Mapping[str, Any]], now: datetime,
                 timeout: float | None = None) -> tuple[str, list[str]] | None:
    """Why no cluster takes a pending Workload, recomputed from the clusters' last heartbeats: the verdict
    ("can never run here: ..." or "waiting for room: ...") and one line per cluster with its figures and the
    heartbeat's age. None when the Workload has no PodSets recorded."""
    from dispatcher.workload import need_of

    try:
        need = need_of(str(w["kind"]), list(w.get("podsets") or []))
    except (Invalid, KeyError, ValueError, TypeError):
        return None
    if not need.pods:
        return None
    excluded = set(w.get("excluded") or [])
    fits: list[_Fit] = []
    lines: list[str] = []
    for row, view in _views(cluster_rows):
        last = view.last_heartbeat
        age = "never heard" if last is None else f"heartbeat {int(max(0.0, (now - last).total_seconds()))}s ago"
        if not view.online:
            lines.append(f"{view.name} ({age}): offline")
            continue
        if view.name in excluded:
            lines.append(f"{view.name} ({age}): rejected it before")
            continue
        if view.kinds is not None and need.kind not in view.kinds:
            lines.append(f"{view.name} ({age}): does not run {need.kind}")
            continue
        fit = _fit_one(need, row, view)
        fits.append(fit)
        lines.append(f"{view.name} ({age}): {fit.text}")
    if not fits:
        if not lines:
            return "waiting for room: no worker cluster has sent a heartbeat yet", lines
        return "waiting for room: no online cluster can take it now", lines
    if all(f.verdict == "never" for f in fits):
        best = max(fits, key=lambda f: (f.largest, f.cluster))
        others = [f.cluster for f in fits if f is not best]
        return f"can never run here: {best.text} on {best.cluster}" + (
            f" (nor on {', '.join(others)})" if others else ""), lines
    waiting = [f for f in fits if f.verdict == "wait"]
    if waiting:
        return "waiting for room: " + "; ".join(f"on {f.cluster}, {f.text}" for f in waiting), lines
    return "waiting for the next placement round: " + ", ".join(f.cluster for f in fits if f.verdict == "fits") \
        + " has room now", lines


async def _why(session: AsyncSession, w: Mapping[str, Any], placements: Sequence[Mapping[str, Any]], kube: Any,
               now: datetime) -> dict[str, Any]:
    from dispatcher.queueing.views import pending_from_db

    out: dict[str, Any] = {"workload": f"{w['namespace']}/{w['name']}", "uid": w["uid"], "state": w["state"],
                           "cluster_queue": w.get("cluster_queue"), "queue": w.get("queue"),
                           "priority": w.get("priority") or 0, "priority_source": w.get("priority_source") or "",
                           "step": None, "answer": "", "details": [],
                           "position_in_cluster_queue": None, "position_in_local_queue": None}
    state = str(w["state"])
    reason = str(w.get("reason") or "")
    if state == "pending" and w.get("suspended"):
        out.update(step="suspended", answer="suspended on the manager cluster; queued once resumed")
    elif state == "pending":
        last = (await session.execute(
            sa.select(events_table.c.reason, events_table.c.message)
            .where(events_table.c.workload_uid == w["uid"], events_table.c.type == "pending")
            .order_by(events_table.c.id.desc()).limit(1))).first()
        word = last.reason if last is not None else ""
        step = STEPS.get(word, "queued")
        out.update(step=step, reason=word,
                   answer=reason or (last.message if last is not None else "")
                   or "waiting for its turn: nothing has held it yet")
        if step == "placement":
            explained = explain_room(w, [_row(r) for r in await queries.list_clusters(session)], now)
            if explained is not None:
                recorded = out["answer"]
                out["answer"], out["details"] = explained[0], list(explained[1])
                if not explained[0].startswith("can never") and recorded and recorded != explained[0]:
                    # what the dispatcher decided last (a starvation hold, its release) still holds
                    out["details"].insert(0, f"the dispatcher's last decision: {recorded}")
        if step != "queue":  # a Workload held at the queue step has no place in any ClusterQueue
            mine = await pending_from_db(session, uid=str(w["uid"]))
            if mine:
                out.update(position_in_cluster_queue=mine[0]["position_in_cluster_queue"],
                           position_in_local_queue=mine[0]["position_in_local_queue"])
        if w.get("pinned"):
            out["answer"] += f" (pinned to {w['pinned']})"
    elif state in HOLDING:
        current = next((p for p in placements if p["attempt"] == w.get("attempt")), None)
        where = w.get("cluster") or (current or {}).get("cluster")
        answer = f"{state} on {where}"
        if current is not None:
            answer += f" (attempt {current['attempt']})" + (f": {current['reason']}" if current.get("reason") else "")
        if w.get("cluster_queue"):
            answer += f"; quota held in ClusterQueue {w['cluster_queue']}"
        out.update(step="admitted", answer=answer)
    else:
        out.update(step=state, answer=reason or state)
    return _why_shape(out)


WHY_KEYS = ("workload", "uid", "state", "step", "answer", "reason", "details", "cluster_queue", "queue", "priority",
            "priority_source", "position_in_cluster_queue", "position_in_local_queue")


def _why_shape(answer: Mapping[str, Any]) -> dict[str, Any]:
    """Every ``why`` answer with the same keys in the same order (the API's ``Why``)."""
    return {k: answer.get(k, [] if k == "details" else None) for k in WHY_KEYS}


async def why(session: AsyncSession, ref: str, kube: Any = None, now: datetime | None = None
              ) -> dict[str, Any] | None:
    """Why one Workload (``namespace/name``, ``name`` in default, or uid) is where it is; None: no Workload."""
    found = await workload(session, ref, None, now)
    if found is None and (group := await _group_ref(kube, ref)):
        found = await workload(session, group, None, now)
    return None if found is None else dict(found["why"])


async def _group_ref(kube: Any, ref: str) -> str | None:
    """``namespace/name`` of the Workload of the pod group Pod ``ref`` belongs to; None: not such a Pod."""
    if kube is None or "/" not in ref:
        return None
    from dispatcher.intake.unclaimed import group_lead

    namespace, _, name = ref.partition("/")
    lead = await group_lead(kube, namespace, name)
    return f"{namespace}/{lead}" if lead else None


def not_managed(job_ref: str, explanation: str) -> dict[str, Any]:
    """The ``why`` answer for a Job of the manager cluster that mkd does not manage."""
    return _why_shape({"workload": job_ref, "state": "not managed", "step": "not managed", "answer": explanation,
                       "details": [], "priority": 0, "priority_source": ""})


__all__: Sequence[str] = (
    "UnknownRef",
    "cluster_health",
    "cluster_item",
    "clusters",
    "event_item",
    "events",
    "explain_room",
    "handover_report",
    "handover_status",
    "job_conditions",
    "not_managed",
    "pending",
    "queues",
    "refused_senders",
    "unclaimed",
    "why",
    "workload",
    "workload_item",
    "workload_total",
    "workloads",
)
