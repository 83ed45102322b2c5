"""Basic CRUD, discovery and watch through the typed client and DynamicClient."""

from __future__ import annotations

import pytest
from kubernetes import client, watch
from kubernetes.dynamic import DynamicClient

pytestmark = pytest.mark.realcluster


def pod(name: str, **labels: str) -> dict:
    return {"metadata": {"name": name, "labels": labels},
            "spec": {"containers": [{"name": "c", "image": "busybox:1.36"}]}}


def test_create_get_list_delete_pod(api: client.ApiClient, ns: str) -> None:
    v1 = client.CoreV1Api(api)
    created = v1.create_namespaced_pod(ns, pod("p1", app="x"))
    assert created.metadata.uid and created.metadata.creation_timestamp
    got = v1.read_namespaced_pod("p1", ns)
    assert got.metadata.uid == created.metadata.uid
    assert [p.metadata.name for p in v1.list_namespaced_pod(ns, label_selector="app=x").items] == ["p1"]
    v1.delete_namespaced_pod("p1", ns, grace_period_seconds=0)


def test_dynamic_client_discovers_core_and_batch(api: client.ApiClient, ns: str) -> None:
    dc = DynamicClient(api)
    jobs = dc.resources.get(api_version="batch/v1", kind="Job")
    assert jobs.namespaced
    cms = dc.resources.get(api_version="v1", kind="ConfigMap")
    cms.create(body={"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm"}, "data": {"k": "v"}},
               namespace=ns)
    assert cms.get(name="cm", namespace=ns).data.k == "v"


def test_watch_sees_added_then_modified(api: client.ApiClient, ns: str) -> None:
    v1 = client.CoreV1Api(api)
    cm = v1.create_namespaced_config_map(ns, {"metadata": {"name": "w"}, "data": {"a": "1"}})
    v1.patch_namespaced_config_map("w", ns, {"data": {"a": "2"}})
    seen = []
    w = watch.Watch()
    for ev in w.stream(v1.list_namespaced_config_map, ns, resource_version=cm.metadata.resource_version,
                       timeout_seconds=5):
        seen.append((ev["type"], ev["object"].data.get("a")))
        if len(seen) == 1:
            w.stop()
    assert seen == [("MODIFIED", "2")]
