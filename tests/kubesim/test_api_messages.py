"""The wording audit: one request per kind of error the API answers (404, 409, 403, 400, 422 and its field
causes), each compared whole (code, reason, message, details) with what upstream's constructors build. A row
names the upstream file its wording follows; apimachinery's ``pkg/api/errors/errors.go`` (NewNotFound,
NewAlreadyExists, NewConflict, NewForbidden, NewInvalid, NewBadRequest) and
``pkg/util/validation/field/errors.go`` (Invalid, Required, NotSupported, Duplicate, Forbidden, TooLong, TooMany)
frame them all."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from kubernetes import client

from kubesim.testing import eventually

pytestmark = pytest.mark.realcluster

GROUP = "audits.kubesim.mkd.dev"
API = f"{GROUP}/v1"
ZEROS = "00000000-0000-0000-0000-000000000000"
SUBDOMAIN = ("a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and "
             "must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is "
             "'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')")


@pytest.fixture(scope="module")
def audits(api: client.ApiClient) -> Iterator[client.CustomObjectsApi]:
    """A namespaced CRD whose schema breaks each kube-openapi rule once."""
    ext = client.ApiextensionsV1Api(api)
    spec = {"type": "object", "required": ["need"], "properties": {
        "need": {"type": "string"},
        "name": {"type": "string", "maxLength": 4},
        "tags": {"type": "array", "maxItems": 1, "items": {"type": "string"}},
        "set": {"type": "array", "x-kubernetes-list-type": "set", "items": {"type": "string"}},
        "mode": {"type": "string", "enum": ["a", "b"]},
        "count": {"type": "integer", "minimum": 0},
    }}
    body = {"metadata": {"name": f"audits.{GROUP}"}, "spec": {
        "group": GROUP, "scope": "Namespaced", "names": {"plural": "audits", "singular": "audit", "kind": "Audit"},
        "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {
            "type": "object", "properties": {"spec": spec}}}}]}}
    try:
        ext.create_custom_resource_definition(body)
    except client.ApiException as e:
        if e.status != 409:
            raise
    co = client.CustomObjectsApi(api)

    def served() -> bool:
        try:
            co.list_namespaced_custom_object(GROUP, "v1", "default", "audits")
        except client.ApiException as e:
            if e.status in (404, 429, 503):
                return False
            raise
        return True

    eventually(served, what="the audits CRD served")
    yield co
    ext.delete_custom_resource_definition(f"audits.{GROUP}")


@dataclass
class Env:
    api: client.ApiClient
    ns: str
    co: client.CustomObjectsApi

    @property
    def v1(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.api)

    def cm(self, name: str, **meta: Any) -> dict[str, Any]:
        return {"metadata": {"name": name, **meta}}

    def audit(self, name: str, **spec: Any) -> dict[str, Any]:
        return {"apiVersion": API, "kind": "Audit", "metadata": {"name": name}, "spec": {"need": "x", **spec}}

    def raw(self, method: str, path: str, body: Any = None, content_type: str = "application/json",
            **query: str) -> tuple[int, dict[str, Any]]:
        m, url, headers, data, _ = self.api.param_serialize(
            method, path, query_params=list(query.items()), body=body,
            header_params={"Accept": "application/json", "Content-Type": content_type}, auth_settings=["BearerToken"])
        resp = self.api.call_api(m, url, header_params=headers, body=data)
        resp.read()
        out: dict[str, Any] = json.loads(resp.data)
        return resp.status, out


def invalid(kind: str, name: str, *causes: tuple[str, str, str], group: str = "") -> dict[str, Any]:
    """NewInvalid's Status from (reason, field, message) causes."""
    texts = [f"{f}: {m}" if f else m for _, f, m in causes]
    joined = texts[0] if len(texts) == 1 else "[" + ", ".join(texts) + "]"
    qualified = f"{kind}.{group}" if group else kind
    details: dict[str, Any] = {"causes": [{"reason": r, "message": m, "field": f} for r, f, m in causes]}
    if name:
        details["name"] = name
    if group:
        details["group"] = group
    if kind:
        details["kind"] = kind
    return {"code": 422, "reason": "Invalid", "message": f'{qualified} "{name}" is invalid: {joined}',
            "details": details}


