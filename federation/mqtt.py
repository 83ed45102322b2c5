"""The MQTT boundary: the only module importing ``aiomqtt`` (and, through it, paho).

``MqttLink`` is one connection, an async context manager with an explicit state (new → open →
closed): QoS 1 publish that returns once the broker's PUBACK arrived, QoS 1 subscriptions, a will
message, username/password and TLS, and a persistent session (clean_session False, stable client
id) so QoS 1 messages queued by the broker while a peer was away reach it when it reconnects.
``LinkHealth`` is the link's health as data (connected, lost since, failed attempts, capped
exponential backoff with jitter on an injected clock); the reconnect loop stays in the caller.
Every aiomqtt / paho / socket / TLS error becomes a ``federation.errors`` error in ``_translate``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import socket
import ssl
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from datetime import datetime
from types import TracebackType
from typing import Any, Literal
from urllib.parse import unquote, urlsplit

import aiomqtt
from aiomqtt.exceptions import MqttConnectError

from federation.clock import Clock
from federation.errors import Permanent, Transport
from federation.retry import capped
from federation.settings import MqttSettings, check_mqtt_url

log = logging.getLogger(__name__)
# paho logs every packet at DEBUG and aiomqtt warns about "pending publish calls" above 10;
# at 500 publishes/s both are noise, our own logger says what matters.
_QUIET = logging.getLogger("federation.mqtt.paho")
_QUIET.setLevel(logging.ERROR)

QOS = 1
_BAD_CREDENTIALS = {4, 5, 134, 135}  # 3.1.1 bad user/password, not authorised; 5.0 equivalents


@dataclass(frozen=True)
class Will:
    """Published by the broker for us when the connection dies without a DISCONNECT."""

    topic: str
    payload: bytes
    retain: bool = True


@dataclass(frozen=True)
class Message:
    topic: str
    payload: bytes
    retain: bool


class LinkClosed(Transport):
    """The link was used after it closed (or after its connection dropped): open a new one."""


@dataclass(frozen=True)
class BrokerAddress:
    host: str
    port: int
    tls: bool
    username: str | None
    password: str | None


def parse_url(settings: MqttSettings) -> BrokerAddress:
    """Split ``settings.url``; explicit ``username`` / ``password`` settings win over the URL's."""
    try:
        host, port, tls = check_mqtt_url(settings.url)
    except ValueError as exc:
        raise Permanent(str(exc), reason="BadSettings") from None
    parts = urlsplit(settings.url)
    username = settings.username or (unquote(parts.username) if parts.username else None)
    password = settings.password or (unquote(parts.password) if parts.password else None)
    return BrokerAddress(host, port, tls, username, password)


def _tls_context(settings: MqttSettings) -> ssl.SSLContext:
    try:
        context = ssl.create_default_context(cafile=str(settings.tls_ca) if settings.tls_ca else None)
        if settings.tls_cert:
            context.load_cert_chain(str(settings.tls_cert), str(settings.tls_key) if settings.tls_key else None)
    except (OSError, ssl.SSLError) as exc:
        raise Permanent(f"MQTT TLS files unusable: {exc}", reason="BadSettings") from None
    return context


@contextlib.contextmanager
def _translate(action: str) -> Iterator[None]:
    """The one place where library errors become ours: bad credentials are Permanent, the rest Transport."""
    try:
        yield
    except aiomqtt.MqttCodeError as exc:
        code = getattr(exc.rc, "value", exc.rc)
        if isinstance(exc, MqttConnectError) and code in _BAD_CREDENTIALS:
            raise Permanent(f"MQTT {action}: broker refused the credentials ({exc})", reason="MqttAuth") from exc
        raise Transport(f"MQTT {action}: {exc}") from exc
    except aiomqtt.MqttError as exc:
        raise Transport(f"MQTT {action}: {exc or type(exc).__name__}") from exc
    except (OSError, ssl.SSLError, EOFError) as exc:
        raise Transport(f"MQTT {action}: {exc or type(exc).__name__}") from exc


