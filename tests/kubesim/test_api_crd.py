"""CustomResourceDefinitions: becoming served, versions, scope, status subresource, DynamicClient, removal."""

from __future__ import annotations

import pytest
from kubernetes import client
from kubernetes.dynamic import DynamicClient

from kubesim.testing import eventually, gone, status_of

pytestmark = pytest.mark.realcluster


def widget(group: str, name: str, version: str = "v1", **spec: object) -> dict:
    return {"apiVersion": f"{group}/{version}", "kind": "Widget", "metadata": {"name": name},
            "spec": spec, "status": {"ready": True}}


def test_crd_conditions_and_discovery(api: client.ApiClient, crd_group: str) -> None:
    crd = client.ApiextensionsV1Api(api).read_custom_resource_definition(f"widgets.{crd_group}")
    conds = {c.type: c.status for c in crd.status.conditions}
    assert conds["Established"] == "True" and conds["NamesAccepted"] == "True"
    assert crd.status.accepted_names.kind == "Widget"
    resources = client.CustomObjectsApi(api).get_api_resources(crd_group, "v1") if False else None
    del resources
    dc = DynamicClient(api)
    res = dc.resources.get(api_version=f"{crd_group}/v1", kind="Widget")
    assert res.namespaced and res.name == "widgets"


def test_custom_resource_crud_with_status_subresource(api: client.ApiClient, crd_group: str, ns: str) -> None:
    co = client.CustomObjectsApi(api)
    w = co.create_namespaced_custom_object(crd_group, "v1", ns, "widgets", widget(crd_group, "a", size=1,
                                                                                  extra={"free": ["form"]}))
    assert "status" not in w  # status is dropped on create when the status subresource is on
    assert w["spec"]["extra"] == {"free": ["form"]}  # preserve-unknown-fields keeps everything
    assert w["metadata"]["generation"] == 1
    w = co.patch_namespaced_custom_object(crd_group, "v1", ns, "widgets", "a", {"status": {"ready": True}})
    assert "status" not in w
    w = co.patch_namespaced_custom_object_status(crd_group, "v1", ns, "widgets", "a",
                                                 {"status": {"ready": True}, "spec": {"size": 9}})
    assert w["status"] == {"ready": True} and w["spec"]["size"] == 1
    assert w["metadata"]["generation"] == 1
    w = co.patch_namespaced_custom_object(crd_group, "v1", ns, "widgets", "a", {"spec": {"size": 2}})
    assert w["metadata"]["generation"] == 2 and w["status"] == {"ready": True}
    listed = co.list_namespaced_custom_object(crd_group, "v1", ns, "widgets")
    assert [i["metadata"]["name"] for i in listed["items"]] == ["a"]
    assert listed["kind"] == "WidgetList"
    beta = co.get_namespaced_custom_object(crd_group, "v1beta1", ns, "widgets", "a")
    assert beta["apiVersion"] == f"{crd_group}/v1beta1"
    co.delete_namespaced_custom_object(crd_group, "v1", ns, "widgets", "a")
    with pytest.raises(client.ApiException) as ei:
        co.get_namespaced_custom_object(crd_group, "v1", ns, "widgets", "a")
    assert ei.value.status == 404
    assert status_of(ei.value)["details"]["group"] == crd_group


def test_cr_with_wrong_kind_is_422_invalid(api: client.ApiClient, crd_group: str, ns: str) -> None:
    body = widget(crd_group, "k")
    body["kind"] = "Gadget"
    with pytest.raises(client.ApiException) as ei:
        client.CustomObjectsApi(api).create_namespaced_custom_object(crd_group, "v1", ns, "widgets", body)
    st = status_of(ei.value)
    assert ei.value.status == 422 and st["reason"] == "Invalid"
    assert st["details"]["causes"] == [{"reason": "FieldValueInvalid", "field": "kind",
                                        "message": 'Invalid value: "Gadget": must be Widget'}]


def test_cluster_scoped_crd_and_removal(api: client.ApiClient) -> None:
    ext = client.ApiextensionsV1Api(api)
    group = "scoped.kubesim.mkd.dev"
    ext.create_custom_resource_definition({"metadata": {"name": f"gizmos.{group}"}, "spec": {
        "group": group, "scope": "Cluster", "names": {"plural": "gizmos", "kind": "Gizmo"},
        "versions": [{"name": "v1alpha1", "served": True, "storage": True,
                      "schema": {"openAPIV3Schema": {"type": "object",
                                                     "x-kubernetes-preserve-unknown-fields": True}}}]}})
    co = client.CustomObjectsApi(api)

    def create() -> bool:
        try:
            co.create_cluster_custom_object(group, "v1alpha1", "gizmos", {
                "apiVersion": f"{group}/v1alpha1", "kind": "Gizmo", "metadata": {"name": "g1"}})
        except client.ApiException as e:
            if e.status in (404, 429, 503):  # not served yet; a real server may also throttle for a moment
                return False
            raise
        return True

    eventually(create, what="gizmos served")
    g = co.get_cluster_custom_object(group, "v1alpha1", "gizmos", "g1")
    assert "namespace" not in g["metadata"]
    ext.delete_custom_resource_definition(f"gizmos.{group}")
    eventually(gone(lambda: co.get_cluster_custom_object(group, "v1alpha1", "gizmos", "g1")), timeout=30,
               what="custom resources removed with their CRD")