def refused(fn: Callable[[], Any]) -> dict[str, Any]:
    with pytest.raises(client.ApiException) as ei:
        fn()
    out: dict[str, Any] = json.loads(ei.value.body)
    assert out["code"] == ei.value.status
    return out


def _status(st: dict[str, Any]) -> dict[str, Any]:
    return {k: st[k] for k in ("code", "reason", "message", "details") if k in st}


# --- the rows: (id, upstream file, the refused request -> its Status, the Status expected) ----------------


def not_found_core(e: Env) -> tuple[dict[str, Any], dict[str, Any]]:
    got = refused(lambda: e.v1.read_namespaced_config_map("nope", e.ns))
    return got, {"code": 404, "reason": "NotFound", "message": 'configmaps "nope" not found',
                 "details": {"name": "nope", "kind": "configmaps"}}


def not_found_group(e: Env) -> tuple[dict[str, Any], dict[str, Any]]:
    got = refused(lambda: client.BatchV1Api(e.api).read_namespaced_job("nope", e.ns))
    return got, {"code": 404, "reason": "NotFound", "message": 'jobs.batch "nope" not found',
                 "details": {"name": "nope", "group": "batch", "kind": "jobs"}}


def already_exists(e: Env) -> tuple[dict[str, Any], dict[str, Any]]:
    e.v1.create_namespaced_config_map(e.ns, e.cm("dup"))
    got = refused(lambda: e.v1.create_namespaced_config_map(e.ns, e.cm("dup")))
    return got, {"code": 409, "reason": "AlreadyExists", "message": 'configmaps "dup" already exists',
                 "details": {"name": "dup", "kind": "configmaps"}}


def conflict(e: Env) -> tuple[dict[str, Any], dict[str, Any]]:
    cm = e.v1.create_namespaced_config_map(e.ns, e.cm("stale"))
    e.v1.patch_namespaced_config_map("stale", e.ns, {"data": {"a": "1"}})
    got = refused(lambda: e.v1.replace_namespaced_config_map("stale", e.ns, cm))
    return got, {"code": 409, "reason": "Conflict", "message": 'Operation cannot be fulfilled on configmaps "stale": '
                 "the object has been modified; please apply your changes to the latest version and try again",
                 "details": {"name": "stale", "kind": "configmaps"}}


def delete_precondition(e: Env) -> tuple[dict[str, Any], dict[str, Any]]:
    cm = e.v1.create_namespaced_config_map(e.ns, e.cm("pre"))
    got = refused(lambda: e.v1.delete_namespaced_config_map("pre", e.ns, body=client.V1DeleteOptions(
        preconditions=client.V1Preconditions(uid=ZEROS))))
    # BeforeDelete checks the preconditions early, naming the resource by its kind.
    return got, {"code": 409, "reason": "Conflict", "message": f'Operation cannot be fulfilled on ConfigMap "pre": '
                 f"the UID in the precondition ({ZEROS}) does not match the UID in record ({cm.metadata.uid}). The "
                 "object might have been deleted and then recreated", "details": {"name": "pre", "kind": "ConfigMap"}}


def update_precondition(e: Env) -> tuple[dict[str, Any], dict[str, Any]]:
    cm = e.v1.create_namespaced_config_map(e.ns, e.cm("upd"))
    real_uid = cm.metadata.uid
    cm.metadata.uid = ZEROS
    got = refused(lambda: e.v1.replace_namespaced_config_map("upd", e.ns, cm))
    storage = (f"StorageError: invalid object, Code: 4, Key: /registry/configmaps/{e.ns}/upd, ResourceVersion: 0, "
               f"AdditionalErrorMsg: Precondition failed: UID in precondition: {ZEROS}, UID in object meta: "
               f"{real_uid}")
    return got, {"code": 409, "reason": "Conflict", "message": f'Operation cannot be fulfilled on configmaps "upd": '
                 f"{storage}", "details": {"name": "upd", "kind": "configmaps"}}


