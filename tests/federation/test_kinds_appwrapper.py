"""AppWrapper's PodSets as Kueue computes them (declared, or inferred by the AppWrapper operator for the kinds it
knows, named ``<appwrapper>-<index>``), its refusals with field and fix, and finished from its phase."""

from __future__ import annotations

from typing import Any

import pytest

from federation import labels
from federation.errors import Invalid
from federation.kinds.appwrapper import APPWRAPPER
from federation.kinds.registry import by_api

POD = {"spec": {"containers": [{"name": "c", "image": "busybox",
                                "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}]}}


def aw(*components: dict[str, Any], name: str = "wrapped") -> dict[str, Any]:
    return {"apiVersion": "workload.codeflare.dev/v1beta2", "kind": "AppWrapper",
            "metadata": {"name": name, "namespace": "ns"},
            "spec": {"managedBy": labels.MULTIKUEUE, "components": list(components)}}


def job(parallelism: int | None = None, completions: int | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"template": POD}
    if parallelism is not None:
        spec["parallelism"] = parallelism
    if completions is not None:
        spec["completions"] = completions
    return {"template": {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j"}, "spec": spec}}


def counts(obj: dict[str, Any]) -> list[tuple[str, int]]:
    return [(p.name, p.count) for p in APPWRAPPER.podsets(obj)]


def test_registered_under_its_api() -> None:
    assert by_api("workload.codeflare.dev/v1beta2", "AppWrapper") is APPWRAPPER
    assert APPWRAPPER.run_by == "operator" and APPWRAPPER.plural == "appwrappers"


@pytest.mark.parametrize(("parallelism", "completions", "pods"),
                         [(None, None, 1), (4, None, 4), (4, 2, 2), (2, 5, 2)])
def test_a_job_component_counts_min_of_parallelism_and_completions(
        parallelism: int | None, completions: int | None, pods: int) -> None:
    assert counts(aw(job(parallelism, completions))) == [("wrapped-0", pods)]


def test_podsets_are_numbered_across_components_and_inferred_per_kind() -> None:
    pytorch = {"template": {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": "p"},
                            "spec": {"pytorchReplicaSpecs": {"Master": {"template": POD},
                                                             "Worker": {"replicas": 3, "template": POD}}}}}
    jobset = {"template": {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": {"name": "s"},
                           "spec": {"replicatedJobs": [{"name": "w", "replicas": 2, "template": {
                               "spec": {"parallelism": 3, "template": POD}}}]}}}
    ray = {"template": {"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": "r"},
                        "spec": {"headGroupSpec": {"template": POD},
                                 "workerGroupSpecs": [{"groupName": "g", "replicas": 2, "template": POD}]}}}
    deployment = {"template": {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"},
                               "spec": {"replicas": 2, "template": POD}}}
    podsets = APPWRAPPER.podsets(aw(pytorch, jobset, ray, deployment))
    assert [(p.name, p.count) for p in podsets] == [
        ("wrapped-0", 1), ("wrapped-1", 3), ("wrapped-2", 6), ("wrapped-3", 1), ("wrapped-4", 2), ("wrapped-5", 2)]
    assert str(podsets[1].requests["cpu"]) == "1"


def test_declared_podsets_of_an_unknown_kind() -> None:
    custom = {"template": {"apiVersion": "example.com/v1", "kind": "Thing", "metadata": {"name": "t"},
                           "spec": {"pods": {"template": POD}}},
              "podSets": [{"path": "template.spec.pods.template", "replicas": 4}]}
    assert counts(aw(custom)) == [("wrapped-0", 4)]


def first(obj: dict[str, Any]) -> Invalid:
    errors = APPWRAPPER.validate(obj)
    assert errors, "expected a refusal"
    return errors[0]


@pytest.mark.parametrize(("obj", "field", "words"), [
    (aw(), "spec.components", "at least one"),
    (aw({"podSets": []}), "spec.components[0].template", "required"),
    (aw({"template": {"apiVersion": "example.com/v1", "kind": "Thing", "metadata": {"name": "t"}}}),
     "spec.components[0].podSets", "required"),
    (aw({**job(2), "podSets": [{"path": "template.spec.template", "replicas": 3}]}),
     "spec.components[0].podSets", "differs from the inferred count 2"),
    (aw({"template": {"apiVersion": "example.com/v1", "kind": "Thing", "metadata": {"name": "t"}, "spec": {}},
         "podSets": [{"path": "template.spec.pods.template"}]}), "spec.components[0].podSets[0].path", "missing"),
    (aw({"template": {"apiVersion": "example.com/v1", "kind": "Thing", "metadata": {"name": "t"}, "spec": {}},
         "podSets": [{"path": "spec.template"}]}), "spec.components[0].podSets[0].path", "template"),
    (aw(*[job() for _ in range(9)]), "spec.components", "at most 8"),
    ({**aw(job()), "spec": {**aw(job())["spec"], "managedBy": "someone/else"}}, "spec.managedBy", "unsupported"),
    (aw(job(), name="x" * 62), "metadata.name", "61"),
    (aw(job(), name="a.b"), "metadata.name", "RFC 1123"),
])
def test_refusals_name_the_field_and_the_fix(obj: dict[str, Any], field: str, words: str) -> None:
    error = first(obj)
    assert error.field == field and words in str(error), str(error)
    assert error.fix
    with pytest.raises(Invalid):
        APPWRAPPER.podsets(obj)


def with_status(phase: str, *conditions: tuple[str, str]) -> dict[str, Any]:
    return {**aw(job()), "status": {"phase": phase, "conditions": [
        {"type": t, "status": s, "reason": "R", "message": "m"} for t, s in conditions]}}


def test_finished_from_the_phase_as_kueue_reads_it() -> None:
    assert APPWRAPPER.finished(with_status("Running")) is None
    done = APPWRAPPER.finished(with_status("Succeeded", ("ResourcesDeployed", "True")))
    assert done is not None and done.outcome == "Succeeded"
    # Failed counts once the operator has deleted the resources
    assert APPWRAPPER.finished(with_status("Failed", ("ResourcesDeployed", "True"))) is None
    failed = APPWRAPPER.finished(with_status("Failed", ("ResourcesDeployed", "False"), ("Unhealthy", "True")))
    assert failed is not None and failed.outcome == "Failed"


def test_the_worker_copy_has_no_managed_by_and_suspend_is_spec_suspend() -> None:
    copy = APPWRAPPER.prepare_for_worker(aw(job()), stamp={"mkd": "x"}, managed_by=None)
    assert "managedBy" not in copy["spec"]
    assert APPWRAPPER.with_suspended(copy, True)["spec"]["suspend"] is True
