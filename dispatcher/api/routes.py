"""The ``/api/v1`` endpoints: reads straight from the database, actions through the engine's inbox.

Reads run the query functions of :mod:`dispatcher.db.admin` in a fresh read-only session (the engine's
transactions are not disturbed); filters are checked the way mkctl checks them, so ``state=bogus`` is a
400 naming the states. Actions build an :class:`~dispatcher.adminactions.AdminAction`, queue it for
the engine and answer once the engine's transaction committed (or 504 after ``action_timeout``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Query, Request

from dispatcher.api import models as m
from dispatcher.api.auth import Access, Authenticator, AuthError, User, action_access, read_access
from dispatcher.db import admin as dbadmin
from dispatcher.db import queries
from federation.errors import Invalid

STALE_INTERVALS = 3.0


@dataclass
class ApiContext:
    """What the API needs from the dispatcher; ``engine`` None serves reads only."""

    sessions: Any
    auth: Authenticator
    engine: Any = None
    kube: Any = None
    action_timeout: float = 30.0
    ready_checks: dict[str, Any] = field(default_factory=dict)
    """name → callable returning None (ready) or a sentence saying what is missing."""


def ctx_of(request: Request) -> ApiContext:
    ctx: ApiContext = request.app.state.ctx
    return ctx


def token_of(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    if header.lower().startswith("bearer "):
        return header[7:].strip()
    return request.cookies.get("mkd_token") or None


async def authenticated(request: Request) -> User:
    try:
        return await ctx_of(request).auth.user(token_of(request))
    except AuthError as exc:
        raise HTTPException(exc.status, exc.message, headers={"WWW-Authenticate": "Bearer"}) from None


async def allow(request: Request, user: User, access: Access) -> None:
    try:
        await ctx_of(request).auth.require(user, access)
    except AuthError as exc:
        raise HTTPException(exc.status, exc.message) from None


def bad_request(exc: Invalid) -> HTTPException:
    return HTTPException(400, exc.message)


def health(row: Mapping[str, Any], now: datetime) -> str:
    last = row.get("last_heartbeat")
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


def cluster_item(row: Mapping[str, Any], running: int, now: datetime) -> m.ClusterItem:
    capacity = row.get("capacity") or {}
    allocatable = dict(capacity.get("allocatable") or {})
    free = dict(capacity.get("free") or {})
    return m.ClusterItem(name=row["name"], health=health(row, now), cordoned=bool(row.get("cordoned")),
                         online=bool(row.get("online")), last_heartbeat=row.get("last_heartbeat"),
                         lost_since=row.get("lost_since"), agent_version=row.get("agent_version") or "",
                         labels=dict(row.get("labels") or {}), kinds=row.get("kinds"), allocatable=allocatable,
                         free=free, used=_used(allocatable, free), running=running)


def why_of(workload: Mapping[str, Any], current: Mapping[str, Any] | None,
           queued: Mapping[str, Any] | None = None) -> m.Why:
    """The "why" answer: for a pending Workload the queueing package's (which step holds it, its
    positions), for a placed one why its cluster won, else its reason."""
    if queued is not None and workload["state"] == "pending":
        return m.Why(state="pending", answer=str(queued.get("message") or ""), step=queued.get("step"),
                     cluster_queue=queued.get("cluster_queue"),
                     position_in_cluster_queue=queued.get("position_in_cluster_queue"),
                     position_in_local_queue=queued.get("position_in_local_queue"))
    state = str(workload["state"])
    reason = str(workload.get("reason") or "")
    if state == "pending":
        if workload.get("suspended"):
            answer = reason or "suspended on the manager cluster; placed once resumed"
        else:
            answer = reason or "waiting for the next placement round"
        if workload.get("pinned"):
            answer += f" (pinned to {workload['pinned']})"
    elif state in ("placed", "running") and current is not None:
        answer = f"on {current['cluster']} (attempt {current['attempt']}): {current.get('reason') or 'placed'}"
    else:
        answer = reason or state
    return m.Why(state=state, answer=answer, cluster_queue=workload.get("cluster_queue"))


def _mkd_conditions(ctx: ApiContext, uid: str) -> list[dict[str, Any]]:
    """mkd's conditions as the engine last saw them on the manager Job (its Job cache)."""
    engine = ctx.engine
    obj = (getattr(engine, "cache", None) or {}).get(uid) if engine is not None else None
    if not obj:
        return []
    conditions = (obj.get("status") or {}).get("conditions") or []
    return [dict(c) for c in conditions if isinstance(c, Mapping)]


