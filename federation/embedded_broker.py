"""An MQTT broker inside the process (amqtt): the only module importing ``amqtt``.

For ``mkd dev`` / the demo and for tests on machines without Mosquitto. ``EmbeddedBroker`` is an async context
manager bound to ``127.0.0.1`` and a free port by default (optionally TLS); ``.url`` is what
``MqttSettings.url`` takes. Checked with aiomqtt as the client (tests/federation/test_mqtt.py): QoS 1
delivery, retained messages, will messages on an unclean disconnect and persistent sessions (clean_session
False) that queue QoS 1 messages while a subscriber is away.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from amqtt.broker import Broker
from amqtt.plugins.base import BaseAuthPlugin
from amqtt.session import Session

from federation.errors import Permanent

# amqtt logs every connection, packet and plugin step at INFO; its warnings are still worth seeing.
for _name in ("amqtt", "transitions"):
    logging.getLogger(_name).setLevel(logging.WARNING)


class AcceptAll(BaseAuthPlugin):  # type: ignore[misc]
    """Accept every client without marking it anonymous.

    amqtt's own AnonymousAuthPlugin flags sessions anonymous, and amqtt neither queues QoS 1
    messages for an offline anonymous session nor keeps it: persistent sessions would silently
    not work. Mosquitto makes no such distinction.
    """

    @dataclass
    class Config:
        pass

    async def authenticate(self, *, session: Session) -> bool | None:
        return True


class EmbeddedBroker:
    """An amqtt broker listening on ``host:port`` (port 0: the OS picks a free one) while entered.

    What it lacks compared to Mosquitto (production deployments should run Mosquitto or another broker):
    * state lives in memory only: retained messages and queued session messages die with the process;
    * no limit on queued messages per offline session (Mosquitto: ``max_queued_messages``), and
      offline sessions never expire unless ``session_expiry_interval`` is set;
    * messages queued for an offline persistent session arrive with the retain flag set (Mosquitto
      clears it), so consumers must not read meaning into ``Message.retain`` for commands/reports;
    * MQTT 3.1.1 only (no MQTT 5 properties, receive-maximum or session expiry per client);
    * every client is accepted (no ACLs, no password file; username/password are ignored); a TLS
      listener is available (``certfile`` / ``keyfile``) but client certificates are not required;
    * amqtt's stock anonymous-auth plugin disables persistent sessions for anonymous clients, so this
      module installs its own accept-all plugin (``AcceptAll``) to keep them working;
    * an order of magnitude slower than Mosquitto (pure Python, one event loop shared with its host).
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0, *, certfile: Path | None = None,
                 keyfile: Path | None = None) -> None:
        """``certfile`` / ``keyfile`` (PEM) make it a TLS listener (``mqtts://``)."""
        self.host = host
        self.port = port
        self.certfile = certfile
        self.keyfile = keyfile
        self._broker: Broker | None = None

    @property
    def url(self) -> str:
        if self._broker is None:
            raise RuntimeError("EmbeddedBroker.url is known once the broker is entered")
        scheme = "mqtts" if self.certfile else "mqtt"
        return f"{scheme}://{self.host}:{self.port}"

    async def __aenter__(self) -> EmbeddedBroker:
        if self._broker is not None:
            raise RuntimeError("EmbeddedBroker is already running")
        listener: dict[str, Any] = {"type": "tcp", "bind": f"{self.host}:{self.port}"}
        if self.certfile:
            listener.update(ssl=True, certfile=str(self.certfile), keyfile=str(self.keyfile or self.certfile))
        config: dict[str, Any] = {
            "listeners": {"default": listener},
            # No $SYS publishing and no packet/event loggers: only what a federation needs.
            "plugins": {f"{__name__}.AcceptAll": {}},
        }
        broker = Broker(config)
        try:
            await broker.start()
        except Exception as exc:
            raise Permanent(f"embedded MQTT broker cannot listen on {self.host}:{self.port}: {exc}",
                            reason="BrokerStart") from exc
        server = broker._servers["default"].instance
        sockets = getattr(server, "sockets", None) or ()
        if sockets:
            self.port = int(sockets[0].getsockname()[1])
        self._broker = broker
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        broker, self._broker = self._broker, None
        if broker is not None:
            await broker.shutdown()
