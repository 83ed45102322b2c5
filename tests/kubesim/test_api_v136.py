"""What a v1.36 API server refuses or adds that kubesim once did not: the Job status rules of the v1.36 Job
strategy, ``kube-root-ca.crt`` in every namespace, the 256 KiB annotation limit, canonical quantity strings,
a custom resource's wrong ``kind`` (422), the relaxed Service name rule.

The Job status tests use Jobs whose ``spec.managedBy`` names another controller, so that on a real cluster
the Job controller leaves their status to the test (as it leaves it to MultiKueue and to mkd's mirror).
"""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client
from kubernetes.dynamic import DynamicClient

from kubesim.testing import eventually, pod_body, status_of

pytestmark = pytest.mark.realcluster

T0, T1 = "2026-01-01T00:00:00Z", "2026-01-01T00:01:00Z"


def external_job(name: str) -> dict[str, Any]:
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name}, "spec": {
        "managedBy": "example.com/elsewhere", "template": {"spec": {
            "restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox:1.36"}]}}}}


def cond(ctype: str, reason: str = "Done") -> dict[str, Any]:
    return {"type": ctype, "status": "True", "reason": reason, "message": "", "lastTransitionTime": T1,
            "lastProbeTime": T1}


def status_refused(batch: client.BatchV1Api, name: str, ns: str, status: dict[str, Any]) -> dict[str, Any]:
    with pytest.raises(client.ApiException) as ei:  # a merge patch: lists (conditions) are replaced whole
        batch.patch_namespaced_job_status(name, ns, {"status": status},
                                          _content_type="application/merge-patch+json")
    assert ei.value.status == 422, ei.value.body
    return status_of(ei.value)


def test_complete_without_success_criteria_met_is_422(api: client.ApiClient, ns: str) -> None:
    batch = client.BatchV1Api(api)
    batch.create_namespaced_job(ns, external_job("done"))
    st = status_refused(batch, "done", ns, {"startTime": T0, "completionTime": T1, "succeeded": 1,
                                            "conditions": [cond("Complete")]})
    detail = "Invalid value: cannot set Complete=True condition without the SuccessCriteriaMet=true condition"
    assert st["reason"] == "Invalid"
    assert st["details"]["causes"] == [{"reason": "FieldValueInvalid", "message": detail,
                                        "field": "status.conditions"}]
    assert st["message"] == f'Job.batch "done" is invalid: status.conditions: {detail}'
    # The way the Job controller (and a mirroring managedBy controller) finishes a Job is accepted.
    batch.patch_namespaced_job_status("done", ns, {"status": {
        "startTime": T0, "succeeded": 1, "conditions": [cond("SuccessCriteriaMet", "CompletionsReached")]}})
    job = batch.patch_namespaced_job_status("done", ns, {"status": {"completionTime": T1, "conditions": [
        cond("SuccessCriteriaMet", "CompletionsReached"), cond("Complete", "CompletionsReached")]}})
    assert [c.type for c in job.status.conditions] == ["SuccessCriteriaMet", "Complete"]
    # A terminal condition cannot be taken back.
    st = status_refused(batch, "done", ns, {"conditions": [cond("SuccessCriteriaMet", "CompletionsReached")]})
    assert {"reason": "FieldValueInvalid", "field": "status.conditions",
            "message": "Invalid value: cannot disable the terminal Complete=True condition"} in st["details"]["causes"]


def test_failed_needs_failure_target_start_time_and_no_active_pods(api: client.ApiClient, ns: str) -> None:
    batch = client.BatchV1Api(api)
    batch.create_namespaced_job(ns, external_job("fail"))
    st = status_refused(batch, "fail", ns, {"active": 1, "conditions": [cond("Failed", "BackoffLimitExceeded")]})
    causes = {(c["field"], c["message"]) for c in st["details"]["causes"]}
    assert ("status.conditions", "Invalid value: cannot set Failed=True condition without the FailureTarget=true "
            "condition") in causes
    assert ("status.active", "Invalid value: 1: active>0 is invalid for finished job") in causes
    assert ("status.startTime", "Required value: startTime is required for finished job") in causes
    job = batch.patch_namespaced_job_status("fail", ns, {"status": {"startTime": T0, "conditions": [
        cond("FailureTarget", "BackoffLimitExceeded"), cond("Failed", "BackoffLimitExceeded")]}})
    assert [c.type for c in job.status.conditions] == ["FailureTarget", "Failed"]


