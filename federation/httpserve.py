"""Serving an ASGI application (FastAPI/Starlette) on uvicorn as a supervised task, for both services.

The dispatcher serves its API, dashboard and metrics this way, the agent its metrics and probes.
uvicorn must not take SIGINT/SIGTERM over: the service's own handlers start its staged shutdown.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any


async def serve(app: Any, host: str, port: int, started: Callable[[int], None] | None = None, **tls: Any) -> None:
    """Run ``app`` until cancelled; ``started(port)`` is called with the bound port (``port`` 0: any).
    ``tls``: uvicorn's ``ssl_certfile`` / ``ssl_keyfile`` (the handover's admission webhook serves HTTPS)."""
    import uvicorn

    config = uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False, lifespan="off",
                            **tls)
    server = uvicorn.Server(config)
    server.capture_signals = contextlib.nullcontext  # type: ignore[method-assign,assignment]
    # The server is a child of the calling (supervised) task: its failure, also while shutting down,
    # is that task's failure, raised by the group (federation/tasks.py), never dropped.
    async with asyncio.TaskGroup() as group:
        task = group.create_task(server.serve(), name=f"http-server:{host}:{port}")
        try:
            while not server.started:
                if task.done():
                    return  # the group raises the bind error
                await asyncio.sleep(0.02)
            if started is not None:
                sockets = [s for srv in server.servers for s in srv.sockets]
                started(int(sockets[0].getsockname()[1]) if sockets else port)
            await asyncio.wait({task})
        finally:
            server.should_exit = True  # a graceful stop: uvicorn closes its connections
            await asyncio.wait({task}, timeout=5)  # then the group cancels what is left
