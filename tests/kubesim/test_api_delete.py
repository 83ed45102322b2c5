"""Deletion: finalizers, propagation policies, owner-reference garbage collection, namespace termination."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes import client

from kubesim.testing import eventually, gone

pytestmark = pytest.mark.realcluster


def owner_ref(obj: Any, kind: str, api_version: str = "v1", block: bool = False) -> dict[str, Any]:
    return {"apiVersion": api_version, "kind": kind, "name": obj.metadata.name, "uid": obj.metadata.uid,
            "blockOwnerDeletion": block}


def cm(name: str, owners: list[dict[str, Any]] | None = None, finalizers: list[str] | None = None) -> dict:
    meta: dict[str, Any] = {"name": name}
    if owners:
        meta["ownerReferences"] = owners
    if finalizers:
        meta["finalizers"] = finalizers
    return {"metadata": meta}


def test_finalizer_keeps_object_with_deletion_timestamp(api: client.ApiClient, ns: str) -> None:
    v1 = client.CoreV1Api(api)
    v1.create_namespaced_config_map(ns, cm("f", finalizers=["mkd.dev/test"]))
    v1.delete_namespaced_config_map("f", ns)
    lingering = v1.read_namespaced_config_map("f", ns)
    assert lingering.metadata.deletion_timestamp is not None
    assert lingering.metadata.finalizers == ["mkd.dev/test"]
    v1.patch_namespaced_config_map("f", ns, {"metadata": {"finalizers": None}})
    eventually(gone(lambda: v1.read_namespaced_config_map("f", ns)), what="object released by its finalizer")


def test_background_deletion_collects_dependents(api: client.ApiClient, ns: str) -> None:
    v1 = client.CoreV1Api(api)
    owner = v1.create_namespaced_config_map(ns, cm("owner"))
    v1.create_namespaced_config_map(ns, cm("dep", [owner_ref(owner, "ConfigMap")]))
    v1.delete_namespaced_config_map("owner", ns, propagation_policy="Background")
    eventually(gone(lambda: v1.read_namespaced_config_map("dep", ns)), what="dependent collected")


def test_dependent_with_two_owners_survives_one(api: client.ApiClient, ns: str) -> None:
    v1 = client.CoreV1Api(api)
    a = v1.create_namespaced_config_map(ns, cm("oa"))
    b = v1.create_namespaced_config_map(ns, cm("ob"))
    v1.create_namespaced_config_map(ns, cm("shared", [owner_ref(a, "ConfigMap"), owner_ref(b, "ConfigMap")]))
    v1.delete_namespaced_config_map("oa", ns)
    eventually(gone(lambda: v1.read_namespaced_config_map("oa", ns)), what="owner gone")
    assert v1.read_namespaced_config_map("shared", ns).metadata.name == "shared"
    v1.delete_namespaced_config_map("ob", ns)
    eventually(gone(lambda: v1.read_namespaced_config_map("shared", ns)), what="orphaned dependent collected")


def test_orphan_deletion_strips_owner_references(api: client.ApiClient, ns: str) -> None:
    v1 = client.CoreV1Api(api)
    owner = v1.create_namespaced_config_map(ns, cm("o"))
    v1.create_namespaced_config_map(ns, cm("kid", [owner_ref(owner, "ConfigMap")]))
    v1.delete_namespaced_config_map("o", ns, propagation_policy="Orphan")
    eventually(gone(lambda: v1.read_namespaced_config_map("o", ns)), what="owner gone")
    kid = v1.read_namespaced_config_map("kid", ns)
    assert not kid.metadata.owner_references


def test_foreground_waits_for_blocking_dependents(api: client.ApiClient, ns: str) -> None:
    v1 = client.CoreV1Api(api)
    owner = v1.create_namespaced_config_map(ns, cm("fg"))
    v1.create_namespaced_config_map(ns, cm("blocker", [owner_ref(owner, "ConfigMap", block=True)],
                                           finalizers=["mkd.dev/hold"]))
    v1.delete_namespaced_config_map("fg", ns, propagation_policy="Foreground")

    def owner_waiting() -> bool:
        o = v1.read_namespaced_config_map("fg", ns)
        d = v1.read_namespaced_config_map("blocker", ns)
        return bool(o.metadata.deletion_timestamp and "foregroundDeletion" in (o.metadata.finalizers or [])
                    and d.metadata.deletion_timestamp)

    eventually(owner_waiting, what="owner in foreground deletion, dependent being deleted")
    v1.patch_namespaced_config_map("blocker", ns, {"metadata": {"finalizers": None}})
    eventually(gone(lambda: v1.read_namespaced_config_map("fg", ns)), what="owner deleted after dependent")


def test_job_delete_default_orphans_dependents_background_removes_them(api: client.ApiClient, ns: str) -> None:
    # ConfigMaps as the dependents, so that no Job controller adopts or releases them on the way.
    v1 = client.CoreV1Api(api)
    batch = client.BatchV1Api(api)
    template = {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "x"}]}}
    job = batch.create_namespaced_job(ns, {"metadata": {"name": "j"}, "spec": {"suspend": True,
                                                                              "template": template}})
    v1.create_namespaced_config_map(ns, cm("jd", [owner_ref(job, "Job", "batch/v1")]))
    batch.delete_namespaced_job("j", ns)  # batch/v1 still defaults to orphaning dependents
    eventually(gone(lambda: batch.read_namespaced_job("j", ns)), what="job gone")
    assert not v1.read_namespaced_config_map("jd", ns).metadata.owner_references
    job = batch.create_namespaced_job(ns, {"metadata": {"name": "j2"}, "spec": {"suspend": True,
                                                                               "template": template}})
    v1.create_namespaced_config_map(ns, cm("jd2", [owner_ref(job, "Job", "batch/v1")]))
    batch.delete_namespaced_job("j2", ns, propagation_policy="Background")
    eventually(gone(lambda: v1.read_namespaced_config_map("jd2", ns)), what="dependent collected with its job")


def test_delete_precondition_uid_mismatch_is_409(api: client.ApiClient, ns: str) -> None:
    v1 = client.CoreV1Api(api)
    v1.create_namespaced_config_map(ns, cm("pre"))
    with pytest.raises(client.ApiException) as ei:
        v1.delete_namespaced_config_map("pre", ns, body=client.V1DeleteOptions(
            preconditions=client.V1Preconditions(uid="00000000-0000-0000-0000-000000000000")))
    assert ei.value.status == 409


def test_namespace_deletion_terminates_then_removes_contents(api: client.ApiClient) -> None:
    v1 = client.CoreV1Api(api)
    v1.create_namespace({"metadata": {"name": "doomed-ns"}})
    v1.create_namespaced_config_map("doomed-ns", cm("inside", finalizers=["mkd.dev/hold"]))
    out = json.loads(v1.delete_namespace("doomed-ns", _preload_content=False).data)
    assert out["kind"] == "Namespace" and out["status"]["phase"] == "Terminating"
    assert v1.read_namespace("doomed-ns").status.phase == "Terminating"
    with pytest.raises(client.ApiException) as ei:
        v1.create_namespaced_config_map("doomed-ns", cm("late"))
    # plugin/pkg/admission/namespace/lifecycle/admission.go: NewForbidden plus a NamespaceTerminating cause.
    assert ei.value.status == 403
    st = json.loads(ei.value.body)
    assert st["reason"] == "Forbidden"
    assert st["message"] == ('configmaps "late" is forbidden: unable to create new content in namespace doomed-ns '
                             "because it is being terminated")
    assert st["details"] == {"name": "late", "kind": "configmaps", "causes": [
        {"reason": "NamespaceTerminating", "message": "namespace doomed-ns is being terminated",
         "field": "metadata.namespace"}]}
    eventually(lambda: v1.read_namespaced_config_map("inside", "doomed-ns").metadata.deletion_timestamp,
               what="contents being deleted")
    v1.patch_namespaced_config_map("inside", "doomed-ns", {"metadata": {"finalizers": None}})
    eventually(gone(lambda: v1.read_namespace("doomed-ns")), timeout=60, what="namespace removed")


def test_bound_pod_is_deleted_gracefully(api: client.ApiClient, ns: str) -> None:
    v1 = client.CoreV1Api(api)
    node = v1.list_node().items[0].metadata.name
    v1.create_namespaced_pod(ns, {"metadata": {"name": "bound"}, "spec": {
        "nodeName": node, "terminationGracePeriodSeconds": 5,
        "containers": [{"name": "c", "image": "busybox:1.36", "command": ["sleep", "3600"]}]}})
    out = json.loads(v1.delete_namespaced_pod("bound", ns, _preload_content=False).data)
    assert out["kind"] == "Pod"
    assert out["metadata"]["deletionGracePeriodSeconds"] == 5 and out["metadata"]["deletionTimestamp"]
    eventually(gone(lambda: v1.read_namespaced_pod("bound", ns)), timeout=30, what="kubelet confirms deletion")


def test_unbound_pod_is_deleted_at_once(api: client.ApiClient, ns: str) -> None:
    v1 = client.CoreV1Api(api)
    v1.create_namespaced_pod(ns, {"metadata": {"name": "unbound"}, "spec": {
        "schedulerName": "no-such-scheduler", "containers": [{"name": "c", "image": "busybox:1.36"}]}})
    v1.delete_namespaced_pod("unbound", ns)
    with pytest.raises(client.ApiException) as ei:
        v1.read_namespaced_pod("unbound", ns)
    assert ei.value.status == 404


def test_system_namespaces_cannot_be_deleted(api: client.ApiClient) -> None:
    with pytest.raises(client.ApiException) as ei:
        client.CoreV1Api(api).delete_namespace("kube-system")
    assert ei.value.status == 403