def test_status_counters_cannot_go_down_or_below_zero(api: client.ApiClient, ns: str) -> None:
    batch = client.BatchV1Api(api)
    batch.create_namespaced_job(ns, external_job("count"))
    batch.patch_namespaced_job_status("count", ns, {"status": {"startTime": T0, "failed": 2, "active": 1}})
    st = status_refused(batch, "count", ns, {"failed": 1})
    assert st["details"]["causes"] == [{"reason": "FieldValueInvalid", "field": "status.failed",
                                        "message": "Invalid value: 1: cannot decrease the failed counter"}]
    st = status_refused(batch, "count", ns, {"ready": 2})
    assert st["details"]["causes"][0]["message"] == "Invalid value: 2: cannot set more ready pods than active"


def test_every_namespace_has_the_root_ca_configmap(api: client.ApiClient, ns: str) -> None:
    v1 = client.CoreV1Api(api)

    def published() -> Any:
        try:
            return v1.read_namespaced_config_map("kube-root-ca.crt", ns)
        except client.ApiException as e:
            if e.status == 404:
                return None
            raise

    cm = eventually(published, timeout=30, what="kube-root-ca.crt in a new namespace")
    assert cm.data["ca.crt"].startswith("-----BEGIN CERTIFICATE-----")
    assert "kubernetes.io/description" in cm.metadata.annotations
    v1.delete_namespaced_config_map("kube-root-ca.crt", ns)
    eventually(published, timeout=30, what="kube-root-ca.crt published again after a delete")


def test_annotations_are_capped_at_256_kib_in_total(api: client.ApiClient, ns: str) -> None:
    v1 = client.CoreV1Api(api)
    big = {"a": "x" * (128 * 1024), "b": "y" * (128 * 1024)}  # 262146 bytes with the keys
    with pytest.raises(client.ApiException) as ei:
        v1.create_namespaced_config_map(ns, {"metadata": {"name": "big", "annotations": big}})
    st = status_of(ei.value)
    assert ei.value.status == 422
    # apimachinery pkg/api/validation/objectmeta.go ValidateAnnotations: field.TooLong(path, "", 262144).
    assert st["details"]["causes"] == [{"reason": "FieldValueTooLong", "field": "metadata.annotations",
                                        "message": "Too long: may not be more than 262144 bytes"}]
    big["b"] = "y" * (128 * 1024 - 2)
    v1.create_namespaced_config_map(ns, {"metadata": {"name": "fits", "annotations": big}})


LABEL_VALUE_RULE = ("a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', "
                    "and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or "
                    "'12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')")
LABEL_KEY_RULE = ("name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with "
                  "an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for "
                  "validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')")


