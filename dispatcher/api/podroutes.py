"""``/api/v1/workloads/{ns}/{name}/pods`` and ``/logs``: a placed Job's pods, their Events and container logs,
read on the worker cluster through its agent (``dispatcher.wire.podstreams``).

Who may read is decided as if the pods were local: the manager cluster's SubjectAccessReview must allow
``list pods`` (pods, Events) or ``get pods/log`` (logs) in the Job's namespace. Errors say what to do: a Job
not placed yet says where it waits, a pod not found lists the pods, a wrong container lists the containers, an
offline cluster says since when. ``/logs`` streams ``text/plain`` (``follow=true`` until the container ends, the
reader leaves or the follow idles); the pod and container read are in the ``X-Mkd-Pod`` / ``X-Mkd-Container``
headers, and a stream that breaks after its first byte ends with a line ``mkd: <why>``.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Annotated, Any

import sqlalchemy as sa
from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.responses import JSONResponse, StreamingResponse

from dispatcher.api.auth import AuthError, User, log_access, pods_access
from dispatcher.api.routes import UserDep, allow, ctx_of
from dispatcher.db import admin as dbadmin
from dispatcher.db import models
from dispatcher.wire.podstreams import PodStreams, StreamError
from federation.messages import JobRef, PlacementKey
from federation.podstream import Frame

router = APIRouter(prefix="/api/v1")

LIVE = ("sent", "accepted", "running", "suspended", "finished", "failed")
"""Placement states whose copy may still be on its cluster."""
ENDINGS = {
    "idle": "\nmkd: no new line for {idle}s: the follow ended (follow again to go on)\n",
    "stopped": "\nmkd: the agent of cluster {cluster} ended the stream (it is stopping or restarting); "
               "follow again in a moment\n",
    "pod_gone": "\nmkd: pod {pod} was deleted on cluster {cluster}: its log ends here\n",
}
"""What a stream's reader is told when it ended for another reason than the container's end."""
_DURATION = re.compile(r"^(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")


@dataclass(frozen=True)
class Target:
    cluster: str
    placement: PlacementKey
    job: JobRef


def parse_since(text: str | None) -> int | None:
    """``90s``, ``5m``, ``1h30m`` (kubectl's --since) → seconds; 400 naming the parameter otherwise."""
    if not text:
        return None
    match = _DURATION.match(text)
    if match is None or not any(match.groups()):
        raise HTTPException(400, f"since: {text!r} is not a duration; use e.g. 30s, 5m or 1h")
    h, m, s = (int(g or 0) for g in match.groups())
    seconds = h * 3600 + m * 60 + s
    if seconds < 1:
        raise HTTPException(400, "since: must be at least 1s")
    return seconds


async def target(request: Request, namespace: str, name: str, attempt: int | None) -> Target:
    """Where the Job's copy runs (its current placement, or attempt ``attempt``); 404/409 saying why not."""
    async with ctx_of(request).sessions() as s:
        uid = await dbadmin.find_workload_uid(s, f"{namespace}/{name}")
        if uid is None:
            raise HTTPException(404, f"no workload {namespace}/{name} (mkd claims only Jobs whose managedBy is "
                                     "kueue.x-k8s.io/multikueue)")
        w = (await s.execute(sa.select(models.workloads).where(models.workloads.c.uid == uid))).mappings().one()
        rows = (await s.execute(sa.select(models.placements).where(models.placements.c.workload_uid == uid)
                                .order_by(models.placements.c.attempt))).mappings().all()
    if attempt is None:
        current = [r for r in rows if r["attempt"] == w["attempt"] and r["cluster"] == w["cluster"]]
        if not current or w["cluster"] is None:
            where = w["cluster_queue"] or w["queue"]
            raise HTTPException(409, f"{namespace}/{name} is not placed on a cluster yet ({w['state']}: "
                                     f"{w['reason'] or 'waiting'}; queue {where}): it has no pods to show. "
                                     f"`mkctl why {namespace}/{name}` says what it waits for")
        row = current[-1]
    else:
        found = [r for r in rows if r["attempt"] == attempt]
        if not found:
            have = ", ".join(str(r["attempt"]) for r in rows) or "none"
            raise HTTPException(404, f"{namespace}/{name} has no attempt {attempt} (attempts: {have})")
        row = found[-1]
    if row["state"] not in LIVE:
        raise HTTPException(410, f"attempt {row['attempt']} of {namespace}/{name} on cluster {row['cluster']} is "
                                 f"{row['state']}: its copy and its pods are gone from that cluster")
    return Target(row["cluster"], PlacementKey(workload_uid=uid, attempt=row["attempt"], epoch=row["epoch"]),
                  JobRef(kind=w["kind"], api_version=w["api_version"], namespace=namespace, name=name))


CAUSE_SECONDS = 3.0
"""How long ``why`` waits for the worker's pods before it answers without them."""


async def worker_causes(request: Request, user: User, namespace: str, name: str) -> list[str]:
    """Why the pods of a placed Job do not run, read on its worker (``pod master-0 on worker-2: ImagePullBackOff:
    ...``): for ``why``. Nothing when the user may not list pods there, the Job is not placed, or the worker does
    not answer within ``CAUSE_SECONDS`` (``why`` still answers from the database)."""
    ctx = ctx_of(request)
    if ctx.streams is None:
        return []
    try:
        await ctx.auth.require(user, pods_access(namespace))
        where = await target(request, namespace, name, None)
    except (AuthError, HTTPException):
        return []
    streams: PodStreams = ctx.streams

    async def listed() -> list[dict[str, Any]]:
        async for frame in streams.ask(where.cluster, user.name, streams.new_ask(what="pods", placement=where.placement,
                                                                                 job=where.job)):
            if frame.kind == "pods":
                return list(frame.fields.get("pods") or [])
        return []
    try:
        pods = await asyncio.wait_for(listed(), CAUSE_SECONDS)
    except (StreamError, TimeoutError):
        return []
    return [f"pod {p['name']} on {where.cluster}: {p['reason']}" + (f": {p['message']}" if p.get("message") else "")
            for p in pods if p.get("reason")]


def broker(request: Request) -> PodStreams:
    streams = ctx_of(request).streams
    if streams is None:
        raise HTTPException(503, "this server does not reach the worker clusters (no log-stream broker); "
                                 "ask the active dispatcher")
    return streams  # type: ignore[no-any-return]


def _http(exc: StreamError) -> HTTPException:
    return HTTPException(exc.status, {"reason": exc.reason, "message": exc.message, **exc.fields})


@router.get("/workloads/{namespace}/{name}/pods",
            summary="The Job's pods on its cluster (role, index, phase, ready, restarts, node, why) and their Events")
async def get_pods(request: Request, user: UserDep, namespace: str, name: str,
                   attempt: Annotated[int | None, Query(ge=1, description="an earlier attempt, while its copy "
                                                                           "exists")] = None) -> JSONResponse:
    await allow(request, user, pods_access(namespace))
    where = await target(request, namespace, name, attempt)
    streams = broker(request)
    ask = streams.new_ask(what="pods", placement=where.placement, job=where.job)
    try:
        async for frame in streams.ask(where.cluster, user.name, ask):
            if frame.kind == "pods":
                return JSONResponse({"cluster": where.cluster, "attempt": where.placement.attempt,
                                     "pods": frame.fields.get("pods") or [],
                                     "events": frame.fields.get("events") or []})
    except StreamError as exc:
        raise _http(exc) from None
    raise HTTPException(502, f"the agent of cluster {where.cluster} ended without listing the pods")


@router.get("/workloads/{namespace}/{name}/logs", response_class=StreamingResponse,
            summary="A container's log from the Job's pod (default: the lead role's first pod), streamed")
async def get_logs(
    request: Request, user: UserDep, namespace: str, name: str,
    pod: str = "", role: str = "", index: Annotated[int | None, Query(ge=0)] = None, container: str = "",
    previous: bool = False, tail: Annotated[int | None, Query(ge=0)] = None,
    since: Annotated[str | None, Query(description="30s, 5m, 1h30m")] = None, timestamps: bool = False,
    follow: bool = False, limit_bytes: Annotated[int | None, Query(ge=1)] = None,
    attempt: Annotated[int | None, Query(ge=1)] = None,
) -> StreamingResponse:
    await allow(request, user, log_access(namespace))
    seconds = parse_since(since)
    where = await target(request, namespace, name, attempt)
    streams = broker(request)
    ask = streams.new_ask(what="logs", placement=where.placement, job=where.job, pod=pod, role=role, index=index,
                          container=container, previous=previous, tail_lines=tail, since_seconds=seconds,
                          timestamps=timestamps, follow=follow, limit_bytes=limit_bytes)
    frames = streams.ask(where.cluster, user.name, ask)
    try:
        first: Frame = await anext(frames)  # errors before the first byte are HTTP errors
    except StreamError as exc:
        raise _http(exc) from None
    except StopAsyncIteration:
        raise HTTPException(502, f"the agent of cluster {where.cluster} ended the stream at once") from None
    headers = {"X-Mkd-Cluster": where.cluster, "X-Mkd-Pod": str(first.fields.get("pod") or ""),
               "X-Mkd-Container": str(first.fields.get("container") or ""), "Cache-Control": "no-store",
               "X-Content-Type-Options": "nosniff"}

    async def body() -> AsyncIterator[bytes]:
        try:
            if first.data:
                yield first.data
            async for frame in frames:
                if frame.data:
                    yield frame.data
                if frame.kind == "end" and frame.fields.get("reason") in ENDINGS:
                    yield ENDINGS[str(frame.fields["reason"])].format(cluster=where.cluster, pod=headers["X-Mkd-Pod"],
                                                                     idle=f"{ask.idle_seconds:g}").encode()
        except StreamError as exc:
            yield f"\nmkd: {exc.message}\n".encode()
        finally:
            await frames.aclose()  # type: ignore[attr-defined]

    return StreamingResponse(body(), media_type="text/plain; charset=utf-8", headers=headers)

