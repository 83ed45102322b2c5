"""kubesim's HTTP/1.1 front end: one asyncio protocol per connection that parses requests, hands each to
the API server's handler on the connection's own task and writes the answer.

kubesim answers every request from memory in a few tens of microseconds, so a general web framework's
per-request machinery (a task per request, a streaming payload reader, middleware-ready request and
response objects) was most of its CPU per request. This module keeps only what the Kubernetes API over
plain HTTP needs: Content-Length and chunked request bodies (read whole before the handler runs, at most
``MAX_BODY``), ``Expect: 100-continue``, keep-alive (HTTP/1.1 by default, HTTP/1.0 when asked),
pipelined requests answered in order, and chunked streaming answers for watches (:class:`StreamResponse`,
with the transport's flow control). Answers carry the headers aiohttp's server wrote when kubesim used it
(``Content-Length``, ``Date``, ``Server``, ``Connection`` when it differs from the version's default); the
handler reads the request through :class:`Request`, whose ``path`` and ``query`` are decoded exactly as
aiohttp decoded them (through yarl whenever a ``%`` or ``+`` is present)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl as ssl_module
from collections import deque
from collections.abc import Awaitable, Callable
from http import HTTPStatus
from typing import Any

from aiohttp.helpers import parse_content_type, rfc822_formatted_time
from aiohttp.http import SERVER_SOFTWARE
from multidict import MultiDict
from yarl import URL

log = logging.getLogger("kubesim.http")

MAX_BODY = 64 * 1024 * 1024
MAX_HEAD = 64 * 1024
"""Bytes of request line and headers accepted before the request is refused (aiohttp: 8 KiB per line)."""
SHUTDOWN_SECONDS = 60.0
"""How long ``HttpServer.close`` lets requests being served finish (aiohttp's runner waited as long)."""

Handler = Callable[["Request"], Awaitable[Any]]

_CONTENT_TYPES: dict[str, str] = {}


class BadRequest(Exception):
    """A request that cannot be parsed (400) or whose body is too large (413): answered, and the connection
    closed."""

    def __init__(self, message: str, status: int = 400, version: tuple[int, int] = (1, 0)) -> None:
        super().__init__(message)
        self.status = status
        self.version = version  # of the status line: 1.0 when the request line itself did not parse


class Headers(dict[str, str]):
    """A request's headers by lower-cased name, read case-insensitively (the first of a repeated header)."""

    __slots__ = ()

    def get(self, name: str, default: Any = None) -> Any:  # type: ignore[override]
        return dict.get(self, name.lower(), default)

    def __getitem__(self, name: str) -> str:
        return dict.__getitem__(self, name.lower())

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and dict.__contains__(self, name.lower())


class Request:
    """One parsed request, with the part of aiohttp's request interface the API server reads."""

    __slots__ = ("_body", "_query", "conn", "headers", "keep_alive", "method", "path", "query_string",
                 "raw_target", "transport", "version")

    def __init__(self, method: str, target: str, version: tuple[int, int], headers: Headers,
                 conn: Connection) -> None:
        self.method = method
        self.conn = conn
        self.raw_target = target
        self.version = version
        self.headers = headers
        self.transport = conn.transport
        self._body = b""
        self._query: MultiDict[str] | None = None
        how = headers.get("Connection", "").lower()
        self.keep_alive = ("close" not in how) if version >= (1, 1) else ("keep-alive" in how)
        path, _, query = target.partition("?")
        if "%" in path or "#" in target or "%" in query or "+" in query or not path.startswith("/"):
            url = _url(target)  # what aiohttp's parser builds for the target, decoded the same way
            self.path = url.path
            self.query_string = url.query_string
            self._query = MultiDict(url.query)
        else:
            self.path = path
            self.query_string = query

    @property
    def query(self) -> MultiDict[str]:
        """The query parameters (``a=1&&b`` -> a: "1", b: ""), as yarl parses an undecorated query."""
        q = self._query
        if q is None:
            pairs = []
            for part in self.query_string.split("&"):
                if part:
                    k, _, v = part.partition("=")
                    pairs.append((k, v))
            q = self._query = MultiDict(pairs)
        return q

    @property
    def content_type(self) -> str:
        """The media type of Content-Type without parameters (``application/octet-stream`` when absent)."""
        raw = self.headers.get("Content-Type")
        if raw is None:
            return "application/octet-stream"
        got = _CONTENT_TYPES.get(raw)
        if got is None:
            got = parse_content_type(raw)[0]
            if len(_CONTENT_TYPES) < 256:
                _CONTENT_TYPES[raw] = got
        return got

    async def read(self) -> bytes:
        return self._body


_PHRASES = {s.value: s.phrase for s in HTTPStatus}


class ResponseHeaders:
    """A response's headers in order, repeats allowed (one ``Warning`` header per warning)."""

    __slots__ = ("pairs",)

    def __init__(self, init: dict[str, str] | None = None) -> None:
        self.pairs: list[tuple[str, str]] = list(init.items()) if init else []

    def add(self, name: str, value: str) -> None:
        self.pairs.append((name, value))

    def items(self) -> list[tuple[str, str]]:
        return self.pairs

    def get(self, name: str, default: str | None = None) -> str | None:
        low = name.lower()
        return next((v for k, v in self.pairs if k.lower() == low), default)

    def __contains__(self, name: object) -> bool:
        low = str(name).lower()
        return any(k.lower() == low for k, _ in self.pairs)

    def __setitem__(self, name: str, value: str) -> None:
        low = name.lower()
        self.pairs = [(k, v) for k, v in self.pairs if k.lower() != low]
        self.pairs.append((name, value))


class Response:
    """A whole answer: what ``aiohttp.web.Response(body=..., status=..., content_type=..., headers=...)`` or
    ``(text=...)`` made, written with the same headers, without aiohttp's per-response machinery."""

    __slots__ = ("body", "headers", "status")
    prepared = False  # never streamed

    def __init__(self, *, body: bytes | None = None, status: int = 200, content_type: str | None = None,
                 headers: dict[str, str] | None = None, text: str | None = None) -> None:
        if text is not None:
            body = text.encode()
            content_type = f"{content_type or 'text/plain'}; charset=utf-8"
        self.body = body or b""
        self.status = status
        self.headers = ResponseHeaders(headers)
        if content_type:
            self.headers["Content-Type"] = content_type

    @property
    def reason(self) -> str:
        return _PHRASES.get(self.status, "")


def _url(target: str) -> URL:
    """The URL aiohttp's request parser built for a request target (origin-form split as it split it)."""
    if not target.startswith("/"):
        return URL(target)
    path, sep, rest = target.partition("?")
    if sep:
        query, _, fragment = rest.partition("#")
    else:
        path, _, fragment = path.partition("#")
        query = ""
    return URL.build(path=path, query_string=query, fragment=fragment, encoded=True)


def _head(status: int, reason: str, version: tuple[int, int], headers: Any, keep_alive: bool) -> list[str]:
    """The status line and headers as aiohttp wrote them (Date and Server unless set, Connection when the
    connection's fate differs from the version's default)."""
    lines = [f"HTTP/{version[0]}.{version[1]} {status} {reason}"]
    names = set()
    for k, v in headers.items():
        lines.append(f"{k}: {v}")
        names.add(k.lower())
    if "date" not in names:
        lines.append(f"Date: {rfc822_formatted_time()}")
    if "server" not in names:
        lines.append(f"Server: {SERVER_SOFTWARE}")
    if "connection" not in names:
        if keep_alive and version == (1, 0):
            lines.append("Connection: keep-alive")
        elif not keep_alive and version >= (1, 1):
            lines.append("Connection: close")
    return lines


class StreamResponse:
    """A chunked answer written as it goes (watches): ``prepare``, ``write`` and ``write_eof``."""

    def __init__(self, headers: dict[str, str] | None = None, status: int = 200) -> None:
        self.status = status
        self.headers = ResponseHeaders(headers)
        self.prepared = False
        self._conn: Connection | None = None

    def enable_chunked_encoding(self) -> None:
        """Always chunked (kept for the handler's aiohttp-shaped code)."""

    async def prepare(self, request: Request) -> None:
        conn = request.conn
        self._conn = conn
        self.prepared = True
        self.headers["Transfer-Encoding"] = "chunked"
        lines = _head(self.status, _PHRASES.get(self.status, ""), request.version, self.headers,
                      request.keep_alive)
        conn.write(("\r\n".join(lines) + "\r\n\r\n").encode("utf-8", "surrogateescape"))
        await conn.drain()

    async def write(self, data: bytes) -> None:
        conn = self._conn
        assert conn is not None
        if data:
            conn.write(b"%x\r\n%b\r\n" % (len(data), data))
            await conn.drain()

    async def write_eof(self) -> None:
        conn = self._conn
        assert conn is not None
        conn.write(b"0\r\n\r\n")
        await conn.drain()


class Connection(asyncio.Protocol):
    """One client connection: parses what arrives, serves requests in order on one task."""

    def __init__(self, server: HttpServer) -> None:
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.pending: deque[Request | BadRequest] = deque()
        self.current: Request | None = None  # parsed head, body still arriving
        self.need = 0  # body bytes still expected for ``current`` (-1: chunked)
        self.waiter: asyncio.Future[None] | None = None
        self.task: asyncio.Task[None] | None = None
        self.busy = False
        self.closed = False
        self.broken = False
        self._paused = False
        self._drain: asyncio.Future[None] | None = None
        self._chunk_left = -1  # bytes left in the chunk being read; -1: a size line next, -2: trailers
        self._chunked_body: bytearray | None = None

    # ---------------------------------------------------------------- asyncio callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.server.connections.add(self)
        self.task = self.server.loop.create_task(self._serve())

    def connection_lost(self, exc: BaseException | None) -> None:
        self.closed = True
        self.transport = None
        self.server.connections.discard(self)
        self._wake()
        d = self._drain
        if d is not None and not d.done():
            d.set_exception(ConnectionResetError("Connection lost"))

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        d = self._drain
        if d is not None and not d.done():
            d.set_result(None)

    def data_received(self, data: bytes) -> None:
        if self.broken:
            return  # the connection closes once the requests before the broken one are answered
        self.buf += data
        try:
            self._parse()
        except BadRequest as e:
            self.pending.append(e)
            self.buf.clear()
            self.broken = True
        if self.pending:
            self._wake()

    # ---------------------------------------------------------------- parsing

    def _parse(self) -> None:
        buf = self.buf
        while True:
            req = self.current
            if req is None:
                end = buf.find(b"\r\n\r\n")
                if end < 0:
                    if len(buf) > MAX_HEAD:
                        raise BadRequest("request head too large")
                    return
                req = self._head(bytes(buf[:end]))
                del buf[:end + 4]
                self.current = req
            if self.need == -1:
                if not self._chunks(req):
                    return
            elif self.need:
                if len(buf) < self.need:
                    return
                req._body = bytes(buf[:self.need])
                del buf[:self.need]
                self.need = 0
            self.current = None
            self.pending.append(req)

    def _head(self, head: bytes) -> Request:
        text = head.decode("utf-8", "surrogateescape")
        lines = text.split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            raise BadRequest(f"bad request line {lines[0][:100]!r}")
        method, target, proto = parts
        version = (1, 1) if proto == "HTTP/1.1" else (1, 0)
        headers = Headers()
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep or not name or name[-1] in " \t":
                raise BadRequest(f"bad header line {line[:100]!r}")
            headers.setdefault(name.lower(), value.strip(" \t"))
        req = Request(method, target, version, headers, self)
        te = headers.get("Transfer-Encoding")
        if te is not None and te.lower() == "chunked":
            self.need = -1
            self._chunk_left = -1
        else:
            cl = headers.get("Content-Length")
            if cl is not None:
                if not cl.isdigit():
                    raise BadRequest("bad Content-Length")
                self.need = int(cl)
                if self.need > MAX_BODY:
                    raise BadRequest(f"Maximum request body size {MAX_BODY} exceeded, actual body size "
                                     f"{self.need}", 413, version)
        expect = headers.get("Expect")
        if expect and version >= (1, 1):  # what aiohttp's default expect handler did
            if expect.lower() != "100-continue":
                raise BadRequest(f"Unknown Expect: {expect}", 417, version)
            if self.transport is not None:
                self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        return req

    def _chunks(self, req: Request) -> bool:
        """Decode a chunked body as far as it has arrived; True once complete (trailers dropped)."""
        buf = self.buf
        body = self._chunked_body
        if body is None:
            body = self._chunked_body = bytearray()
        while True:
            if self._chunk_left == -1:
                end = buf.find(b"\r\n")
                if end < 0:
                    return False
                size_text = bytes(buf[:end]).split(b";", 1)[0].strip()
                try:
                    size = int(size_text, 16)
                except ValueError:
                    raise BadRequest("bad chunk size") from None
                del buf[:end + 2]
                if size == 0:
                    self._chunk_left = -2
                else:
                    self._chunk_left = size
            if self._chunk_left == -2:  # trailers until an empty line
                end = buf.find(b"\r\n")
                if end < 0:
                    return False
                del buf[:end + 2]
                if end == 0:
                    req._body = bytes(body)
                    self._chunked_body = None
                    self.need = 0
                    return True
                continue
            if len(buf) < self._chunk_left + 2:
                return False
            body += buf[:self._chunk_left]
            if len(body) > MAX_BODY:
                raise BadRequest(f"Maximum request body size {MAX_BODY} exceeded", 413)
            del buf[:self._chunk_left + 2]
            self._chunk_left = -1

    # ---------------------------------------------------------------- serving

    def _wake(self) -> None:
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(None)

    def write(self, data: bytes) -> None:
        t = self.transport
        if t is None or t.is_closing():
            raise ConnectionResetError("Cannot write to closing transport")
        t.write(data)

    async def drain(self) -> None:
        if self._paused and not self.closed:
            d = self._drain = self.server.loop.create_future()
            try:
                await d
            finally:
                self._drain = None

    async def _serve(self) -> None:
        loop = self.server.loop
        handler = self.server.handler
        try:
            while not self.closed:
                if not self.pending:
                    self.waiter = loop.create_future()
                    try:
                        await self.waiter
                    finally:
                        self.waiter = None
                    continue
                req = self.pending.popleft()
                if isinstance(req, BadRequest):
                    self._answer_plain(req)
                    self._close()
                    return
                self.busy = True
                try:
                    resp = await handler(req)
                    if isinstance(resp, StreamResponse):
                        keep = req.keep_alive and resp.prepared
                    else:
                        keep = req.keep_alive
                        self._answer(req, resp, keep)
                except (ConnectionResetError, asyncio.CancelledError):
                    raise
                except Exception:
                    log.exception("kubesim: serving %s %s failed", req.method, req.path)
                    self._close()
                    return
                finally:
                    self.busy = False
                if not keep:
                    self._close()
                    return
        except (ConnectionResetError, asyncio.CancelledError):
            self._close()

    def _answer(self, req: Request, resp: Response, keep: bool) -> None:
        body = resp.body
        headers = resp.headers
        if body and not any(k.lower() == "content-type" for k, _ in headers.pairs):
            headers.add("Content-Type", "application/octet-stream")
        headers.add("Content-Length", str(len(body)))
        head = "\r\n".join(_head(resp.status, resp.reason, req.version, headers, keep)) + "\r\n\r\n"
        data = head.encode("utf-8", "surrogateescape")
        self.write(data + body if req.method != "HEAD" else data)

    def _answer_plain(self, e: BadRequest) -> None:
        body = (str(e) if e.status == 417 else f"{e.status}, message: {e}").encode()
        headers = {"Content-Type": "text/plain; charset=utf-8", "Content-Length": str(len(body))}
        head = "\r\n".join(_head(e.status, _PHRASES[e.status], e.version, headers, False)) + "\r\n\r\n"
        with contextlib.suppress(ConnectionResetError):
            self.write(head.encode() + body)

    def _close(self) -> None:
        self.closed = True
        t = self.transport
        if t is not None and not t.is_closing():
            t.close()


class HttpServer:
    """The listening socket of one cluster and its connections."""

    def __init__(self, handler: Handler, loop: asyncio.AbstractEventLoop) -> None:
        self.handler = handler
        self.loop = loop
        self.connections: set[Connection] = set()
        self._server: asyncio.base_events.Server | None = None

    async def start(self, host: str, port: int, backlog: int = 1024, ssl: ssl_module.SSLContext | None = None) -> None:
        self._server = await self.loop.create_server(lambda: Connection(self), host, port, reuse_address=True,
                                                     backlog=backlog, ssl=ssl)

    async def close(self) -> None:
        """Stop listening, close idle connections, let requests being served finish (up to
        ``SHUTDOWN_SECONDS``), then close the rest."""
        if self._server is not None:
            self._server.close()
        deadline = self.loop.time() + SHUTDOWN_SECONDS
        while True:
            for c in list(self.connections):
                if not c.busy:
                    c._close()
                    if c.task is not None:
                        c.task.cancel()
            if not any(c.busy for c in self.connections) or self.loop.time() >= deadline:
                break
            await asyncio.sleep(0.05)
        for c in list(self.connections):
            if c.transport is not None:
                c.transport.abort()
            if c.task is not None:
                c.task.cancel()
        if self._server is not None:
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
            self._server = None
