"""The handover parts of a running dispatcher, as supervised tasks.

``handover/policies`` and ``handover/namespaces`` (informers), ``handover/flush`` (shadow records and
counts to SQL) and, with ``handover.webhook_port``, ``handover/webhook`` (the HTTPS admission webhook).
Intake shows every Job event to :meth:`HandoverBook.observe`.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from typing import Any

from dispatcher.handover.book import HandoverBook
from dispatcher.handover.policy import Decision
from federation.errors import Invalid
from federation.kinds.manifests import handed_over
from federation.tasks import Supervisor

log = logging.getLogger(__name__)


class HandoverService:
    def __init__(self, dispatcher: Any, sessions: Any) -> None:
        s = dispatcher.settings
        h = s.handover
        engine = dispatcher.engine
        self.settings = h
        kinds = tuple(handed_over(dispatcher.kinds))  # a kind without managedBy is handed over by its queue label
        self.book = HandoverBook(dispatcher.kube, sessions, dispatcher.clock, kinds=kinds,
                                 views=lambda: engine.book.views(), heartbeat_timeout=s.heartbeat_timeout_seconds,
                                 extra_controllers=h.extra_controllers, flush_seconds=h.flush_seconds)
        self.kinds = kinds
        self.routed: Counter[tuple[str, str]] = Counter()  # (kind, policy) → Jobs the webhook routed
        self.port: int | None = None
        self.started = asyncio.Event()
        if h.webhook_port is not None and (h.webhook_cert_file is None or h.webhook_key_file is None):
            raise Invalid("handover.webhook_cert_file", "the webhook serves HTTPS only and needs a certificate",
                          fix="set --handover-webhook-cert-file and --handover-webhook-key-file "
                              "(PEM files mounted from the webhook's Secret), or leave the webhook port unset")

    def _routed(self, kind: str, decision: Decision) -> None:
        self.routed[(kind, decision.policy or "")] += 1

    async def _webhook(self) -> None:
        from dispatcher.api import serve
        from dispatcher.handover.webhook import create_app

        app = create_app(self.kinds, self.book.decide, self._routed)
        port: int = self.port if self.port is not None else (self.settings.webhook_port or 0)

        def bound(p: int) -> None:
            self.port = p
            self.started.set()
            log.info("handover webhook serving https on %s:%d/mutate", self.settings.webhook_host, p)

        await serve(app, self.settings.webhook_host, port, bound,
                    ssl_certfile=str(self.settings.webhook_cert_file), ssl_keyfile=str(self.settings.webhook_key_file))

    def start_tasks(self, sup: Supervisor) -> None:
        sup.start("handover/policies", self.book.watch_policies, side=True)
        sup.start("handover/namespaces", self.book.watch_namespaces, side=True)
        sup.start("handover/flush", self.book.run, side=True)
        if self.settings.webhook_port is not None:
            sup.start("handover/webhook", self._webhook, restart=True)
