"""batch/v1 Job: one PodSet ``main``, managedBy at spec.managedBy, finished from Complete / Failed.

The count is ``parallelism`` (default 1), capped by ``completions`` when that is set. The Job
validation rules mkd depends on (pod template with containers and images, ``restartPolicy``
Never or OnFailure, non-negative counts) live here as :func:`validate_job_spec` because JobSet
and TrainJob runtimes embed the same JobSpec. The worker copy drops the selector and the
controller-uid labels the manager's API server generated: the worker's would refuse them.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
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
    validate_managed_by,
    validate_pod_template,
)
from federation.podset import PodSet

JOB_RESTART_POLICIES = ("Never", "OnFailure")
GENERATED_LABELS = (
    "controller-uid",
    "batch.kubernetes.io/controller-uid",
    "job-name",
    "batch.kubernetes.io/job-name",
)
"""Labels the Job API server adds to the selector and the template; they name the manager's uid."""
PODSET_NAME = "main"
_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def job_pod_count(job_spec: Mapping[str, Any]) -> int:
    """Pods running at once: parallelism (default 1), at most completions when set."""
    count = int_or(job_spec.get("parallelism"), 1)
    completions = job_spec.get("completions")
    if isinstance(completions, int) and not isinstance(completions, bool):
        count = min(count, completions)
    return count


def validate_job_spec(job_spec: Any, field: str, *, restart_policy_required: bool = True) -> list[Invalid]:
    """A batch/v1 JobSpec as the API server checks what mkd relies on.

    JobSet's webhook defaults a missing pod ``restartPolicy`` to OnFailure, so inside a JobSet (or a
    training runtime's JobSet template) only a present, wrong value is refused.
    """
    if not isinstance(job_spec, Mapping):
        return [Invalid(field, "is required", fix="add a Job spec with template.spec.containers")]
    errors: list[Invalid] = []
    for key in (
        "parallelism",
        "completions",
        "backoffLimit",
        "activeDeadlineSeconds",
        "ttlSecondsAfterFinished",
    ):
        errors += validate_count(
            job_spec.get(key), f"{field}.{key}", minimum=1 if key == "activeDeadlineSeconds" else 0
        )
    template_field = f"{field}.template"
    errors += validate_pod_template(job_spec.get("template"), template_field)
    policy = get_path(as_map(job_spec.get("template")), ("spec", "restartPolicy"))
    missing_ok = policy is None and not restart_policy_required
    if (
        isinstance(job_spec.get("template"), Mapping)
        and policy not in JOB_RESTART_POLICIES
        and not missing_ok
    ):
        what = "is required" if policy is None else f"unsupported value {policy!r}"
        errors.append(
            Invalid(f"{template_field}.spec.restartPolicy", what, fix="set restartPolicy: Never or OnFailure")
        )
    return errors


def validate_job_name(name: Any) -> list[Invalid]:
    """A Job's name is a DNS-1123 subdomain that also fits the 63-character job-name label."""
    if not isinstance(name, str) or not name:
        return [Invalid("metadata.name", "is required", fix="set a name such as my-job")]
    if len(name) > 63 or not _SUBDOMAIN.fullmatch(name):
        return [
            Invalid(
                "metadata.name",
                f"{name!r} is not a valid Job name (DNS-1123, at most 63 characters)",
                fix="use lower case letters, digits, '-' and '.'",
            )
        ]
    return []


@dataclass(frozen=True)
class BatchJobKind(BaseKind):
    """batch/v1 Job; see the module docstring."""

    def validate(self, job: Mapping[str, Any], runtime: Mapping[str, Any] | None = None) -> list[Invalid]:
        errors = validate_job_name(get_path(job, ("metadata", "name")))
        errors += validate_managed_by(self, job)
        errors += validate_job_spec(job.get("spec"), "spec")
        errors += validate_bool(job, ("spec", "suspend"))
        return errors

    def podsets(self, job: Mapping[str, Any], runtime: Mapping[str, Any] | None = None) -> list[PodSet]:
        spec = job.get("spec")
        raise_first(validate_job_spec(spec, "spec"))
        spec = as_map(spec)
        return [podset_for(PODSET_NAME, job_pod_count(spec), as_map(spec.get("template")), "spec.template")]

    def finished(self, job: Mapping[str, Any]) -> Finished | None:
        return finished_from_conditions(job, "Complete", "Failed")

    def keep_worker_generated(self, existing: Mapping[str, Any], update: dict[str, Any]) -> None:
        """The worker's selector and controller-uid labels are immutable: carried over into an update."""
        old = as_map(existing.get("spec"))
        spec = update.get("spec")
        if not isinstance(spec, dict) or old.get("manualSelector") is True:
            return
        if "selector" in old:
            spec["selector"] = copy.deepcopy(old["selector"])
        template = spec.setdefault("template", {})
        for source, meta in ((get_path(old, ("template", "metadata")), template.setdefault("metadata", {})),
                             (existing.get("metadata"), update.setdefault("metadata", {}))):
            generated = {k: v for k, v in as_map(as_map(source).get("labels")).items() if k in GENERATED_LABELS}
            if generated:
                meta["labels"] = {**as_map(meta.get("labels")), **generated}

    def strip_server_defaults(self, job: dict[str, Any]) -> None:
        spec = job.get("spec")
        if not isinstance(spec, dict) or spec.get("manualSelector") is True:
            return
        spec.pop("selector", None)
        template_meta = get_path(spec, ("template", "metadata"))
        for meta in (template_meta, job.get("metadata")):
            if isinstance(meta, dict) and isinstance(meta.get("labels"), dict):
                meta["labels"] = {k: v for k, v in meta["labels"].items() if k not in GENERATED_LABELS}


BATCH_JOB = BatchJobKind(
    name="Job",
    group="batch",
    version="v1",
    plural="jobs",
    controller=labels.BATCH_JOB_CONTROLLER,
    managed_by_path=("spec", "managedBy"),
    suspend_path=("spec", "suspend"),
    run_by="operator",  # the worker's kubernetes.io/job-controller
)
