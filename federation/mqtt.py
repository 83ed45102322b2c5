"""The MQTT boundary: the only module importing ``aiomqtt`` and paho (under it).

``MqttLink`` is one connection, an async context manager with an explicit state (new → open → closed): QoS 1
publish that returns once the broker's PUBACK arrived, QoS 1 subscriptions, a will message, username/password
and TLS, and a persistent session (clean_session False, stable client id) so QoS 1 messages queued by the
broker while a peer was away reach it when it reconnects. ``LinkHealth`` is the link's health as data
(connected, lost since, failed attempts, capped exponential backoff with jitter on an injected clock); the
reconnect loop stays in the caller. Every aiomqtt / paho / socket / TLS error becomes a ``federation.errors``
error in ``_translate``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import socket
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime
from types import TracebackType
from typing import Any, Literal, NoReturn
from urllib.parse import unquote, urlsplit

import aiomqtt
from aiomqtt.exceptions import MqttConnectError
from paho.mqtt.client import MQTT_ERR_SUCCESS

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


class _translate:
    """The one place where library errors become ours: bad credentials are Permanent, the rest Transport.

    A class rather than a generator-based context manager: it is entered for every publish."""

    __slots__ = ("action",)

    def __init__(self, action: str) -> None:
        self.action = action

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        action = self.action
        if isinstance(exc, aiomqtt.MqttCodeError):
            code = getattr(exc.rc, "value", exc.rc)
            if isinstance(exc, MqttConnectError) and code in _BAD_CREDENTIALS:
                raise Permanent(f"MQTT {action}: broker refused the credentials ({exc})", reason="MqttAuth") from exc
            raise Transport(f"MQTT {action}: {exc}") from exc
        if isinstance(exc, aiomqtt.MqttError | OSError | ssl.SSLError | EOFError):
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
    """Cancel-safe iterator over the link's inbox (an async generator would be closed by a cancelled ``anext``)."""

    def __init__(self, link: MqttLink, inbox: asyncio.Queue[Message | None]) -> None:
        self._link = link
        self._inbox = inbox

    def __aiter__(self) -> _Messages:
        return self

    async def __anext__(self) -> Message:
        if self._link.state != "open":
            raise LinkClosed(f"MQTT link {self._link.client_id} is closed")
        m = await self._inbox.get()  # cancel-safe: a cancelled get takes nothing
        if m is None:  # the connection ended; every message received before it came first (each one was
            self._inbox.put_nowait(None)  # acknowledged as paho handed it over: dropping it would lose it)
            self._link._raise_disconnected()
        return m


def _expire(acked: asyncio.Future[None], topic: str) -> None:
    if not acked.done():
        acked.set_exception(Transport(f"MQTT publish to {topic}: no PUBACK in time (Operation timed out)"))


class _Acked:
    """Stands in for aiomqtt's per-publish Event: its PUBACK callback calls ``set()``, which resolves the
    publish's future (no Event, no task, no ``asyncio.wait`` per message)."""

    __slots__ = ("future",)

    def __init__(self, future: asyncio.Future[None]) -> None:
        self.future = future

    def set(self) -> None:
        if not self.future.done():
            self.future.set_result(None)


class _Writes:
    """When paho writes, once connected. paho asks for a writable socket for every packet it queues (a publish,
    each PUBACK it owes for a message received): aiomqtt answers with ``call_soon_threadsafe`` + ``add_writer``
    and a ``remove_writer`` once written, a wake-up of the loop and two epoll changes per packet. Once the
    link is up paho runs on the loop's thread only, so this writes on the loop's next turn instead (every
    packet queued by then goes at once) and waits for writability only while the socket's buffer is full."""

    def __init__(self, client: aiomqtt.Client) -> None:
        self._client = client
        self._paho = client._client
        self._loop = asyncio.get_running_loop()
        self._due = False
        self._fd = -1
        """The socket whose writability the loop watches for us (-1: none)."""

    def install(self) -> None:
        sock = self._paho.socket()
        if self._paho._registered_write and sock is not None:  # aiomqtt's writer (added or about to be)
            self._fd = sock.fileno()
        self._paho.on_socket_register_write = self._register
        self._paho.on_socket_unregister_write = self._unregister

    def _register(self, _client: Any, _userdata: Any, _sock: Any) -> None:
        if not self._due:
            self._due = True
            self._loop.call_soon(self._write)

    def _unregister(self, _client: Any, _userdata: Any, _sock: Any) -> None:
        if self._fd >= 0:
            self._loop.remove_writer(self._fd)
            self._fd = -1

    def _write(self) -> None:
        self._due = False
        try:
            self._paho.loop_write()
        except Exception as exc:  # as aiomqtt's writer: a broken pipe is a lost connection
            if not self._client._disconnected.done():
                self._client._disconnected.set_exception(exc)
            return
        if self._fd < 0 and self._paho.want_write():  # the socket's buffer is full: wait until it drains
            sock = self._paho.socket()
            if sock is not None:
                self._fd = sock.fileno()
                self._loop.add_writer(self._fd, self._write)