router = APIRouter(prefix="/api/v1")
UserDep = Annotated[User, Depends(authenticated)]


@router.get("/workloads", response_model=m.WorkloadPage, summary="Workloads with their current placement")
async def list_workloads(
    request: Request, user: UserDep,
    namespace: str | None = None, kind: str | None = None, queue: str | None = None, cluster: str | None = None,
    state: Annotated[str | None, Query(description="pending, placed, running, suspended, finished, failed, "
                                                   "rejected, deleted (any case)")] = None,
    label: Annotated[str | None, Query(description="key=value[,key2=value2]: the Job's labels, all must match")
                     ] = None,
    limit: Annotated[int, Query(ge=1, le=5000)] = 500,
    offset: Annotated[int, Query(ge=0)] = 0,
) -> m.WorkloadPage:
    await allow(request, user, read_access(namespace or ""))
    try:
        f = dbadmin.WorkloadFilter(namespace=namespace, kind=dbadmin.parse_kind(kind, field_name="kind"),
                                   queue=queue, cluster=cluster,
                                   state=dbadmin.parse_state(state, field_name="state"),
                                   labels=dbadmin.parse_labels(label, field_name="label"))
    except Invalid as exc:
        raise bad_request(exc) from None
    async with ctx_of(request).sessions() as s:
        rows = await dbadmin.list_workloads(s, f, limit=limit, offset=offset)
        total = await dbadmin.count_workloads(s, f)
    return m.WorkloadPage(items=[m.WorkloadItem(**dict(r._mapping)) for r in rows], total=total, limit=limit,
                          offset=offset)


async def _find(request: Request, namespace: str, name: str) -> str:
    async with ctx_of(request).sessions() as s:
        uid = await dbadmin.find_workload_uid(s, f"{namespace}/{name}")
    if uid is None:
        raise HTTPException(404, f"no workload {namespace}/{name} (mkd claims only Jobs whose managedBy is "
                                 f"kueue.x-k8s.io/multikueue; /api/v1/jobs/{namespace}/{name}/owner says who "
                                 "manages it)")
    return uid


@router.get("/workloads/{namespace}/{name}", response_model=m.WorkloadDetail,
            summary="One Workload: every placement attempt, its history, conditions and why it is where it is")
async def get_workload(request: Request, user: UserDep, namespace: str, name: str) -> m.WorkloadDetail:
    await allow(request, user, read_access(namespace))
    uid = await _find(request, namespace, name)
    from dispatcher.queueing.views import why_from_db

    async with ctx_of(request).sessions() as s:
        found = await queries.show_workload(s, uid)
        rows = await dbadmin.list_workloads(s, dbadmin.WorkloadFilter(namespace=namespace, name=name), limit=50)
        queued = await why_from_db(s, uid)
    assert found is not None
    w = dict(found.workload._mapping)
    summary = next((dict(r._mapping) for r in rows if r.uid == uid), {})
    placements = [dict(p._mapping) for p in found.placements]
    current = next((p for p in placements if p["attempt"] == w["attempt"]), None)
    events = [m.EventItem(**dict(e._mapping), namespace=namespace, name=name, kind=w["kind"]) for e in found.events]
    return m.WorkloadDetail(**{**w, **{k: summary.get(k) for k in ("placement_state", "epoch") if summary}},
                            placements=[m.PlacementItem(**p) for p in placements], events=events,
                            conditions=_mkd_conditions(ctx_of(request), uid), why=why_of(w, current, queued))


@router.get("/jobs/{namespace}/{name}/owner", response_model=m.Owner,
            summary="Who manages a Job of the manager cluster that mkd did not claim")
async def job_owner(request: Request, user: UserDep, namespace: str, name: str) -> m.Owner:
    await allow(request, user, read_access(namespace))
    ctx = ctx_of(request)
    if ctx.kube is None:
        raise HTTPException(404, "this server has no manager cluster client")
    from dispatcher.unclaimed import explain

    message = await explain(ctx.kube, namespace, name)
    if message is None:
        raise HTTPException(404, f"no Job {namespace}/{name} of any kind mkd knows on the manager cluster")
    return m.Owner(message=message)


@router.get("/clusters", response_model=m.ClusterPage, summary="Clusters with health, capacity and usage")
async def list_clusters(request: Request, user: UserDep) -> m.ClusterPage:
    await allow(request, user, read_access())
    async with ctx_of(request).sessions() as s:
        rows = await queries.list_clusters(s)
        running = await dbadmin.holding_per_cluster(s)
    now = datetime.now(UTC)
    return m.ClusterPage(items=[cluster_item(dict(r._mapping), running.get(r.name, 0), now) for r in rows])


