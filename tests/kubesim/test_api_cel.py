"""CEL on the API server: CRD ``x-kubernetes-validations`` and ValidatingAdmissionPolicy (+ Binding).

Driven through the official client. The expected Status bodies are the ones a real kube-apiserver writes:
CRD rules are field errors in a 422 Invalid (``<path>: Invalid value: "<schema type>": <message>``);
a policy denial is ``<resource> "<name>" is forbidden: ValidatingAdmissionPolicy '<p>' with binding '<b>'
denied request: <message>`` with the validation's reason (default Invalid, 422).
"""

from __future__ import annotations

import contextlib
import copy
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.dynamic import DynamicClient

from federation.kinds.crds import load_crds
from kubesim.testing import eventually, status_of

pytestmark = pytest.mark.realcluster

REPO = Path(__file__).resolve().parents[2]
GIZMO_GROUP = "cel.kubesim.mkd.dev"
MULTIKUEUE = "kueue.x-k8s.io/multikueue"
JSON_PATCH = "application/json-patch+json"
ADMISSION_V1 = "admissionregistration.k8s.io/v1"


def _install_crd(ext: client.ApiextensionsV1Api, body: dict[str, Any]) -> None:
    try:
        ext.create_custom_resource_definition(body)
    except client.ApiException as e:
        if e.status != 409:
            raise
    name = body["metadata"]["name"]

    def established() -> bool:
        crd = ext.read_custom_resource_definition(name)
        return any(c.type == "Established" and c.status == "True" for c in (crd.status.conditions or []))

    eventually(established, what=f"CRD {name} Established")


@pytest.fixture(scope="module")
def mkd_crds(api: client.ApiClient) -> None:
    ext = client.ApiextensionsV1Api(api)
    for crd in load_crds():
        if crd["metadata"]["name"] in ("pytorchjobs.kubeflow.org", "trainjobs.trainer.kubeflow.org",
                                       "jobsets.jobset.x-k8s.io"):
            _install_crd(ext, crd)


def _gizmo_schema() -> dict[str, Any]:
    """Rules with the same expressions as the upstream Kubeflow trainer / JobSet CRDs and mkd's own."""
    return {"type": "object", "properties": {
        "apiVersion": {"type": "string"}, "kind": {"type": "string"}, "metadata": {"type": "object"},
        "spec": {
            "type": "object",
            "x-kubernetes-validations": [
                {"rule": "[has(self.torch), has(self.mpi), has(self.jax)].filter(x, x).size() <= 1",
                 "message": "Only one of the policy can be configured"},
                {"rule": "!(has(self.numNodes) && (has(self.torch) && has(self.torch.elasticPolicy)))",
                 "message": "numNodes should not be set if torch.elasticPolicy is configured"},
                {"rule": "double(self.min) < double(self.max)", "message": "min must be strictly less than max",
                 "fieldPath": ".min"},
                # format(), not '+' on string(): a concatenation's size is unknown, so over any cost budget.
                {"rule": "self.replicas <= 8",
                 "messageExpression": "'replicas is %d, at most 8 allowed'.format([self.replicas])"},
                {"rule": "!has(self.forbidden)", "message": "forbidden may not be set", "reason": "FieldValueForbidden"},
            ],
            "properties": {
                "numNodes": {"type": "integer", "minimum": 0},
                "replicas": {"type": "integer"},
                "min": {"type": "string"}, "max": {"type": "string"},
                "forbidden": {"type": "string"},
                "torch": {"type": "object", "x-kubernetes-preserve-unknown-fields": True,
                          "properties": {"elasticPolicy": {"type": "object",
                                                           "x-kubernetes-preserve-unknown-fields": True}}},
                "mpi": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                "jax": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                "numProcPerNode": {"x-kubernetes-int-or-string": True, "x-kubernetes-validations": [
                    {"rule": "self > 0 || self in ['auto', 'cpu', 'gpu']",
                     "message": "NumProcPerNode must be equal to auto, cpu, gpu, or int value"}]},
                # Bounded sizes keep the rules within a real server's estimated cost budget.
                "order": {"type": "array", "items": {"type": "integer"}, "maxItems": 16,
                          "x-kubernetes-validations": [{"rule": "self.isSorted()", "message": "order must be sorted"}]},
                "runtimeRef": {"type": "object", "properties": {"name": {"type": "string"}},
                               "x-kubernetes-validations": [{"rule": "self == oldSelf",
                                                             "message": "runtimeRef is immutable"}]},
                "containers": {"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"],
                               "maxItems": 16,
                               "items": {"type": "object", "required": ["name"], "properties": {
                                   "name": {"type": "string", "maxLength": 63},
                                   "image": {"type": "string", "maxLength": 256, "x-kubernetes-validations": [
                                       {"rule": "self == oldSelf", "message": "image is immutable"}]}}}},
                "size": {"type": "integer", "x-kubernetes-validations": [
                    {"rule": "oldSelf.hasValue() ? self >= oldSelf.value() : self <= 5", "optionalOldSelf": True,
                     "message": "size starts at most 5 and only grows"}]},
                "label": {"type": "string", "maxLength": 64, "x-kubernetes-validations": [
                    {"rule": "self.lowerAscii() == self && self.split('-').size() <= 3"}]},
            }},
    }, "x-kubernetes-validations": [
        {"rule": "self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')",
         "message": "metadata.name must match RFC 1035 DNS label format"}]}


