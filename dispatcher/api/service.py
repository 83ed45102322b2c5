"""The dispatcher's HTTP server as one of its supervised tasks (``api``).

Built from a running :class:`~dispatcher.app.Dispatcher`: the API reads through a session factory of
its own on the same database, queues actions into the engine's inbox, checks tokens with the manager
cluster's client, and serves the dispatcher's metrics. Readiness: intake has listed every kind and
the report subscription is in place.
"""

from __future__ import annotations

import asyncio
from typing import Any

from dispatcher.api import create_app, serve
from dispatcher.api.auth import Authenticator
from dispatcher.api.metrics import DispatcherMetrics
from dispatcher.api.routes import ApiContext


class HttpService:
    def __init__(self, dispatcher: Any, sessions: Any) -> None:
        s = dispatcher.settings
        self.dispatcher = dispatcher
        self.sessions = sessions
        self.metrics = DispatcherMetrics(dispatcher)
        token = s.api_token.get_secret_value() if s.api_token is not None else None
        self.auth = Authenticator(kube=dispatcher.kube, static_token=token, token_review=True)
        self.ctx = ApiContext(sessions=sessions, auth=self.auth, engine=dispatcher.engine, kube=dispatcher.kube,
                              ready_checks={"intake": self._intake_ready, "reports": self._reports_ready,
                                            "queues": self._queues_ready})
        self.app = create_app(self.ctx, self.metrics)
        self.app.state.side = dispatcher.side  # degraded side work, listed by /readyz
        self.host = s.api_host
        self.port: int = s.api_port or 0
        self.started = asyncio.Event()

    def _intake_ready(self) -> str | None:
        intake = self.dispatcher.intake
        return None if intake is not None and intake.ready.is_set() else "has not listed every job kind yet"

    def _queues_ready(self) -> str | None:
        watcher = self.dispatcher.queue_watcher  # (none in Kueue mode: Kueue admits)
        return watcher.problem() if watcher is not None else None

    def _reports_ready(self) -> str | None:
        reports = self.dispatcher.reports
        return None if reports is not None and reports.subscribed.is_set() else "not subscribed to Reports yet"

    async def start(self) -> None:
        async with self.sessions() as s:
            await self.metrics.start(s)

    def _bound(self, port: int) -> None:
        self.port = port
        self.started.set()

    async def run(self) -> None:
        # a restart binds the port the first run got (0 in settings means "any" only once)
        port = self.port if self.started.is_set() else (self.dispatcher.settings.api_port or 0)
        await serve(self.app, self.host, port, self._bound)