def test_crd_name_must_match_plural_and_group(api: client.ApiClient) -> None:
    with pytest.raises(client.ApiException) as ei:
        client.ApiextensionsV1Api(api).create_custom_resource_definition({
            "metadata": {"name": "wrong.example.com"}, "spec": {
                "group": "example.com", "scope": "Namespaced", "names": {"plural": "things", "kind": "Thing"},
                "versions": [{"name": "v1", "served": True, "storage": True,
                              "schema": {"openAPIV3Schema": {"type": "object"}}}]}})
    assert ei.value.status == 422


def test_crd_update_serves_a_new_version(api: client.ApiClient) -> None:
    ext = client.ApiextensionsV1Api(api)
    group = "evolving.kubesim.mkd.dev"
    schema = {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}
    ext.create_custom_resource_definition({"metadata": {"name": f"things.{group}"}, "spec": {
        "group": group, "scope": "Namespaced", "names": {"plural": "things", "kind": "Thing"},
        "versions": [{"name": "v1", "served": True, "storage": True, "schema": schema}]}})
    co = client.CustomObjectsApi(api)
    try:
        eventually(lambda: _served(co, group, "v1"), what="v1 served")
        ext.patch_custom_resource_definition(f"things.{group}", [{"op": "add", "path": "/spec/versions/-", "value": {
            "name": "v2", "served": True, "storage": False, "schema": schema}}])
        eventually(lambda: _served(co, group, "v2"), what="v2 served after the CRD update")
    finally:
        ext.delete_custom_resource_definition(f"things.{group}")


def _served(co: client.CustomObjectsApi, group: str, version: str) -> bool:
    try:
        co.list_namespaced_custom_object(group, version, "default", "things")
    except client.ApiException as e:
        if e.status in (404, 429, 503):  # not served yet; a real server may also throttle for a moment
            return False
        raise
    return True


def test_body_api_version_must_match_the_url(api: client.ApiClient, crd_group: str, ns: str) -> None:
    with pytest.raises(client.ApiException) as ei:
        client.CustomObjectsApi(api).create_namespaced_custom_object(
            crd_group, "v1", ns, "widgets", widget(crd_group, "mismatch", version="v1beta1"))
    assert ei.value.status == 400


def test_scale_subresource(api: client.ApiClient, ns: str) -> None:
    ext = client.ApiextensionsV1Api(api)
    group = "scalable.kubesim.mkd.dev"
    schema = {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}
    ext.create_custom_resource_definition({"metadata": {"name": f"pools.{group}"}, "spec": {
        "group": group, "scope": "Namespaced", "names": {"plural": "pools", "kind": "Pool"},
        "versions": [{"name": "v1", "served": True, "storage": True, "schema": schema, "subresources": {
            "status": {}, "scale": {"specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.replicas"}}}]}})
    co = client.CustomObjectsApi(api)
    try:
        def create() -> bool:
            try:
                co.create_namespaced_custom_object(group, "v1", ns, "pools", {
                    "apiVersion": f"{group}/v1", "kind": "Pool", "metadata": {"name": "p"}, "spec": {"replicas": 2}})
            except client.ApiException as e:
                if e.status == 404:
                    return False
                raise
            return True

        eventually(create, what="pools served")
        scale = co.get_namespaced_custom_object_scale(group, "v1", ns, "pools", "p")
        assert scale["kind"] == "Scale" and scale["spec"]["replicas"] == 2
        co.patch_namespaced_custom_object_scale(group, "v1", ns, "pools", "p", {"spec": {"replicas": 5}})
        assert co.get_namespaced_custom_object(group, "v1", ns, "pools", "p")["spec"]["replicas"] == 5
    finally:
        ext.delete_custom_resource_definition(f"pools.{group}")


