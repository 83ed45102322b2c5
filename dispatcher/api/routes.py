"""The ``/api/v1`` endpoints: reads straight from the database, actions through the engine's inbox.

Reads answer with the read model's functions (:mod:`dispatcher.readmodel`, the same mkctl and the dashboard
call) in a fresh read-only session (the engine's transactions are not disturbed) and, where the truth lives
on the manager cluster, its client; filters are checked the way mkctl checks them, so ``state=bogus`` is a
400 naming the states. Actions build an :class:`~dispatcher.engine.adminactions.AdminAction`, queue it for
the engine and answer once the engine's transaction committed (or 504 after ``action_timeout``).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Query, Request

from dispatcher import readmodel
from dispatcher.api import models as m
from dispatcher.api.auth import Access, Authenticator, AuthError, User, action_access, read_access
from dispatcher.db import admin as dbadmin
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
    streams: Any = None
    """The log-stream broker (dispatcher.wire.podstreams); None: pods and logs are not served."""


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
        rows = await readmodel.workloads(s, f, limit=limit, offset=offset)
        total = await readmodel.workload_total(s, f)
    return m.WorkloadPage(items=[m.WorkloadItem(**r) for r in rows], **total, limit=limit, offset=offset)


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
    ctx = ctx_of(request)
    async with ctx.sessions() as s:
        found = await readmodel.workload(s, f"{namespace}/{name}", ctx.kube)
    if found is None:
        await _find(request, namespace, name)  # the 404 naming the owner endpoint
    assert found is not None
    return m.WorkloadDetail(**found)


@router.get("/why/{namespace}/{name}", response_model=m.Why,
            summary="Why a Job is where it is: the step that holds it, what it lacks, or who manages it instead")
async def get_why(request: Request, user: UserDep, namespace: str, name: str) -> m.Why:
    await allow(request, user, read_access(namespace))
    ctx = ctx_of(request)
    async with ctx.sessions() as s:
        found = await readmodel.why(s, f"{namespace}/{name}", ctx.kube)
    if found is None:
        other = await readmodel.unclaimed(ctx.kube, namespace, name)
        if other is None:
            raise HTTPException(404, f"no workload {namespace}/{name} and no Job of that name on the manager "
                                     "cluster (mkd claims only Jobs whose managedBy is kueue.x-k8s.io/multikueue)")
        found = readmodel.not_managed(f"{namespace}/{name}", other)
    elif found.get("state") in ("placed", "running"):  # the worker-side cause, read through the agent
        from dispatcher.api.podroutes import worker_causes

        found = {**found, "details": await worker_causes(request, user, namespace, name) + list(found["details"])}
    return m.Why(**found)


@router.get("/pending", response_model=m.PendingPage,
            summary="Pending Workloads in admission order with their positions in ClusterQueue and LocalQueue")
async def list_pending(request: Request, user: UserDep, cluster_queue: str | None = None,
                       namespace: str | None = None,
                       queue: Annotated[str | None, Query(description="LocalQueue name (the Job's queue label)")
                                        ] = None) -> m.PendingPage:
    await allow(request, user, read_access(namespace or ""))
    async with ctx_of(request).sessions() as s:
        rows = await readmodel.pending(s, cluster_queue=cluster_queue, namespace=namespace, queue=queue)
    return m.PendingPage(items=[m.PendingItem(**r) for r in rows])


@router.get("/jobs/{namespace}/{name}/owner", response_model=m.Owner,
            summary="Who manages a Job of the manager cluster that mkd did not claim")
async def job_owner(request: Request, user: UserDep, namespace: str, name: str) -> m.Owner:
    await allow(request, user, read_access(namespace))
    ctx = ctx_of(request)
    if ctx.kube is None:
        raise HTTPException(404, "this server has no manager cluster client")
    from dispatcher.intake.unclaimed import explain

    message = await explain(ctx.kube, namespace, name)
    if message is None:
        raise HTTPException(404, f"no Job {namespace}/{name} of any kind mkd knows on the manager cluster")
    return m.Owner(message=message)


@router.get("/clusters", response_model=m.ClusterPage, summary="Clusters with health, capacity and usage")
async def list_clusters(request: Request, user: UserDep) -> m.ClusterPage:
    await allow(request, user, read_access())
    async with ctx_of(request).sessions() as s:
        return m.ClusterPage(items=[m.ClusterItem(**c) for c in await readmodel.clusters(s)])


@router.get("/refused", response_model=m.RefusedPage,
            summary="Senders refused because no key is registered for them (never clusters)")
async def list_refused(request: Request, user: UserDep) -> m.RefusedPage:
    await allow(request, user, read_access())
    async with ctx_of(request).sessions() as s:
        return m.RefusedPage(items=[m.RefusedSender(**r) for r in await readmodel.refused_senders(s)])


@router.get("/handover/status", response_model=m.HandoverPage,
            summary="Jobs on the manager per namespace, kind and controller (managedBy)")
async def handover_status(request: Request, user: UserDep, namespace: str | None = None) -> m.HandoverPage:
    await allow(request, user, read_access(namespace or ""))
    async with ctx_of(request).sessions() as s:
        return m.HandoverPage(**await readmodel.handover_status(s, namespace))


@router.get("/handover/report", response_model=m.HandoverPage,
            summary="What mkd would do with the Jobs of other controllers a HandoverPolicy selects")
async def handover_report(request: Request, user: UserDep, namespace: str | None = None) -> m.HandoverPage:
    await allow(request, user, read_access(namespace or ""))
    async with ctx_of(request).sessions() as s:
        return m.HandoverPage(items=await readmodel.handover_report(s, namespace))


@router.get("/queues", response_model=m.QueuePage,
            summary="ClusterQueues and LocalQueues: quota, usage, Workloads pending and admitted")
async def list_queues(request: Request, user: UserDep) -> m.QueuePage:
    await allow(request, user, read_access())
    ctx = ctx_of(request)
    async with ctx.sessions() as s:
        return m.QueuePage(**await readmodel.queues(s, ctx.kube))


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
        try:
            rows = await readmodel.events(s, ref=workload, cluster=cluster, type_=type, after_id=after, limit=limit)
        except readmodel.UnknownRef:
            raise HTTPException(404, f"no workload {workload!r}") from None
    return m.EventPage(items=[m.EventItem(**r) for r in rows])


# --- actions ------------------------------------------------------------------------------------


async def _act(request: Request, action: Any) -> m.ActionResult:
    from dispatcher.engine.adminactions import ActionRefused

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
        from dispatcher.engine.adminactions import AdminAction

        await allow(request, user, action_access(verb, "clusters", name))
        return await _act(request, AdminAction(verb, name, actor=user.name))  # type: ignore[arg-type]

    handler.__name__ = f"{verb}_cluster"
    router.post(f"/clusters/{{name}}/{verb}", response_model=m.ActionResult, summary=doc)(handler)


def _workload_route(verb: str, doc: str) -> None:
    async def handler(request: Request, user: UserDep, namespace: str, name: str,
                      body: m.PinBody | None = None) -> m.ActionResult:
        from dispatcher.engine.adminactions import AdminAction

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
_workload_route("evict", "Take a Workload off its cluster; it is placed again on another one (never there)")
_workload_route("pin", "Pin a Workload to one cluster (null unpins)")
