"""Faults on demand (kubesim only): 500 / 429 answers, paused requests, dropped watches, cluster restarts."""

from __future__ import annotations

import threading
import time

import pytest
import urllib3
from kubernetes import client

import kubesim
from kubesim.testing import status_of

pytestmark = pytest.mark.kubesim_only("injects API faults and restarts the server, which only kubesim can do")


@pytest.fixture
def faults(sim_only: kubesim.Sim) -> object:
    f = sim_only.cluster("sim").faults
    yield f
    f.clear()


def test_fail_500_then_recovers(api: client.ApiClient, ns: str, faults: kubesim.server.Faults) -> None:
    v1 = client.CoreV1Api(api)
    faults.fail(500, 30)
    with pytest.raises(client.ApiException) as ei:
        v1.list_namespaced_config_map(ns)
    assert ei.value.status == 500
    assert status_of(ei.value)["reason"] == "InternalError"
    faults.clear()
    assert v1.list_namespaced_config_map(ns).items is not None


def test_fail_429_carries_retry_after(api: client.ApiClient, ns: str, faults: kubesim.server.Faults) -> None:
    faults.fail(429, 30)
    with pytest.raises(client.ApiException) as ei:
        client.CoreV1Api(api).read_namespace(ns)
    assert ei.value.status == 429
    assert ei.value.headers["Retry-After"] == "1"
    assert status_of(ei.value)["details"]["retryAfterSeconds"] == 1


def test_pause_holds_requests_until_released(api: client.ApiClient, ns: str,
                                             faults: kubesim.server.Faults) -> None:
    v1 = client.CoreV1Api(api)
    faults.pause(30)
    result: list[str] = []
    t = threading.Thread(target=lambda: result.append(v1.read_namespace(ns).metadata.name), daemon=True)
    t.start()
    t.join(0.3)
    assert t.is_alive() and not result  # held by the pause
    faults.clear()
    t.join(10)
    assert result == [ns]


def test_drop_watches_cuts_open_streams(api: client.ApiClient, ns: str, faults: kubesim.server.Faults) -> None:
    v1 = client.CoreV1Api(api)
    rv = v1.list_namespaced_config_map(ns).metadata.resource_version
    resp = v1.list_namespaced_config_map(ns, watch=True, resource_version=rv, timeout_seconds=120,
                                         _preload_content=False, _request_timeout=20)
    threading.Timer(0.2, faults.drop_watches).start()
    started = time.monotonic()
    with pytest.raises(urllib3.exceptions.HTTPError):
        resp.read()
    assert time.monotonic() - started < 20  # ended by the drop, not by a timeout


def test_stop_and_start_cluster_keeps_state(api: client.ApiClient, ns: str, sim_only: kubesim.Sim) -> None:
    v1 = client.CoreV1Api(api)
    before = v1.create_namespaced_config_map(ns, {"metadata": {"name": "survivor"}, "data": {"k": "v"}})
    url = sim_only.url("sim")
    sim_only.stop_cluster("sim")
    try:
        with pytest.raises(urllib3.exceptions.MaxRetryError):
            v1.read_namespaced_config_map("survivor", ns, _request_timeout=2)
    finally:
        sim_only.start_cluster("sim")
    assert sim_only.url("sim") == url
    after = v1.read_namespaced_config_map("survivor", ns)
    assert after.metadata.uid == before.metadata.uid and after.data == {"k": "v"}
    again = v1.create_namespaced_config_map(ns, {"metadata": {"name": "later"}})
    assert int(again.metadata.resource_version) > int(before.metadata.resource_version)