@router.get("/queues", response_model=m.QueuePage, summary="Queues: Workloads per state and admitted requests")
async def list_queues(request: Request, user: UserDep) -> m.QueuePage:
    await allow(request, user, read_access())
    from dispatcher.api.queues import queue_page

    ctx = ctx_of(request)
    async with ctx.sessions() as s:
        return await queue_page(s, getattr(ctx.engine, "queueing", None))


@router.get("/events", response_model=m.EventPage, summary="History rows across every Workload and Cluster")
async def list_events(
    request: Request, user: UserDep,
    workload: Annotated[str | None, Query(description="NAMESPACE/NAME, NAME or uid")] = None,
    cluster: str | None = None, type: str | None = None,
    after: Annotated[int, Query(ge=0, description="only events with a larger id (following)")] = 0,
    limit: Annotated[int, Query(ge=1, le=5000)] = 500,
) -> m.EventPage:
    await allow(request, user, read_access())
    from dispatcher.db.models import EVENT_TYPES

    if type and type not in EVENT_TYPES:
        raise HTTPException(400, f"type: {type!r} is not an event type; use one of: {', '.join(EVENT_TYPES)}")
    async with ctx_of(request).sessions() as s:
        uid = None
        if workload:
            uid = await dbadmin.find_workload_uid(s, workload)
            if uid is None:
                raise HTTPException(404, f"no workload {workload!r}")
        rows = await dbadmin.list_events(s, workload_uid=uid, cluster=cluster, type_=type, after_id=after,
                                         limit=limit)
    return m.EventPage(items=[m.EventItem(**dict(r._mapping)) for r in rows])


# --- actions ------------------------------------------------------------------------------------


async def _act(request: Request, action: Any) -> m.ActionResult:
    from dispatcher.adminactions import ActionRefused

    ctx = ctx_of(request)
    if ctx.engine is None:
        raise HTTPException(503, "this server serves reads only (no engine)")
    metrics = getattr(request.app.state, "metrics", None)

    def count(result: str) -> None:
        if metrics is not None:
            metrics.actions.labels(action.verb, result).inc()

    ctx.engine.inbox.put_nowait(action)
    try:
        message = await asyncio.wait_for(asyncio.shield(action.done), ctx.action_timeout)
    except TimeoutError:
        count("timeout")
        raise HTTPException(504, f"the engine did not decide within {ctx.action_timeout:g}s; the action is "
                                 "queued and may still happen: check `mkctl events`") from None
    except ActionRefused as exc:
        count("refused")
        raise HTTPException(exc.status, exc.message) from None
    count("ok")
    return m.ActionResult(message=message)


def _cluster_route(verb: str, doc: str) -> None:
    async def handler(request: Request, user: UserDep, name: str) -> m.ActionResult:
        from dispatcher.adminactions import AdminAction

        await allow(request, user, action_access(verb, "clusters", name))
        return await _act(request, AdminAction(verb, name, actor=user.name))  # type: ignore[arg-type]

    handler.__name__ = f"{verb}_cluster"
    router.post(f"/clusters/{{name}}/{verb}", response_model=m.ActionResult, summary=doc)(handler)


def _workload_route(verb: str, doc: str) -> None:
    async def handler(request: Request, user: UserDep, namespace: str, name: str,
                      body: m.PinBody | None = None) -> m.ActionResult:
        from dispatcher.adminactions import AdminAction

        await allow(request, user, action_access(verb, "workloads", name, namespace))
        uid = await _find(request, namespace, name)
        if verb == "pin" and body is None:
            raise HTTPException(422, "body: send {\"cluster\": NAME} to pin, {\"cluster\": null} to unpin")
        return await _act(request, AdminAction(verb, uid, cluster=body.cluster if body else None,  # type: ignore[arg-type]
                                               actor=user.name))

    handler.__name__ = f"{verb}_workload"
    router.post(f"/workloads/{{namespace}}/{{name}}/{verb}", response_model=m.ActionResult, summary=doc)(handler)


_cluster_route("cordon", "Cordon a cluster: no new placements there")
_cluster_route("uncordon", "Uncordon a cluster: placements allowed again")
_cluster_route("drain", "Drain a cluster: cordon it and move every Workload placed there (Delete + requeue)")
_workload_route("requeue", "Take a Workload off its cluster and place it again")
_workload_route("evict", "Take a Workload off its cluster; it is placed on another one")
_workload_route("pin", "Pin a Workload to one cluster (null unpins)")