@pytest.fixture(scope="module")
def gizmos(api: client.ApiClient) -> Iterator[str]:
    ext = client.ApiextensionsV1Api(api)
    body = {"metadata": {"name": f"gizmos.{GIZMO_GROUP}"}, "spec": {
        "group": GIZMO_GROUP, "scope": "Namespaced",
        "names": {"plural": "gizmos", "singular": "gizmo", "kind": "Gizmo"},
        "versions": [{"name": "v1", "served": True, "storage": True,
                      "schema": {"openAPIV3Schema": _gizmo_schema()}}]}}
    _install_crd(ext, body)
    yield GIZMO_GROUP
    with contextlib.suppress(client.ApiException):
        ext.delete_custom_resource_definition(f"gizmos.{GIZMO_GROUP}")


def gizmo(name: str, **spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"min": "0.1", "max": "0.5", "replicas": 1}
    base.update(spec)
    return {"apiVersion": f"{GIZMO_GROUP}/v1", "kind": "Gizmo", "metadata": {"name": name}, "spec": base}


def refused(fn: Any, *args: Any, **kw: Any) -> dict[str, Any]:
    with pytest.raises(client.ApiException) as ei:
        fn(*args, **kw)
    return status_of(ei.value)


def pytorchjob(name: str, managed_by: str | None = MULTIKUEUE) -> dict[str, Any]:
    run_policy: dict[str, Any] = {"suspend": True}
    if managed_by is not None:
        run_policy["managedBy"] = managed_by
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": name},
            "spec": {"runPolicy": run_policy, "pytorchReplicaSpecs": {"Master": {"replicas": 1}}}}


# ---------------------------------------------------------------------------------------- CRD rules


def test_changing_managedby_on_a_claimed_job_is_refused_by_the_crd_rule(api: client.ApiClient, mkd_crds: None,
                                                                       ns: str) -> None:
    co = client.CustomObjectsApi(api)
    co.create_namespaced_custom_object("kubeflow.org", "v1", ns, "pytorchjobs", pytorchjob("claimed"))
    st = refused(co.patch_namespaced_custom_object, "kubeflow.org", "v1", ns, "pytorchjobs", "claimed",
                 {"spec": {"runPolicy": {"managedBy": "kubeflow.org/training-operator"}}})
    assert st["code"] == 422 and st["reason"] == "Invalid"
    # apiextensions-apiserver schema/cel/validation.go fieldErrorForReason: a scalar self is shown as it is.
    assert st["message"] == ('PyTorchJob.kubeflow.org "claimed" is invalid: spec.runPolicy.managedBy: '
                             'Invalid value: "kubeflow.org/training-operator": managedBy is immutable')
    assert st["details"]["causes"] == [{"reason": "FieldValueInvalid", "field": "spec.runPolicy.managedBy",
                                        "message": 'Invalid value: "kubeflow.org/training-operator": managedBy is '
                                                   "immutable"}]
    assert st["details"]["group"] == "kubeflow.org" and st["details"]["kind"] == "PyTorchJob"
    # An update that leaves managedBy alone passes the transition rule.
    got = co.patch_namespaced_custom_object("kubeflow.org", "v1", ns, "pytorchjobs", "claimed",
                                            {"metadata": {"labels": {"a": "b"}}})
    assert got["spec"]["runPolicy"]["managedBy"] == MULTIKUEUE
    # TrainJob: the rule sits on spec.managedBy.
    tj = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "metadata": {"name": "tj"},
          "spec": {"managedBy": MULTIKUEUE, "runtimeRef": {"name": "torch"}}}
    co.create_namespaced_custom_object("trainer.kubeflow.org", "v1alpha1", ns, "trainjobs", tj)
    st = refused(co.patch_namespaced_custom_object, "trainer.kubeflow.org", "v1alpha1", ns, "trainjobs", "tj",
                 {"spec": {"managedBy": "trainer.kubeflow.org/trainjob-controller"}})
    assert st["code"] == 422 and st["details"]["causes"][0]["field"] == "spec.managedBy"


def test_transition_rule_needs_an_old_value(api: client.ApiClient, mkd_crds: None, ns: str) -> None:
    """``self == oldSelf`` only runs when both values exist: setting or removing managedBy passes the rule."""
    co = client.CustomObjectsApi(api)
    co.create_namespaced_custom_object("kubeflow.org", "v1", ns, "pytorchjobs", pytorchjob("unset", None))
    got = co.patch_namespaced_custom_object("kubeflow.org", "v1", ns, "pytorchjobs", "unset",
                                            {"spec": {"runPolicy": {"managedBy": MULTIKUEUE}}})
    assert got["spec"]["runPolicy"]["managedBy"] == MULTIKUEUE
    # Status writes validate the whole object with the old one: an unchanged managedBy passes.
    co.patch_namespaced_custom_object_status("kubeflow.org", "v1", ns, "pytorchjobs", "unset",
                                             {"status": {"conditions": [{"type": "Created", "status": "True"}]}})


