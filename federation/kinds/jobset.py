"""JobSet (jobset.x-k8s.io/v1alpha2): one PodSet per replicatedJob, managedBy at spec.managedBy.

A replicatedJob runs ``replicas`` (default 1) copies of a batch Job template, so its PodSet count
is replicas x the pods one Job runs at once (parallelism, default 1, capped by completions: Kueue's
``PodsCountPerReplica``). Finished comes from the JobSet's Completed /
Failed conditions. Replicated job names become part of Job and pod names, so they are checked as
DNS-1035 labels and must be unique, as the JobSet webhook requires.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from federation import labels
from federation.errors import Invalid
from federation.kinds.base import (
    BaseKind,
    Finished,
    as_map,
    finished_from_conditions,
    get_path,
    int_or,
    podset_for,
    raise_first,
    validate_bool,
    validate_count,
    validate_dns1035,
    validate_managed_by,
)
from federation.kinds.batchjob import job_pod_count, validate_job_spec
from federation.podset import PodSet

GROUP = "jobset.x-k8s.io"
DEFAULT_REPLICAS = 1
"""A replicatedJob without ``replicas`` runs one Job (the JobSet webhook's default)."""


def replicated_job_pods(rjob: Mapping[str, Any]) -> int:
    """Pods a replicatedJob runs at once: its replicas times its Job's :func:`job_pod_count`."""
    job_spec = as_map(get_path(rjob, ("template", "spec")))
    return int_or(rjob.get("replicas"), DEFAULT_REPLICAS) * job_pod_count(job_spec)


def replicated_jobs(jobset_spec: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    items = jobset_spec.get("replicatedJobs")
    return [as_map(item) for item in items] if isinstance(items, list) else []


def validate_replicated_jobs(jobset_spec: Any, field: str) -> list[Invalid]:
    """``replicatedJobs``: present, uniquely named, replicas >= 0, each with a valid Job template."""
    items = as_map(jobset_spec).get("replicatedJobs")
    path = f"{field}.replicatedJobs"
    if not isinstance(items, list) or not items:
        return [
            Invalid(
                path, "must have at least one replicated job", fix="add replicatedJobs: [{name, template}]"
            )
        ]
    errors: list[Invalid] = []
    seen: set[str] = set()
    for index, item in enumerate(items):
        here = f"{path}[{index}]"
        if not isinstance(item, Mapping):
            errors.append(Invalid(here, "must be an object", fix="write {name, replicas, template}"))
            continue
        name = item.get("name")
        errors += validate_dns1035(name, f"{here}.name")
        if isinstance(name, str):
            if name in seen:
                errors.append(
                    Invalid(
                        f"{here}.name",
                        f"duplicate replicated job name {name!r}",
                        fix="give each a unique name",
                    )
                )
            seen.add(name)
        errors += validate_count(item.get("replicas"), f"{here}.replicas", minimum=0)
        errors += validate_job_spec(
            get_path(item, ("template", "spec")), f"{here}.template.spec", restart_policy_required=False
        )
    return errors


def replicated_job_podsets(rjobs: Sequence[Mapping[str, Any]], field: str) -> list[PodSet]:
    """One PodSet per replicatedJob (:func:`replicated_job_pods`); zero-pod ones are left out."""
    out = []
    for index, rjob in enumerate(rjobs):
        job_spec = as_map(get_path(rjob, ("template", "spec")))
        count = replicated_job_pods(rjob)
        if count > 0:
            template = as_map(job_spec.get("template"))
            out.append(
                podset_for(
                    str(rjob.get("name")),
                    count,
                    template,
                    f"{field}.replicatedJobs[{index}].template.spec.template",
                )
            )
    return out


@dataclass(frozen=True)
class JobSetKind(BaseKind):
    """JobSet; see the module docstring."""

    def validate(self, job: Mapping[str, Any], runtime: Mapping[str, Any] | None = None) -> list[Invalid]:
        errors = validate_dns1035(get_path(job, ("metadata", "name")))
        errors += validate_managed_by(self, job)
        errors += validate_replicated_jobs(job.get("spec"), "spec")
        errors += validate_bool(job, ("spec", "suspend"))
        return errors

    def podsets(self, job: Mapping[str, Any], runtime: Mapping[str, Any] | None = None) -> list[PodSet]:
        raise_first(validate_replicated_jobs(job.get("spec"), "spec"))
        return replicated_job_podsets(replicated_jobs(as_map(job.get("spec"))), "spec")

    def finished(self, job: Mapping[str, Any]) -> Finished | None:
        return finished_from_conditions(job, "Completed", "Failed")


JOBSET = JobSetKind(
    name="JobSet",
    group=GROUP,
    version="v1alpha2",
    plural="jobsets",
    controller=labels.JOBSET_CONTROLLER,
    managed_by_path=("spec", "managedBy"),
    suspend_path=("spec", "suspend"),
)
