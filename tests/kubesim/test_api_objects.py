"""Object semantics: identity fields, versions, errors with real Status bodies, defaults, subresources."""

from __future__ import annotations

import json

import pytest
from kubernetes import client

from kubesim.testing import pod_body, status_of

pytestmark = pytest.mark.realcluster


def test_uid_timestamp_generation_and_increasing_resource_version(api: client.ApiClient, ns: str) -> None:
    v1 = client.CoreV1Api(api)
    a = v1.create_namespaced_config_map(ns, {"metadata": {"name": "a"}, "data": {"x": "1"}})
    b = v1.create_namespaced_config_map(ns, {"metadata": {"name": "b"}})
    assert a.metadata.uid != b.metadata.uid
    assert a.metadata.creation_timestamp is not None
    assert int(b.metadata.resource_version) > int(a.metadata.resource_version)
    a2 = v1.patch_namespaced_config_map("a", ns, {"data": {"x": "2"}})
    assert int(a2.metadata.resource_version) > int(b.metadata.resource_version)
    lst = v1.list_namespaced_config_map(ns)
    assert int(lst.metadata.resource_version) >= int(a2.metadata.resource_version)


def test_generation_bumps_on_spec_not_status(api: client.ApiClient, ns: str) -> None:
    batch = client.BatchV1Api(api)
    job = batch.create_namespaced_job(ns, {"metadata": {"name": "g"}, "spec": {"suspend": True, "template": {
        "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]}}}})
    assert job.metadata.generation == 1
    job = batch.patch_namespaced_job("g", ns, {"metadata": {"labels": {"l": "v"}}})
    assert job.metadata.generation == 1
    job = batch.patch_namespaced_job_status("g", ns, {"status": {"conditions": [
        {"type": "Suspended", "status": "True", "reason": "JobSuspended", "message": "m"}]}})
    assert job.metadata.generation == 1
    job = batch.patch_namespaced_job("g", ns, {"spec": {"parallelism": 3}})
    assert job.metadata.generation == 2


def test_create_twice_is_409_already_exists(api: client.ApiClient, ns: str) -> None:
    v1 = client.CoreV1Api(api)
    v1.create_namespaced_config_map(ns, {"metadata": {"name": "dup"}})
    with pytest.raises(client.ApiException) as ei:
        v1.create_namespaced_config_map(ns, {"metadata": {"name": "dup"}})
    st = status_of(ei.value)
    assert ei.value.status == 409
    assert (st["kind"], st["status"], st["reason"], st["code"]) == ("Status", "Failure", "AlreadyExists", 409)
    assert st["details"] == {"name": "dup", "kind": "configmaps"}
    assert st["message"] == 'configmaps "dup" already exists'


def test_stale_update_is_409_conflict(api: client.ApiClient, ns: str) -> None:
    v1 = client.CoreV1Api(api)
    cm = v1.create_namespaced_config_map(ns, {"metadata": {"name": "c"}, "data": {"v": "1"}})
    cm.data = {"v": "2"}
    v1.replace_namespaced_config_map("c", ns, cm)
    cm.data = {"v": "3"}  # still carries the old resourceVersion
    with pytest.raises(client.ApiException) as ei:
        v1.replace_namespaced_config_map("c", ns, cm)
    assert ei.value.status == 409
    assert status_of(ei.value)["reason"] == "Conflict"
    assert "the object has been modified" in status_of(ei.value)["message"]


def test_missing_object_is_404_with_details(api: client.ApiClient, ns: str) -> None:
    with pytest.raises(client.ApiException) as ei:
        client.BatchV1Api(api).read_namespaced_job("nope", ns)
    st = status_of(ei.value)
    assert ei.value.status == 404
    assert st["reason"] == "NotFound"
    assert st["details"] == {"name": "nope", "group": "batch", "kind": "jobs"}
    assert st["message"] == 'jobs.batch "nope" not found'


@pytest.mark.parametrize(("kind", "name", "ok"), [
    ("pod", "a.b-c", True), ("pod", "Bad_Name", False), ("pod", "x" * 254, False),
    ("service", "a.b", False), ("service", "1abc", True), ("service", "svc-1", True),  # 1abc: v1.36 rule
    ("namespace", "a.b", False), ("namespace", "x" * 64, False),
])
def test_name_validation_is_422_invalid(api: client.ApiClient, ns: str, kind: str, name: str, ok: bool) -> None:
    v1 = client.CoreV1Api(api)

    def create() -> None:
        if kind == "pod":
            v1.create_namespaced_pod(ns, pod_body(name))
        elif kind == "service":
            v1.create_namespaced_service(ns, {"metadata": {"name": name}, "spec": {"ports": [{"port": 80}]}})
        else:
            v1.create_namespace({"metadata": {"name": name}})

    if ok:
        create()
        return
    with pytest.raises(client.ApiException) as ei:
        create()
    st = status_of(ei.value)
    assert ei.value.status == 422
    assert st["reason"] == "Invalid"
    assert st["details"]["causes"][0]["field"] == "metadata.name"
    assert st["details"]["causes"][0]["reason"] == "FieldValueInvalid"


def test_missing_required_fields_are_422(api: client.ApiClient, ns: str) -> None:
    v1 = client.CoreV1Api(api)
    with pytest.raises(client.ApiException) as ei:
        v1.create_namespaced_pod(ns, {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c"}]}})
    st = status_of(ei.value)
    assert ei.value.status == 422
    assert {"reason": "FieldValueRequired", "message": "Required value", "field": "spec.containers[0].image"} \
        in st["details"]["causes"]
    with pytest.raises(client.ApiException) as ei:
        client.BatchV1Api(api).create_namespaced_job(ns, {"metadata": {"name": "j"}, "spec": {"template": {
            "spec": {"restartPolicy": "Always", "containers": [{"name": "c", "image": "x"}]}}}})
    assert ei.value.status == 422
    assert status_of(ei.value)["details"]["causes"][0]["field"] == "spec.template.spec.restartPolicy"


def test_generate_name(api: client.ApiClient, ns: str) -> None:
    v1 = client.CoreV1Api(api)
    a = v1.create_namespaced_config_map(ns, {"metadata": {"generateName": "gen-"}})
    b = v1.create_namespaced_config_map(ns, {"metadata": {"generateName": "gen-"}})
    assert a.metadata.name.startswith("gen-") and len(a.metadata.name) == 9
    assert a.metadata.name != b.metadata.name
    assert a.metadata.generate_name == "gen-"


def test_main_resource_write_ignores_status_and_status_write_ignores_spec(api: client.ApiClient, ns: str) -> None:
    v1 = client.CoreV1Api(api)
    body = pod_body("s")
    body["status"] = {"phase": "Succeeded"}
    p = v1.create_namespaced_pod(ns, body)
    assert p.status.phase == "Pending"
    p = v1.patch_namespaced_pod("s", ns, {"status": {"phase": "Failed"}})
    assert p.status.phase != "Failed"
    p = v1.patch_namespaced_pod_status("s", ns, {"spec": {"activeDeadlineSeconds": 5},
                                                 "status": {"conditions": [{"type": "X", "status": "True"}]}})
    assert p.spec.active_deadline_seconds is None
    assert any(c.type == "X" for c in p.status.conditions), p.status.conditions


def test_pod_defaults(api: client.ApiClient, ns: str) -> None:
    body = pod_body("d")
    del body["spec"]["restartPolicy"]
    body["spec"]["containers"][0]["resources"] = {"limits": {"cpu": "1", "memory": "1Gi"}}
    p = client.CoreV1Api(api).create_namespaced_pod(ns, body)
    assert p.spec.restart_policy == "Always"
    assert p.spec.dns_policy == "ClusterFirst"
    assert p.spec.termination_grace_period_seconds == 30
    assert p.spec.scheduler_name == "default-scheduler"
    assert p.spec.service_account_name == "default"
    assert p.status.phase == "Pending"
    assert p.status.qos_class == "Guaranteed"
    c = p.spec.containers[0]
    assert c.resources.requests == {"cpu": "1", "memory": "1Gi"}
    assert c.image_pull_policy == "IfNotPresent"
    assert c.termination_message_path == "/dev/termination-log"


def test_pod_spec_is_immutable_except_image(api: client.ApiClient, ns: str) -> None:
    v1 = client.CoreV1Api(api)
    v1.create_namespaced_pod(ns, pod_body("im"))
    p = v1.patch_namespaced_pod("im", ns, {"spec": {"containers": [{"name": "main", "image": "busybox:1.37"}]}})
    assert p.spec.containers[0].image == "busybox:1.37"
    with pytest.raises(client.ApiException) as ei:
        v1.patch_namespaced_pod("im", ns, {"spec": {"containers": [{"name": "main", "command": ["false"]}]}})
    assert ei.value.status == 422


def test_service_defaults_and_headless(api: client.ApiClient, ns: str) -> None:
    v1 = client.CoreV1Api(api)
    s = v1.create_namespaced_service(ns, {"metadata": {"name": "web"}, "spec": {"ports": [{"port": 80}]}})
    assert s.spec.cluster_ip and s.spec.cluster_ip != "None"
    assert s.spec.cluster_ips == [s.spec.cluster_ip]
    assert s.spec.type == "ClusterIP"
    assert s.spec.ports[0].protocol == "TCP"
    assert s.spec.ports[0].target_port == 80
    h = v1.create_namespaced_service(ns, {"metadata": {"name": "hl"}, "spec": {"clusterIP": "None",
                                                                               "selector": {"a": "b"}}})
    assert h.spec.cluster_ip == "None"


def test_job_defaults_selector_and_template_labels(api: client.ApiClient, ns: str) -> None:
    j = client.BatchV1Api(api).create_namespaced_job(ns, {"metadata": {"name": "jd"}, "spec": {
        "suspend": True,
        "template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "x"}]}}}})
    uid = j.metadata.uid
    assert (j.spec.completions, j.spec.parallelism, j.spec.backoff_limit) == (1, 1, 6)
    assert j.spec.completion_mode == "NonIndexed"
    assert j.spec.pod_replacement_policy == "TerminatingOrFailed"
    assert j.spec.selector.match_labels == {"batch.kubernetes.io/controller-uid": uid}
    labels = j.spec.template.metadata.labels
    assert labels["batch.kubernetes.io/controller-uid"] == uid and labels["controller-uid"] == uid
    assert labels["batch.kubernetes.io/job-name"] == "jd" and labels["job-name"] == "jd"


def test_secret_data_must_be_base64_and_string_data_is_encoded(api: client.ApiClient, ns: str) -> None:
    v1 = client.CoreV1Api(api)
    with pytest.raises(client.ApiException) as ei:
        v1.create_namespaced_secret(ns, {"metadata": {"name": "bad"}, "data": {"k": "!!notbase64"}})
    assert ei.value.status == 400
    s = v1.create_namespaced_secret(ns, {"metadata": {"name": "ok"}, "stringData": {"k": "hi"}})
    assert s.data == {"k": "aGk="} and s.type == "Opaque"


def test_default_namespaces_and_service_account(api: client.ApiClient, ns: str) -> None:
    v1 = client.CoreV1Api(api)
    names = {n.metadata.name for n in v1.list_namespace().items}
    assert {"default", "kube-system"} <= names
    assert v1.read_namespace(ns).status.phase == "Active"
    from kubesim.testing import eventually
    eventually(lambda: v1.list_namespaced_service_account(ns, field_selector="metadata.name=default").items,
               what="default service account")


def test_delete_answers_object_or_status_as_upstream(api: client.ApiClient, ns: str) -> None:
    v1 = client.CoreV1Api(api)
    v1.create_namespaced_config_map(ns, {"metadata": {"name": "x"}})
    st = json.loads(v1.delete_namespaced_config_map("x", ns, _preload_content=False).data)
    assert st["kind"] == "Status" and st["status"] == "Success"
    assert st["details"]["name"] == "x" and st["details"]["kind"] == "configmaps"
    v1.create_namespaced_service_account(ns, {"metadata": {"name": "sa"}})
    sa = json.loads(v1.delete_namespaced_service_account("sa", ns, _preload_content=False).data)
    assert sa["kind"] == "ServiceAccount" and sa["metadata"]["name"] == "sa"


def test_leases_and_events(api: client.ApiClient, ns: str) -> None:
    coord = client.CoordinationV1Api(api)
    lease = coord.create_namespaced_lease(ns, {"metadata": {"name": "l"}, "spec": {
        "holderIdentity": "me", "leaseDurationSeconds": 15}})
    assert lease.spec.holder_identity == "me"
    v1 = client.CoreV1Api(api)
    v1.create_namespaced_event(ns, {"metadata": {"name": "e1"}, "involvedObject": {
        "kind": "Pod", "name": "p", "namespace": ns}, "reason": "Test", "message": "hello", "type": "Normal"})
    evs = v1.list_namespaced_event(ns, field_selector="involvedObject.name=p").items
    assert [e.reason for e in evs] == ["Test"]


def test_binding_subresource_assigns_the_node_once(api: client.ApiClient, ns: str) -> None:
    v1 = client.CoreV1Api(api)
    node = v1.list_node().items[0].metadata.name
    v1.create_namespaced_pod(ns, pod_body("tobind", schedulerName="no-such-scheduler"))
    binding = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "tobind"},
               "target": {"apiVersion": "v1", "kind": "Node", "name": node}}
    v1.create_namespaced_pod_binding("tobind", ns, binding, _preload_content=False)
    pod = v1.read_namespaced_pod("tobind", ns)
    assert pod.spec.node_name == node
    with pytest.raises(client.ApiException) as ei:
        v1.create_namespaced_pod_binding("tobind", ns, binding, _preload_content=False)
    assert ei.value.status == 409


def test_create_with_resource_version_is_refused(api: client.ApiClient, ns: str) -> None:
    # Objects copied from another cluster must have their resourceVersion stripped before create.
    v1 = client.CoreV1Api(api)
    with pytest.raises(client.ApiException) as ei:
        v1.create_namespaced_config_map(ns, {"metadata": {"name": "rv", "resourceVersion": "12"}})
    assert ei.value.status == 500
    assert "resourceVersion should not be set" in status_of(ei.value)["message"]


def test_update_with_another_uid_is_a_precondition_conflict(api: client.ApiClient, ns: str) -> None:
    v1 = client.CoreV1Api(api)
    cm = v1.create_namespaced_config_map(ns, {"metadata": {"name": "u"}})
    cm.metadata.uid = "00000000-0000-0000-0000-000000000000"
    cm.metadata.resource_version = None
    with pytest.raises(client.ApiException) as ei:
        v1.replace_namespaced_config_map("u", ns, cm)
    assert ei.value.status == 409


def test_job_immutable_fields(api: client.ApiClient, ns: str) -> None:
    batch = client.BatchV1Api(api)
    batch.create_namespaced_job(ns, {"metadata": {"name": "imm"}, "spec": {
        "suspend": True, "completions": 2, "parallelism": 1, "managedBy": "example.com/dispatcher",
        "template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "x"}]}}}})
    for patch in ({"spec": {"completions": 3}}, {"spec": {"managedBy": "example.com/other"}},
                  {"spec": {"selector": {"matchLabels": {"a": "b"}}}}):
        with pytest.raises(client.ApiException) as ei:
            batch.patch_namespaced_job("imm", ns, patch)
        assert ei.value.status == 422, patch
    # The template of a suspended job may change (Kueue relies on this to inject node selectors).
    job = batch.patch_namespaced_job("imm", ns, {"spec": {"template": {"spec": {"nodeSelector": {"x": "y"}}}}})
    assert job.spec.template.spec.node_selector == {"x": "y"}
    with pytest.raises(client.ApiException) as ei:
        batch.patch_namespaced_job("imm", ns, {"spec": {"template": {"spec": {"containers": [
            {"name": "c", "image": "other"}]}}}})
    assert ei.value.status == 422