def test_label_values_and_keys_are_refused_with_each_rule_they_break(api: client.ApiClient, ns: str) -> None:
    """apimachinery pkg/api/validate/content/kube.go IsLabelValue / IsLabelKey (MaxLenError in bytes, then the
    RegexError), each message an Invalid cause at ``metadata.labels`` (metav1 validation ValidateLabels)."""
    v1 = client.CoreV1Api(api)

    def causes(labels: dict[str, str]) -> list[dict[str, str]]:
        with pytest.raises(client.ApiException) as ei:
            v1.create_namespaced_config_map(ns, {"metadata": {"name": "lbl", "labels": labels}})
        assert ei.value.status == 422
        return list(status_of(ei.value)["details"]["causes"])

    long_ok = "a" * 64
    assert causes({"k": long_ok}) == [{"reason": "FieldValueInvalid", "field": "metadata.labels",
                                       "message": f'Invalid value: "{long_ok}": must be no more than 63 bytes'}]
    long_bad = "-" + "a" * 63
    assert causes({"k": long_bad}) == [
        {"reason": "FieldValueInvalid", "field": "metadata.labels",
         "message": f'Invalid value: "{long_bad}": must be no more than 63 bytes'},
        {"reason": "FieldValueInvalid", "field": "metadata.labels",
         "message": f'Invalid value: "{long_bad}": {LABEL_VALUE_RULE}'}]
    assert causes({"bad key!": "v"}) == [{"reason": "FieldValueInvalid", "field": "metadata.labels",
                                          "message": f'Invalid value: "bad key!": {LABEL_KEY_RULE}'}]
    v1.create_namespaced_config_map(ns, {"metadata": {"name": "lbl", "labels": {"k": "a" * 63}}})


def test_quantities_come_back_as_canonical_strings(api: client.ApiClient, ns: str) -> None:
    body = pod_body("q", schedulerName="kubesim-nobody")
    body["spec"]["containers"][0]["resources"] = {
        "requests": {"cpu": 0.5, "memory": "1.5Gi", "nvidia.com/gpu": 1},
        "limits": {"cpu": "1000m", "memory": "2048Mi", "nvidia.com/gpu": 1}}
    # The dynamic client sends the numbers as they are (the typed client refuses non-string quantities).
    pods = DynamicClient(api).resources.get(api_version="v1", kind="Pod")
    res = pods.create(body=body, namespace=ns).to_dict()["spec"]["containers"][0]["resources"]
    assert res == {"requests": {"cpu": "500m", "memory": "1536Mi", "nvidia.com/gpu": "1"},
                   "limits": {"cpu": "1", "memory": "2Gi", "nvidia.com/gpu": "1"}}
    bad = pod_body("bad")
    bad["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "lots"}}
    with pytest.raises(client.ApiException) as ei:
        client.CoreV1Api(api).create_namespaced_pod(ns, bad)
    assert ei.value.status == 400
    assert "quantities must match the regular expression" in status_of(ei.value)["message"]


def test_service_names_follow_the_relaxed_v1_36_rule(api: client.ApiClient, ns: str) -> None:
    v1 = client.CoreV1Api(api)
    svc = v1.create_namespaced_service(ns, {"metadata": {"name": "1abc"}, "spec": {"ports": [{"port": 80}]}})
    assert svc.metadata.name == "1abc"
    with pytest.raises(client.ApiException) as ei:
        v1.create_namespaced_service(ns, {"metadata": {"name": "a.b"}, "spec": {"ports": [{"port": 80}]}})
    assert ei.value.status == 422


def test_start_time_cannot_be_removed_while_the_job_is_unsuspended(api: client.ApiClient, ns: str) -> None:
    """A status write that drops ``startTime`` of a running Job is refused whole (what a mirror writing a new
    worker copy's status, not started yet, must avoid); suspended, the same removal is accepted."""
    batch = client.BatchV1Api(api)
    batch.create_namespaced_job(ns, external_job("running"))
    batch.patch_namespaced_job_status("running", ns, {"status": {"startTime": T0, "active": 1}})
    st = status_refused(batch, "running", ns, {"startTime": None, "active": 0})
    assert {"reason": "FieldValueRequired", "field": "status.startTime",
            "message": "Required value: startTime cannot be removed for unsuspended job"} in st["details"]["causes"]
    assert batch.read_namespaced_job_status("running", ns).status.active == 1   # nothing of it was written
    batch.patch_namespaced_job("running", ns, {"spec": {"suspend": True}})
    job = batch.patch_namespaced_job_status("running", ns, {"status": {"startTime": None, "active": 0}},
                                            _content_type="application/merge-patch+json")
    assert job.status.start_time is None