def namespace_terminating(e: Env) -> tuple[dict[str, Any], dict[str, Any]]:
    doomed = f"{e.ns}-gone"
    e.v1.create_namespace({"metadata": {"name": doomed}})
    e.v1.create_namespaced_config_map(doomed, e.cm("hold", finalizers=["mkd.dev/hold"]))
    e.v1.delete_namespace(doomed)
    try:
        got = refused(lambda: e.v1.create_namespaced_config_map(doomed, e.cm("late")))
    finally:
        e.v1.patch_namespaced_config_map("hold", doomed, {"metadata": {"finalizers": None}})
    return got, {"code": 403, "reason": "Forbidden", "message": f'configmaps "late" is forbidden: unable to create '
                 f"new content in namespace {doomed} because it is being terminated",
                 "details": {"name": "late", "kind": "configmaps", "causes": [
                     {"reason": "NamespaceTerminating", "message": f"namespace {doomed} is being terminated",
                      "field": "metadata.namespace"}]}}


def name_mismatch(e: Env) -> tuple[dict[str, Any], dict[str, Any]]:
    e.v1.create_namespaced_config_map(e.ns, e.cm("here"))
    got = refused(lambda: e.v1.replace_namespaced_config_map("here", e.ns, e.cm("there")))
    return got, {"code": 400, "reason": "BadRequest",
                 "message": "the name of the object (there) does not match the name on the URL (here)"}


def strict_create(e: Env) -> tuple[dict[str, Any], dict[str, Any]]:
    body = e.audit("strict")
    body["spec"]["bogus"] = 1
    got = refused(lambda: e.co.create_namespaced_custom_object(GROUP, "v1", e.ns, "audits", body,
                                                               field_validation="Strict"))
    return got, {"code": 400, "reason": "BadRequest", "message": 'Audit in version "v1" cannot be handled as a '
                 'Audit: strict decoding error: unknown field "spec.bogus"'}


def field_validation_value(e: Env) -> tuple[dict[str, Any], dict[str, Any]]:
    got = refused(lambda: e.v1.create_namespaced_config_map(e.ns, e.cm("fv"), field_validation="Loose"))
    return got, invalid("CreateOptions", "", ("FieldValueNotSupported", "fieldValidation",
                                              'Unsupported value: "Loose": supported values: "", "Ignore", '
                                              '"Strict", "Warn"'), group="meta.k8s.io")


def dry_run_value(e: Env) -> tuple[dict[str, Any], dict[str, Any]]:
    status, got = e.raw("POST", f"/api/v1/namespaces/{e.ns}/configmaps", e.cm("dry"), dryRun="true")
    assert status == 422
    with pytest.raises(client.ApiException) as ei:  # refused, not written
        e.v1.read_namespaced_config_map("dry", e.ns)
    assert ei.value.status == 404
    return got, invalid("CreateOptions", "", ("FieldValueNotSupported", "dryRun",
                                              'Unsupported value: ["true"]: supported values: "All"'),
                        group="meta.k8s.io")


def propagation_value(e: Env) -> tuple[dict[str, Any], dict[str, Any]]:
    e.v1.create_namespaced_config_map(e.ns, e.cm("prop"))
    got = refused(lambda: e.v1.delete_namespaced_config_map("prop", e.ns, propagation_policy="Sideways"))
    return got, invalid("DeleteOptions", "", ("FieldValueNotSupported", "propagationPolicy",
                                              'Unsupported value: "Sideways": supported values: "Foreground", '
                                              '"Background", "Orphan", "nil"'), group="meta.k8s.io")


