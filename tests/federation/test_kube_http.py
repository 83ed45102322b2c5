"""federation.kube's requests on the event loop (``federation.keepalive.Http``): keep-alive, framing, auth refresh, timeouts, TLS.

A raw asyncio server answers exactly what each test needs, so the client's handling of each HTTP/1.1
case is seen on its own: connections reused and closed by the server while idle, chunked bodies, a
body that runs to the connection's end, a 401 that makes the client read its credentials again, a
server that never answers, and TLS checked against the kubeconfig's CA.
"""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from federation.errors import NotFound, Transport
from federation.keepalive import Conn, Slots
from federation.kube import CONFIGMAPS, Kube
from federation.settings import KubeSettings
from tests.security.tls import make_tls

Answer = Callable[["Request"], Awaitable[bytes | None]]


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    connection: int


@dataclass
class Server:
    answer: Answer
    requests: list[Request] = field(default_factory=list)
    connections: int = 0
    writers: list[asyncio.StreamWriter] = field(default_factory=list)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        number = self.connections
        self.writers.append(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                first, *lines = head.decode().split("\r\n")
                method, path, _ = first.split(" ")
                headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines if ln)}
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                request = Request(method, path, headers, body, number)
                self.requests.append(request)
                out = await self.answer(request)
                if out is None:
                    break
                writer.write(out)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    def close_idle(self) -> None:
        for writer in self.writers:
            writer.close()


def response(status: int, body: dict[str, object] | None = None, *, extra: str = "") -> bytes:
    data = json.dumps(body or {}).encode()
    return (f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n{extra}\r\n"
            .encode() + data)


def configmap(name: str) -> dict[str, object]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": "ns"}}


@pytest.fixture
async def serve(tmp_path: Path) -> AsyncIterator[Callable[..., Awaitable[tuple[Server, Path]]]]:
    servers: list[asyncio.Server] = []

    async def start(answer: Answer, *, tls: ssl.SSLContext | None = None, ca: Path | None = None,
                    token: str = "t0ken") -> tuple[Server, Path]:
        server = Server(answer)
        listening = await asyncio.start_server(server.handle, "127.0.0.1", 0, ssl=tls)
        servers.append(listening)
        port = listening.sockets[0].getsockname()[1]
        cluster: dict[str, str] = {"server": f"{'https' if tls else 'http'}://127.0.0.1:{port}"}
        if ca is not None:
            cluster["certificate-authority"] = str(ca)
        kubeconfig = tmp_path / f"kubeconfig-{port}"
        kubeconfig.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "c",
            "clusters": [{"name": "c", "cluster": cluster}],
            "users": [{"name": "u", "user": {"token": token}}],
            "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}))
        return server, kubeconfig

    yield start
    for listening in servers:
        listening.close()


async def test_connections_are_reused_and_a_closed_idle_one_is_replaced(serve) -> None:  # type: ignore[no-untyped-def]
    async def answer(request: Request) -> bytes:
        return response(200, {"metadata": {"name": request.path.rsplit("/", 1)[1]}})

    server, kubeconfig = await serve(answer)
    async with Kube(kubeconfig) as kube:
        for name in ("a", "b", "c"):
            assert (await kube.get(CONFIGMAPS, name, "ns"))["metadata"]["name"] == name
        assert server.connections == 1  # one keep-alive connection for requests in turn
        server.close_idle()  # the server drops the idle connection (its keep-alive timeout)
        await asyncio.sleep(0.05)  # real time: the client sees the server's close before its next request
        assert (await kube.get(CONFIGMAPS, "d", "ns"))["metadata"]["name"] == "d"
        assert server.connections == 2
    first = server.requests[0]
    assert first.method == "GET" and first.path == "/api/v1/namespaces/ns/configmaps/a"
    assert first.headers["authorization"] == "Bearer t0ken"
    assert first.headers["accept"] == "application/json"
    assert first.headers["user-agent"].startswith("mkd/")


