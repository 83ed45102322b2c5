"""Patches: JSON merge, JSON patch, strategic merge (merge keys and directives), server-side apply."""

from __future__ import annotations

import json

import pytest
import yaml
from kubernetes import client
from kubernetes.dynamic import DynamicClient
from kubernetes.dynamic.exceptions import DynamicApiError

from kubesim.testing import pod_body, status_of

pytestmark = pytest.mark.realcluster


def test_json_merge_patch_replaces_lists_and_null_deletes(api: client.ApiClient, ns: str) -> None:
    v1 = client.CoreV1Api(api)
    v1.create_namespaced_config_map(ns, {"metadata": {"name": "m", "labels": {"a": "1", "b": "2"}},
                                         "data": {"x": "1"}})
    dc = DynamicClient(api)
    cms = dc.resources.get(api_version="v1", kind="ConfigMap")
    res = cms.patch(name="m", namespace=ns, body={"metadata": {"labels": {"a": None, "c": "3"}}},
                    content_type="application/merge-patch+json")
    assert dict(res.metadata.labels) == {"b": "2", "c": "3"}


def test_json_patch_ops(api: client.ApiClient, ns: str) -> None:
    v1 = client.CoreV1Api(api)
    v1.create_namespaced_config_map(ns, {"metadata": {"name": "j"}, "data": {"a": "1", "b": "2"}})
    cm = v1.patch_namespaced_config_map("j", ns, [
        {"op": "test", "path": "/data/a", "value": "1"},
        {"op": "replace", "path": "/data/a", "value": "10"},
        {"op": "remove", "path": "/data/b"},
        {"op": "add", "path": "/metadata/labels", "value": {"k": "v"}},
        {"op": "copy", "from": "/data/a", "path": "/data/c"},
    ])
    assert cm.data == {"a": "10", "c": "10"}
    assert cm.metadata.labels == {"k": "v"}
    with pytest.raises(client.ApiException) as ei:
        v1.patch_namespaced_config_map("j", ns, [{"op": "test", "path": "/data/a", "value": "nope"}])
    assert ei.value.status == 422


def test_strategic_merge_by_name_for_containers_and_env(api: client.ApiClient, ns: str) -> None:
    # A PodTemplate: a built-in kind whose pod spec may change freely (a Job's template may not).
    v1 = client.CoreV1Api(api)
    v1.create_namespaced_pod_template(ns, {"metadata": {"name": "s"}, "template": {"spec": {
        "restartPolicy": "Never", "containers": [
            {"name": "a", "image": "x", "env": [{"name": "E1", "value": "1"}, {"name": "E2", "value": "2"}]},
            {"name": "b", "image": "y"}]}}})
    pt = v1.patch_namespaced_pod_template("s", ns, {"template": {"spec": {"containers": [
        {"name": "a", "env": [{"name": "E2", "value": "two"}, {"name": "E3", "value": "3"}]}]}}})
    cs = pt.template.spec.containers
    assert [c.name for c in cs] == ["a", "b"]
    assert cs[0].image == "x"
    assert [(e.name, e.value) for e in cs[0].env] == [("E1", "1"), ("E2", "two"), ("E3", "3")]
    pt = v1.patch_namespaced_pod_template("s", ns, {"template": {"spec": {"containers": [
        {"name": "b", "$patch": "delete"}]}}})
    assert [c.name for c in pt.template.spec.containers] == ["a"]


def test_strategic_merge_ports_volumes_and_status_conditions(api: client.ApiClient, ns: str) -> None:
    v1 = client.CoreV1Api(api)
    svc = v1.create_namespaced_service(ns, {"metadata": {"name": "p"}, "spec": {"ports": [
        {"name": "http", "port": 80}, {"name": "https", "port": 443}]}})
    svc = v1.patch_namespaced_service("p", ns, {"spec": {"ports": [{"name": "http2", "port": 80,
                                                                    "targetPort": 8080}]}})
    assert [(p.port, p.name, p.target_port) for p in svc.spec.ports] == [(80, "http2", 8080), (443, "https", 443)]
    body = pod_body("c")
    v1.create_namespaced_pod(ns, {**body, "spec": {**body["spec"], "schedulerName": "none"}})
    v1.patch_namespaced_pod_status("c", ns, {"status": {"conditions": [{"type": "A", "status": "True"}]}})
    pod = v1.patch_namespaced_pod_status("c", ns, {"status": {"conditions": [{"type": "B", "status": "False"}]}})
    conds = {c.type: c.status for c in pod.status.conditions}
    assert (conds["A"], conds["B"]) == ("True", "False")