def name_invalid(e: Env) -> tuple[dict[str, Any], dict[str, Any]]:
    got = refused(lambda: e.v1.create_namespaced_config_map(e.ns, e.cm("Bad_Name")))
    return got, invalid("ConfigMap", "Bad_Name", ("FieldValueInvalid", "metadata.name",
                                                  f'Invalid value: "Bad_Name": {SUBDOMAIN}'))


def name_required(e: Env) -> tuple[dict[str, Any], dict[str, Any]]:
    got = refused(lambda: e.v1.create_namespaced_config_map(e.ns, {"metadata": {}}))
    return got, invalid("ConfigMap", "", ("FieldValueRequired", "metadata.name",
                                          "Required value: name or generateName is required"))


def annotations_too_long(e: Env) -> tuple[dict[str, Any], dict[str, Any]]:
    big = {"a": "x" * (256 * 1024)}
    got = refused(lambda: e.v1.create_namespaced_config_map(e.ns, e.cm("big", annotations=big)))
    return got, invalid("ConfigMap", "big", ("FieldValueTooLong", "metadata.annotations",
                                             "Too long: may not be more than 262144 bytes"))


def resource_version_required(e: Env) -> tuple[dict[str, Any], dict[str, Any]]:
    e.co.create_namespaced_custom_object(GROUP, "v1", e.ns, "audits", e.audit("blind"))
    got = refused(lambda: e.co.replace_namespaced_custom_object(GROUP, "v1", e.ns, "audits", "blind",
                                                                e.audit("blind")))
    return got, invalid("audits", "blind", ("FieldValueInvalid", "metadata.resourceVersion",
                                            "Invalid value: 0: must be specified for an update"), group=GROUP)


def schema_causes(e: Env) -> tuple[dict[str, Any], dict[str, Any]]:
    body = {"apiVersion": API, "kind": "Audit", "metadata": {"name": "shapes"}, "spec": {
        "name": "toolong", "tags": ["a", "b"], "set": ["s", "s"], "mode": "c", "count": -1}}
    got = refused(lambda: e.co.create_namespaced_custom_object(GROUP, "v1", e.ns, "audits", body))
    # The causes come in the validator's order (properties in map order); the message lists them so.
    listed = ", ".join(f"{c['field']}: {c['message']}" for c in got["details"]["causes"])
    assert got["message"] == f'Audit.{GROUP} "shapes" is invalid: [{listed}]'
    got["details"]["causes"].sort(key=lambda c: (c["field"], c["reason"]))
    causes = [
        ("FieldValueInvalid", "spec.count", "Invalid value: -1: spec.count in body should be greater than or "
                                            "equal to 0"),
        ("FieldValueNotSupported", "spec.mode", 'Unsupported value: "c": supported values: "a", "b"'),
        ("FieldValueTooLong", "spec.name", "Too long: may not be more than 4 bytes"),
        ("FieldValueRequired", "spec.need", "Required value"),
        ("FieldValueDuplicate", "spec.set[1]", 'Duplicate value: "s"'),
        ("FieldValueTooMany", "spec.tags", "Too many: 2: must have at most 1 item"),
    ]
    want = invalid("Audit", "shapes", *causes, group=GROUP)
    got["message"] = want["message"]
    return got, want


def strict_patch(e: Env) -> tuple[dict[str, Any], dict[str, Any]]:
    e.v1.create_namespaced_config_map(e.ns, e.cm("sp"))
    got = refused(lambda: e.v1.patch_namespaced_config_map("sp", e.ns, {"bogus": 1}, field_validation="Strict",
                                                           _content_type="application/merge-patch+json"))
    (cause,) = got["details"]["causes"]
    shown = json.loads(cause["message"][len("Invalid value: "):].rsplit(": strict decoding error: ", 1)[0])
    assert json.loads(shown)["bogus"] == 1
    message = f'Invalid value: {json.dumps(shown)}: strict decoding error: unknown field "bogus"'
    return got, {"code": 422, "reason": "Invalid", "message": f' "" is invalid: patch: {message}',
                 "details": {"causes": [{"reason": "FieldValueInvalid", "message": message, "field": "patch"}]}}


