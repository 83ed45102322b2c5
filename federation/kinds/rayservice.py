"""RayService (ray.io/v1, KubeRay): Ray Serve applications on a RayCluster, run on the worker by its KubeRay operator.

PodSets as Kueue counts them (``rayservice.PodSets``): those of the RayCluster KubeRay makes from
``rayClusterConfig`` (``raycluster.py``: head, worker groups × numOfHosts, the GCS fault tolerance floor).
Validation follows Kueue's webhook (the RayCluster refusals: in-tree autoscaling, a group named ``head``, more
than 8 PodSets) and KubeRay's (a DNS-1035 name of at most 47 characters). A RayService never finishes: it
serves, holding its quota, until deleted; ``Ready`` (``serviceStatus`` Running) says it serves. managedBy at
``spec.managedBy`` (KubeRay 1.6 and later); suspend where Kueue suspends it, ``spec.rayClusterConfig.suspend``.
The worker copy carries no managedBy, so the worker's KubeRay, of any version, runs it; edits, new
``serveConfigV2`` included, reach the copy as every placed Job's edits do.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from federation.errors import Invalid
from federation.kinds.base import (
    BaseKind,
    Finished,
    as_map,
    get_path,
    validate_bool,
    validate_dns1035,
    validate_managed_by,
)
from federation.kinds.raycluster import (
    GROUP,
    KUBERAY_OPERATOR,
    annotations_of,
    cluster_podsets,
    validate_cluster_spec,
)
from federation.podset import PodSet

CONFIG = "rayClusterConfig"
MAX_NAME = 47
"""KubeRay's ``MaxRayServiceNameLength``: its RayCluster and Service names are derived from it."""


@dataclass(frozen=True)
class RayServiceKind(BaseKind):
    """RayService; see the module docstring."""

    def validate(self, job: Mapping[str, Any], runtime: Mapping[str, Any] | None = None) -> list[Invalid]:
        errors = validate_dns1035(get_path(job, ("metadata", "name")), max_length=MAX_NAME)
        errors += validate_managed_by(self, job)
        errors += validate_bool(job, self.suspend_path)
        errors += validate_cluster_spec(get_path(job, ("spec", CONFIG)), f"spec.{CONFIG}")
        return errors

    def podsets(self, job: Mapping[str, Any], runtime: Mapping[str, Any] | None = None) -> list[PodSet]:
        return cluster_podsets(as_map(get_path(job, ("spec", CONFIG))), f"spec.{CONFIG}", annotations_of(job))

    def finished(self, job: Mapping[str, Any]) -> Finished | None:
        return None  # a RayService serves until it is deleted (Kueue: never finished)


RAYSERVICE = RayServiceKind(
    name="RayService",
    group=GROUP,
    version="v1",
    plural="rayservices",
    controller=KUBERAY_OPERATOR,
    managed_by_path=("spec", "managedBy"),
    suspend_path=("spec", CONFIG, "suspend"),
    run_by="operator",  # the worker's KubeRay
)