def test_strategic_patch_is_415_on_custom_resources(api: client.ApiClient, crd_group: str, ns: str) -> None:
    co = client.CustomObjectsApi(api)
    co.create_namespaced_custom_object(crd_group, "v1", ns, "widgets", {
        "apiVersion": f"{crd_group}/v1", "kind": "Widget", "metadata": {"name": "w"}, "spec": {"size": 1}})
    with pytest.raises(client.ApiException) as ei:
        co.patch_namespaced_custom_object(crd_group, "v1", ns, "widgets", "w", {"spec": {"size": 2}},
                                          _content_type="application/strategic-merge-patch+json")
    assert ei.value.status == 415
    assert status_of(ei.value)["reason"] == "UnsupportedMediaType"
    w = co.patch_namespaced_custom_object(crd_group, "v1", ns, "widgets", "w", {"spec": {"size": 2}})
    assert w["spec"]["size"] == 2


def test_server_side_apply_creates_then_merges_with_managed_fields(api: client.ApiClient, ns: str) -> None:
    dc = DynamicClient(api)
    cms = dc.resources.get(api_version="v1", kind="ConfigMap")
    manifest = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "ssa", "namespace": ns,
                                                                      "labels": {"a": "1"}}, "data": {"k": "v"}}
    first = cms.server_side_apply(body=manifest, field_manager="mkd-test", force_conflicts=True)
    assert first.data.k == "v"
    manifest["data"] = {"k": "v2", "k2": "x"}
    second = cms.server_side_apply(body=manifest, field_manager="mkd-test", force_conflicts=True)
    assert dict(second.data) == {"k": "v2", "k2": "x"}
    assert second.metadata.uid == first.metadata.uid
    managers = [(m.manager, m.operation) for m in second.metadata.managedFields]
    assert ("mkd-test", "Apply") in managers


def test_apply_without_field_manager_is_rejected(api: client.ApiClient, ns: str) -> None:
    body = yaml.safe_dump({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "nofm"}})
    dc = DynamicClient(api)
    with pytest.raises(DynamicApiError) as ei:
        dc.request("patch", f"/api/v1/namespaces/{ns}/configmaps/nofm", body=body,
                   content_type="application/apply-patch+yaml")
    assert ei.value.status in (400, 422)


def _cm_manifest(ns: str, **data: str) -> dict:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "owned", "namespace": ns}, "data": data}


def test_apply_conflict_between_managers_and_force(api: client.ApiClient, ns: str) -> None:
    cms = DynamicClient(api).resources.get(api_version="v1", kind="ConfigMap")
    cms.server_side_apply(body=_cm_manifest(ns, k="a"), field_manager="first")
    with pytest.raises(DynamicApiError) as ei:
        cms.server_side_apply(body=_cm_manifest(ns, k="b"), field_manager="second")
    assert ei.value.status == 409
    body = json.loads(ei.value.body)
    assert body["reason"] == "Conflict"
    assert body["details"]["causes"][0]["field"] == ".data.k"
    # Same value: shared ownership, no conflict.
    cms.server_side_apply(body=_cm_manifest(ns, k="a"), field_manager="second")
    forced = cms.server_side_apply(body=_cm_manifest(ns, k="c"), field_manager="second", force_conflicts=True)
    assert forced.data.k == "c"


def test_apply_removes_fields_the_manager_stopped_applying(api: client.ApiClient, ns: str) -> None:
    cms = DynamicClient(api).resources.get(api_version="v1", kind="ConfigMap")
    cms.server_side_apply(body=_cm_manifest(ns, a="1", b="2"), field_manager="mkd")
    after = cms.server_side_apply(body=_cm_manifest(ns, a="1"), field_manager="mkd")
    assert dict(after.data) == {"a": "1"}