def strategic_on_custom(e: Env) -> tuple[dict[str, Any], dict[str, Any]]:
    e.co.create_namespaced_custom_object(GROUP, "v1", e.ns, "audits", e.audit("smp"))
    status, got = e.raw("PATCH", f"/apis/{API}/namespaces/{e.ns}/audits/smp", {"spec": {"name": "x"}},
                        "application/strategic-merge-patch+json")
    assert status == 415
    return got, {"code": 415, "reason": "UnsupportedMediaType",
                 "message": "the body of the request was in an unknown format - accepted media types include: "
                            "application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml"}


def strict_strategic_patch(e: Env) -> tuple[dict[str, Any], dict[str, Any]]:
    e.v1.create_namespaced_config_map(e.ns, e.cm("ssp"))
    got = refused(lambda: e.v1.patch_namespaced_config_map("ssp", e.ns, {"bogus": {"b": 1, "a": "x"}},
                                                           field_validation="Strict",
                                                           _content_type="application/strategic-merge-patch+json"))
    message = 'Invalid value: "map[bogus:map[a:x b:1]]": strict decoding error: unknown field "bogus"'
    return got, {"code": 422, "reason": "Invalid", "message": f' "" is invalid: patch: {message}',
                 "details": {"causes": [{"reason": "FieldValueInvalid", "message": message, "field": "patch"}]}}


def immortal_namespace(e: Env) -> tuple[dict[str, Any], dict[str, Any]]:
    got = refused(lambda: e.v1.delete_namespace("default", dry_run="All"))
    return got, {"code": 403, "reason": "Forbidden",
                 "message": 'namespaces "default" is forbidden: this namespace may not be deleted',
                 "details": {"name": "default", "kind": "namespaces"}}


def crd_name(e: Env) -> tuple[dict[str, Any], dict[str, Any]]:
    body = {"metadata": {"name": "wrong.example.com"}, "spec": {
        "group": "example.com", "scope": "Namespaced", "names": {"plural": "things", "kind": "Thing"},
        "versions": [{"name": "v1", "served": True, "storage": True,
                      "schema": {"openAPIV3Schema": {"type": "object"}}}]}}
    got = refused(lambda: client.ApiextensionsV1Api(e.api).create_custom_resource_definition(body, dry_run="All"))
    return got, invalid("CustomResourceDefinition", "wrong.example.com", (
        "FieldValueInvalid", "metadata.name", 'Invalid value: "wrong.example.com": must be '
                                              'spec.names.plural+"."+spec.group'), group="apiextensions.k8s.io")


def apply_conflict(e: Env) -> tuple[dict[str, Any], dict[str, Any]]:
    def apply(manager: str, value: str) -> Any:
        body = json.dumps({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "ssa"},
                           "data": {"k": value}})
        return e.raw("PATCH", f"/api/v1/namespaces/{e.ns}/configmaps/ssa", body,
                     "application/apply-patch+yaml", fieldManager=manager)

    assert apply("first", "a")[0] == 201
    status, got = apply("second", "b")
    assert status == 409
    return got, {"code": 409, "reason": "Conflict",
                 "message": 'Apply failed with 1 conflict: conflict with "first": .data.k',
                 "details": {"causes": [{"reason": "FieldManagerConflict", "message": 'conflict with "first"',
                                         "field": ".data.k"}]}}


def role_rule(e: Env) -> tuple[dict[str, Any], dict[str, Any]]:
    body = {"metadata": {"name": "r"}, "rules": [{"verbs": ["get"], "nonResourceURLs": ["/healthz"]}]}
    got = refused(lambda: client.RbacAuthorizationV1Api(e.api).create_namespaced_role(e.ns, body, dry_run="All"))
    return got, invalid("Role", "r", ("FieldValueInvalid", "rules[0].nonResourceURLs",
                                      'Invalid value: ["/healthz"]: namespaced rules cannot apply to non-resource '
                                      "URLs"), group="rbac.authorization.k8s.io")


