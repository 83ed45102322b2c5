"""HTTP/1.1 on the event loop: keep-alive connections as asyncio protocols, for :mod:`federation.kube`'s requests.

:class:`Http` sends a request over a connection it keeps (LIFO, at most ``limit`` at once, taken in turn through
:class:`Slots`), set up from the official client's ``Configuration`` (host and path prefix, the TLS checks and
files its urllib3 pool would use); :class:`Conn` parses the response as its bytes arrive (Content-Length,
chunked, or until the connection's end) and hands it over through one future. Socket, TLS, framing and time-out
failures raise :class:`~federation.errors.Transport`; a reused connection the server had closed while idle is
replaced without the caller seeing it. It knows nothing of Kubernetes: headers, authentication included, come
from the caller.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import ssl
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from federation.errors import Transport
from federation.tasks import park, wake_first

_HEAD_LIMIT = 1 << 20
"""Bytes of status line and headers (or of one chunk-size or trailer line) accepted before a response is refused."""

Response = tuple[int, dict[str, str], bytes, bool]
"""status, headers with lower-case names, body, and whether the connection may be kept (HTTP/1.1 and the body's
end was marked, not the connection's close)."""


class _Stale(Exception):
    """A reused connection the server had closed before it read the request: send it on a new one."""


class Conn(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection, an asyncio protocol: the response to the request in flight is parsed
    as its bytes arrive and handed over through one future (no stream reader and writer, one await a request)."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.eof = False
        self.error: BaseException | None = None
        """Why the connection was lost, when it was not a clean close."""
        self.waiter: asyncio.Future[Response] | None = None
        self.method = ""
        self.reused = False
        self.status = 0
        self.http11 = False
        self.headers: dict[str, str] = {}
        self.framing = 0
        """Of the response being read: 0 head, 1 Content-Length, 2 chunked, 3 until the connection's end."""
        self.length = 0
        """Content-Length, or the size of the chunk being read (-1: its size line comes next, -2: trailers)."""
        self.parts: list[bytes] = []

    # --- asyncio.Protocol ---

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if self.waiter is not None:
            self.advance()

    def eof_received(self) -> bool | None:
        self.eof = True
        self.advance()
        return None  # let the transport close

    def connection_lost(self, exc: Exception | None) -> None:
        self.eof = True
        if exc is not None and self.error is None:
            self.error = exc
        self.advance()

    # --- one exchange ---

    def alive(self) -> bool:
        return not self.eof and self.transport is not None and not self.transport.is_closing()

    def close(self) -> None:
        if self.transport is not None:
            with contextlib.suppress(Exception):
                self.transport.close()

    def send(self, waiter: asyncio.Future[Response], method: str, data: bytes, reused: bool) -> None:
        """Write a request; ``waiter`` gets its response (or the error that ended it)."""
        if self.transport is None or self.transport.is_closing():
            raise ConnectionResetError("Connection lost")
        self.waiter, self.method, self.reused, self.framing = waiter, method, reused, 0
        self.transport.write(data)
        if self.buf or self.eof:
            self.advance()

    def advance(self) -> None:
        waiter = self.waiter
        if waiter is None:
            return
        if waiter.done():  # timed out or cancelled
            self.waiter = None
            return
        try:
            response = self._parse()
        except (_Stale, OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as exc:
            self.waiter = None
            waiter.set_exception(exc)
            return
        if response is not None:
            self.waiter = None
            waiter.set_result(response)

    def _short(self, line: bool) -> None:
        """The response is not complete in the buffer: raise if it never will be."""
        if line and len(self.buf) > _HEAD_LIMIT:
            raise asyncio.LimitOverrunError("no line end within the limit", len(self.buf))
        if self.error is not None:
            raise self.error
        if self.eof:
            raise asyncio.IncompleteReadError(bytes(self.buf), None)

    def _parse(self) -> Response | None:
        buf = self.buf
        if self.framing == 0:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                if self.reused and (isinstance(self.error, ConnectionError) or (self.eof and self.error is None and not buf)):
                    raise _Stale()  # closed while idle: the request never reached the server
                self._short(True)
                return None
            status_line, *lines = buf[:end].decode("latin-1").split("\r\n")
            del buf[:end + 4]
            version, _, rest = status_line.partition(" ")
            self.status = status = int(rest.split(" ", 1)[0])
            self.headers = headers = {}
            for field_line in lines:
                name, sep, value = field_line.partition(":")
                if sep:
                    headers[name.strip().lower()] = value.strip()
            self.http11 = version == "HTTP/1.1"
            if self.method == "HEAD" or status in (204, 304) or 100 <= status < 200:
                return status, headers, b"", self.http11
            if headers.get("transfer-encoding", "").lower() == "chunked":
                self.framing, self.length, self.parts = 2, -1, []
            elif (length := headers.get("content-length")) is not None:
                self.framing, self.length = 1, int(length)
                if self.length < 0:
                    raise ValueError(f"negative Content-Length {length}")
            else:
                self.framing = 3
        if self.framing == 1:
            n = self.length
            if len(buf) < n:
                self._short(False)
                return None
            body = bytes(buf[:n])
            del buf[:n]
            return self.status, self.headers, body, self.http11
        if self.framing == 2:
            while True:
                if self.length == -2:  # trailers, then the blank line
                    i = buf.find(b"\r\n")
                    if i < 0:
                        break
                    del buf[:i + 2]
                    if i == 0:
                        body, self.parts = b"".join(self.parts), []
                        return self.status, self.headers, body, self.http11
                    continue
                if self.length == -1:
                    i = buf.find(b"\r\n")
                    if i < 0:
                        break
                    size = int(bytes(buf[:i]).split(b";", 1)[0].strip(), 16)
                    del buf[:i + 2]
                    self.length = size if size else -2
                    continue
                if len(buf) < self.length + 2:
                    self._short(False)
                    return None
                self.parts.append(bytes(buf[:self.length]))
                del buf[:self.length + 2]
                self.length = -1
            self._short(True)
            return None
        if self.error is not None:
            raise self.error
        if not self.eof:
            return None
        body = bytes(buf)
        buf.clear()
        return self.status, self.headers, body, False  # until the server closed the connection


def _expire(waiter: asyncio.Future[Response]) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError())


class Slots:
    """At most ``limit`` holders at once, the others served in turn (what ``asyncio.Semaphore`` does).

    A free slot is taken with no await and no scan. Python 3.11's Semaphore checks every waiter for
    cancellation on each acquire while any wait (``locked()``): with an apply loop's workers queued on
    the connections that was 2 % of an agent's samples. A released slot goes straight to the
    first waiter (no race with a newcomer); a waiter cancelled after it was handed one passes it on.
    """

    __slots__ = ("_free", "_waiters")

    def __init__(self, limit: int) -> None:
        self._free = limit
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()

    async def acquire(self) -> None:
        if self._free > 0 and not self._waiters:
            self._free -= 1
            return
        await park(self._waiters, self.release)  # handed a slot, then cancelled before running: the next takes it

    def release(self) -> None:
        if not wake_first(self._waiters):
            self._free += 1


class Http:
    """HTTP/1.1 requests over asyncio protocols (:class:`Conn`), keep-alive connections reused (LIFO, at most
    ``limit`` at once).

    Built from the official client's ``Configuration``: the host (with any path prefix), the TLS
    checks and files the client's own urllib3 pool would use (CA file or data, client certificate and
    key, ``verify_ssl``, ``assert_hostname``, ``tls_server_name``). Headers, authentication included,
    are given per request by the caller. Socket, TLS and protocol failures raise ``Transport``.
    """

    def __init__(self, configuration: Any, limit: int) -> None:
        url = urlsplit(configuration.host)
        self.tls = url.scheme == "https"
        self.host = url.hostname or "localhost"
        self.port = url.port or (443 if self.tls else 80)
        self.prefix = url.path.rstrip("/")
        self.authority = url.netloc.rpartition("@")[2]
        self.ssl: ssl.SSLContext | None = None
        self.server_hostname: str | None = None
        if self.tls:
            self.ssl = self._context(configuration)
            assert_hostname = configuration.assert_hostname
            self.server_hostname = (configuration.tls_server_name
                                    or (assert_hostname if isinstance(assert_hostname, str) else None) or self.host)
        self._idle: list[Conn] = []
        self._slots = Slots(limit)
        self._limit = limit

    @staticmethod
    def _context(configuration: Any) -> ssl.SSLContext:
        if configuration.verify_ssl:
            context = ssl.create_default_context(cafile=configuration.ssl_ca_cert,
                                                 cadata=getattr(configuration, "ca_cert_data", None))
            if configuration.assert_hostname is False:
                context.check_hostname = False
        else:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        if configuration.cert_file:
            context.load_cert_chain(configuration.cert_file, configuration.key_file)
        return context

    def close(self) -> None:
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    @staticmethod
    def header_block(headers: Mapping[str, str]) -> bytes:
        """``headers`` as the lines of a request head (what ``request`` takes; built once, reused)."""
        return "".join(f"{k}: {v}\r\n" for k, v in headers.items()).encode("latin-1")

    async def request(self, method: str, path: str, headers: bytes, body: bytes | None,
                      within: float) -> tuple[int, dict[str, str], bytes]:
        """(status, headers with lower-case names, body); ``headers`` as ``header_block`` made them.
        Raises Transport when no answer came ``within`` s."""
        length = f"Content-Length: {len(body or b'')}\r\n" if body is not None or method in ("POST", "PUT", "PATCH") \
            else ""
        data = b"".join((f"{method} {self.prefix}{path} HTTP/1.1\r\nHost: {self.authority}\r\n".encode("latin-1"),
                         headers, length.encode("latin-1"), b"\r\n", body or b""))
        await self._slots.acquire()
        try:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + within
            try:
                while True:
                    conn = self._take()
                    reused = conn is not None
                    if conn is None:
                        async with asyncio.timeout_at(deadline):
                            _, conn = await loop.create_connection(
                                Conn, self.host, self.port, ssl=self.ssl, server_hostname=self.server_hostname)
                    try:
                        return await self._exchange(loop, conn, method, data, reused, deadline)
                    except _Stale:
                        continue
            except TimeoutError:
                raise Transport(f"no answer within {within:g}s") from None
            except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as exc:
                raise Transport(f"{type(exc).__name__}: {exc}") from None
        finally:
            self._slots.release()

    def _take(self) -> Conn | None:
        while self._idle:
            conn = self._idle.pop()
            if conn.alive():
                return conn
            conn.close()
        return None

    async def _exchange(self, loop: asyncio.AbstractEventLoop, conn: Conn, method: str, data: bytes, reused: bool,
                        deadline: float) -> tuple[int, dict[str, str], bytes]:
        keep = False
        try:
            waiter: asyncio.Future[Response] = loop.create_future()
            conn.send(waiter, method, data, reused)
            timer = loop.call_at(deadline, _expire, waiter)
            try:
                status, headers, body, keepable = await waiter
            finally:
                timer.cancel()
            keep = keepable and headers.get("connection", "").lower() != "close"
            return status, headers, body
        finally:
            if keep and len(self._idle) < self._limit:
                self._idle.append(conn)
            else:
                conn.close()
