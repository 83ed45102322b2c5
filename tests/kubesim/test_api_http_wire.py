"""kubesim's HTTP/1.1 framing as a raw client sees it (kubesim/httpserver.py): keep-alive and pipelined
requests answered in order, chunked request bodies, ``Connection: close`` and HTTP/1.0, the response
headers (Content-Length, Content-Type, Date, Server), percent-encoded paths and queries decoded as before,
a watch streamed in chunks, and a request line that is not HTTP answered 400. These held with the aiohttp
server kubesim used before its own front end, and must keep holding."""

from __future__ import annotations

import socket
import time
from urllib.parse import urlsplit

import orjson
import pytest

import kubesim

pytestmark = pytest.mark.kubesim_only("speaks raw HTTP to kubesim's server")

AUTH = "Host: kubesim\r\nAuthorization: Bearer kubesim-sim\r\nUser-Agent: raw-wire-test/1\r\n"


def connect(sim: kubesim.Sim) -> socket.socket:
    url = urlsplit(sim.url("sim"))
    assert url.hostname is not None and url.port is not None
    return socket.create_connection((url.hostname, url.port), timeout=10)


def read_response(s: socket.socket, buf: bytes = b"") -> tuple[str, dict[str, str], bytes, bytes]:
    """One Content-Length answer: (status line, headers by lower-cased name, body, what followed it)."""
    while b"\r\n\r\n" not in buf:
        chunk = s.recv(65536)
        assert chunk, f"connection closed before a full head: {buf!r}"
        buf += chunk
    head, _, rest = buf.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    length = int(headers["content-length"])
    while len(rest) < length:
        chunk = s.recv(65536)
        assert chunk
        rest += chunk
    return lines[0], headers, rest[:length], rest[length:]


def closed_by_server(s: socket.socket, leftover: bytes = b"") -> bool:
    assert leftover == b""
    try:
        return s.recv(1) == b""
    except ConnectionResetError:
        return True


def test_keep_alive_and_pipelined_requests_answered_in_order(sim: kubesim.Sim) -> None:
    with connect(sim) as s:
        s.sendall((f"GET /api/v1/namespaces/default HTTP/1.1\r\n{AUTH}\r\n"
                   f"GET /api/v1/namespaces/kube-system HTTP/1.1\r\n{AUTH}\r\n").encode())
        status1, headers1, body1, rest = read_response(s)
        status2, _, body2, rest = read_response(s, rest)
        assert status1 == status2 == "HTTP/1.1 200 OK"
        assert orjson.loads(body1)["metadata"]["name"] == "default"
        assert orjson.loads(body2)["metadata"]["name"] == "kube-system"
        assert headers1["content-type"] == "application/json"
        assert headers1["content-length"] == str(len(body1))
        assert "date" in headers1 and headers1["server"].startswith("Python/")
        assert "connection" not in headers1  # HTTP/1.1 keeps the connection by default
        # ... and the same connection serves a third request afterwards.
        s.sendall(f"GET /version HTTP/1.1\r\n{AUTH}\r\n".encode())
        status3, _, body3, _ = read_response(s, rest)
        assert status3 == "HTTP/1.1 200 OK" and orjson.loads(body3)["major"] == "1"


def test_chunked_request_body(sim: kubesim.Sim) -> None:
    body = orjson.dumps({"metadata": {"name": "chunked-body"}, "data": {"k": "v" * 100}})
    chunks = b"".join(b"%x\r\n%b\r\n" % (len(body[i:i + 17]), body[i:i + 17]) for i in range(0, len(body), 17))
    with connect(sim) as s:
        s.sendall((f"POST /api/v1/namespaces/default/configmaps HTTP/1.1\r\n{AUTH}"
                   "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n").encode())
        s.sendall(chunks[:40])
        time.sleep(0.05)  # the body arrives in pieces
        s.sendall(chunks[40:] + b"0\r\n\r\n")
        status, _, got, _ = read_response(s)
    assert status == "HTTP/1.1 201 Created"
    assert orjson.loads(got)["data"] == {"k": "v" * 100}


def test_connection_close_and_http_1_0(sim: kubesim.Sim) -> None:
    with connect(sim) as s:
        s.sendall(f"GET /version HTTP/1.1\r\n{AUTH}Connection: close\r\n\r\n".encode())
        status, headers, _, rest = read_response(s)
        assert status == "HTTP/1.1 200 OK" and headers["connection"] == "close"
        assert closed_by_server(s, rest)
    with connect(sim) as s:  # HTTP/1.0 closes unless asked to keep the connection
        s.sendall(f"GET /version HTTP/1.0\r\n{AUTH}\r\n".encode())
        status, headers, _, rest = read_response(s)
        assert status == "HTTP/1.0 200 OK" and "connection" not in headers
        assert closed_by_server(s, rest)
    with connect(sim) as s:
        s.sendall(f"GET /version HTTP/1.0\r\n{AUTH}Connection: keep-alive\r\n\r\n".encode())
        status, headers, _, rest = read_response(s)
        assert status == "HTTP/1.0 200 OK" and headers["connection"] == "keep-alive"
        s.sendall(f"GET /healthz HTTP/1.0\r\n{AUTH}\r\n".encode())
        status, headers, body, rest = read_response(s, rest)
        assert status == "HTTP/1.0 200 OK" and body == b"ok"
        assert headers["content-type"] == "text/plain; charset=utf-8"