def test_updates_and_patches_record_their_own_managed_fields_entries(api: client.ApiClient, ns: str) -> None:
    """apiserver pkg/endpoints/handlers/fieldmanager (managedFieldsUpdater) and structured-merge-diff's
    Updater.Update: a create, merge patch or update records an ``Update`` entry for its field manager (the
    fieldManager parameter, else the User-Agent's product) with the fields it set; an update takes the fields
    it changes from every other manager, Apply ones too; Apply entries are listed first."""
    def entries(obj: dict) -> list[tuple[str, str, dict]]:
        return [(m["manager"], m["operation"], m["fieldsV1"]) for m in obj["metadata"]["managedFields"]]

    v1 = client.CoreV1Api(api)
    cms = DynamicClient(api).resources.get(api_version="v1", kind="ConfigMap")
    cms.server_side_apply(body=_cm_manifest(ns, a="1"), field_manager="applier")
    raw = v1.patch_namespaced_config_map("owned", ns, {"data": {"b": "2"}}, field_manager="patcher",
                                         _preload_content=False)
    patched = json.loads(raw.data)
    assert entries(patched) == [("applier", "Apply", {"f:data": {"f:a": {}}}),
                                ("patcher", "Update", {"f:data": {"f:b": {}}})]
    assert {m["manager"]: m["apiVersion"] for m in patched["metadata"]["managedFields"]} == {
        "applier": "v1", "patcher": "v1"}
    # A PUT changing "a": the applier loses it (and its entry with it), the updater owns it.
    current = v1.read_namespaced_config_map("owned", ns)
    current.data["a"] = "3"
    raw = v1.replace_namespaced_config_map("owned", ns, current, field_manager="updater", _preload_content=False)
    assert entries(json.loads(raw.data)) == [("patcher", "Update", {"f:data": {"f:b": {}}}),
                                             ("updater", "Update", {"f:data": {"f:a": {}}})]
    # A create without fieldManager: the manager is the User-Agent's product; a map it brings into being
    # is owned with its "." member.
    api.user_agent = "mkd-probe/1.0 (test)"
    try:
        raw = v1.create_namespaced_config_map(ns, {"metadata": {"name": "plain", "labels": {"x": "y"}},
                                                   "data": {"k": "v"}}, _preload_content=False)
    finally:
        api.user_agent = "OpenAPI-Generator/python"
    assert entries(json.loads(raw.data)) == [("mkd-probe", "Update", {
        "f:data": {".": {}, "f:k": {}}, "f:metadata": {"f:labels": {".": {}, "f:x": {}}}})]


def test_apply_conflicts_name_the_managers_as_upstream_words_them(api: client.ApiClient, ns: str) -> None:
    """apiserver pkg/util/managedfields/internal/conflict.go NewConflictError: one conflict is worded inline,
    several are grouped per manager; an Update manager is named with its apiVersion and time. Applying a value
    an Update manager set is a conflict too (structured-merge-diff), unless forced, which takes the field."""
    import re

    v1 = client.CoreV1Api(api)
    cms = DynamicClient(api).resources.get(api_version="v1", kind="ConfigMap")
    v1.create_namespaced_config_map(ns, {"metadata": {"name": "owned"}, "data": {"k": "a", "j": "a"}},
                                    field_manager="creator")
    with pytest.raises(DynamicApiError) as ei:
        cms.server_side_apply(body=_cm_manifest(ns, k="b"), field_manager="applier")
    body = json.loads(ei.value.body)
    assert ei.value.status == 409 and body["reason"] == "Conflict"
    stamp = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ"
    assert re.fullmatch(rf'Apply failed with 1 conflict: conflict with "creator" using v1 at {stamp}: \.data\.k',
                        body["message"]), body["message"]
    (cause,) = body["details"]["causes"]
    assert cause["reason"] == "FieldManagerConflict" and cause["field"] == ".data.k"
    assert re.fullmatch(rf'conflict with "creator" using v1 at {stamp}', cause["message"])
    forced = cms.server_side_apply(body=_cm_manifest(ns, k="b"), field_manager="applier", force_conflicts=True)
    owners = {m["manager"]: m["fieldsV1"] for m in forced.to_dict()["metadata"]["managedFields"]}
    assert owners["applier"] == {"f:data": {"f:k": {}}}
    assert owners["creator"] == {"f:data": {".": {}, "f:j": {}}}
    # Two fields of one Apply manager: grouped under it (a forced apply of "j" takes it from "creator").
    cms.server_side_apply(body=_cm_manifest(ns, k="b", j="b"), field_manager="applier", force_conflicts=True)
    with pytest.raises(DynamicApiError) as ei:
        cms.server_side_apply(body=_cm_manifest(ns, k="c", j="c"), field_manager="other")
    assert json.loads(ei.value.body)["message"] == (
        'Apply failed with 2 conflicts: conflicts with "applier":\n- .data.j\n- .data.k')


