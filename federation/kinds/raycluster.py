"""RayCluster (ray.io/v1, KubeRay): a head and worker groups, run on the worker by its KubeRay operator.

PodSets as Kueue counts a RayCluster spec (``raycluster.BuildPodSets``): ``head`` with one pod, then one
per worker group, named by its lower-case ``groupName``, with ``replicas`` (default 1) times ``numOfHosts``
when that is above 1. With GCS fault tolerance (``gcsFaultToleranceOptions`` or the annotation
``ray.io/ft-enabled: "true"``) the head's Ray container (its first) requests at least what KubeRay's Redis
cleanup Job does, 200m CPU and 256Mi. Kueue refuses in-tree autoscaling (mkd slices no workloads), a worker
group named ``head``, and more than 8 PodSets. A RayCluster never finishes: it holds its quota while it
exists. managedBy at ``spec.managedBy`` (KubeRay 1.3 and later), suspend at ``spec.suspend``; the worker
copy carries no managedBy, so the worker's KubeRay runs it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from federation.errors import Invalid
from federation.jsoncopy import json_copy
from federation.kinds.base import (
    BaseKind,
    Finished,
    as_map,
    get_path,
    int_or,
    podset_for,
    raise_first,
    validate_bool,
    validate_count,
    validate_dns1035,
    validate_managed_by,
    validate_pod_template,
)
from federation.podset import PodSet, format_quantity, parse_quantity

GROUP = "ray.io"
KUBERAY_OPERATOR = "ray.io/kuberay-operator"
"""KubeRay's own managedBy value (``utils.KubeRayController``)."""
HEAD = "head"
MAX_PODSETS = 8
"""Kueue's ``jobframework.MaxPodSets``."""
FT_ANNOTATION = "ray.io/ft-enabled"
REDIS_CLEANUP_REQUESTS = {"cpu": "200m", "memory": "256Mi"}
"""What KubeRay's Redis cleanup Job requests; Kueue keeps the head's Ray container at least this big."""


def _ft_enabled(spec: Mapping[str, Any], annotations: Mapping[str, Any]) -> bool:
    return spec.get("gcsFaultToleranceOptions") is not None or annotations.get(FT_ANNOTATION) == "true"


def worker_count(group: Mapping[str, Any]) -> int:
    """Pods of one worker group as Kueue counts them: replicas (default 1) times numOfHosts above 1."""
    count = int_or(group.get("replicas"), 1)
    hosts = int_or(group.get("numOfHosts"), 1)
    return count * hosts if hosts > 1 else count


def validate_cluster_spec(spec: Any, field: str) -> list[Invalid]:
    """A RayClusterSpec as Kueue's webhook and the PodSets need it."""
    if not isinstance(spec, Mapping):
        return [Invalid(field, "is required", fix="add a headGroupSpec with a pod template, and workerGroupSpecs")]
    errors: list[Invalid] = []
    if spec.get("enableInTreeAutoscaling") is True:
        errors.append(Invalid(f"{field}.enableInTreeAutoscaling", "a kueue managed job should only use "
                              "autoscaling when workload slicing is enabled",
                              fix="remove enableInTreeAutoscaling (mkd admits the replicas written)"))
    errors += validate_pod_template(get_path(spec, ("headGroupSpec", "template")), f"{field}.headGroupSpec.template")
    groups = spec.get("workerGroupSpecs") or []
    if not isinstance(groups, list):
        return [*errors, Invalid(f"{field}.workerGroupSpecs", "must be a list", fix="write a list of worker groups")]
    if len(groups) + 1 > MAX_PODSETS:
        errors.append(Invalid(f"{field}.workerGroupSpecs", f"too many: {len(groups) + 1} PodSets, at most "
                              f"{MAX_PODSETS}", fix=f"use at most {MAX_PODSETS - 1} worker groups"))
    names: set[str] = set()
    for index, group in enumerate(groups):
        path = f"{field}.workerGroupSpecs[{index}]"
        if not isinstance(group, Mapping):
            errors.append(Invalid(path, "must be an object", fix="write {groupName, replicas, template}"))
            continue
        name = group.get("groupName")
        if not isinstance(name, str) or not name:
            errors.append(Invalid(f"{path}.groupName", "is required", fix="name the group, e.g. workers"))
        elif name == HEAD:
            errors.append(Invalid(f"{path}.groupName", f"{HEAD!r} is reserved for the head group",
                                  fix="rename the worker group"))
        elif name.lower() in names:
            errors.append(Invalid(f"{path}.groupName", f"{name!r} is used by another worker group",
                                  fix="give every worker group its own name"))
        else:
            names.add(name.lower())
        for key in ("replicas", "minReplicas", "maxReplicas"):
            errors += validate_count(group.get(key), f"{path}.{key}", minimum=0)
        errors += validate_count(group.get("numOfHosts"), f"{path}.numOfHosts", minimum=1)
        errors += validate_pod_template(group.get("template"), f"{path}.template")
    return errors


