"""MPIJob (kubeflow.org/v2beta1, mpi-operator): Launcher and Worker, managedBy at spec.runPolicy.managedBy.

mpi-operator validates inside its controller after defaulting, so mkd applies the same defaults
in memory before checking (never writing them back): Launcher replicas 1 / restartPolicy
OnFailure, Worker replicas 0 / restartPolicy Never, slotsPerWorker 1, sshAuthMountPath
``/root/.ssh``, mpiImplementation OpenMPI, launcherCreationPolicy AtStartup, cleanPodPolicy None.
Rules: a Launcher spec with exactly 1 replica, a Worker (when present) with at least 1, restart
policies Never or OnFailure, at least one container per replica, slotsPerWorker >= 0, and
``{name}-worker-{n-1}`` a DNS-1035 label. PodSets ``launcher`` and ``worker``.
"""

from __future__ import annotations

import copy
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
    validate_pod_template,
)
from federation.kinds.kubeflow import RUN_POLICY, validate_run_policy
from federation.podset import PodSet

GROUP = "kubeflow.org"
LAUNCHER = "Launcher"
WORKER = "Worker"
RESTART_POLICIES = ("Never", "OnFailure")
MPI_IMPLEMENTATIONS = ("OpenMPI", "Intel", "MPICH")
LAUNCHER_CREATION_POLICIES = ("AtStartup", "WaitForWorkersReady")
DEFAULT_SSH_AUTH_MOUNT_PATH = "/root/.ssh"
SPEC_DEFAULTS: Mapping[str, Any] = {
    "slotsPerWorker": 1,
    "runLauncherAsWorker": False,
    "sshAuthMountPath": DEFAULT_SSH_AUTH_MOUNT_PATH,
    "mpiImplementation": "OpenMPI",
    "launcherCreationPolicy": "AtStartup",
}
"""mpi-operator's ``SetDefaults_MPIJob`` for ``spec``; the dispatcher and the agent both default from here."""
RUN_POLICY_DEFAULTS: Mapping[str, Any] = {"cleanPodPolicy": "None"}
_DEFAULTS = {LAUNCHER: (1, "OnFailure"), WORKER: (0, "Never")}
"""Replicas and restartPolicy per replica type."""


def with_defaults(job: Mapping[str, Any], *, empty_is_unset: bool = False) -> dict[str, Any]:
    """A copy with mpi-operator's in-memory defaults applied (the stored object keeps its omissions).

    ``empty_is_unset``: an empty or null string field is defaulted too, as the controller's Go defaulting
    sees it (the agent's render); the dispatcher validates the object as written, where an empty
    ``sshAuthMountPath`` is refused."""
    out = copy.deepcopy(dict(job))
    spec = out.setdefault("spec", {}) if empty_is_unset else out.get("spec")
    if not isinstance(spec, dict):
        return out

    def put(node: dict[str, Any], key: str, value: Any) -> None:
        if key not in node or (empty_is_unset and isinstance(value, str) and not node[key]):
            node[key] = value

    for key, value in SPEC_DEFAULTS.items():
        put(spec, key, value)
    run_policy = spec.setdefault("runPolicy", {})
    if isinstance(run_policy, dict):
        for key, value in RUN_POLICY_DEFAULTS.items():
            put(run_policy, key, value)
    specs = spec.get("mpiReplicaSpecs")
    if isinstance(specs, dict):
        for rtype, (replicas, policy) in _DEFAULTS.items():
            replica = specs.get(rtype)
            if isinstance(replica, dict):
                put(replica, "replicas", replicas)
                put(replica, "restartPolicy", policy)
    return out


