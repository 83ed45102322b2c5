"""The explicit registry, protocol conformance of every kind, and the shipped CRDs matching the kinds."""

from __future__ import annotations

import subprocess
import sys

import pytest

from federation import labels
from federation.errors import Invalid
from federation.kinds import JobKind
from federation.kinds.crds import load_crds
from federation.kinds.registry import KINDS, by_api, by_name

EXPECTED = {
    "PyTorchJob": (
        "kubeflow.org/v1",
        "pytorchjobs",
        labels.TRAINING_OPERATOR,
        ("spec", "runPolicy", "managedBy"),
    ),
    "TFJob": ("kubeflow.org/v1", "tfjobs", labels.TRAINING_OPERATOR, ("spec", "runPolicy", "managedBy")),
    "XGBoostJob": (
        "kubeflow.org/v1",
        "xgboostjobs",
        labels.TRAINING_OPERATOR,
        ("spec", "runPolicy", "managedBy"),
    ),
    "PaddleJob": (
        "kubeflow.org/v1",
        "paddlejobs",
        labels.TRAINING_OPERATOR,
        ("spec", "runPolicy", "managedBy"),
    ),
    "JAXJob": ("kubeflow.org/v1", "jaxjobs", labels.TRAINING_OPERATOR, ("spec", "runPolicy", "managedBy")),
    "MPIJob": ("kubeflow.org/v2beta1", "mpijobs", labels.MPI_OPERATOR, ("spec", "runPolicy", "managedBy")),
    "TrainJob": (
        "trainer.kubeflow.org/v1alpha1",
        "trainjobs",
        labels.TRAINJOB_CONTROLLER,
        ("spec", "managedBy"),
    ),
    "Job": ("batch/v1", "jobs", labels.BATCH_JOB_CONTROLLER, ("spec", "managedBy")),
    "JobSet": ("jobset.x-k8s.io/v1alpha2", "jobsets", labels.JOBSET_CONTROLLER, ("spec", "managedBy")),
    "RayJob": ("ray.io/v1", "rayjobs", "ray.io/kuberay-operator", ("spec", "managedBy")),
    "RayCluster": ("ray.io/v1", "rayclusters", "ray.io/kuberay-operator", ("spec", "managedBy")),
    "RayService": ("ray.io/v1", "rayservices", "ray.io/kuberay-operator", ("spec", "managedBy")),
    "AppWrapper": ("workload.codeflare.dev/v1beta2", "appwrappers", "workload.codeflare.dev/appwrapper-controller",
                   ("spec", "managedBy")),
    "LeaderWorkerSet": ("leaderworkerset.x-k8s.io/v1", "leaderworkersets", "lws-controller-manager", ()),
    "Pod": ("v1", "pods", "kueue.x-k8s.io/admission", ()),  # no managedBy: the queue label and the gate
}


def test_registry_lists_every_kind_once() -> None:
    assert [k.name for k in KINDS] == list(EXPECTED)
    for kind in KINDS:
        assert isinstance(kind, JobKind)
        api_version, plural, controller, path = EXPECTED[kind.name]
        assert (kind.api_version, kind.plural, kind.controller, kind.managed_by_path) == (
            api_version,
            plural,
            controller,
            path,
        )
        assert kind.api_version == (f"{kind.group}/{kind.version}" if kind.group else kind.version)
        assert by_name(kind.name) is kind
        assert by_api(kind.api_version, kind.name) is kind


def test_lookups_refuse_unknown_kinds() -> None:
    with pytest.raises(Invalid) as info:
        by_name("MXJob")
    assert info.value.field == "kind" and "PyTorchJob" in info.value.fix
    assert by_api("kubeflow.org/v1", "MPIJob") is None  # v1 MPIJob is not supported, only v2beta1
    assert by_api("batch/v2", "Job") is None


def test_importing_the_package_registers_nothing() -> None:
    code = (
        "import sys, federation.kinds; "
        "print(any(m.startswith('federation.kinds.pytorch') for m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("kind", [k for k in KINDS if k.managed_by_path], ids=lambda k: k.name)
def test_bad_managed_by_is_refused_by_every_kind(kind: JobKind) -> None:
    job: dict = {"apiVersion": kind.api_version, "kind": kind.name, "metadata": {"name": "x"}, "spec": {}}
    node = job
    for key in kind.managed_by_path[:-1]:
        node = node.setdefault(key, {})
    node[kind.managed_by_path[-1]] = "example.com/elsewhere"
    assert ".".join(kind.managed_by_path) in [e.field for e in kind.validate(job)]
    assert kind.managed_by(job) == "example.com/elsewhere"
    for value in (kind.controller, labels.MULTIKUEUE):
        node[kind.managed_by_path[-1]] = value
        assert ".".join(kind.managed_by_path) not in [e.field for e in kind.validate(job)]


def test_crds_cover_every_custom_kind_and_the_runtimes() -> None:
    crds = {c["spec"]["names"]["kind"]: c for c in load_crds() if c["spec"]["group"] != "kueue.x-k8s.io"}
    custom = {k.name for k in KINDS if k.group not in ("batch", "")}
    assert set(crds) == custom | {"TrainingRuntime", "ClusterTrainingRuntime"}
    for kind in KINDS:
        if kind.name not in crds:
            continue
        crd = crds[kind.name]
        assert crd["metadata"]["name"] == f"{kind.plural}.{kind.group}"
        [version] = crd["spec"]["versions"]
        assert version["name"] == kind.version and version["served"] and version["storage"]
        assert version["subresources"]["status"] == {}
        schema = version["schema"]["openAPIV3Schema"]["properties"]
        assert schema["spec"]["x-kubernetes-preserve-unknown-fields"] is True
        assert schema["status"]["x-kubernetes-preserve-unknown-fields"] is True
        if not kind.managed_by_path:  # LeaderWorkerSet: no managedBy field
            assert "managedBy" not in schema["spec"].get("properties", {})
            continue
        node = schema
        for key in kind.managed_by_path:
            node = node[key] if key == "spec" else node["properties"][key]
        if "enum" in node:
            assert set(node["enum"]) == {kind.controller, labels.MULTIKUEUE}
        elif kind.name == "AppWrapper":  # a plain string in the operator's CRD: its webhook checks the value
            assert node == {"type": "string"}
        else:  # KubeRay states the allowed values as a CEL rule
            rules = [v["rule"] for v in node["x-kubernetes-validations"]]
            assert f"self in ['{kind.controller}', '{labels.MULTIKUEUE}']" in rules
    assert crds["ClusterTrainingRuntime"]["spec"]["scope"] == "Cluster"
    assert crds["TrainingRuntime"]["spec"]["scope"] == "Namespaced"
    columns = {c["name"] for c in crds["PyTorchJob"]["spec"]["versions"][0]["additionalPrinterColumns"]}
    assert columns == {"State", "Age"}
