"""The Kubeflow v1 family (kubeflow.org/v1): one base for PyTorchJob, TFJob, XGBoostJob, PaddleJob, JAXJob.

Every member has a replica-spec map (``spec.<x>ReplicaSpecs``: replica type -> ``{replicas,
template, restartPolicy}``), the shared ``spec.runPolicy`` (suspend, managedBy, cleanPodPolicy,
deadlines), and finishes through its ``Succeeded`` / ``Failed`` conditions. A member differs only
in its replica-spec field, its valid replica types, the name of its main container and a few
webhook rules, so it is a few lines (see ``tfjob.py`` etc.; PyTorchJob adds its own checks in
``pytorch.py``). PodSets: one per replica type in the kind's order, name = lower-case type,
count = replicas (default 1).
"""

from __future__ import annotations

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
    validate_count,
    validate_dns1035,
    validate_managed_by,
    validate_pod_template,
)
from federation.podset import PodSet

GROUP = "kubeflow.org"
RUN_POLICY = ("spec", "runPolicy")
RESTART_POLICIES = ("Always", "OnFailure", "Never", "ExitCode")
CLEAN_POD_POLICIES = ("All", "Running", "None")
DEFAULT_REPLICAS = 1
"""A replica spec without ``replicas`` runs one (the operator's defaulting)."""


def validate_run_policy(kind: BaseKind, job: Mapping[str, Any]) -> list[Invalid]:
    """``spec.runPolicy``: managedBy value, cleanPodPolicy, non-negative deadlines and limits, suspend."""
    errors = validate_managed_by(kind, job)
    run_policy = get_path(job, RUN_POLICY)
    if run_policy is None:
        return errors
    if not isinstance(run_policy, Mapping):
        return [*errors, Invalid("spec.runPolicy", "must be an object", fix="write runPolicy: {...}")]
    clean = run_policy.get("cleanPodPolicy")
    if clean is not None and clean not in CLEAN_POD_POLICIES:
        errors.append(
            Invalid(
                "spec.runPolicy.cleanPodPolicy",
                f"unsupported value {clean!r}",
                fix=f"use one of {', '.join(CLEAN_POD_POLICIES)}",
            )
        )
    for key in ("ttlSecondsAfterFinished", "activeDeadlineSeconds", "backoffLimit"):
        errors += validate_count(run_policy.get(key), f"spec.runPolicy.{key}", minimum=0)
    suspend = run_policy.get("suspend")
    if suspend is not None and not isinstance(suspend, bool):
        errors.append(
            Invalid("spec.runPolicy.suspend", f"{suspend!r} is not a boolean", fix="write true or false")
        )
    return errors