@dataclass(frozen=True)
class MPIJobKind(BaseKind):
    """MPIJob v2beta1; see the module docstring."""

    def validate(self, job: Mapping[str, Any], runtime: Mapping[str, Any] | None = None) -> list[Invalid]:
        job = with_defaults(job)
        errors = self.validate_name(job)
        errors += validate_run_policy(self, job)
        spec = as_map(job.get("spec"))
        errors += validate_count(spec.get("slotsPerWorker"), "spec.slotsPerWorker", minimum=0)
        mount = spec.get("sshAuthMountPath")
        if not isinstance(mount, str) or not mount:
            errors.append(
                Invalid(
                    "spec.sshAuthMountPath", "is required", fix=f"set it, e.g. {DEFAULT_SSH_AUTH_MOUNT_PATH}"
                )
            )
        for key, allowed in (
            ("mpiImplementation", MPI_IMPLEMENTATIONS),
            ("launcherCreationPolicy", LAUNCHER_CREATION_POLICIES),
        ):
            if spec.get(key) not in allowed:
                errors.append(
                    Invalid(
                        f"spec.{key}",
                        f"unsupported value {spec.get(key)!r}",
                        fix=f"use one of {', '.join(allowed)}",
                    )
                )
        errors += self.validate_replica_specs(job)
        return errors

    def validate_name(self, job: Mapping[str, Any]) -> list[Invalid]:
        name = get_path(job, ("metadata", "name"))
        errors = validate_dns1035(name)
        if errors or not isinstance(name, str):
            return errors
        replicas = int_or(get_path(job, ("spec", "mpiReplicaSpecs", WORKER, "replicas")), 1)
        hostname = f"{name}-worker-{max(replicas, 1) - 1}"
        if validate_dns1035(hostname):
            return [
                Invalid(
                    "metadata.name",
                    f"pods and services could not be named with the invalid DNS label {hostname!r}",
                    fix="shorten the name so that {name}-worker-{replicas-1} has at most 63 characters",
                )
            ]
        return []

    def validate_replica_specs(self, job: Mapping[str, Any]) -> list[Invalid]:
        specs = get_path(job, ("spec", "mpiReplicaSpecs"))
        base = "spec.mpiReplicaSpecs"
        if not isinstance(specs, Mapping) or not specs:
            return [Invalid(base, "must have replica specs", fix="add mpiReplicaSpecs.Launcher and .Worker")]
        errors: list[Invalid] = []
        for rtype in specs:
            if rtype not in (LAUNCHER, WORKER):
                errors.append(
                    Invalid(
                        f"{base}.{rtype}",
                        f"unsupported replica type {rtype!r}",
                        fix="use Launcher and Worker (exact case)",
                    )
                )
        if specs.get(LAUNCHER) is None:
            errors.append(
                Invalid(f"{base}.{LAUNCHER}", "must have Launcher replica spec", fix="add a Launcher")
            )
        for rtype in (LAUNCHER, WORKER):
            spec = specs.get(rtype)
            if spec is None:
                continue
            path = f"{base}.{rtype}"
            if not isinstance(spec, Mapping):
                errors.append(Invalid(path, "must be an object", fix="write {replicas, template}"))
                continue
            replicas = spec.get("replicas", _DEFAULTS[rtype][0])
            if rtype == LAUNCHER:
                if replicas != 1:
                    errors.append(
                        Invalid(f"{path}.replicas", f"must be 1, not {replicas!r}", fix="set replicas: 1")
                    )
            else:
                errors += validate_count(replicas, f"{path}.replicas", minimum=1)
            policy = spec.get("restartPolicy", _DEFAULTS[rtype][1])
            if policy not in RESTART_POLICIES:
                errors.append(
                    Invalid(
                        f"{path}.restartPolicy", f"unsupported value {policy!r}", fix="use Never or OnFailure"
                    )
                )
            errors += validate_pod_template(spec.get("template"), f"{path}.template")
        return errors

    def podsets(self, job: Mapping[str, Any], runtime: Mapping[str, Any] | None = None) -> list[PodSet]:
        raise_first(self.validate_replica_specs(job))
        specs = as_map(get_path(job, ("spec", "mpiReplicaSpecs")))
        out = []
        for rtype in (LAUNCHER, WORKER):
            spec = as_map(specs.get(rtype))
            count = int_or(spec.get("replicas"), _DEFAULTS[rtype][0])
            if spec and count > 0:
                out.append(
                    podset_for(
                        rtype.lower(), count, as_map(spec.get("template")), f"{base_path(rtype)}.template"
                    )
                )
        return out

    def finished(self, job: Mapping[str, Any]) -> Finished | None:
        return finished_from_conditions(job, "Succeeded", "Failed")


def base_path(rtype: str) -> str:
    return f"spec.mpiReplicaSpecs.{rtype}"


MPIJOB = MPIJobKind(
    name="MPIJob",
    group=GROUP,
    version="v2beta1",
    plural="mpijobs",
    controller=labels.MPI_OPERATOR,
    managed_by_path=(*RUN_POLICY, "managedBy"),
    suspend_path=(*RUN_POLICY, "suspend"),
)