async def test_chunked_and_unframed_bodies_and_error_mapping(serve) -> None:  # type: ignore[no-untyped-def]
    async def answer(request: Request) -> bytes | None:
        name = request.path.rsplit("/", 1)[1]
        if name == "chunked":
            data = json.dumps({"metadata": {"name": "chunked"}, "data": {"k": "v" * 5000}}).encode()
            chunks = b"".join(f"{len(data[i:i + 1000]):x}\r\n".encode() + data[i:i + 1000] + b"\r\n"
                              for i in range(0, len(data), 1000))
            return (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunks + b"0\r\n\r\n")
        if name == "unframed":  # no length, no chunks: the body ends with the connection
            request_writer = server.writers[request.connection - 1]
            request_writer.write(b"HTTP/1.1 200 OK\r\n\r\n" + json.dumps({"metadata": {"name": "u"}}).encode())
            await request_writer.drain()
            return None
        if name == "missing":
            return response(404, {"kind": "Status", "message": "configmaps \"missing\" not found"})
        if request.method == "POST":
            return response(201, json.loads(request.body))
        return response(503, {"message": "busy"}, extra="Retry-After: 3\r\n")

    server, kubeconfig = await serve(answer)
    async with Kube(kubeconfig) as kube:
        got = await kube.get(CONFIGMAPS, "chunked", "ns")
        assert got["data"]["k"] == "v" * 5000
        assert (await kube.get(CONFIGMAPS, "unframed", "ns"))["metadata"]["name"] == "u"
        created = await kube.create(CONFIGMAPS, configmap("made"))
        assert created["metadata"]["name"] == "made"
        assert server.connections == 2  # the unframed answer's connection was not reused
        assert server.requests[-1].body == json.dumps(configmap("made"), separators=(",", ":")).encode()
        with pytest.raises(NotFound, match="not found"):
            await kube.get(CONFIGMAPS, "missing", "ns")
        with pytest.raises(Transport) as busy:
            await kube.get(CONFIGMAPS, "other", "ns")
        assert busy.value.delay == 3.0


async def test_a_401_reads_the_credentials_again_once(serve) -> None:  # type: ignore[no-untyped-def]
    async def answer(request: Request) -> bytes:
        if request.headers.get("authorization") != "Bearer new":
            return response(401, {"message": "Unauthorized"})
        return response(200, {"metadata": {"name": "x"}})

    server, kubeconfig = await serve(answer, token="old")
    async with Kube(kubeconfig) as kube:
        with pytest.raises(Exception, match="Unauthorized"):  # read again, still refused: the 401 is the answer
            await kube.get(CONFIGMAPS, "x", "ns")
        assert [r.headers["authorization"] for r in server.requests] == ["Bearer old", "Bearer old"]
        # the token rotates (what an exec plugin's refresh hook does): the next 401 re-reads it at once
        def rotate(configuration: object) -> None:
            kube._api.configuration.api_key = {"authorization": "Bearer new"}

        kube._api.configuration.refresh_api_key_hook = rotate
        assert (await kube.get(CONFIGMAPS, "x", "ns"))["metadata"]["name"] == "x"
    assert [r.headers["authorization"] for r in server.requests[2:]] == ["Bearer old", "Bearer new"]


async def test_no_answer_within_the_timeout_is_a_transport_error(serve) -> None:  # type: ignore[no-untyped-def]
    async def answer(request: Request) -> bytes:
        await asyncio.sleep(30)  # a server that never answers in time (the client's timeout ends it)
        return response(200)

    _, kubeconfig = await serve(answer)
    async with Kube(kubeconfig, settings=KubeSettings(timeout=0.3)) as kube:
        with pytest.raises(Transport, match=r"no answer within 0\.3s"):
            await kube.get(CONFIGMAPS, "x", "ns")


async def test_tls_is_checked_against_the_kubeconfig_ca(serve, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    ca, cert, key = make_tls(tmp_path / "tls")
    other_ca, _, _ = make_tls(tmp_path / "other")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)

    async def answer(request: Request) -> bytes:
        return response(200, {"metadata": {"name": "secure"}})

    _, kubeconfig = await serve(answer, tls=context, ca=ca)
    async with Kube(kubeconfig) as kube:
        assert (await kube.get(CONFIGMAPS, "secure", "ns"))["metadata"]["name"] == "secure"
    _, untrusted = await serve(answer, tls=context, ca=other_ca)
    async with Kube(untrusted) as kube:
        with pytest.raises(Transport, match="CERTIFICATE_VERIFY_FAILED"):
            await kube.get(CONFIGMAPS, "secure", "ns")


@pytest.mark.parametrize("on_loop", [True, False])
async def test_both_request_paths_send_and_map_the_same(serve, on_loop: bool) -> None:  # type: ignore[no-untyped-def]
    """``requests_on_loop=False`` is the way back to the official client's urllib3 pool: same request, same
    answer, same error mapping."""
    async def answer(request: Request) -> bytes:
        name = request.path.rsplit("/", 1)[1]
        if name == "missing":
            return response(404, {"kind": "Status", "reason": "NotFound", "message": "configmaps \"missing\" not found"})
        return response(200, {"metadata": {"name": name}})

    server, kubeconfig = await serve(answer)
    async with Kube(kubeconfig, settings=KubeSettings(requests_on_loop=on_loop)) as kube:
        assert (kube._http is not None) is on_loop
        assert (await kube.get(CONFIGMAPS, "a", "ns"))["metadata"]["name"] == "a"
        with pytest.raises(NotFound, match="missing"):
            await kube.get(CONFIGMAPS, "missing", "ns")
    first = server.requests[0]
    assert first.method == "GET" and first.path == "/api/v1/namespaces/ns/configmaps/a"
    assert first.headers["authorization"] == "Bearer t0ken"
    assert first.headers["user-agent"].startswith("mkd/")


