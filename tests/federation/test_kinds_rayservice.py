"""RayService: PodSets as Kueue counts them (its rayClusterConfig's RayCluster PodSets), Kueue's and KubeRay's
refusals with field and fix, never finished, suspended where Kueue suspends it, the copy left to the worker's
KubeRay."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from federation import labels
from federation.kinds.rayservice import RAYSERVICE


def template(cpu: str) -> dict[str, Any]:
    return {"spec": {"containers": [{"name": "ray", "image": "rayproject/ray:2.46.0",
                                     "resources": {"requests": {"cpu": cpu}}}]}}


def rayservice(**config: Any) -> dict[str, Any]:
    return {"apiVersion": "ray.io/v1", "kind": "RayService", "metadata": {"name": "serve", "namespace": "team-a"},
            "spec": {"managedBy": labels.MULTIKUEUE, "serveConfigV2": "applications: []",
                     "rayClusterConfig": {"headGroupSpec": {"rayStartParams": {}, "template": template("2")},
                                          "workerGroupSpecs": [{"groupName": "Gpu", "replicas": 2, "numOfHosts": 2,
                                                                "template": template("1")}], **config}}}


def test_podsets_are_its_rayclusters() -> None:
    sets = RAYSERVICE.podsets(rayservice())
    assert [(p.name, p.count) for p in sets] == [("head", 1), ("gpu", 4)]
    # GCS fault tolerance: the head's Ray container requests at least what the Redis cleanup Job does
    ft = rayservice(gcsFaultToleranceOptions={"redisAddress": "redis:6379"})
    ft["spec"]["rayClusterConfig"]["headGroupSpec"]["template"] = template("100m")
    assert RAYSERVICE.podsets(ft)[0].requests["cpu"] == Decimal("0.2")


@pytest.mark.parametrize(("change", "field"), [
    ({"enableInTreeAutoscaling": True}, "spec.rayClusterConfig.enableInTreeAutoscaling"),
    ({"workerGroupSpecs": [{"groupName": "head", "template": template("1")}]},
     "spec.rayClusterConfig.workerGroupSpecs[0].groupName"),
    ({"suspend": "yes"}, "spec.rayClusterConfig.suspend"),
])
def test_refusals_name_the_field_and_the_fix(change: dict[str, Any], field: str) -> None:
    problems = RAYSERVICE.validate(rayservice(**change))
    assert [p.field for p in problems] == [field] and problems[0].fix


def test_name_managed_by_and_config_are_checked() -> None:
    job = rayservice()
    job["metadata"]["name"] = "s" * 48
    assert [p.field for p in RAYSERVICE.validate(job)] == ["metadata.name"]
    job = rayservice()
    job["spec"]["managedBy"] = "example.com/other"
    assert [p.field for p in RAYSERVICE.validate(job)] == ["spec.managedBy"]
    del job["spec"]["rayClusterConfig"], job["spec"]["managedBy"]
    assert [p.field for p in RAYSERVICE.validate(job)] == ["spec.rayClusterConfig"]


def test_never_finished_suspended_in_its_cluster_config_and_copied_without_managed_by() -> None:
    job = rayservice()
    job["status"] = {"serviceStatus": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
    assert RAYSERVICE.finished(job) is None
    stopped = RAYSERVICE.with_suspended(job, True)
    assert stopped["spec"]["rayClusterConfig"]["suspend"] is True and RAYSERVICE.is_suspended(stopped)
    assert RAYSERVICE.suspend_patch(job, True) == {"spec": {"rayClusterConfig": {"suspend": True}}}
    copy = RAYSERVICE.prepare_for_worker(job, stamp={labels.ORIGIN: "o"}, managed_by=None)
    assert "managedBy" not in copy["spec"] and "status" not in copy
    assert copy["spec"]["serveConfigV2"] == "applications: []"
