"""``POST /api/v1/whatif``: replay a trace (or the history) against a configuration, answered with the report.

The body carries the trace as JSON Lines text (``trace``; without it the dispatcher's history, ``since`` ago or
all of it), the configuration as YAML text (``configuration``; each part not given is the live one) and,
optionally, a change to compare (``compare``) and whether to draw the plot (``plot``: a base64 PNG in the
answer). The answer is ``mkctl whatif -o json``'s (``a``, ``b`` and ``comparison`` with ``compare``). Reading
the whole federation's history needs the cluster-wide read access; bad input is a 400 naming the line or
object and field.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, HTTPException, Request
from pydantic import BaseModel, Field

from dispatcher.api.auth import read_access
from dispatcher.api.routes import UserDep, allow, ctx_of
from dispatcher.whatif import service
from federation.errors import Invalid

router = APIRouter(prefix="/api/v1")


class WhatIfRequest(BaseModel):
    trace: str | None = Field(default=None, description="JSON Lines, one Job per line (docs/WHATIF.md); "
                                                        "none: the dispatcher's history")
    since: str | None = Field(default=None, description="With the history: 7d, 12h, 30m or an RFC 3339 time")
    configuration: str | None = Field(default=None, description="YAML: Kueue objects, WhatIfSettings, "
                                                                "WorkerCluster; parts not given are the live ones")
    compare: str | None = Field(default=None, description="YAML: objects replacing those of the same kind and "
                                                          "name, replayed side by side")
    plot: bool = Field(default=False, description="Add the plot, a base64 PNG, as 'plot'")


@router.post("/whatif", summary="Replay a workload against another configuration: waits, preemptions, utilisation")
async def whatif(request: Request, user: UserDep, body: Annotated[WhatIfRequest, Body()]) -> dict[str, Any]:
    await allow(request, user, read_access())
    ctx = ctx_of(request)
    try:
        since = service.parse_since(body.since, field="since")
        async with ctx.sessions() as s:
            return await service.answer(s, ctx.kube, trace_text=body.trace, since=since,
                                        configuration=body.configuration, compare=body.compare, plot=body.plot)
    except Invalid as exc:
        raise HTTPException(400, exc.message) from None