def test_crd_rules_from_upstream_expressions(api: client.ApiClient, gizmos: str, ns: str) -> None:
    co = client.CustomObjectsApi(api)
    ok = co.create_namespaced_custom_object(gizmos, "v1", ns, "gizmos", gizmo(
        "ok", torch={"x": 1}, numProcPerNode="auto", order=[1, 2, 3], label="a-b"))
    assert ok["spec"]["numProcPerNode"] == "auto"
    co.create_namespaced_custom_object(gizmos, "v1", ns, "gizmos", gizmo("ok2", numProcPerNode=4))

    st = refused(co.create_namespaced_custom_object, gizmos, "v1", ns, "gizmos", gizmo(
        "bad", torch={"elasticPolicy": {}}, mpi={}, numNodes=2, min="0.9", max="0.5", replicas=9,
        forbidden="x", order=[3, 1], label="A"))
    assert st["code"] == 422 and st["reason"] == "Invalid"
    # The spec's own rules come first, in order; the real server walks properties in map order (random).
    # fieldErrorForReason shows a scalar self, never an object or a list, nor beside a messageExpression's text.
    causes = st["details"]["causes"]
    assert causes[:5] == [
        {"reason": "FieldValueInvalid", "field": "spec",
         "message": "Invalid value: Only one of the policy can be configured"},
        {"reason": "FieldValueInvalid", "field": "spec",
         "message": "Invalid value: numNodes should not be set if torch.elasticPolicy is configured"},
        {"reason": "FieldValueInvalid", "field": "spec.min",
         "message": "Invalid value: min must be strictly less than max"},
        {"reason": "FieldValueInvalid", "field": "spec",
         "message": "Invalid value: replicas is 9, at most 8 allowed"},
        {"reason": "FieldValueForbidden", "field": "spec", "message": "Forbidden: forbidden may not be set"},
    ]
    assert sorted(causes[5:], key=lambda c: c["field"]) == [
        {"reason": "FieldValueInvalid", "field": "spec.label",
         "message": "Invalid value: \"A\": failed rule: self.lowerAscii() == self && "
                    "self.split('-').size() <= 3"},
        {"reason": "FieldValueInvalid", "field": "spec.order",
         "message": "Invalid value: order must be sorted"},
    ]
    assert st["message"].startswith('Gizmo.cel.kubesim.mkd.dev "bad" is invalid: [spec: Invalid value: '
                                    "Only one of the policy can be configured, ")

    st = refused(co.create_namespaced_custom_object, gizmos, "v1", ns, "gizmos", gizmo("9gizmo"))
    assert st["details"]["causes"] == [
        {"reason": "FieldValueInvalid", "field": "<nil>",
         "message": "Invalid value: metadata.name must match RFC 1035 DNS label format"}]

    # int-or-string: a string that is no keyword makes `self > 0` fail to find an overload, so the rule errors.
    st = refused(co.create_namespaced_custom_object, gizmos, "v1", ns, "gizmos", gizmo("ips", numProcPerNode="x"))
    (c,) = st["details"]["causes"]
    assert c["field"] == "spec.numProcPerNode"
    assert "no such overload" in c["message"]
    assert c["message"].endswith("NumProcPerNode must be equal to auto, cpu, gpu, or int value")


NOT_CHECKED = ("Invalid value: null: some validation rules were not checked because the object was invalid; "
               "correct the existing errors to complete validation")


def test_schema_and_rule_errors_come_in_one_answer(api: client.ApiClient, gizmos: str, ns: str) -> None:
    """apiextensions-apiserver pkg/registry/customresource/strategy.go Validate: schema errors and rule errors in
    one 422; after a blocking schema error (NotSupported, Required, TooLong, TooMany, TypeInvalid) the rules are
    not run and a field-less cause says so."""
    co = client.CustomObjectsApi(api)
    # minimum is not blocking: the rules run too.
    st = refused(co.create_namespaced_custom_object, gizmos, "v1", ns, "gizmos", gizmo(
        "both", numNodes=-1, replicas=9))
    assert st["details"]["causes"] == [
        {"reason": "FieldValueInvalid", "field": "spec.numNodes",
         "message": "Invalid value: -1: spec.numNodes in body should be greater than or equal to 0"},
        {"reason": "FieldValueInvalid", "field": "spec", "message": "Invalid value: replicas is 9, at most 8 allowed"}]
    # TooLong blocks: the rules are not checked.
    st = refused(co.create_namespaced_custom_object, gizmos, "v1", ns, "gizmos", gizmo(
        "blocked", label="x" * 65, replicas=9))
    assert st["details"]["causes"] == [
        {"reason": "FieldValueTooLong", "field": "spec.label", "message": "Too long: may not be more than 64 bytes"},
        {"reason": "FieldValueInvalid", "field": "<nil>", "message": NOT_CHECKED}]
    assert st["message"] == (f'Gizmo.{GIZMO_GROUP} "blocked" is invalid: [spec.label: Too long: may not be more '
                             f"than 64 bytes, <nil>: {NOT_CHECKED}]")