State = Literal["new", "open", "closed"]


class MqttLink:
    """One connection to the broker; enter once, then publish / subscribe / iterate messages.

    aiomqtt connects, subscribes and runs paho on the event loop; the two per-message paths bypass its
    wrappers, which cost a task, an ``asyncio.wait`` and an Event per message (bench/mqtt_bench.py: a 5 KB
    message cost the publisher ~115 µs of CPU and the subscriber ~95, ~80 and ~63 without them). Received
    messages go from paho's callback into the link's inbox, ended by the connection's end after every
    message received before it; a publish hands the message to paho and awaits a future its PUBACK
    callback resolves, failed at once when the connection ends or after ``publish_timeout``. paho writes
    what it queued (publishes, the PUBACKs it owes) on the loop's next turn (``_Writes``): ~85 and ~59 µs.
    """

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
        self._inbox: asyncio.Queue[Message | None] = asyncio.Queue()
        """Messages received, in order; None once the connection ended (after every message received before)."""
        self._waiting: dict[asyncio.Future[None], str] = {}
        """Publishes awaiting their PUBACK -> topic: failed at once when the connection ends."""
        # paho's in-flight window (max_inflight): publishes beyond it would wait in paho's queue, each with a
        # PUBACK timer already running. A few dozen in flight keep the socket busy.
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
            # paho hands each message to us, not to aiomqtt's Message/Topic objects and its iterator
            # (a task and an asyncio.wait per message): ``messages`` reads this link's inbox
            client._client.on_message = self._on_message
            await client.__aenter__()
        self._client = client
        # aiomqtt resolves this future when the connection ends: publishes awaiting their PUBACK then
        # fail at once instead of waiting out publish_timeout, and the inbox ends after what it holds.
        self._disconnected = client._disconnected
        self._disconnected.add_done_callback(self._connection_ended)
        _Writes(client).install()
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
            self._inbox.put_nowait(None)
            self._retrieve_disconnect_error()

    def _on_message(self, _client: Any, _userdata: Any, message: Any) -> None:
        """paho's callback for a PUBLISH received (its PUBACK goes once this returns)."""
        payload = message.payload
        self._inbox.put_nowait(Message(message.topic, payload if type(payload) is bytes else bytes(payload),
                                       bool(message.retain)))

    def _connection_ended(self, _fut: asyncio.Future[None]) -> None:
        self._inbox.put_nowait(None)
        for waiter, topic in list(self._waiting.items()):
            if not waiter.done():
                waiter.set_exception(
                    LinkClosed(f"MQTT link {self.client_id} lost its connection before the PUBACK for {topic}"))

    def _raise_disconnected(self) -> NoReturn:
        fut = self._disconnected
        cause = fut.exception() if fut is not None and fut.done() and not fut.cancelled() else None
        raise LinkClosed(f"MQTT receive: the connection of link {self.client_id} ended") from cause

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
            # paho directly, as aiomqtt's publish does, but without its Event, wait_for task and O(n) scan of
            # pending calls per message; its PUBACK callback resolves our future (``_Acked``)
            info = client._client.publish(topic, payload, QOS, retain)
            if info.rc != MQTT_ERR_SUCCESS:
                raise aiomqtt.MqttCodeError(info.rc, "Could not publish message")
            if info.is_published():
                return
            loop = asyncio.get_running_loop()
            acked: asyncio.Future[None] = loop.create_future()
            client._pending_publishes[info.mid] = _Acked(acked)  # type: ignore[assignment]
            self._waiting[acked] = topic
            timer = loop.call_later(self.settings.publish_timeout, _expire, acked, topic)
            try:
                await acked
            finally:
                timer.cancel()
                del self._waiting[acked]
                client._pending_publishes.pop(info.mid, None)

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
        self._open()
        return _Messages(self, self._inbox)

    def drop(self) -> None:
        """Cut the connection without a DISCONNECT, as a crash would: the broker then publishes the will."""
        client = self._open()
        sock: Any = client._client.socket()
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