class _FakeTransport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.written = b""
        self.closed = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += bytes(data)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True


@pytest.mark.parametrize("response, body, keep", [
    (b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello", b"hello", True),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3;x=y\r\nhel\r\n2\r\nlo\r\n0\r\nT: 1\r\n\r\n", b"hello", True),
    (b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nhi", b"hi", False),
    (b"HTTP/1.1 204 No Content\r\n\r\n", b"", True),
])
async def test_a_response_arriving_a_byte_at_a_time_is_parsed_whole(response: bytes, body: bytes, keep: bool) -> None:
    conn, transport = Conn(), _FakeTransport()
    conn.connection_made(transport)
    for _ in range(2):  # the second on the kept connection, after the first left nothing behind
        waiter = asyncio.get_running_loop().create_future()
        conn.send(waiter, "GET", b"GET / HTTP/1.1\r\n\r\n", reused=False)
        for i in range(len(response)):
            assert not waiter.done()
            conn.data_received(response[i:i + 1])
        status, _, got, keepable = waiter.result()
        assert (status, got, keepable) == (204 if not body else 200, body, keep)
        assert not conn.buf


async def test_an_unframed_body_ends_with_the_connection_and_a_short_one_is_an_error() -> None:
    conn = Conn()
    conn.connection_made(_FakeTransport())
    waiter = asyncio.get_running_loop().create_future()
    conn.send(waiter, "GET", b"", reused=False)
    conn.data_received(b"HTTP/1.1 200 OK\r\n\r\nab")
    conn.data_received(b"c")
    assert not waiter.done()
    conn.eof_received()
    assert waiter.result()[2:] == (b"abc", False)
    short = Conn()
    short.connection_made(_FakeTransport())
    waiter = asyncio.get_running_loop().create_future()
    short.send(waiter, "GET", b"", reused=True)
    short.data_received(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nab")
    short.connection_lost(None)
    with pytest.raises(asyncio.IncompleteReadError):
        waiter.result()


async def test_at_most_max_concurrency_requests_are_in_flight_and_the_rest_go_in_turn(serve) -> None:  # type: ignore[no-untyped-def]
    gate = asyncio.Event()
    in_flight = peak = 0

    async def answer(request: Request) -> bytes:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await gate.wait()
        in_flight -= 1
        return response(200, {"metadata": {"name": request.path.rsplit("/", 1)[1]}})

    server, kubeconfig = await serve(answer)
    async with Kube(kubeconfig, settings=KubeSettings(max_concurrency=2)) as kube:
        tasks = [asyncio.create_task(kube.get(CONFIGMAPS, f"c{i}", "ns")) for i in range(6)]
        await asyncio.sleep(0.1)  # real time: more requests, had they been let through, reach the server now
        assert len(server.requests) == 2  # the other four wait for a slot
        tasks[3].cancel()  # one gives up while waiting: it takes no slot with it
        gate.set()
        done = await asyncio.gather(*tasks, return_exceptions=True)
        assert isinstance(done[3], asyncio.CancelledError)
        assert [d["metadata"]["name"] for i, d in enumerate(done) if i != 3] == ["c0", "c1", "c2", "c4", "c5"]
        assert [r.path.rsplit("/", 1)[1] for r in server.requests] == ["c0", "c1", "c2", "c4", "c5"]  # in turn
        assert peak == 2
        gate.clear()
        again = [asyncio.create_task(kube.get(CONFIGMAPS, f"d{i}", "ns")) for i in range(3)]
        await asyncio.sleep(0.1)  # real time: the freed slots' requests reach the server
        assert len(server.requests) == 7  # both slots are free again
        gate.set()
        await asyncio.gather(*again)


async def test_a_slot_handed_to_a_waiter_cancelled_before_it_ran_goes_to_the_next() -> None:
    slots = Slots(1)
    await slots.acquire()
    second = asyncio.create_task(slots.acquire())
    third = asyncio.create_task(slots.acquire())
    await asyncio.sleep(0)
    slots.release()  # handed to the second waiter...
    second.cancel()  # ...which is cancelled before it runs: the slot must not be lost
    await asyncio.sleep(0)
    await asyncio.wait_for(third, 1)
    slots.release()
    await asyncio.wait_for(slots.acquire(), 1)  # one slot, free again
    assert second.cancelled()