class LinkHealth:
    """Health of one link as data; the caller's reconnect loop reads and updates it.

    ``lost_since`` is set when the link first fails and kept across failed retries, so "worker lost
    for N seconds" is measured from the real loss, not from the latest retry.
    """

    def __init__(self, settings: MqttSettings, clock: Clock, *, jitter: float = 0.2,
                 rng: random.Random | None = None) -> None:
        self.initial = settings.backoff_initial
        self.cap = settings.backoff_max
        self.jitter = jitter
        self.clock = clock
        self._rng = rng or random.Random()
        self.connected = False
        self.connects = 0
        self.lost_since: datetime | None = None
        self.failed_attempts = 0
        self.last_error = ""

    def connected_now(self) -> None:
        self.connects += 1  # metrics: reconnects = connects - 1
        self.connected = True
        self.lost_since = None
        self.failed_attempts = 0
        self.last_error = ""

    def failed(self, exc: BaseException) -> None:
        """A connect attempt failed or an open link dropped."""
        self.connected = False
        if self.lost_since is None:
            self.lost_since = self.clock.now()
        self.failed_attempts += 1
        self.last_error = str(exc)

    def lost_for(self) -> float:
        """Seconds since the link was lost (0 while connected)."""
        if self.lost_since is None:
            return 0.0
        return max(0.0, (self.clock.now() - self.lost_since).total_seconds())

    def base_delay(self) -> float:
        """``initial × 2^(attempts-1)``, capped; 0 before any failure."""
        return capped(self.failed_attempts, self.initial, self.cap)

    def next_delay(self) -> float:
        """The base delay less up to ``jitter`` of it, so peers that lost one broker do not return in step."""
        base = self.base_delay()
        return base * (1.0 - self.jitter * self._rng.random())


class _Messages:
    """Cancel-safe iterator (an async generator would be closed by a cancelled ``anext``)."""

    def __init__(self, link: MqttLink, client: aiomqtt.Client) -> None:
        self._link = link
        self._source = client.messages

    def __aiter__(self) -> _Messages:
        return self

    async def __anext__(self) -> Message:
        if self._link.state != "open":
            raise LinkClosed(f"MQTT link {self._link.client_id} is closed")
        with _translate("receive"):
            m = await self._source.__anext__()
        payload = m.payload
        data = bytes(payload) if isinstance(payload, bytes | bytearray) else (
            b"" if payload is None else str(payload).encode())
        return Message(str(m.topic), data, bool(m.retain))


State = Literal["new", "open", "closed"]