def test_percent_encoded_path_and_query(sim: kubesim.Sim) -> None:
    store = sim.cluster("sim").store
    sim.run(lambda: store.create("configmaps", {"metadata": {"name": "enc-a", "namespace": "default",
                                                             "labels": {"tier": "a b"[:1]}}}))
    with connect(sim) as s:
        s.sendall(f"GET /api/v1/namespaces/default/configmaps?labelSelector=tier%3Da&limit=5 HTTP/1.1\r\n{AUTH}\r\n"
                  f"GET /api/v1/namespaces/def%61ult/configmaps/enc-%61 HTTP/1.1\r\n{AUTH}\r\n".encode())
        status, _, body, rest = read_response(s)
        assert status == "HTTP/1.1 200 OK"
        assert [i["metadata"]["name"] for i in orjson.loads(body)["items"]] == ["enc-a"]
        status, _, body, _ = read_response(s, rest)
        assert status == "HTTP/1.1 200 OK" and orjson.loads(body)["metadata"]["name"] == "enc-a"


def test_watch_streams_chunks(sim: kubesim.Sim) -> None:
    store = sim.cluster("sim").store
    with connect(sim) as s:
        s.sendall(f"GET /api/v1/namespaces/default/configmaps?watch=true&fieldSelector=metadata.name%3Dwatched"
                  f"&timeoutSeconds=2 HTTP/1.1\r\n{AUTH}\r\n".encode())
        buf = b""
        while b"\r\n\r\n" not in buf:
            buf += s.recv(65536)
        head, _, rest = buf.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 OK\r\n")
        assert b"Transfer-Encoding: chunked" in head and b"Content-Type: application/json" in head
        sim.run(lambda: store.create("configmaps", {"metadata": {"name": "watched", "namespace": "default"}}))
        while not rest.endswith(b"0\r\n\r\n"):  # the stream ends after timeoutSeconds
            chunk = s.recv(65536)
            assert chunk
            rest += chunk
    events = []
    while rest:
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            break
        events += [orjson.loads(line) for line in rest[:size].splitlines()]
        rest = rest[size + 2:]
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [("ADDED", "watched")]


def test_not_http_is_400(sim: kubesim.Sim) -> None:
    with connect(sim) as s:
        s.sendall(b"HELLO\r\n\r\n")
        buf = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            buf += chunk
    assert buf.startswith(b"HTTP/1.0 400 Bad Request\r\n")  # no version could be read: 1.0, as aiohttp answered


@pytest.mark.parametrize("target", [
    "/api/v1/namespaces/default/pods?watch=true&resourceVersion=5&allowWatchBookmarks=true",
    "/api/v1/namespaces/default/pods?labelSelector=a%3Db%2Cc+in+%28x%29&limit=500",
    "/apis/kubeflow.org/v1/namespaces/a%2Db/pytorchjobs/j%2F1/status?fieldManager=x+y",
    "/q?a=1&&b", "/q?=x&a=b=c", "/q?", "/q?k=v#frag", "/p#f", "/", "/a;b?c;d=e",
])
def test_targets_decode_as_aiohttp_did(target: str) -> None:
    """The fast path (no ``%`` or ``+``) and the yarl path give the path and query aiohttp gave."""
    from yarl import URL

    from kubesim.httpserver import Headers, Request

    class Conn:
        transport = None

    got = Request("GET", target, (1, 1), Headers(), Conn())  # type: ignore[arg-type]
    path, _, rest = target.partition("?")
    query, _, fragment = rest.partition("#")
    if "?" not in target:
        path, _, fragment = path.partition("#")
    want = URL.build(path=path, query_string=query, fragment=fragment, encoded=True)
    assert got.path == want.path
    assert list(got.query.items()) == list(want.query.items())


@pytest.mark.parametrize(("value", "watches"), [("yes", True), ("", True), ("TRUE", True), ("0", False),
                                                ("False", False)])
def test_watch_is_any_value_but_0_or_false(sim: kubesim.Sim, value: str, watches: bool) -> None:
    """The API server reads a bool query parameter as true unless it is "0" or "false" in any case (its
    string-slice-to-bool conversion): ``?watch=yes`` streams, ``?watch=0`` lists."""
    with connect(sim) as s:
        s.sendall(f"GET /api/v1/namespaces/default/configmaps?watch={value}&timeoutSeconds=1 HTTP/1.1\r\n"
                  f"{AUTH}\r\n".encode())
        buf = b""
        while b"\r\n\r\n" not in buf:
            buf += s.recv(65536)
        head = buf.partition(b"\r\n\r\n")[0]
    assert head.startswith(b"HTTP/1.1 200 OK\r\n")
    assert (b"Transfer-Encoding: chunked" in head) is watches, head
