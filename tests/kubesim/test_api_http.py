"""kubesim's HTTP layer as a client that is not the official one sees it: ``Expect: 100-continue`` (curl sends
it for large bodies) is answered before the body is read, an unknown expectation is 417, and the audit log
classifies what was asked."""

from __future__ import annotations

import socket
from urllib.parse import urlsplit

import orjson
import pytest

import kubesim

pytestmark = pytest.mark.kubesim_only("speaks raw HTTP to kubesim's server")


def exchange(sim: kubesim.Sim, head: str, body: bytes, wait_continue: bool) -> tuple[bytes, bytes]:
    """Send ``head``; with ``wait_continue``, read the interim answer before sending ``body``. Returns the
    interim bytes (empty without waiting) and the final answer's first bytes."""
    url = urlsplit(sim.url("sim"))
    with socket.create_connection((url.hostname, url.port), timeout=10) as s:
        s.sendall(head.encode())
        interim = b""
        if wait_continue:
            while b"\r\n\r\n" not in interim:
                interim += s.recv(4096)
        s.sendall(body)
        final = b""
        while b"\r\n\r\n" not in final:
            chunk = s.recv(65536)
            if not chunk:
                break
            final += chunk
        return interim, final


def request_head(path: str, body: bytes, expect: str) -> str:
    return (f"POST {path} HTTP/1.1\r\nHost: kubesim\r\nAuthorization: Bearer kubesim-sim\r\n"
            f"User-Agent: raw-http-test/1\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            f"Expect: {expect}\r\nConnection: close\r\n\r\n")


def test_expect_100_continue_is_answered_before_the_body(sim: kubesim.Sim) -> None:
    body = orjson.dumps({"metadata": {"name": "expect-continue"}, "data": {"a": "b"}})
    interim, final = exchange(sim, request_head("/api/v1/namespaces/default/configmaps", body, "100-continue"),
                              body, wait_continue=True)
    assert interim.startswith(b"HTTP/1.1 100 Continue\r\n")
    assert final.startswith(b"HTTP/1.1 201 Created\r\n")
    assert sim.cluster("sim").store.get("configmaps", "default", "expect-continue") is not None
    assert ("create", "", "configmaps") in sim.cluster("sim").server.audit.by("raw-http-test/")


def test_unknown_expectation_is_417(sim: kubesim.Sim) -> None:
    body = orjson.dumps({"metadata": {"name": "expect-other"}})
    _, final = exchange(sim, request_head("/api/v1/namespaces/default/configmaps", body, "something-else"),
                        body, wait_continue=False)
    assert final.startswith(b"HTTP/1.1 417 Expectation Failed\r\n")
    assert sim.cluster("sim").store.get("configmaps", "default", "expect-other") is None