def cluster_podsets(spec: Mapping[str, Any], field: str, annotations: Mapping[str, Any], *,
                    head_extra: list[dict[str, Any]] | None = None) -> list[PodSet]:
    """Kueue's PodSets of a RayClusterSpec (see the module docstring); ``head_extra``: containers KubeRay adds
    to the head pod (a RayJob's sidecar submitter)."""
    raise_first(validate_cluster_spec(spec, field))
    head = json_copy(dict(as_map(get_path(spec, ("headGroupSpec", "template")))))
    containers = get_path(head, ("spec", "containers"))
    if _ft_enabled(spec, annotations) and isinstance(containers, list) and containers:
        resources = containers[0].setdefault("resources", {})
        requests = resources.setdefault("requests", {})
        for resource, least in REDIS_CLEANUP_REQUESTS.items():
            have = requests.get(resource)
            floor = parse_quantity(least, resource)
            if have is None or parse_quantity(have, resource) < floor:
                requests[resource] = format_quantity(Decimal(floor), resource)
    if head_extra and isinstance(containers, list):
        containers.extend(head_extra)
    out = [podset_for(HEAD, 1, head, f"{field}.headGroupSpec.template")]
    for index, group in enumerate(spec.get("workerGroupSpecs") or []):
        out.append(podset_for(str(group["groupName"]).lower(), worker_count(group), as_map(group.get("template")),
                              f"{field}.workerGroupSpecs[{index}].template"))
    return out


def annotations_of(job: Mapping[str, Any]) -> Mapping[str, Any]:
    return as_map(get_path(job, ("metadata", "annotations")))


@dataclass(frozen=True)
class RayClusterKind(BaseKind):
    """RayCluster; see the module docstring."""

    def validate(self, job: Mapping[str, Any], runtime: Mapping[str, Any] | None = None) -> list[Invalid]:
        errors = validate_dns1035(get_path(job, ("metadata", "name")))
        errors += validate_managed_by(self, job)
        errors += validate_bool(job, ("spec", "suspend"))
        errors += validate_cluster_spec(job.get("spec"), "spec")
        return errors

    def podsets(self, job: Mapping[str, Any], runtime: Mapping[str, Any] | None = None) -> list[PodSet]:
        return cluster_podsets(as_map(job.get("spec")), "spec", annotations_of(job))

    def finished(self, job: Mapping[str, Any]) -> Finished | None:
        return None  # a RayCluster serves until it is deleted (Kueue: never finished)


RAYCLUSTER = RayClusterKind(
    name="RayCluster",
    group=GROUP,
    version="v1",
    plural="rayclusters",
    controller=KUBERAY_OPERATOR,
    managed_by_path=("spec", "managedBy"),
    suspend_path=("spec", "suspend"),
    run_by="operator",  # the worker's KubeRay
)