def test_server_side_apply_on_the_status_subresource(api: client.ApiClient, crd_group: str, ns: str) -> None:
    co = client.CustomObjectsApi(api)
    co.create_namespaced_custom_object(crd_group, "v1", ns, "widgets", widget(crd_group, "st", size=1))
    body = {"apiVersion": f"{crd_group}/v1", "kind": "Widget", "metadata": {"name": "st"},
            "status": {"phase": "Ready"}, "spec": {"size": 7}}
    w = co.patch_namespaced_custom_object_status(crd_group, "v1", ns, "widgets", "st", body,
                                                 field_manager="status-writer", force=True,
                                                 _content_type="application/apply-patch+yaml")
    assert w["status"] == {"phase": "Ready"}
    assert w["spec"]["size"] == 1  # a status apply leaves the spec alone
    assert any(m["manager"] == "status-writer" and m.get("subresource") == "status"
               for m in w["metadata"]["managedFields"])


def test_status_merge_patch_keeps_everything_but_status(api: client.ApiClient, crd_group: str, ns: str) -> None:
    """A merge patch on /status changes status alone (spec, labels and the rest stay as stored), answers the
    stored object, and one that changes nothing keeps the resourceVersion."""
    co = client.CustomObjectsApi(api)
    body = widget(crd_group, "st", size=1, nested={"a": [1, {"b": None}]})
    body["metadata"]["labels"] = {"keep": "me"}
    made = co.create_namespaced_custom_object(crd_group, "v1", ns, "widgets", body)
    w = co.patch_namespaced_custom_object_status(
        crd_group, "v1", ns, "widgets", "st",
        {"metadata": {"labels": {"keep": None, "new": "x"}}, "spec": {"size": 7, "nested": None},
         "status": {"ready": False, "phase": "Up", "list": [{"k": 1}]}})
    assert w["spec"] == made["spec"] and w["metadata"]["labels"] == {"keep": "me"}
    assert w["status"] == {"ready": False, "phase": "Up", "list": [{"k": 1}]}
    assert co.get_namespaced_custom_object(crd_group, "v1", ns, "widgets", "st") == w
    again = co.patch_namespaced_custom_object_status(crd_group, "v1", ns, "widgets", "st",
                                                     {"status": {"phase": "Up"}})
    assert again["metadata"]["resourceVersion"] == w["metadata"]["resourceVersion"]
    w = co.patch_namespaced_custom_object_status(crd_group, "v1", ns, "widgets", "st", {"status": None})
    assert "status" not in w and w["spec"] == made["spec"]


def test_update_without_resource_version_is_refused_where_upstream_demands_one(api: client.ApiClient, crd_group: str,
                                                                                ns: str) -> None:
    """apiserver pkg/registry/generic/registry/store.go Update: a PUT without metadata.resourceVersion is 422
    (`field.Invalid(metadata.resourceVersion, 0, ...)`, the resource as the kind) unless the kind's strategy
    AllowUnconditionalUpdate: custom resources and Leases do not, ConfigMaps do."""
    co = client.CustomObjectsApi(api)
    co.create_namespaced_custom_object(crd_group, "v1", ns, "widgets", widget(crd_group, "blind", size=1))
    with pytest.raises(client.ApiException) as ei:
        co.replace_namespaced_custom_object(crd_group, "v1", ns, "widgets", "blind", widget(crd_group, "blind", size=2))
    st = status_of(ei.value)
    assert ei.value.status == 422 and st["reason"] == "Invalid"
    detail = "metadata.resourceVersion: Invalid value: 0: must be specified for an update"
    assert st["message"] == f'widgets.{crd_group} "blind" is invalid: {detail}'
    assert st["details"] == {"name": "blind", "group": crd_group, "kind": "widgets", "causes": [
        {"reason": "FieldValueInvalid", "message": "Invalid value: 0: must be specified for an update",
         "field": "metadata.resourceVersion"}]}
    assert co.get_namespaced_custom_object(crd_group, "v1", ns, "widgets", "blind")["spec"]["size"] == 1

    coord = client.CoordinationV1Api(api)
    coord.create_namespaced_lease(ns, {"metadata": {"name": "l"}, "spec": {"holderIdentity": "a"}})
    with pytest.raises(client.ApiException) as ei:
        coord.replace_namespaced_lease("l", ns, {"metadata": {"name": "l"}, "spec": {"holderIdentity": "b"}})
    assert ei.value.status == 422 and status_of(ei.value)["details"]["kind"] == "leases"

    v1 = client.CoreV1Api(api)
    v1.create_namespaced_config_map(ns, {"metadata": {"name": "free"}, "data": {"a": "1"}})
    out = v1.replace_namespaced_config_map("free", ns, {"metadata": {"name": "free"}, "data": {"a": "2"}})
    assert out.data == {"a": "2"}