@dataclass(frozen=True)
class KubeflowV1Kind(BaseKind):
    """A member of the Kubeflow v1 family; see the module docstring."""

    replica_specs_field: str = ""
    replica_types: tuple[str, ...] = ()
    """Valid replica types, in PodSet order."""
    container_name: str = ""
    """The webhook's default container: at least one container per replica must carry this name."""
    operator_name: str = ""
    """The training-operator's controller for the kind (``pytorchjob-controller``): the value of the
    ``training.kubeflow.org/operator-name`` label on the Pods and Services it creates."""
    port_name: str = ""
    """The main container's port the operator adds when missing (``pytorchjob-port``); its per-index Services
    expose it and the env rules read it."""
    default_port: int = 0
    """``containerPort`` of :attr:`port_name` when the operator adds it."""
    default_restart_policy: str = "Never"
    """The restartPolicy of a replica spec that sets none (the operator's ``SetDefaults_<Kind>``)."""
    single_types: tuple[str, ...] = ("Master",)
    """Replica types whose replicas must be exactly 1."""
    required_types: tuple[str, ...] = ()
    """Replica types that must be present (XGBoost's Master)."""
    at_most_one_of: tuple[str, ...] = ()
    """At most one of these types may be present (TFJob: Chief or Master)."""
    min_replicas: int = 0
    single_replicas_explicit: bool = False
    """The webhook reads the raw object: a single type without ``replicas`` is refused (PyTorch, XGBoost)."""

    @property
    def specs_path(self) -> tuple[str, str]:
        return ("spec", self.replica_specs_field)

    def replica_specs(self, job: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
        """The replica specs present, in the kind's replica-type order (unknown types last)."""
        specs = as_map(get_path(job, self.specs_path))
        known = [t for t in self.replica_types if t in specs]
        unknown = [t for t in specs if t not in self.replica_types]
        return {t: as_map(specs[t]) for t in (*known, *unknown)}

    def replicas(self, spec: Mapping[str, Any]) -> int:
        return int_or(spec.get("replicas"), DEFAULT_REPLICAS)

    def validate(self, job: Mapping[str, Any], runtime: Mapping[str, Any] | None = None) -> list[Invalid]:
        errors = validate_dns1035(get_path(job, ("metadata", "name")))
        errors += validate_run_policy(self, job)
        errors += self.validate_replica_specs(job)
        return errors

    def validate_replica_specs(self, job: Mapping[str, Any]) -> list[Invalid]:
        base = f"spec.{self.replica_specs_field}"
        raw = get_path(job, self.specs_path)
        if not isinstance(raw, Mapping) or not raw:
            types = " and ".join(self.replica_types)
            return [Invalid(base, "must be required", fix=f"add replica specs ({types}) with pod templates")]
        errors: list[Invalid] = []
        for rtype, spec in raw.items():
            path = f"{base}.{rtype}"
            if rtype not in self.replica_types:
                errors.append(
                    Invalid(
                        path,
                        f"unsupported replica type {rtype!r}",
                        fix=f"use one of {', '.join(self.replica_types)} (exact case)",
                    )
                )
            if not isinstance(spec, Mapping):
                errors.append(
                    Invalid(
                        f"{path}.template.spec.containers",
                        "must be specified",
                        fix="add a replica spec with a pod template",
                    )
                )
                continue
            errors += validate_pod_template(
                spec.get("template"), f"{path}.template", required_container=self.container_name
            )
            replicas = spec.get("replicas")
            if rtype in self.single_types:
                if replicas is None and self.single_replicas_explicit:
                    errors.append(Invalid(f"{path}.replicas", "must be 1", fix="set replicas: 1"))
                elif replicas is not None and replicas != 1:
                    errors.append(
                        Invalid(f"{path}.replicas", f"must be 1, not {replicas!r}", fix="set replicas: 1")
                    )
            else:
                errors += validate_count(replicas, f"{path}.replicas", minimum=self.min_replicas)
            policy = spec.get("restartPolicy")
            if policy is not None and policy not in RESTART_POLICIES:
                errors.append(
                    Invalid(
                        f"{path}.restartPolicy",
                        f"unsupported value {policy!r}",
                        fix=f"use one of {', '.join(RESTART_POLICIES)}",
                    )
                )
        for rtype in self.required_types:
            if rtype not in raw:
                errors.append(
                    Invalid(f"{base}.{rtype}", "must be present", fix=f"add a {rtype} replica spec")
                )
        present = [t for t in self.at_most_one_of if t in raw]
        if len(present) > 1:
            errors.append(
                Invalid(
                    base,
                    f"must not have more than 1 of {' or '.join(self.at_most_one_of)}",
                    fix=f"keep only one of {', '.join(present)}",
                )
            )
        return errors

    def podsets(self, job: Mapping[str, Any], runtime: Mapping[str, Any] | None = None) -> list[PodSet]:
        raise_first(self.validate_replica_specs(job))
        out = []
        for rtype, spec in self.replica_specs(job).items():
            count = self.replicas(spec)
            if count > 0:
                path = f"spec.{self.replica_specs_field}.{rtype}.template"
                out.append(podset_for(rtype.lower(), count, as_map(spec.get("template")), path))
        return out

    def finished(self, job: Mapping[str, Any]) -> Finished | None:
        return finished_from_conditions(job, "Succeeded", "Failed")


def v1_kind(
    name: str,
    plural: str,
    replica_specs_field: str,
    replica_types: tuple[str, ...],
    container_name: str,
    **rules: Any,
) -> KubeflowV1Kind:
    """A Kubeflow v1 member: managedBy at spec.runPolicy.managedBy, suspend at spec.runPolicy.suspend, its
    operator ``<kind>-controller`` (lower case)."""
    return KubeflowV1Kind(
        name=name,
        group=GROUP,
        version="v1",
        plural=plural,
        controller=labels.TRAINING_OPERATOR,
        managed_by_path=(*RUN_POLICY, "managedBy"),
        suspend_path=(*RUN_POLICY, "suspend"),
        replica_specs_field=replica_specs_field,
        replica_types=replica_types,
        container_name=container_name,
        operator_name=f"{name.lower()}-controller",
        **rules,
    )
