"""RayJob and RayCluster: PodSets as Kueue counts them for quota, the webhook's refusals with field and fix,
finished / succeeded / failed from KubeRay's status, and the worker copy left to the worker's KubeRay."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from federation import labels
from federation.errors import Invalid
from federation.kinds.raycluster import RAYCLUSTER
from federation.kinds.rayjob import RAYJOB


def template(cpu: str = "1", image: str = "rayproject/ray:2.46.0", name: str = "ray") -> dict[str, Any]:
    return {"spec": {"containers": [{"name": name, "image": image, "resources": {"requests": {"cpu": cpu}}}]}}


def cluster_spec(**extra: Any) -> dict[str, Any]:
    return {"headGroupSpec": {"rayStartParams": {}, "template": template("2")},
            "workerGroupSpecs": [{"groupName": "Small", "replicas": 3, "template": template("1")},
                                 {"groupName": "tpu", "replicas": 2, "numOfHosts": 4, "template": template("4")},
                                 {"groupName": "one", "template": template("1")}], **extra}


def rayjob(**spec: Any) -> dict[str, Any]:
    return {"apiVersion": "ray.io/v1", "kind": "RayJob",
            "metadata": {"name": "train", "namespace": "team-a"},
            "spec": {"entrypoint": "python train.py", "shutdownAfterJobFinishes": True,
                     "managedBy": labels.MULTIKUEUE, "rayClusterSpec": cluster_spec(), **spec}}


def test_rayjob_podsets_head_worker_groups_and_default_submitter() -> None:
    sets = RAYJOB.podsets(rayjob())
    assert [(p.name, p.count) for p in sets] == [("head", 1), ("small", 3), ("tpu", 8), ("one", 1),
                                                  ("submitter", 1)]
    assert sets[0].requests["cpu"] == Decimal(2)
    submitter = sets[-1]
    assert submitter.requests["cpu"] == Decimal("0.5") and submitter.requests["memory"] == Decimal(200 * 2**20)
    assert submitter.template["spec"]["containers"][0]["image"] == "rayproject/ray:2.46.0"
    assert submitter.template["spec"]["restartPolicy"] == "Never"


def test_rayjob_submitter_template_httpmode_and_sidecar() -> None:
    own = RAYJOB.podsets(rayjob(submitterPodTemplate=template("300m", name="submit")))
    assert own[-1].name == "submitter" and own[-1].requests["cpu"] == Decimal("0.3")
    assert [p.name for p in RAYJOB.podsets(rayjob(submissionMode="HTTPMode"))] == ["head", "small", "tpu", "one"]
    sidecar = RAYJOB.podsets(rayjob(submissionMode="SidecarMode"))
    assert [p.name for p in sidecar] == ["head", "small", "tpu", "one"]
    assert sidecar[0].requests["cpu"] == Decimal("2.5")  # the head plus KubeRay's submitter container


def test_gcs_fault_tolerance_raises_the_head_to_the_redis_cleanup_requests() -> None:
    job = rayjob()
    job["metadata"]["annotations"] = {"ray.io/ft-enabled": "true"}
    job["spec"]["rayClusterSpec"]["headGroupSpec"]["template"] = template("100m")
    head = RAYJOB.podsets(job)[0]
    assert head.requests["cpu"] == Decimal("0.2") and head.requests["memory"] == Decimal(256 * 2**20)
    big = RAYJOB.podsets(rayjob())[0]
    assert "memory" not in big.requests  # without fault tolerance nothing is added


@pytest.mark.parametrize(("change", "field", "fix"), [
    ({"clusterSelector": {"ray.io/cluster": "shared"}}, "spec.clusterSelector", "rayClusterSpec"),
    ({"shutdownAfterJobFinishes": False}, "spec.shutdownAfterJobFinishes", "true"),
    ({"rayClusterSpec": None}, "spec.rayClusterSpec", "headGroupSpec"),
    ({"rayClusterSpec": cluster_spec(enableInTreeAutoscaling=True)}, "spec.rayClusterSpec.enableInTreeAutoscaling",
     "remove"),
    ({"submissionMode": "Batch"}, "spec.submissionMode", "K8sJobMode"),
])
def test_rayjob_refusals_name_field_and_fix(change: dict[str, Any], field: str, fix: str) -> None:
    job = rayjob(**change)
    errors = RAYJOB.validate(job)
    assert field in [e.field for e in errors], errors
    assert fix in next(e for e in errors if e.field == field).fix
    if field != "spec.clusterSelector" and field != "spec.shutdownAfterJobFinishes" \
            and field != "spec.submissionMode":
        with pytest.raises(Invalid):
            RAYJOB.podsets(job)


def test_rayjob_valid_and_name_limit() -> None:
    assert RAYJOB.validate(rayjob()) == []
    job = rayjob()
    job["metadata"]["name"] = "r" * 48
    assert [e.field for e in RAYJOB.validate(job)] == ["metadata.name"]


def test_worker_groups_named_head_or_too_many_are_refused() -> None:
    spec = cluster_spec()
    spec["workerGroupSpecs"][0]["groupName"] = "head"
    assert "spec.workerGroupSpecs[0].groupName" in [e.field for e in RAYCLUSTER.validate(
        {"metadata": {"name": "c"}, "spec": spec})]
    many = cluster_spec(workerGroupSpecs=[{"groupName": f"g{i}", "template": template()} for i in range(8)])
    assert "spec.workerGroupSpecs" in [e.field for e in RAYCLUSTER.validate({"metadata": {"name": "c"}, "spec": many})]


def test_rayjob_finished_from_deployment_and_job_status() -> None:
    def status(**values: Any) -> dict[str, Any]:
        return {**rayjob(), "status": values}
    assert RAYJOB.finished(status(jobDeploymentStatus="Running", jobStatus="RUNNING")) is None
    done = RAYJOB.finished(status(jobDeploymentStatus="Complete", jobStatus="SUCCEEDED", message="ok"))
    assert done is not None and (done.outcome, done.message) == ("Succeeded", "ok")
    failed = RAYJOB.finished(status(jobDeploymentStatus="Failed", jobStatus="FAILED", reason="AppFailed"))
    assert failed is not None and (failed.outcome, failed.reason) == ("Failed", "AppFailed")
    invalid = RAYJOB.finished(status(jobDeploymentStatus="ValidationFailed", message="bad"))
    assert invalid is not None and invalid.outcome == "Failed"
    assert RAYJOB.finished(status(jobDeploymentStatus="ValidationFailed", rayClusterName="train-x")) is None


def test_raycluster_podsets_never_finishes_and_worker_copy_has_no_managed_by() -> None:
    job = {"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": "c", "namespace": "a"},
           "spec": {**cluster_spec(), "managedBy": labels.MULTIKUEUE}, "status": {"state": "ready"}}
    assert RAYCLUSTER.validate(job) == []
    assert [(p.name, p.count) for p in RAYCLUSTER.podsets(job)] == [("head", 1), ("small", 3), ("tpu", 8),
                                                                     ("one", 1)]
    assert RAYCLUSTER.finished(job) is None
    for kind in (RAYCLUSTER, RAYJOB):
        assert kind.run_by == "operator"
        copy = kind.prepare_for_worker(job, stamp={"x": "y"}, managed_by=None)
        assert "managedBy" not in copy["spec"] and "status" not in copy
