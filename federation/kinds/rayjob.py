"""RayJob (ray.io/v1, KubeRay): a RayCluster made for one Ray job, run on the worker by its KubeRay operator.

PodSets as Kueue counts them (``rayjob.PodSets``): the RayCluster's (``raycluster.py``: head, worker groups),
then, with ``submissionMode`` K8sJobMode (the CRD's default), a ``submitter`` PodSet of one pod from
``submitterPodTemplate`` or KubeRay's default submitter (the head's image, 500m CPU and 200Mi requested);
with SidecarMode the head pod carries that submitter container instead. Validation follows Kueue's webhook:
a RayJob mkd dispatches brings its own ``rayClusterSpec`` (a ``clusterSelector`` names a RayCluster that
lives in one cluster, while mkd may place the job in another) and sets ``shutdownAfterJobFinishes`` (else
the cluster would hold its quota after the job). Finished when ``jobDeploymentStatus`` is Complete or Failed
(or ValidationFailed before any cluster was made), succeeded when ``jobStatus`` is SUCCEEDED, with
``status.message``. managedBy at ``spec.managedBy`` (KubeRay 1.3 and later), suspend at ``spec.suspend``.
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
    podset_for,
    validate_bool,
    validate_dns1035,
    validate_managed_by,
    validate_pod_template,
)
from federation.kinds.raycluster import (
    GROUP,
    KUBERAY_OPERATOR,
    annotations_of,
    cluster_podsets,
    validate_cluster_spec,
)
from federation.podset import PodSet

SUBMISSION_MODES = ("K8sJobMode", "HTTPMode", "InteractiveMode", "SidecarMode")
DEFAULT_SUBMISSION_MODE = "K8sJobMode"
"""The CRD's default for ``spec.submissionMode``."""
SUBMITTER_CONTAINER = "ray-job-submitter"
SUBMITTER_RESOURCES = {"requests": {"cpu": "500m", "memory": "200Mi"}, "limits": {"cpu": "1", "memory": "1Gi"}}
"""KubeRay's default submitter container resources (``GetDefaultSubmitterContainer``)."""
MAX_NAME = 47
"""KubeRay refuses longer RayJob names (its RayCluster and Service names are derived from it)."""
FINISHED_DEPLOYMENTS = ("Complete", "Failed")


def submission_mode(job: Mapping[str, Any]) -> str:
    mode = get_path(job, ("spec", "submissionMode"))
    return mode if isinstance(mode, str) and mode else DEFAULT_SUBMISSION_MODE


def default_submitter(job: Mapping[str, Any]) -> dict[str, Any]:
    """KubeRay's default submitter pod template: the head's image, its default resources, restartPolicy Never."""
    image = get_path(job, ("spec", "rayClusterSpec", "headGroupSpec", "template", "spec", "containers"))
    head_image = image[0].get("image") if isinstance(image, list) and image and isinstance(image[0], Mapping) else ""
    return {"spec": {"containers": [{"name": SUBMITTER_CONTAINER, "image": head_image,
                                     "resources": SUBMITTER_RESOURCES}], "restartPolicy": "Never"}}


@dataclass(frozen=True)
class RayJobKind(BaseKind):
    """RayJob; see the module docstring."""

    def validate(self, job: Mapping[str, Any], runtime: Mapping[str, Any] | None = None) -> list[Invalid]:
        errors = validate_dns1035(get_path(job, ("metadata", "name")), max_length=MAX_NAME)
        errors += validate_managed_by(self, job)
        errors += validate_bool(job, ("spec", "suspend"))
        spec = as_map(job.get("spec"))
        mode = spec.get("submissionMode")
        if mode is not None and mode not in SUBMISSION_MODES:
            errors.append(Invalid("spec.submissionMode", f"unsupported value {mode!r}",
                                  fix=f"use one of {', '.join(SUBMISSION_MODES)}"))
        if spec.get("clusterSelector"):
            return [*errors, Invalid(
                "spec.clusterSelector", "a kueue managed job should not use an existing cluster",
                fix="give the RayJob a rayClusterSpec (the selected RayCluster lives in one cluster; mkd may "
                    "place the job in another), or remove managedBy to run it next to that cluster")]
        if spec.get("shutdownAfterJobFinishes") is not True:
            errors.append(Invalid("spec.shutdownAfterJobFinishes", "a kueue managed job should delete the cluster "
                                  "after finishing", fix="set shutdownAfterJobFinishes: true"))
        errors += validate_cluster_spec(spec.get("rayClusterSpec"), "spec.rayClusterSpec")
        template = spec.get("submitterPodTemplate")
        if template is not None and submission_mode(job) == "K8sJobMode":
            errors += validate_pod_template(template, "spec.submitterPodTemplate")
        return errors

    def podsets(self, job: Mapping[str, Any], runtime: Mapping[str, Any] | None = None) -> list[PodSet]:
        mode = submission_mode(job)
        sidecar = [{"name": SUBMITTER_CONTAINER, "resources": SUBMITTER_RESOURCES}] if mode == "SidecarMode" else None
        out = cluster_podsets(as_map(get_path(job, ("spec", "rayClusterSpec"))), "spec.rayClusterSpec",
                              annotations_of(job), head_extra=sidecar)
        if mode == "K8sJobMode":
            template = get_path(job, ("spec", "submitterPodTemplate"))
            field = "spec.submitterPodTemplate"
            if not isinstance(template, Mapping):
                template, field = default_submitter(job), "spec.rayClusterSpec.headGroupSpec.template"
            out.append(podset_for("submitter", 1, template, field))
        return out

    def finished(self, job: Mapping[str, Any]) -> Finished | None:
        status = as_map(job.get("status"))
        deployment = status.get("jobDeploymentStatus")
        if deployment not in FINISHED_DEPLOYMENTS and not (
                deployment == "ValidationFailed" and not status.get("rayClusterName")):
            return None
        message = str(status.get("message") or "")
        if status.get("jobStatus") == "SUCCEEDED":
            return Finished("Succeeded", "SUCCEEDED", message)
        return Finished("Failed", str(status.get("reason") or deployment), message)


RAYJOB = RayJobKind(
    name="RayJob",
    group=GROUP,
    version="v1",
    plural="rayjobs",
    controller=KUBERAY_OPERATOR,
    managed_by_path=("spec", "managedBy"),
    suspend_path=("spec", "suspend"),
    run_by="operator",  # the worker's KubeRay
)
