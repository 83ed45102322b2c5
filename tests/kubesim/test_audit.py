"""kubesim's audit log (``kubesim.audit``) names each request as kube-apiserver's RequestInfo does (verb from the
method and whether a name was given, ``list`` / ``watch`` / ``deletecollection`` on collections, API group, resource
with its subresource, namespace): the requests are the official client's, the expected tuples upstream's."""

from __future__ import annotations

import urllib.request

import pytest
from kubernetes import client, watch

import kubesim
from kubesim.audit import classify

pytestmark = pytest.mark.kubesim_only("reads kubesim's audit log")


def test_the_official_clients_requests_are_named_as_the_apiserver_names_them(
        sim: kubesim.Sim, api: client.ApiClient, ns: str, crd_group: str) -> None:
    api.user_agent = "audit-test/1"
    core, co = client.CoreV1Api(api), client.CustomObjectsApi(api)
    audit = sim.cluster("sim").server.audit
    start = len(audit.records)
    core.read_namespace(ns)
    namespace = core.read_namespace_status(ns)
    core.replace_namespace_status(ns, namespace)
    core.list_namespaced_config_map(ns, label_selector="a=b", limit=5)
    for _ in watch.Watch().stream(core.list_namespaced_config_map, ns, timeout_seconds=1):
        pass
    core.list_node(field_selector="metadata.name=node-a")
    core.read_node_status("node-a")
    core.create_namespaced_config_map(ns, {"metadata": {"name": "c"}})
    core.delete_collection_namespaced_config_map(ns)
    co.create_namespaced_custom_object(crd_group, "v1", ns, "widgets", {
        "apiVersion": f"{crd_group}/v1", "kind": "Widget", "metadata": {"name": "w"}})
    co.patch_namespaced_custom_object_status(crd_group, "v1", ns, "widgets", "w", {"status": {"phase": "x"}})
    co.list_cluster_custom_object(crd_group, "v1", "widgets")
    client.RbacAuthorizationV1Api(api).list_cluster_role()
    got = [(a.verb, a.group, a.resource, a.namespace) for a in audit.records[start:]
           if a.user_agent == "audit-test/1"]
    assert got == [
        ("get", "", "namespaces", ns),  # a namespace's own name is the request's namespace
        ("get", "", "namespaces/status", ns),
        ("update", "", "namespaces/status", ns),
        ("list", "", "configmaps", ns),
        ("watch", "", "configmaps", ns),
        ("list", "", "nodes", ""),
        ("get", "", "nodes/status", ""),
        ("create", "", "configmaps", ns),
        ("deletecollection", "", "configmaps", ns),
        ("create", crd_group, "widgets", ns),
        ("patch", crd_group, "widgets/status", ns),
        ("list", crd_group, "widgets", ""),
        ("list", "rbac.authorization.k8s.io", "clusterroles", ""),
    ]


def test_paths_the_official_client_does_not_send_are_named_as_the_apiserver_names_them(sim: kubesim.Sim) -> None:
    assert classify("GET", "/api/v1/watch/namespaces/a/pods", "") == ("watch", "", "pods", "a")
    assert classify("GET", "/apis/apps/v1/watch/deployments", "") == ("watch", "apps", "deployments", "")
    assert classify("PUT", "/api/v1/namespaces/a/finalize", "") == ("update", "", "namespaces/finalize", "a")
    assert classify("GET", "/api/v1/namespaces/a/pods", "yes") == ("watch", "", "pods", "a")  # not 0 or false
    assert classify("GET", "/api/v1/namespaces/a/pods", "False") == ("list", "", "pods", "a")
    assert classify("GET", "/api/v1/namespaces/a/pods/p", "true") == ("get", "", "pods", "a")  # a name: get
    assert classify("HEAD", "/api/v1/namespaces/a/pods/p", "") == ("get", "", "pods", "a")
    assert classify("GET", "/api/v1/namespaces/a/pods/p/log", "") == ("get", "", "pods/log", "a")
    assert classify("GET", "/api/v1/proxy/namespaces/a/pods/p/x", "") == ("proxy", "", "pods", "a")
    assert classify("GET", "/apis/apps/v1", "") == ("get", "", "/apis/apps/v1", "")  # discovery: non-resource
    assert classify("POST", "/healthz", "") == ("post", "", "/healthz", "")
    request = urllib.request.Request(sim.url("sim") + "/api/v1/namespaces/default/pods?watch=0&limit=1",
                                     headers={"User-Agent": "audit-raw/1"})
    urllib.request.urlopen(request, timeout=10).read()
    assert ("list", "", "pods") in sim.cluster("sim").server.audit.by("audit-raw/")