class MqttLink:
    """One connection to the broker; enter once, then publish / subscribe / iterate messages."""

    def __init__(self, settings: MqttSettings, *, client_id: str, will: Will | None = None,
                 persistent: bool = True) -> None:
        """``persistent`` False starts a clean session (for short-lived tools that must not leave one behind)."""
        self.settings = settings
        self.client_id = client_id
        self.will = will
        self.persistent = persistent
        self.address = parse_url(settings)
        self.state: State = "new"
        self._client: aiomqtt.Client | None = None
        self._disconnected: asyncio.Future[None] | None = None
        # aiomqtt scans all pending calls on every publish (O(n) each): thousands in flight at once
        # make publishing quadratic. A few dozen in flight keep the socket busy at a fraction of the cost.
        self._slots = asyncio.Semaphore(settings.max_inflight)

    async def __aenter__(self) -> MqttLink:
        if self.state != "new":
            raise RuntimeError(f"MqttLink is {self.state}; a link is entered once, make a new one")
        address = self.address
        tls = _tls_context(self.settings) if address.tls or self.settings.tls_ca else None
        will = (aiomqtt.Will(self.will.topic, self.will.payload, qos=QOS, retain=self.will.retain)
                if self.will else None)
        self.state = "closed"  # until the connect succeeds: a failed link is not entered again
        with _translate(f"connect to {address.host}:{address.port}"):
            client = aiomqtt.Client(
                address.host, address.port,
                username=address.username, password=address.password,
                identifier=self.client_id, clean_session=not self.persistent,
                will=will, keepalive=self.settings.keepalive, timeout=self.settings.publish_timeout,
                max_inflight_messages=self.settings.max_inflight, max_queued_outgoing_messages=0,
                tls_context=tls, logger=_QUIET,
            )
            client.pending_calls_threshold = self.settings.max_inflight + 100
            await client.__aenter__()
        self._client = client
        # aiomqtt resolves this future when the connection ends; publishes race against it so
        # they fail at once on a dropped link instead of waiting out publish_timeout.
        self._disconnected = client._disconnected
        self.state = "open"
        log.debug("mqtt link %s open to %s:%d", self.client_id, address.host, address.port)
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        client, self._client = self._client, None
        self.state = "closed"
        if client is None:
            return
        try:
            with _translate("disconnect"):
                await client.__aexit__(exc_type, exc, tb)
        except Transport as err:
            log.debug("mqtt link %s closed uncleanly: %s", self.client_id, err)
        finally:
            self._retrieve_disconnect_error()

    def _retrieve_disconnect_error(self) -> None:
        fut = self._disconnected
        if fut is not None and fut.done() and not fut.cancelled():
            fut.exception()  # mark retrieved so asyncio does not log "never retrieved"

    @property
    def alive(self) -> bool:
        """Open and its connection not known to be lost. A publish that timed out leaves a link alive: the
        PUBACK may be held up (a silent partition that heals before the keepalive notices), not lost."""
        return (self.state == "open" and self._client is not None
                and not (self._disconnected is not None and self._disconnected.done()))

    def _open(self) -> aiomqtt.Client:
        if self.state == "new":
            raise RuntimeError("MqttLink used before `async with`")
        if self._client is None or self.state == "closed":
            raise LinkClosed(f"MQTT link {self.client_id} is closed")
        if self._disconnected is not None and self._disconnected.done():
            raise LinkClosed(f"MQTT link {self.client_id} lost its connection")
        return self._client

    async def publish(self, topic: str, payload: bytes, *, retain: bool = False) -> None:
        """QoS 1; returns after the broker's PUBACK. Call it concurrently: ``max_inflight`` go out at once."""
        client = self._open()
        async with self._slots:
            await self._publish(client, topic, payload, retain)

    async def _publish(self, client: aiomqtt.Client, topic: str, payload: bytes, retain: bool) -> None:
        assert self._disconnected is not None
        if self._disconnected.done():
            raise LinkClosed(f"MQTT link {self.client_id} lost its connection")
        with _translate(f"publish to {topic}"):
            sent = asyncio.ensure_future(client.publish(topic, payload, qos=QOS, retain=retain))
            try:
                await asyncio.wait((sent, self._disconnected), return_when=asyncio.FIRST_COMPLETED)
            except asyncio.CancelledError:
                sent.cancel()
                raise
            if not sent.done():
                sent.cancel()
                raise LinkClosed(f"MQTT link {self.client_id} lost its connection before the PUBACK for {topic}")
            sent.result()

    async def subscribe(self, *filters: str) -> None:
        """QoS 1 subscriptions; with a persistent session they survive reconnects."""
        client = self._open()
        if not filters:
            return
        with _translate(f"subscribe to {', '.join(filters)}"):
            codes = await client.subscribe([(f, QOS) for f in filters])
        for f, code in zip(filters, codes, strict=False):
            value = getattr(code, "value", code)
            if isinstance(value, int) and value >= 0x80:
                raise Permanent(f"MQTT broker refused subscription to {f} (code {value})", reason="MqttSubscribe")

    def messages(self) -> AsyncIterator[Message]:
        """Messages on the subscribed filters, in arrival order; raises Transport when the link drops.

        Cancelling a wait (``asyncio.wait_for(anext(it), t)``) leaves the iterator usable.
        """
        return _Messages(self, self._open())

    def drop(self) -> None:
        """Cut the connection without a DISCONNECT, as a crash would: the broker then publishes the will."""
        client = self._open()
        sock: Any = client._client.socket()
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
