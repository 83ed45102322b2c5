"""Helpers for scenario tests that drive kubesim (or a real cluster) through the official client: bodies,
bounded polling for asynchronous controllers, Status bodies out of ApiException."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any, TypeVar

from kubernetes import client

T = TypeVar("T")


def pod_body(name: str, labels: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels or {}},
            "spec": {"containers": [{"name": "main", "image": "busybox:1.36", "command": ["true"]}],
                     "restartPolicy": "Never", **spec}}


def eventually(fn: Callable[[], T | None], timeout: float = 10.0, what: str = "condition") -> T:
    """Poll ``fn`` until it returns something truthy; real controllers (GC, namespaces) act asynchronously."""
    deadline = time.monotonic() + timeout
    delay = 0.01
    while True:
        out = fn()
        if out:
            return out
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}; last value: {out!r}")
        time.sleep(delay)
        delay = min(delay * 2, 0.2)


def gone(read: Callable[[], Any]) -> Callable[[], bool]:
    def check() -> bool:
        try:
            read()
        except client.ApiException as e:
            return bool(e.status == 404)
        return False
    return check


def status_of(e: client.ApiException) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(e.body or "{}")
    return body