def test_crd_transition_rules_and_ratcheting(api: client.ApiClient, gizmos: str, ns: str) -> None:
    co = client.CustomObjectsApi(api)
    co.create_namespaced_custom_object(gizmos, "v1", ns, "gizmos", gizmo(
        "t", runtimeRef={"name": "torch"}, containers=[{"name": "a", "image": "x:1"}, {"name": "b", "image": "y:1"}]))
    st = refused(co.patch_namespaced_custom_object, gizmos, "v1", ns, "gizmos", "t",
                 {"spec": {"runtimeRef": {"name": "jax"}}})
    assert st["details"]["causes"] == [{"reason": "FieldValueInvalid", "field": "spec.runtimeRef",
                                        "message": "Invalid value: runtimeRef is immutable"}]
    # Map lists correlate by key: b's image changes (refused); a new item c has no old value (allowed).
    st = refused(co.patch_namespaced_custom_object, gizmos, "v1", ns, "gizmos", "t",
                 {"spec": {"containers": [{"name": "b", "image": "y:2"}, {"name": "a", "image": "x:1"}]}})
    assert st["details"]["causes"] == [{"reason": "FieldValueInvalid", "field": "spec.containers[0].image",
                                        "message": 'Invalid value: "y:2": image is immutable'}]
    # optionalOldSelf: evaluated on create too, with oldSelf an optional.
    st = refused(co.create_namespaced_custom_object, gizmos, "v1", ns, "gizmos", gizmo("big", size=7))
    assert st["details"]["causes"] == [{"reason": "FieldValueInvalid", "field": "spec.size",
                                        "message": "Invalid value: 7: size starts at most 5 and only grows"}]
    co.patch_namespaced_custom_object(gizmos, "v1", ns, "gizmos", "t", {"spec": {"size": 3}})
    co.patch_namespaced_custom_object(gizmos, "v1", ns, "gizmos", "t", {"spec": {"size": 9}})
    st = refused(co.patch_namespaced_custom_object, gizmos, "v1", ns, "gizmos", "t", {"spec": {"size": 8}})
    assert st["details"]["causes"][0]["field"] == "spec.size"
    got = co.patch_namespaced_custom_object(gizmos, "v1", ns, "gizmos", "t", {"spec": {"containers": [
        {"name": "a", "image": "x:1"}, {"name": "b", "image": "y:1"}, {"name": "c", "image": "z:1"}]}})
    assert len(got["spec"]["containers"]) == 3


# ---------------------------------------------------------------------------------------- policies


def _admission_docs() -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for f in sorted((REPO / "deploy" / "admission").glob("*.yaml")):
        docs += [d for d in yaml.safe_load_all(f.read_text()) if d and d.get("apiVersion") == ADMISSION_V1]
    return docs