ROWS: list[tuple[str, str, Callable[[Env], tuple[dict[str, Any], dict[str, Any]]]]] = [
    ("404", "apimachinery pkg/api/errors/errors.go NewNotFound", not_found_core),
    ("404-group", "apimachinery pkg/api/errors/errors.go NewNotFound", not_found_group),
    ("409-exists", "apimachinery pkg/api/errors/errors.go NewAlreadyExists", already_exists),
    ("409-conflict", "apiserver pkg/registry/generic/registry/store.go Update (OptimisticLockErrorMsg)", conflict),
    ("409-delete-precondition", "apiserver pkg/registry/rest/delete.go BeforeDelete", delete_precondition),
    ("409-update-precondition", "apiserver pkg/storage/util.go Preconditions.Check, pkg/storage/errors.go "
     "StorageError, registry/generic/registry/storage_factory InterpretUpdateError", update_precondition),
    ("403-terminating", "plugin/pkg/admission/namespace/lifecycle/admission.go", namespace_terminating),
    ("403-immortal", "plugin/pkg/admission/namespace/lifecycle/admission.go", immortal_namespace),
    ("409-apply", "apiserver pkg/util/managedfields/internal/conflict.go NewConflictError", apply_conflict),
    ("400-name", "apiserver pkg/endpoints/handlers/update.go checkName", name_mismatch),
    ("400-strict", "apiserver pkg/endpoints/handlers/create.go transformDecodeError", strict_create),
    ("422-fieldvalidation", "apimachinery pkg/apis/meta/v1/validation/validation.go ValidateFieldValidation",
     field_validation_value),
    ("422-dryrun", "apimachinery pkg/apis/meta/v1/validation/validation.go ValidateDryRun", dry_run_value),
    ("422-propagation", "apimachinery pkg/apis/meta/v1/validation/validation.go ValidateDeleteOptions",
     propagation_value),
    ("422-name", "apimachinery pkg/api/validation/objectmeta.go ValidateObjectMeta", name_invalid),
    ("422-name-required", "apimachinery pkg/api/validation/objectmeta.go ValidateObjectMeta", name_required),
    ("422-annotations", "apimachinery pkg/api/validation/objectmeta.go ValidateAnnotations", annotations_too_long),
    ("422-resourceversion", "apiserver pkg/registry/generic/registry/store.go Update", resource_version_required),
    ("422-role", "pkg/apis/rbac/validation/validation.go ValidatePolicyRule (a list value shown as JSON)",
     role_rule),
    ("422-crd-name", "apiextensions-apiserver pkg/apis/apiextensions/validation/validation.go", crd_name),
    ("422-schema", "apiextensions-apiserver pkg/apiserver/validation/validation.go, kube-openapi validate",
     schema_causes),
    ("422-patch", "apiserver pkg/endpoints/handlers/patch.go jsonPatcher.applyPatchToCurrentObject", strict_patch),
    ("422-patch-strategic", "apiserver pkg/endpoints/handlers/patch.go smpPatcher.applyPatchToCurrentObject",
     strict_strategic_patch),
    ("415-strategic", "apiserver pkg/endpoints/handlers/patch.go PatchResource", strategic_on_custom),
]


@pytest.mark.parametrize("row", ROWS, ids=[r[0] for r in ROWS])
def test_error_wording_matches_upstream(api: client.ApiClient, ns: str, audits: client.CustomObjectsApi,
                                        row: tuple[str, str, Callable[[Env], tuple[dict[str, Any], dict[str, Any]]]]
                                        ) -> None:
    _, upstream, request = row
    got, want = request(Env(api, ns, audits))
    assert _status(got) == want, upstream
