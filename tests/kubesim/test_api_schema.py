"""Custom resources against their CRD's structural schema: validation (422 Invalid with kube-openapi's field
paths and messages), defaulting, pruning, ``fieldValidation`` and ratcheting, as a v1.36 apiserver does them.

Field paths of schema errors are kube-openapi's: map keys joined with ``.``
(``spec.pytorchReplicaSpecs.Worker.replicas``); CEL rule errors (not tested here) write ``[Worker]``.
"""

from __future__ import annotations

import contextlib
import copy
import json
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from federation.kinds.crds import load_crds
from kubesim.testing import eventually, status_of

pytestmark = pytest.mark.realcluster

GROUP = "schema.kubesim.mkd.dev"
API = f"{GROUP}/v1"
REPLICA = {
    "type": "object",
    "properties": {
        "replicas": {"type": "integer", "format": "int32", "minimum": 0},
        "restartPolicy": {"type": "string", "enum": ["Always", "OnFailure", "Never", "ExitCode"],
                          "default": "OnFailure"},
        "template": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
    },
}
SCHEMA = {
    "type": "object",
    "properties": {
        "apiVersion": {"type": "string"}, "kind": {"type": "string"}, "metadata": {"type": "object"},
        "spec": {
            "type": "object",
            "required": ["pytorchReplicaSpecs"],
            "properties": {
                "pytorchReplicaSpecs": {"type": "object", "additionalProperties": REPLICA},
                "runPolicy": {"type": "object", "properties": {
                    "managedBy": {"type": "string",
                                  "enum": ["kubeflow.org/training-operator", "kueue.x-k8s.io/multikueue"]},
                    "suspend": {"type": "boolean", "default": False},
                    "backoffLimit": {"type": "integer", "maximum": 100},
                }},
                "port": {"x-kubernetes-int-or-string": True},
                "alias": {"type": "string", "maxLength": 8, "pattern": "^[a-z]+$"},
                "kindName": {"type": "string", "pattern": "^(?i)[a-z]([-a-z0-9]*[a-z0-9])?$"},
                "ports": {"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"],
                          "items": {"type": "object", "required": ["name"], "properties": {
                              "name": {"type": "string"}, "port": {"type": "integer"}}}},
                "tags": {"type": "array", "maxItems": 2, "items": {"type": "string"}},
                "extra": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
            },
        },
        "status": {"type": "object", "properties": {
            "active": {"type": "integer", "minimum": 0},
            "conditions": {"type": "array", "items": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
        }},
    },
}


def _crd(schema: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": f"torchjobs.{GROUP}"}, "spec": {
                "group": GROUP, "scope": "Namespaced",
                "names": {"plural": "torchjobs", "singular": "torchjob", "kind": "TorchJob"},
                "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": schema},
                              "subresources": {"status": {}}}]}}


def _served(co: client.CustomObjectsApi, group: str, version: str, plural: str) -> bool:
    try:
        co.list_namespaced_custom_object(group, version, "default", plural)
    except client.ApiException as e:
        if e.status in (404, 429, 503):  # not served yet (a real server answers 429/503 for a moment too)
            return False
        raise
    return True


@pytest.fixture(scope="module")
def torchjobs(api: client.ApiClient) -> Iterator[client.CustomObjectsApi]:
    ext = client.ApiextensionsV1Api(api)
    with contextlib.suppress(client.ApiException):
        ext.delete_custom_resource_definition(f"torchjobs.{GROUP}")
    eventually(lambda: _absent(ext, f"torchjobs.{GROUP}"), timeout=30, what="old CRD gone")
    ext.create_custom_resource_definition(_crd(SCHEMA))
    co = client.CustomObjectsApi(api)
    eventually(lambda: _served(co, GROUP, "v1", "torchjobs"), timeout=30, what="torchjobs served")
    yield co
    with contextlib.suppress(client.ApiException):
        ext.delete_custom_resource_definition(f"torchjobs.{GROUP}")


def _absent(ext: client.ApiextensionsV1Api, name: str) -> bool:
    try:
        ext.read_custom_resource_definition(name)
    except client.ApiException as e:
        return e.status == 404
    return False