def _apply_admission(api: client.ApiClient, kubeconfig: Path) -> str:
    """``kubectl apply -f deploy/admission/`` (its ``Kustomization`` file, for ``-k``, is not a .yaml file
    and ``-f`` skips it) when kubectl is installed, else the same objects by the client."""
    kubectl = shutil.which("kubectl")
    folder = REPO / "deploy" / "admission"
    if kubectl:
        out = subprocess.run([kubectl, "--kubeconfig", str(kubeconfig), "apply", "-f", str(folder)],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        return out.stdout
    ar = client.AdmissionregistrationV1Api(api)
    for d in _admission_docs():
        if d["kind"] == "ValidatingAdmissionPolicy":
            ar.create_validating_admission_policy(d)
        else:
            ar.create_validating_admission_policy_binding(d)
    return ""


def _delete_admission(api: client.ApiClient) -> None:
    ar = client.AdmissionregistrationV1Api(api)
    for d in _admission_docs():
        with contextlib.suppress(client.ApiException):
            if d["kind"] == "ValidatingAdmissionPolicy":
                ar.delete_validating_admission_policy(d["metadata"]["name"])
            else:
                ar.delete_validating_admission_policy_binding(d["metadata"]["name"])


@pytest.fixture(scope="module")
def mkd_policies(api: client.ApiClient, kubeconfig: Path, mkd_crds: None) -> Iterator[str]:
    out = _apply_admission(api, kubeconfig)
    yield out
    _delete_admission(api)


def test_kubectl_apply_deploy_admission(api: client.ApiClient, mkd_policies: str) -> None:
    ar = client.AdmissionregistrationV1Api(api)
    if shutil.which("kubectl"):
        assert "validatingadmissionpolicy.admissionregistration.k8s.io/mkd-managedby-immutable-spec created" \
            in mkd_policies
    pol = ar.read_validating_admission_policy("mkd-managedby-immutable-spec")
    assert pol.spec.failure_policy == "Fail"
    assert pol.spec.match_constraints.match_policy == "Equivalent"  # defaulted like a real server
    assert pol.spec.match_constraints.namespace_selector == {} or \
        pol.spec.match_constraints.namespace_selector.to_dict() == {"match_expressions": None, "match_labels": None}
    names = {b.metadata.name for b in ar.list_validating_admission_policy_binding().items}
    assert {"mkd-managedby-immutable-spec", "mkd-managedby-immutable-runpolicy"} <= names


def test_kubectl_get_admission_objects(kubeconfig: Path, mkd_policies: str) -> None:
    kubectl = shutil.which("kubectl")
    if not kubectl:
        pytest.skip("kubectl is not installed")

    def get(what: str) -> list[list[str]]:
        out = subprocess.run([kubectl, "--kubeconfig", str(kubeconfig), "get", what], capture_output=True,
                             text=True, timeout=60, check=True).stdout
        return [line.split() for line in out.splitlines()]

    rows = get("validatingadmissionpolicies")
    assert rows[0] == ["NAME", "VALIDATIONS", "PARAMKIND", "AGE"]
    assert ["mkd-managedby-immutable-spec", "1", "<unset>"] in [r[:3] for r in rows[1:]]
    rows = get("validatingadmissionpolicybindings")
    assert rows[0] == ["NAME", "POLICYNAME", "PARAMREF", "AGE"]
    assert ["mkd-managedby-immutable-spec", "mkd-managedby-immutable-spec", "<unset>"] in [r[:3] for r in rows[1:]]


def test_policies_refuse_what_a_real_server_refuses(api: client.ApiClient, mkd_policies: str, ns: str) -> None:
    co = client.CustomObjectsApi(api)
    co.create_namespaced_custom_object("kubeflow.org", "v1", ns, "pytorchjobs", pytorchjob("pj"))

    def patch_pj() -> Any:
        # Removing managedBy passes the CRD's transition rule (no new value) but not the policy.
        return co.patch_namespaced_custom_object("kubeflow.org", "v1", ns, "pytorchjobs", "pj",
                                                 [{"op": "remove", "path": "/spec/runPolicy/managedBy"}],
                                                 _content_type=JSON_PATCH)

    # A fresh policy takes a moment to be enforced on a real server too.
    def denied() -> dict[str, Any] | None:
        try:
            patch_pj()
        except client.ApiException as e:
            return status_of(e)
        co.patch_namespaced_custom_object("kubeflow.org", "v1", ns, "pytorchjobs", "pj",
                                          {"spec": {"runPolicy": {"managedBy": MULTIKUEUE}}})
        return None

    st = eventually(denied, what="the policy in force")
    msg = ("pytorchjobs.kubeflow.org \"pj\" is forbidden: ValidatingAdmissionPolicy "
           "'mkd-managedby-immutable-runpolicy' with binding 'mkd-managedby-immutable-runpolicy' denied request: "
           "spec.runPolicy.managedBy is immutable (was 'kueue.x-k8s.io/multikueue', now ''); delete and re-create "
           "the job to hand it to another controller")
    assert st == {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": msg,
                  "reason": "Invalid", "code": 422,
                  "details": {"name": "pj", "group": "kubeflow.org", "kind": "pytorchjobs",
                              "causes": [{"message": msg.split("is forbidden: ", 1)[1]}]}}
    # The status subresource is not matched by the policy; other edits pass.
    co.patch_namespaced_custom_object_status("kubeflow.org", "v1", ns, "pytorchjobs", "pj",
                                             {"status": {"conditions": [{"type": "Created", "status": "True"}]}})
    co.patch_namespaced_custom_object("kubeflow.org", "v1", ns, "pytorchjobs", "pj",
                                      {"metadata": {"labels": {"x": "y"}}})
    # JobSet (spec.managedBy): removing it is refused by the second policy.
    js = {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": {"name": "js"},
          "spec": {"managedBy": MULTIKUEUE, "replicatedJobs": []}}
    co.create_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", ns, "jobsets", js)
    st = refused(co.patch_namespaced_custom_object, "jobset.x-k8s.io", "v1alpha2", ns, "jobsets", "js",
                 [{"op": "remove", "path": "/spec/managedBy"}], _content_type=JSON_PATCH)
    assert st["code"] == 422 and st["reason"] == "Invalid"
    assert st["message"].startswith('jobsets.jobset.x-k8s.io "js" is forbidden: ValidatingAdmissionPolicy '
                                    "'mkd-managedby-immutable-spec' with binding 'mkd-managedby-immutable-spec' "
                                    "denied request: spec.managedBy is immutable (was 'kueue.x-k8s.io/multikueue', "
                                    "now '')")


# A policy exercising the rest of the API: match conditions, selectors, variables, reasons, actions.
def _policy(name: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": name}, "spec": spec}


def _binding(name: str, policy: str, actions: list[str], **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": name}, "spec": {"policyName": policy, "validationActions": actions, **spec}}


@pytest.fixture
def policy_env(api: client.ApiClient) -> Iterator[tuple[client.AdmissionregistrationV1Api, str]]:
    ar = client.AdmissionregistrationV1Api(api)
    tag = uuid.uuid4().hex[:6]
    yield ar, tag
    for p in ar.list_validating_admission_policy().items:
        if p.metadata.name.endswith(tag):
            ar.delete_validating_admission_policy(p.metadata.name)
    for b in ar.list_validating_admission_policy_binding().items:
        if b.metadata.name.endswith(tag):
            ar.delete_validating_admission_policy_binding(b.metadata.name)


def _cm(name: str, labels: dict[str, str] | None = None, **data: str) -> dict[str, Any]:
    body: dict[str, Any] = {"metadata": {"name": name, "labels": labels or {}}}
    if data:
        body["data"] = data
    return body


def test_policy_selectors_conditions_variables_and_actions(api: client.ApiClient, ns: str,
                                                           policy_env: tuple[Any, str]) -> None:
    ar, tag = policy_env
    v1 = client.CoreV1Api(api)
    v1.patch_namespace(ns, {"metadata": {"labels": {"policy-test": tag}}})
    rules = [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"],
              "resources": ["configmaps"]}]
    ar.create_validating_admission_policy(_policy(
        f"size-{tag}", failurePolicy="Fail",
        matchConstraints={"resourceRules": rules, "namespaceSelector": {"matchLabels": {"policy-test": tag}},
                          "objectSelector": {"matchExpressions": [{"key": "skip", "operator": "DoesNotExist"}]}},
        matchConditions=[{"name": "not-exempt", "expression": "!has(object.data.exempt)"}],
        variables=[{"name": "count", "expression": "has(object.data) ? size(object.data) : 0"}],
        validations=[
            {"expression": "variables.count <= 2", "reason": "Forbidden",
             "messageExpression": "'at most 2 keys, got ' + string(variables.count)"},
            {"expression": "!has(object.data.bad)"},
            {"expression": "request.operation != 'UPDATE' || oldObject.data == object.data || "
                           "!has(oldObject.data.frozen)", "message": "frozen config maps do not change"},
        ]))
    ar.create_validating_admission_policy_binding(_binding(f"size-{tag}", f"size-{tag}", ["Deny"]))
    ar.create_validating_admission_policy(_policy(
        f"warn-{tag}", matchConstraints={"resourceRules": rules,
                                         "namespaceSelector": {"matchLabels": {"policy-test": tag}}},
        validations=[{"expression": "!has(object.data.legacy)", "message": "legacy keys are deprecated"}]))
    ar.create_validating_admission_policy_binding(_binding(f"warn-{tag}", f"warn-{tag}", ["Warn", "Audit"]))

    def denied() -> dict[str, Any] | None:
        try:
            v1.create_namespaced_config_map(ns, _cm("probe", a="1", b="2", c="3"))
        except client.ApiException as e:
            return status_of(e)
        v1.delete_namespaced_config_map("probe", ns)
        return None

    st = eventually(denied, what="the policy in force")
    msg = (f"configmaps \"probe\" is forbidden: ValidatingAdmissionPolicy 'size-{tag}' with binding 'size-{tag}' "
           "denied request: at most 2 keys, got 3")
    assert st["code"] == 403 and st["reason"] == "Forbidden" and st["message"] == msg
    assert st["details"] == {"name": "probe", "kind": "configmaps", "causes": [{"message": msg.split(": ", 1)[1]}]}

    st = refused(v1.create_namespaced_config_map, ns, _cm("b", bad="1"))
    assert st["code"] == 422 and st["message"].endswith("denied request: failed expression: !has(object.data.bad)")
    # matchConditions false, objectSelector miss: not evaluated.
    v1.create_namespaced_config_map(ns, _cm("exempt", exempt="y", a="1", b="2", c="3"))
    v1.create_namespaced_config_map(ns, _cm("skipped", {"skip": "y"}, a="1", b="2", c="3"))
    # Warn + Audit do not deny; Warn answers with a Warning header.
    _, _, headers = v1.create_namespaced_config_map_with_http_info(ns, _cm("legacy", legacy="1"))
    assert headers.get("Warning") == (f"299 - \"Validation failed for ValidatingAdmissionPolicy 'warn-{tag}' with "
                                      f"binding 'warn-{tag}': legacy keys are deprecated\"")
    # oldObject on UPDATE.
    v1.create_namespaced_config_map(ns, _cm("frozen", frozen="1"))
    st = refused(v1.patch_namespaced_config_map, "frozen", ns, {"data": {"more": "1"}})
    assert st["message"].endswith("denied request: frozen config maps do not change")
    # Another namespace is not selected.
    other = f"o-{tag}"
    v1.create_namespace({"metadata": {"name": other}})
    try:
        v1.create_namespaced_config_map(other, _cm("big", a="1", b="2", c="3"))
    finally:
        v1.delete_namespace(other)


def test_policy_on_configmaps_denies_every_kind_of_write(api: client.ApiClient, ns: str,
                                                        policy_env: tuple[Any, str]) -> None:
    """A policy on a built-in kind (plugin/policy/validating: the dispatcher matches any resource the rules
    name): create, update, merge patch and server-side apply of a ConfigMap are all denied, 422 Invalid
    (no reason given), worded by validating/dispatcher.go."""
    ar, tag = policy_env
    v1 = client.CoreV1Api(api)
    ar.create_validating_admission_policy(_policy(f"cm-{tag}", matchConstraints={"resourceRules": [
        {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"], "resources": ["configmaps"]}]},
        validations=[{"expression": "!has(object.data) || !('bad' in object.data)", "message": "no bad keys"}]))
    ar.create_validating_admission_policy_binding(_binding(
        f"cm-{tag}", f"cm-{tag}", ["Deny"],
        matchResources={"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}}}))

    def denied() -> dict[str, Any] | None:
        try:
            v1.create_namespaced_config_map(ns, _cm("x", bad="1"))
        except client.ApiException as e:
            return status_of(e)
        v1.delete_namespaced_config_map("x", ns)
        return None

    def message(name: str) -> str:
        return (f"configmaps \"{name}\" is forbidden: ValidatingAdmissionPolicy 'cm-{tag}' with binding 'cm-{tag}' "
                "denied request: no bad keys")

    st = eventually(denied, what="the policy in force")
    assert st["code"] == 422 and st["reason"] == "Invalid" and st["message"] == message("x")
    ok = v1.create_namespaced_config_map(ns, _cm("ok", good="1"))
    ok.data = {"bad": "1"}
    for write in (lambda: v1.replace_namespaced_config_map("ok", ns, ok),
                  lambda: v1.patch_namespaced_config_map("ok", ns, {"data": {"bad": "1"}})):
        st = refused(write)
        assert st["code"] == 422 and st["message"] == message("ok")
    applied = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "ssa"}, "data": {"bad": "1"}}
    st = refused(DynamicClient(api).resources.get(api_version="v1", kind="ConfigMap").server_side_apply,
                 body=applied, name="ssa", namespace=ns, field_manager="probe")
    assert st["code"] == 422 and st["message"] == message("ssa")
    assert v1.read_namespaced_config_map("ok", ns).data == {"good": "1"}


def test_policy_runtime_errors_follow_failure_policy(api: client.ApiClient, ns: str,
                                                     policy_env: tuple[Any, str]) -> None:
    ar, tag = policy_env
    v1 = client.CoreV1Api(api)
    v1.patch_namespace(ns, {"metadata": {"labels": {"errors-test": tag}}})

    def pol(name: str, failure: str) -> dict[str, Any]:
        return _policy(name, failurePolicy=failure, matchConstraints={
            "namespaceSelector": {"matchLabels": {"errors-test": tag}},
            "resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                               "resources": ["configmaps"]}]},
            validations=[{"expression": f"object.data.{name.split('-')[0]} == 'x'"}])

    ar.create_validating_admission_policy(pol(f"ignored-{tag}", "Ignore"))
    ar.create_validating_admission_policy_binding(_binding(f"ignored-{tag}", f"ignored-{tag}", ["Deny"]))
    v1.create_namespaced_config_map(ns, _cm("fine"))  # the error is ignored
    ar.create_validating_admission_policy(pol(f"failing-{tag}", "Fail"))
    ar.create_validating_admission_policy_binding(_binding(f"failing-{tag}", f"failing-{tag}", ["Deny"]))

    def denied() -> dict[str, Any] | None:
        try:
            v1.create_namespaced_config_map(ns, _cm("probe"))
        except client.ApiException as e:
            return status_of(e)
        v1.delete_namespaced_config_map("probe", ns)
        return None

    st = eventually(denied, what="the policy in force")
    assert st["code"] == 422
    assert st["message"] == (f"configmaps \"probe\" is forbidden: ValidatingAdmissionPolicy 'failing-{tag}' with "
                             f"binding 'failing-{tag}' denied request: expression 'object.data.failing == 'x'' "
                             "resulted in error: no such key: data")


def test_policy_with_a_broken_expression_is_refused(api: client.ApiClient, policy_env: tuple[Any, str]) -> None:
    ar, tag = policy_env
    body = _policy(f"broken-{tag}", matchConstraints={"resourceRules": [
        {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["configmaps"]}]},
        validations=[{"expression": "object.data.("}])
    st = refused(ar.create_validating_admission_policy, copy.deepcopy(body))
    assert st["code"] == 422 and st["reason"] == "Invalid"
    (c,) = st["details"]["causes"]
    assert c["field"] == "spec.validations[0].expression"
    assert c["message"].startswith('Invalid value: "object.data.(": compilation failed: ERROR: <input>:1:')


def test_policy_on_delete_sees_the_old_object(api: client.ApiClient, ns: str, policy_env: tuple[Any, str]) -> None:
    ar, tag = policy_env
    v1 = client.CoreV1Api(api)
    ar.create_validating_admission_policy(_policy(
        f"keep-{tag}", matchConstraints={
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
            "resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["DELETE"],
                               "resources": ["configmaps"]}]},
        validations=[{"expression": "object == null && !(has(oldObject.metadata.labels) && "
                                    "'protected' in oldObject.metadata.labels)",
                      "message": "protected config maps stay", "reason": "Forbidden"}]))
    ar.create_validating_admission_policy_binding(_binding(f"keep-{tag}", f"keep-{tag}", ["Deny"]))
    v1.create_namespaced_config_map(ns, _cm("kept", {"protected": "yes"}))
    v1.create_namespaced_config_map(ns, _cm("loose"))

    def denied() -> dict[str, Any] | None:
        try:
            v1.delete_namespaced_config_map("kept", ns, dry_run="All")
        except client.ApiException as e:
            return status_of(e)
        return None

    st = eventually(denied, what="the policy in force")
    assert st["code"] == 403 and st["message"] == (
        f"configmaps \"kept\" is forbidden: ValidatingAdmissionPolicy 'keep-{tag}' with binding 'keep-{tag}' "
        "denied request: protected config maps stay")
    v1.delete_namespaced_config_map("loose", ns)
    assert v1.read_namespaced_config_map("kept", ns).metadata.name == "kept"


COST_HINT = ("(try simplifying the rule, or adding maxItems, maxProperties, and maxLength where arrays, maps, and "
             "strings are declared)")


def _rules_crd(spec_schema: dict[str, Any], root_rules: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "object", "properties": {"spec": spec_schema}}
    if root_rules:
        schema["x-kubernetes-validations"] = root_rules
    return {"metadata": {"name": f"checked.{GIZMO_GROUP}"}, "spec": {
        "group": GIZMO_GROUP, "scope": "Namespaced", "names": {"plural": "checked", "singular": "checked",
                                                               "kind": "Checked"},
        "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": schema}}]}}


def test_crd_rules_must_name_fields_the_schema_declares(api: client.ApiClient) -> None:
    """apiserver pkg/cel/common/schemas.go SchemaDeclType: an object exposes only its declared properties (with
    x-kubernetes-preserve-unknown-fields too), a resource root only apiVersion, kind, metadata.name and
    metadata.generateName; cel-go's checker refuses any other field (apiextensions validation.go)."""
    create = client.ApiextensionsV1Api(api).create_custom_resource_definition
    rule = "!(has(self.numNodes) && has(self.torch.elasticPolicy))"
    st = refused(create, _rules_crd({"type": "object", "x-kubernetes-validations": [{"rule": rule}], "properties": {
        "numNodes": {"type": "integer"}, "torch": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}}),
        dry_run="All")
    assert st["code"] == 422
    (c,) = st["details"]["causes"]
    assert c["field"] == "spec.validation.openAPIV3Schema.properties[spec].x-kubernetes-validations[0].rule"
    assert c["reason"] == "FieldValueInvalid"
    assert c["message"].startswith(f'Invalid value: apiextensions.ValidationRule{{Rule:"{rule}", Message:""')
    assert "compilation failed: ERROR: <input>:1:" in c["message"]
    assert "undefined field 'elasticPolicy'" in c["message"]
    st = refused(create, _rules_crd({"type": "object"}, [{"rule": "has(self.metadata.labels)"}]), dry_run="All")
    assert [c["field"] for c in st["details"]["causes"]] == [
        "spec.validation.openAPIV3Schema.x-kubernetes-validations[0].rule"]
    assert "undefined field 'labels'" in st["details"]["causes"][0]["message"]
    # Declared fields (and a root's metadata.name) pass.
    create(_rules_crd({"type": "object", "x-kubernetes-validations": [{"rule": rule}], "properties": {
        "numNodes": {"type": "integer"}, "torch": {"type": "object", "properties": {"elasticPolicy": {
            "type": "object", "x-kubernetes-preserve-unknown-fields": True}}}}},
        [{"rule": "self.metadata.name.size() < 20"}]), dry_run="All")


def test_crd_rules_over_the_cost_budget_are_refused(api: client.ApiClient) -> None:
    """apiextensions validation.go: a rule's estimated cost (cel-go checker/cost.go with the Kubernetes library's
    estimates; sizes from maxItems / maxLength, else from the 3 MiB request limit) may not exceed 10 000 000,
    nor the CRD's total 100 000 000; getCostErrorMessage words the factor."""
    create = client.ApiextensionsV1Api(api).create_custom_resource_definition

    def tags(**bounds: int) -> dict[str, Any]:
        items: dict[str, Any] = {"type": "string"}
        if "maxLength" in bounds:
            items["maxLength"] = bounds["maxLength"]
        tags_schema: dict[str, Any] = {"type": "array", "items": items,
                                       "x-kubernetes-validations": [{"rule": "self.all(x, x.contains('gpu'))"}]}
        if "maxItems" in bounds:
            tags_schema["maxItems"] = bounds["maxItems"]
        return {"type": "object", "properties": {"tags": tags_schema}}

    rule_at = "spec.validation.openAPIV3Schema.properties[spec].properties[tags].x-kubernetes-validations[0].rule"
    st = refused(create, _rules_crd(tags()), dry_run="All")
    assert st["code"] == 422 and st["reason"] == "Invalid"
    assert st["details"]["causes"] == [
        {"reason": "FieldValueForbidden", "field": rule_at,
         "message": f"Forbidden: estimated rule cost exceeds budget by factor of more than 100x {COST_HINT}"},
        {"reason": "FieldValueForbidden", "field": rule_at, "message": "Forbidden: contributed to estimated rule "
                                                                       "cost total exceeding cost limit for entire OpenAPIv3 schema"},
        {"reason": "FieldValueForbidden", "field": "spec.validation.openAPIV3Schema",
         "message": "Forbidden: x-kubernetes-validations estimated rule cost total for entire OpenAPIv3 schema "
                    f"exceeds budget by factor of more than 100x {COST_HINT}"}]
    # 11 per item of at most 16 characters: 909 090 items fit the budget, one more does not.
    create(_rules_crd(tags(maxLength=16, maxItems=909_090)), dry_run="All")
    st = refused(create, _rules_crd(tags(maxLength=16, maxItems=909_091)), dry_run="All")
    assert st["details"]["causes"] == [{"reason": "FieldValueForbidden", "field": rule_at, "message":
                                        f"Forbidden: estimated rule cost exceeds budget by factor of 1.000000x {COST_HINT}"}]
    # A messageExpression that concatenates string(...) has no size bound.
    st = refused(create, _rules_crd({"type": "object", "properties": {"n": {"type": "integer"}},
                                     "x-kubernetes-validations": [{"rule": "self.n < 5", "messageExpression":
                                                                   "'n is ' + string(self.n)"}]}), dry_run="All")
    assert st["details"]["causes"][0] == {
        "reason": "FieldValueForbidden",
        "field": "spec.validation.openAPIV3Schema.properties[spec].x-kubernetes-validations[0].messageExpression",
        "message": f"Forbidden: estimated messageExpression cost exceeds budget by factor of more than 100x {COST_HINT}"}


def test_crd_with_a_rule_that_does_not_compile_is_refused(api: client.ApiClient) -> None:
    body = {"metadata": {"name": f"broken.{GIZMO_GROUP}"}, "spec": {
        "group": GIZMO_GROUP, "scope": "Namespaced",
        "names": {"plural": "broken", "singular": "broken", "kind": "Broken"},
        "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {
            "type": "object", "properties": {"spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": True,
                                                      "x-kubernetes-validations": [{"rule": "self.size( >"}]}}}}}]}}
    st = refused(client.ApiextensionsV1Api(api).create_custom_resource_definition, body)
    assert st["code"] == 422 and st["reason"] == "Invalid"
    (c,) = st["details"]["causes"]
    # apiextensions v1 conversion hoists a schema every version shares to the internal spec.validation, and
    # validation.go reports it there.
    assert c["field"] == "spec.validation.openAPIV3Schema.properties[spec].x-kubernetes-validations[0].rule"
    assert c["message"].startswith('Invalid value: apiextensions.ValidationRule{Rule:"self.size( >", Message:""')
    assert "compilation failed: ERROR: <input>:1:" in c["message"]
    # Versions with schemas of their own are reported at their own path.
    fine = {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}
    body["spec"]["versions"] = [{"name": "v1", "served": True, "storage": True, "schema": fine},
                                {**body["spec"]["versions"][0], "name": "v2", "storage": False}]
    st = refused(client.ApiextensionsV1Api(api).create_custom_resource_definition, body)
    assert [c["field"] for c in st["details"]["causes"]] == [
        "spec.versions[1].schema.openAPIV3Schema.properties[spec].x-kubernetes-validations[0].rule"]
