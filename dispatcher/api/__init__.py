"""The dispatcher's HTTP server: the admin API (``/api/v1``), the dashboard, ``/metrics``, probes.

``create_app(ctx, metrics)`` builds the FastAPI application; ``serve(app, host, port)`` runs it on
uvicorn as one of the dispatcher's supervised tasks (``api``). The OpenAPI document is at
``/openapi.json`` (browsable at ``/docs``). ``/healthz`` answers while the process's event loop runs;
``/readyz`` answers 200 only when the database answers and every readiness check passes (intake has
listed every kind, the report subscription is in place, the queueing objects are listed), 503 naming what is
missing otherwise; either way
it lists, one line each, the side work that is degraded (``federation.tasks.SideWork``: what is wrong and
the fix), which does not make the replica unready.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse, Response

from dispatcher.api.podroutes import router as pod_router
from dispatcher.api.routes import ApiContext, router
from dispatcher.api.whatifroutes import router as whatif_router
from federation.httpserve import serve

__all__ = ["ApiContext", "create_app", "serve"]


def create_app(ctx: ApiContext, metrics: Any = None) -> FastAPI:
    app = FastAPI(title="mkd dispatcher", version="1",
                  description="Workloads, placements, clusters, queues and events of an mkd federation; "
                              "cordon / drain clusters, requeue / evict / pin Workloads.")
    app.state.ctx = ctx
    app.state.metrics = metrics
    app.include_router(router)
    app.include_router(pod_router)
    app.include_router(whatif_router)

    @app.get("/healthz", response_class=PlainTextResponse, include_in_schema=False)
    async def healthz() -> str:
        return "ok"

    @app.get("/readyz", response_class=PlainTextResponse, include_in_schema=False)
    async def readyz() -> Response:
        import sqlalchemy as sa

        missing = []
        try:
            async with ctx.sessions() as s:
                await s.execute(sa.text("SELECT 1"))
        except Exception as exc:  # any database failure means not ready; say which
            missing.append(f"database: {exc.__class__.__name__}: {exc}")
        for name, check in ctx.ready_checks.items():
            problem = check()
            if problem:
                missing.append(f"{name}: {problem}")
        side = getattr(app.state, "side", None)
        degraded = "".join(f"\ndegraded: {line}" for line in side.problems()) if side is not None else ""
        if missing:
            return PlainTextResponse("not ready: " + "; ".join(missing) + degraded, status_code=503)
        return PlainTextResponse("ok" + degraded)

    @app.get("/metrics", include_in_schema=False)
    async def prometheus(request: Request) -> Response:
        from prometheus_client import CONTENT_TYPE_LATEST

        if metrics is None:
            return PlainTextResponse("metrics are not enabled", status_code=404)
        async with ctx.sessions() as s:
            await metrics.refresh(s)
        return Response(metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    from dispatcher.api.dashboard import register as register_dashboard

    register_dashboard(app)
    from dispatcher.api.whatifpage import register as register_whatif_page

    register_whatif_page(app)
    return app