def test_apply_removes_a_map_whose_every_field_the_manager_stopped_applying(api: client.ApiClient, ns: str) -> None:
    """structured-merge-diff: the applier owned the map (and its keys); dropping them all drops the map, no
    ``{}`` is left behind (Kueue's release of ``status.admission`` relies on it)."""
    cms = DynamicClient(api).resources.get(api_version="v1", kind="ConfigMap")
    manifest = _cm_manifest(ns, a="1")
    manifest["metadata"]["labels"] = {"team": "a"}
    cms.server_side_apply(body=manifest, field_manager="mkd")
    without = {k: v for k, v in manifest.items() if k != "data"}
    after = cms.server_side_apply(body=without, field_manager="mkd")
    assert after.data is None and dict(after.metadata.labels) == {"team": "a"}


def test_limit_ranges_and_runtime_classes_are_served(api: client.ApiClient, ns: str) -> None:
    """Kueue lists and watches both (its pods' requests and overhead); a v1.36 server serves them."""
    v1 = client.CoreV1Api(api)
    v1.create_namespaced_limit_range(ns, {"metadata": {"name": "lr"}, "spec": {"limits": [
        {"type": "Container", "default": {"cpu": "500m"}}]}})
    assert [lr.metadata.name for lr in v1.list_namespaced_limit_range(ns).items] == ["lr"]
    node = client.NodeV1Api(api)
    node.create_runtime_class({"metadata": {"name": f"rc-{ns}"}, "handler": "runc"})
    try:
        assert f"rc-{ns}" in [rc.metadata.name for rc in node.list_runtime_class().items]
    finally:
        node.delete_runtime_class(f"rc-{ns}")


def test_apply_merges_a_custom_resources_map_list_item_by_item(api: client.ApiClient, ns: str) -> None:
    """structured-merge-diff on a ``listType: map`` list (a Workload's ``status.conditions``, keyed by type):
    each applier owns its items; applying without an item removes only that applier's own, and an item another
    manager wrote by a merge patch stays (Kueue's job reconciler applies PodsReady alone; QuotaReserved and
    Admitted, written by others, must stay)."""
    from kubesim.testing import eventually

    group = f"lists-{ns}.example.com"
    ext = client.ApiextensionsV1Api(api)
    cond = {"type": "object", "required": ["type", "status"],
            "properties": {"type": {"type": "string"}, "status": {"type": "string"}}}
    schema = {"openAPIV3Schema": {"type": "object", "properties": {"status": {"type": "object", "properties": {
        "conditions": {"type": "array", "items": cond, "x-kubernetes-list-type": "map",
                       "x-kubernetes-list-map-keys": ["type"]}}}}}}
    ext.create_custom_resource_definition({"metadata": {"name": f"gadgets.{group}"}, "spec": {
        "group": group, "scope": "Namespaced", "names": {"plural": "gadgets", "singular": "gadget", "kind": "Gadget"},
        "versions": [{"name": "v1", "served": True, "storage": True, "schema": schema,
                      "subresources": {"status": {}}}]}})
    try:
        def established() -> bool:
            crd = ext.read_custom_resource_definition(f"gadgets.{group}")
            return any(c.type == "Established" and c.status == "True" for c in (crd.status.conditions or []))
        eventually(established, what="CRD Established")
        gadgets = DynamicClient(api).resources.get(api_version=f"{group}/v1", kind="Gadget")
        gadgets.create(body={"apiVersion": f"{group}/v1", "kind": "Gadget", "metadata": {"name": "g"}}, namespace=ns)

        def apply(manager: str, *types: str) -> list[str]:
            body = {"apiVersion": f"{group}/v1", "kind": "Gadget", "metadata": {"name": "g", "namespace": ns},
                    "status": {"conditions": [{"type": t, "status": "True"} for t in types]}}
            got = client.CustomObjectsApi(api).patch_namespaced_custom_object_status(
                group, "v1", ns, "gadgets", "g", body, field_manager=manager, force=True,
                _content_type="application/apply-patch+yaml")
            return [c["type"] for c in (got.get("status") or {}).get("conditions") or []]

        assert apply("admission", "QuotaReserved", "Admitted") == ["QuotaReserved", "Admitted"]
        assert apply("job-controller", "PodsReady") == ["QuotaReserved", "Admitted", "PodsReady"]
        current = gadgets.get(name="g", namespace=ns).to_dict()
        client.CustomObjectsApi(api).patch_namespaced_custom_object_status(
            group, "v1", ns, "gadgets", "g", {"status": {"conditions": [
                *current["status"]["conditions"], {"type": "Checked", "status": "True"}]}},
            field_manager="patcher", _content_type="application/merge-patch+json")
        assert apply("admission", "QuotaReserved") == ["QuotaReserved", "PodsReady", "Checked"]
    finally:
        ext.delete_custom_resource_definition(f"gadgets.{group}")