def job(name: str, **spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"pytorchReplicaSpecs": {"Worker": {"replicas": 2, "template": {"spec": {}}}}}
    base.update(spec)
    return {"apiVersion": API, "kind": "TorchJob", "metadata": {"name": name}, "spec": base}


def refused(co: client.CustomObjectsApi, ns: str, body: dict[str, Any], **kw: Any) -> dict[str, Any]:
    with pytest.raises(client.ApiException) as ei:
        co.create_namespaced_custom_object(GROUP, "v1", ns, "torchjobs", body, **kw)
    st = status_of(ei.value)
    st["code_seen"] = ei.value.status
    return st


def test_negative_replicas_in_a_map_value_is_422_with_the_kube_openapi_path(
        torchjobs: client.CustomObjectsApi, ns: str) -> None:
    body = job("neg")
    body["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] = -1
    st = refused(torchjobs, ns, body)
    assert st["code_seen"] == 422 and st["reason"] == "Invalid"
    path = "spec.pytorchReplicaSpecs.Worker.replicas"
    detail = f"Invalid value: -1: {path} in body should be greater than or equal to 0"
    assert st["details"] == {"name": "neg", "group": GROUP, "kind": "TorchJob", "causes": [
        {"reason": "FieldValueInvalid", "message": detail, "field": path}]}
    assert st["message"] == f'TorchJob.{GROUP} "neg" is invalid: {path}: {detail}'


def test_wrong_type_enum_and_required_each_have_their_cause(torchjobs: client.CustomObjectsApi, ns: str) -> None:
    body = job("types", runPolicy={"managedBy": "example.com/other"})
    body["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] = "two"
    st = refused(torchjobs, ns, body)
    causes = {c["field"]: c for c in st["details"]["causes"]}
    assert causes["spec.pytorchReplicaSpecs.Worker.replicas"] == {
        "reason": "FieldValueTypeInvalid", "field": "spec.pytorchReplicaSpecs.Worker.replicas",
        "message": 'Invalid value: "string": spec.pytorchReplicaSpecs.Worker.replicas in body must be of type '
                   'integer: "string"'}
    assert causes["spec.runPolicy.managedBy"] == {
        "reason": "FieldValueNotSupported", "field": "spec.runPolicy.managedBy",
        "message": 'Unsupported value: "example.com/other": supported values: "kubeflow.org/training-operator", '
                   '"kueue.x-k8s.io/multikueue"'}
    assert len(causes) == 2
    # Several causes: the message lists them in brackets.
    assert st["message"].startswith(f'TorchJob.{GROUP} "types" is invalid: [')

    missing = refused(torchjobs, ns, {"apiVersion": API, "kind": "TorchJob", "metadata": {"name": "req"},
                                      "spec": {"runPolicy": {}}})
    assert missing["details"]["causes"] == [
        {"reason": "FieldValueRequired", "message": "Required value", "field": "spec.pytorchReplicaSpecs"}]


def test_strings_lists_numbers_and_list_map_keys(torchjobs: client.CustomObjectsApi, ns: str) -> None:
    body = job("shapes", alias="UPPERCASEX", tags=["a", "b", "c"], ports=[{"name": "a"}, {"name": "a"}],
               runPolicy={"backoffLimit": 101}, port=1.5)
    st = refused(torchjobs, ns, body)
    got = {(c["field"], c["reason"]): c["message"] for c in st["details"]["causes"]}
    # apiextensions-apiserver's schema validation reports maxLength as field.TooLong (apimachinery
    # pkg/util/validation/field/errors.go) and, as kube-openapi's string validator, stops at the first failing
    # string rule: no pattern error for a string already too long.
    assert got[("spec.alias", "FieldValueTooLong")] == "Too long: may not be more than 8 bytes"
    assert ("spec.alias", "FieldValueInvalid") not in got
    assert got[("spec.tags", "FieldValueTooMany")] == "Too many: 3: must have at most 2 items"
    assert ("spec.ports[1]", "FieldValueDuplicate") in got
    assert got[("spec.runPolicy.backoffLimit", "FieldValueInvalid")] == \
        "Invalid value: 101: spec.runPolicy.backoffLimit in body should be less than or equal to 100"
    assert ("spec.port", "FieldValueTypeInvalid") in got
    st = refused(torchjobs, ns, job("pattern", alias="UPPER"))
    assert st["details"]["causes"] == [{"reason": "FieldValueInvalid", "field": "spec.alias",
                                        "message": "Invalid value: \"UPPER\": spec.alias in body should match "
                                                   "'^[a-z]+$'"}]
    ok = torchjobs.create_namespaced_custom_object(GROUP, "v1", ns, "torchjobs",
                                                   job("intorstr", port="http", ports=[{"name": "a", "port": 1}]))
    assert ok["spec"]["port"] == "http"


def test_defaults_are_applied_recursively(torchjobs: client.CustomObjectsApi, ns: str) -> None:
    created = torchjobs.create_namespaced_custom_object(GROUP, "v1", ns, "torchjobs", job("dflt", runPolicy={}))
    assert created["spec"]["runPolicy"] == {"suspend": False}
    assert created["spec"]["pytorchReplicaSpecs"]["Worker"]["restartPolicy"] == "OnFailure"  # in a map value
    # A null is dropped and then defaulted, as for a missing field.
    patched = torchjobs.patch_namespaced_custom_object(GROUP, "v1", ns, "torchjobs", "dflt",
                                                       [{"op": "replace", "path": "/spec/runPolicy/suspend",
                                                         "value": None}],
                                                       _content_type="application/json-patch+json")
    assert patched["spec"]["runPolicy"]["suspend"] is False


def test_unknown_fields_are_pruned_and_warned_about(torchjobs: client.CustomObjectsApi, ns: str) -> None:
    body = job("prune", bogus={"a": 1}, extra={"kept": {"deep": True}})
    body["spec"]["pytorchReplicaSpecs"]["Worker"]["template"] = {"spec": {"containers": [{"name": "x"}]}}
    body["spec"]["pytorchReplicaSpecs"]["Worker"]["junk"] = 1
    body["topLevel"] = "x"
    data, code, headers = torchjobs.create_namespaced_custom_object_with_http_info(
        GROUP, "v1", ns, "torchjobs", body)
    assert code == 201
    assert "bogus" not in data["spec"] and "topLevel" not in data
    assert "junk" not in data["spec"]["pytorchReplicaSpecs"]["Worker"]
    assert data["spec"]["extra"] == {"kept": {"deep": True}}
    assert data["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"] == [{"name": "x"}]
    warnings = headers.getlist("Warning") if hasattr(headers, "getlist") else [headers.get("Warning")]
    text = " ".join(w or "" for w in warnings)
    for f in ("spec.bogus", "spec.pytorchReplicaSpecs.Worker.junk", "topLevel"):
        assert f'unknown field \\"{f}\\"' in text, text


def test_field_validation_strict_refuses_and_ignore_is_silent(torchjobs: client.CustomObjectsApi, ns: str) -> None:
    body = job("strict", bogus=1)
    st = refused(torchjobs, ns, copy.deepcopy(body), field_validation="Strict")
    assert st["code_seen"] == 400 and st["reason"] == "BadRequest"
    assert st["message"] == 'TorchJob in version "v1" cannot be handled as a TorchJob: strict decoding error: ' \
                            'unknown field "spec.bogus"'
    body["metadata"]["name"] = "ignore"
    data, _, headers = torchjobs.create_namespaced_custom_object_with_http_info(
        GROUP, "v1", ns, "torchjobs", body, field_validation="Ignore")
    assert "bogus" not in data["spec"] and not headers.get("Warning")
    # Strict also applies to patches: apiserver pkg/endpoints/handlers/patch.go refuses the patched object with
    # errors.NewInvalid(schema.GroupKind{}, "", field.Invalid(field.NewPath("patch"), patchedObjJS, ...)).
    current = torchjobs.get_namespaced_custom_object(GROUP, "v1", ns, "torchjobs", "ignore")
    with pytest.raises(client.ApiException) as ei:
        torchjobs.patch_namespaced_custom_object(GROUP, "v1", ns, "torchjobs", "ignore", {"spec": {"nope": 1}},
                                                 field_validation="Strict")
    st = status_of(ei.value)
    assert ei.value.status == 422 and st["reason"] == "Invalid"
    assert list(st["details"]) == ["causes"]
    [cause] = st["details"]["causes"]
    assert cause["field"] == "patch" and cause["reason"] == "FieldValueInvalid"
    prefix, _, shown = cause["message"].partition(": ")
    assert prefix == "Invalid value"
    value, _, detail = shown.rpartition(": strict decoding error: ")
    assert detail == 'unknown field "spec.nope"'
    patched = json.loads(json.loads(value))  # %q of the patched object's JSON
    assert patched["spec"]["nope"] == 1 and patched["metadata"]["uid"] == current["metadata"]["uid"]
    assert st["message"] == f' "" is invalid: patch: {cause["message"]}'


def test_updates_and_status_writes_are_validated(torchjobs: client.CustomObjectsApi, ns: str) -> None:
    torchjobs.create_namespaced_custom_object(GROUP, "v1", ns, "torchjobs", job("upd"))
    with pytest.raises(client.ApiException) as ei:
        torchjobs.patch_namespaced_custom_object(GROUP, "v1", ns, "torchjobs", "upd",
                                                 {"spec": {"runPolicy": {"managedBy": "nobody"}}})
    assert ei.value.status == 422
    with pytest.raises(client.ApiException) as ei:
        torchjobs.patch_namespaced_custom_object_status(GROUP, "v1", ns, "torchjobs", "upd",
                                                        {"status": {"active": -3}})
    assert status_of(ei.value)["details"]["causes"][0]["field"] == "status.active"
    st = torchjobs.patch_namespaced_custom_object_status(GROUP, "v1", ns, "torchjobs", "upd",
                                                         {"status": {"active": 1, "junk": 2}})
    assert st["status"] == {"active": 1}


def test_ratcheting_keeps_unchanged_invalid_values_writable(api: client.ApiClient,
                                                            torchjobs: client.CustomObjectsApi, ns: str) -> None:
    """An object made valid under an older schema can still be updated elsewhere (CRDValidationRatcheting)."""
    ext = client.ApiextensionsV1Api(api)
    torchjobs.create_namespaced_custom_object(GROUP, "v1", ns, "torchjobs", job("ratchet", tags=["a", "b"]))
    tighter = copy.deepcopy(SCHEMA)
    tighter["properties"]["spec"]["properties"]["tags"]["maxItems"] = 1
    crd = ext.read_custom_resource_definition(f"torchjobs.{GROUP}")
    body = _crd(tighter)
    body["metadata"]["resourceVersion"] = crd.metadata.resource_version
    ext.replace_custom_resource_definition(f"torchjobs.{GROUP}", body)
    try:
        def tightened() -> bool:
            try:
                torchjobs.create_namespaced_custom_object(GROUP, "v1", ns, "torchjobs",
                                                          job("probe", tags=["a", "b"]), dry_run="All")
            except client.ApiException as e:
                return e.status == 422
            return False

        eventually(tightened, timeout=30, what="the tighter schema in force")
        out = torchjobs.patch_namespaced_custom_object(GROUP, "v1", ns, "torchjobs", "ratchet",
                                                       {"spec": {"runPolicy": {"suspend": True}}})
        assert out["spec"]["tags"] == ["a", "b"]
        with pytest.raises(client.ApiException) as ei:
            torchjobs.patch_namespaced_custom_object(GROUP, "v1", ns, "torchjobs", "ratchet",
                                                     {"spec": {"tags": ["a", "b", "c"]}})
        assert ei.value.status == 422
    finally:
        crd = ext.read_custom_resource_definition(f"torchjobs.{GROUP}")
        body = _crd(SCHEMA)
        body["metadata"]["resourceVersion"] = crd.metadata.resource_version
        ext.replace_custom_resource_definition(f"torchjobs.{GROUP}", body)


# ------------------------------------------------------------------ mkd's own CRDs


@pytest.fixture(scope="module")
def mkd_crds(api: client.ApiClient) -> client.CustomObjectsApi:
    ext = client.ApiextensionsV1Api(api)
    co = client.CustomObjectsApi(api)
    for crd in load_crds():
        name = crd["metadata"]["name"]
        if name.split(".", 1)[0] not in ("pytorchjobs", "trainjobs"):
            continue
        try:
            ext.create_custom_resource_definition(crd)
        except client.ApiException as e:
            if e.status != 409:
                raise
        plural, group = name.split(".", 1)
        version = crd["spec"]["versions"][0]["name"]
        eventually(lambda g=group, v=version, p=plural: _served(co, g, v, p), timeout=30, what=f"{name} served")
    return co


def test_mkd_crds_default_trainjob_managed_by_and_refuse_foreign_pytorchjob_managers(
        mkd_crds: client.CustomObjectsApi, ns: str) -> None:
    tj = mkd_crds.create_namespaced_custom_object("trainer.kubeflow.org", "v1alpha1", ns, "trainjobs", {
        "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "metadata": {"name": "tj"},
        "spec": {"runtimeRef": {"name": "torch-distributed"}}})
    assert tj["spec"]["managedBy"] == "trainer.kubeflow.org/trainjob-controller"
    assert tj["spec"]["suspend"] is False
    with pytest.raises(client.ApiException) as ei:
        mkd_crds.create_namespaced_custom_object("kubeflow.org", "v1", ns, "pytorchjobs", {
            "apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": "pj"},
            "spec": {"runPolicy": {"managedBy": "example.com/other"}, "pytorchReplicaSpecs": {}}})
    st = status_of(ei.value)
    assert ei.value.status == 422 and st["reason"] == "Invalid"
    assert st["details"]["causes"][0]["field"] == "spec.runPolicy.managedBy"


def test_built_in_kinds_drop_unknown_fields_and_strict_refuses_them(api: client.ApiClient, ns: str) -> None:
    """Typed decoding: a Pod field that does not exist is dropped (with a warning), or refused under Strict
    (kubectl's default), with the path of the misspelt field."""
    from kubernetes.dynamic import DynamicClient

    from kubesim.testing import pod_body

    pods = DynamicClient(api).resources.get(api_version="v1", kind="Pod")
    body = pod_body("typo", schedulerName="kubesim-nobody")
    body["spec"]["containers"][0]["imagePullPolciy"] = "Always"
    body["spec"]["nodeSelectr"] = {"a": "b"}
    # The raw request: the typed client would drop the unknown keys itself, the dynamic one has no
    # fieldValidation parameter.
    method, url, headers, data, _ = api.param_serialize(
        "POST", f"/api/v1/namespaces/{ns}/pods", query_params=[("fieldValidation", "Strict")],
        header_params={"Content-Type": "application/json", "Accept": "application/json"}, body=body,
        auth_settings=["BearerToken"])
    resp = api.call_api(method, url, header_params=headers, body=data)
    resp.read()
    assert resp.status == 400, resp.data
    assert json.loads(resp.data)["message"] == (
        'Pod in version "v1" cannot be handled as a Pod: strict decoding error: '
        'unknown field "spec.containers[0].imagePullPolciy", unknown field "spec.nodeSelectr"')
    created = pods.create(body=body, namespace=ns).to_dict()
    assert "nodeSelectr" not in created["spec"] and "imagePullPolciy" not in created["spec"]["containers"][0]
    assert created["spec"]["containers"][0]["imagePullPolicy"] == "IfNotPresent"  # defaulted, the typo gone


def test_a_pattern_with_inline_flags_after_its_start_is_go_regexp(torchjobs: client.CustomObjectsApi, ns: str) -> None:
    """CRD patterns are Go's RE2, which takes ``(?i)`` anywhere (Kueue's AdmissionCheck ``parameters.kind``)."""
    ok = torchjobs.create_namespaced_custom_object(GROUP, "v1", ns, "torchjobs", job("flags", kindName="MultiKueueConfig"))
    assert ok["spec"]["kindName"] == "MultiKueueConfig"
    st = refused(torchjobs, ns, job("flags-bad", kindName="9x"))
    assert st["details"]["causes"] == [{"reason": "FieldValueInvalid", "field": "spec.kindName",
                                        "message": "Invalid value: \"9x\": spec.kindName in body should match "
                                                   "'^(?i)[a-z]([-a-z0-9]*[a-z0-9])?$'"}]
