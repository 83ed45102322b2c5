"""TrainJob (trainer.kubeflow.org/v1alpha1): PodSets from its (Cluster)TrainingRuntime's JobSet template.

managedBy lives at ``spec.managedBy``; the CRD defaults it to the trainjob controller, so mkd
invents no default: absent means that controller. The runtime (``spec.runtimeRef``, kind
ClusterTrainingRuntime by default) holds a JobSet template; :func:`effective_replicated_jobs`
applies the TrainJob's trainer overrides the way the runtime framework does (KUBEFLOW.md D.3):
the node-count replicatedJob (named ``node``, else the one labelled with ancestor ``trainer``)
runs ``trainer.numNodes`` (else ``mlPolicy.numNodes``, else 1) pods, one fewer when an MPI
policy runs the launcher as a node; ``resourcesPerNode`` is merged into its ``node`` container
(and the launcher's when it is a node); image, command, args and env override the ``node``
container of the trainer ancestor. Other replicatedJobs count replicas x parallelism. Counts live
in ``PodSet.count``; totals are per-pod requests x count, with no separate NumNodes path.
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
    RuntimeRef,
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
from federation.kinds.jobset import replicated_jobs, validate_replicated_jobs
from federation.podset import PodSet, parse_resources, pod_requests

GROUP = "trainer.kubeflow.org"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
ANCESTOR_LABEL = f"{GROUP}/trainjob-ancestor-step"
"""Label on a runtime's replicatedJob template naming its step.

Values: dataset-initializer, model-initializer, trainer.
"""
TRAINER_ANCESTOR = "trainer"
NODE = "node"
"""Name of the trainer replicatedJob and of the main container in every runtime."""
CLUSTER_TRAINING_RUNTIME = "ClusterTrainingRuntime"
TRAINING_RUNTIME = "TrainingRuntime"
RUNTIME_PLURALS = {CLUSTER_TRAINING_RUNTIME: "clustertrainingruntimes", TRAINING_RUNTIME: "trainingruntimes"}
RESERVED_TORCH_ENV = (
    "PET_NNODES",
    "PET_NPROC_PER_NODE",
    "PET_NODE_RANK",
    "PET_MASTER_ADDR",
    "PET_MASTER_PORT",
)
"""Set by the torch plugin on the ``node`` container; the webhook refuses them in ``trainer.env``."""
RUNTIME_FIELD = "runtime.spec"
"""Prefix of field paths that point into the runtime rather than the TrainJob."""


def _ref(job: Mapping[str, Any]) -> tuple[str | None, str, str]:
    ref = as_map(get_path(job, ("spec", "runtimeRef")))
    name = ref.get("name")
    return (
        name if isinstance(name, str) and name else None,
        str(ref.get("apiGroup") or GROUP),
        str(ref.get("kind") or CLUSTER_TRAINING_RUNTIME),
    )


def _num_nodes(job: Mapping[str, Any], runtime: Mapping[str, Any]) -> int:
    value = get_path(job, ("spec", "trainer", "numNodes"))
    if value is None:
        value = get_path(runtime, ("spec", "mlPolicy", "numNodes"))
    return int_or(value, 1)


def _launcher_as_node(runtime: Mapping[str, Any]) -> bool:
    return get_path(runtime, ("spec", "mlPolicy", "mpi", "runLauncherAsNode")) is True


def _is_trainer(rjob: Mapping[str, Any]) -> bool:
    return bool(get_path(rjob, ("template", "metadata", "labels", ANCESTOR_LABEL)) == TRAINER_ANCESTOR)


def _node_index(rjobs: list[dict[str, Any]]) -> int | None:
    """The replicatedJob whose count is numNodes: ``node`` by name, else the trainer ancestor."""
    for index, rjob in enumerate(rjobs):
        if rjob.get("name") == NODE:
            return index
    for index, rjob in enumerate(rjobs):
        if _is_trainer(rjob):
            return index
    return None


def _trainer_indexes(rjobs: list[dict[str, Any]], node_index: int | None) -> list[int]:
    labelled = [i for i, rjob in enumerate(rjobs) if _is_trainer(rjob)]
    return labelled or ([node_index] if node_index is not None else [])


def _node_container(rjob: Mapping[str, Any]) -> dict[str, Any] | None:
    containers = get_path(rjob, ("template", "spec", "template", "spec", "containers"))
    if isinstance(containers, list):
        for container in containers:
            if isinstance(container, dict) and container.get("name") == NODE:
                return container
    return None


def _merge_resources(container: dict[str, Any], per_node: Mapping[str, Any]) -> None:
    resources = container.setdefault("resources", {})
    if not isinstance(resources, dict):
        return
    for key in ("requests", "limits"):
        if isinstance(per_node.get(key), Mapping):
            resources[key] = {**as_map(resources.get(key)), **per_node[key]}


def _upsert_env(container: dict[str, Any], env: list[Any]) -> None:
    existing = container.get("env")
    current = [e for e in existing if isinstance(e, Mapping)] if isinstance(existing, list) else []
    names = {e.get("name") for e in env if isinstance(e, Mapping)}
    container["env"] = [e for e in current if e.get("name") not in names] + [
        dict(e) for e in env if isinstance(e, Mapping)
    ]


def effective_replicated_jobs(job: Mapping[str, Any], runtime: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The runtime's replicatedJobs with the TrainJob's trainer overrides and counts applied."""
    rjobs = [
        copy.deepcopy(dict(r))
        for r in replicated_jobs(as_map(get_path(runtime, ("spec", "template", "spec"))))
    ]
    trainer = as_map(get_path(job, ("spec", "trainer")))
    node_index = _node_index(rjobs)
    trainer_indexes = _trainer_indexes(rjobs, node_index)
    per_node = as_map(trainer.get("resourcesPerNode"))
    for index, rjob in enumerate(rjobs):
        container = _node_container(rjob)
        is_trainer = index in trainer_indexes
        if get_path(rjob, ("template", "metadata", "labels", ANCESTOR_LABEL)) is not None or is_trainer:
            rjob["replicas"] = 1  # initializer and trainer ancestors run one Job each
        if container is None:
            continue
        if is_trainer or index == node_index:
            if isinstance(trainer.get("image"), str):
                container["image"] = trainer["image"]
        if is_trainer:
            for key in ("command", "args"):
                if isinstance(trainer.get(key), list):
                    container[key] = list(trainer[key])
            if isinstance(trainer.get("env"), list):
                _upsert_env(container, trainer["env"])
        if per_node and (index == node_index or (is_trainer and _launcher_as_node(runtime))):
            _merge_resources(container, per_node)
    if node_index is not None:
        count = _num_nodes(job, runtime) - (1 if _launcher_as_node(runtime) else 0)
        job_spec = get_path(rjobs[node_index], ("template", "spec"))
        if isinstance(job_spec, dict):  # otherwise validation reports the missing Job spec
            job_spec["parallelism"] = job_spec["completions"] = max(count, 0)
    return rjobs


@dataclass(frozen=True)
class TrainJobKind(BaseKind):
    """TrainJob; see the module docstring."""

    def runtime_ref(self, job: Mapping[str, Any]) -> RuntimeRef | None:
        name, group, kind = _ref(job)
        if name is None or group != GROUP or kind not in RUNTIME_PLURALS:
            return None
        namespace = get_path(job, ("metadata", "namespace")) if kind == TRAINING_RUNTIME else None
        return RuntimeRef(
            API_VERSION,
            kind,
            RUNTIME_PLURALS[kind],
            name,
            str(namespace or "default") if kind == TRAINING_RUNTIME else None,
        )

    def validate(self, job: Mapping[str, Any], runtime: Mapping[str, Any] | None = None) -> list[Invalid]:
        errors = validate_dns1035(get_path(job, ("metadata", "name")))
        errors += validate_managed_by(self, job)
        errors += self._validate_ref(job)
        errors += self._validate_trainer(job, runtime)
        spec = as_map(job.get("spec"))
        errors += validate_count(spec.get("activeDeadlineSeconds"), "spec.activeDeadlineSeconds", minimum=1)
        errors += validate_bool(job, ("spec", "suspend"))
        if runtime is not None:
            errors += self._validate_runtime(job, runtime)
        return errors

    def _validate_ref(self, job: Mapping[str, Any]) -> list[Invalid]:
        if not isinstance(get_path(job, ("spec", "runtimeRef")), Mapping):
            return [
                Invalid(
                    "spec.runtimeRef", "is required", fix="set runtimeRef.name to a ClusterTrainingRuntime"
                )
            ]
        name, group, kind = _ref(job)
        errors = []
        if name is None:
            errors.append(
                Invalid("spec.runtimeRef.name", "is required", fix="name the runtime, e.g. torch-distributed")
            )
        if group != GROUP:
            errors.append(
                Invalid(
                    "spec.runtimeRef.apiGroup", f"unsupported runtime group {group!r}", fix=f"use {GROUP}"
                )
            )
        if kind not in RUNTIME_PLURALS:
            errors.append(
                Invalid(
                    "spec.runtimeRef.kind",
                    f"unsupported runtime kind {kind!r}",
                    fix="use ClusterTrainingRuntime or TrainingRuntime",
                )
            )
        return errors

    def _validate_trainer(self, job: Mapping[str, Any], runtime: Mapping[str, Any] | None) -> list[Invalid]:
        trainer = get_path(job, ("spec", "trainer"))
        if trainer is None:
            return []
        if not isinstance(trainer, Mapping):
            return [Invalid("spec.trainer", "must be an object", fix="write trainer: {numNodes, image, ...}")]
        errors = validate_count(trainer.get("numNodes"), "spec.trainer.numNodes", minimum=1)
        nproc = trainer.get("numProcPerNode")
        if nproc is not None and not (
            nproc in ("auto", "cpu", "gpu")
            or (isinstance(nproc, str) and re.fullmatch(r"[1-9][0-9]*", nproc))
        ):
            errors += validate_count(nproc, "spec.trainer.numProcPerNode", minimum=1)
        per_node = trainer.get("resourcesPerNode")
        if per_node is not None and not isinstance(per_node, Mapping):
            errors.append(
                Invalid("spec.trainer.resourcesPerNode", "must be an object", fix="write {requests: {...}}")
            )
        elif isinstance(per_node, Mapping):
            for key in ("requests", "limits"):
                try:
                    parse_resources(per_node.get(key), f"spec.trainer.resourcesPerNode.{key}")
                except Invalid as exc:
                    errors.append(exc)
        env = trainer.get("env")
        torch = runtime is None or get_path(runtime, ("spec", "mlPolicy", "torch")) is not None
        if env is not None and not isinstance(env, list):
            errors.append(Invalid("spec.trainer.env", "must be a list", fix="write env: [{name, value}]"))
        elif isinstance(env, list):
            for index, item in enumerate(env):
                name = as_map(item).get("name")
                if not isinstance(name, str) or not name:
                    errors.append(
                        Invalid(f"spec.trainer.env[{index}].name", "is required", fix="name the variable")
                    )
                elif torch and name in RESERVED_TORCH_ENV:
                    errors.append(
                        Invalid(
                            f"spec.trainer.env[{index}].name",
                            f"{name} is reserved for the torch runtime",
                            fix="remove it; use trainer.numNodes / numProcPerNode instead",
                        )
                    )
        for key in ("image",):
            if key in trainer and not (isinstance(trainer[key], str) and trainer[key]):
                errors.append(
                    Invalid(f"spec.trainer.{key}", "must be a non-empty string", fix="set the image")
                )
        for key in ("command", "args"):
            if key in trainer and not (
                isinstance(trainer[key], list) and all(isinstance(a, str) for a in trainer[key])
            ):
                errors.append(
                    Invalid(f"spec.trainer.{key}", "must be a list of strings", fix=f'write {key}: ["..."]')
                )
        return errors

    def _validate_runtime(self, job: Mapping[str, Any], runtime: Mapping[str, Any]) -> list[Invalid]:
        name, _, kind = _ref(job)
        errors: list[Invalid] = []
        if runtime.get("kind") not in (None, kind):
            errors.append(
                Invalid(
                    "spec.runtimeRef.kind",
                    f"refers to a {kind} but the runtime is a {runtime.get('kind')}",
                    fix="fix runtimeRef.kind",
                )
            )
        errors += validate_count(
            get_path(runtime, ("spec", "mlPolicy", "numNodes")),
            f"{RUNTIME_FIELD}.mlPolicy.numNodes",
            minimum=1,
        )
        template_spec = get_path(runtime, ("spec", "template", "spec"))
        structural = validate_replicated_jobs(template_spec, f"{RUNTIME_FIELD}.template.spec")
        if structural and not isinstance(as_map(template_spec).get("replicatedJobs"), list):
            return errors + structural
        rjobs = effective_replicated_jobs(job, runtime)
        node_index = _node_index(rjobs)
        if node_index is None:
            errors.append(
                Invalid(
                    f"{RUNTIME_FIELD}.template.spec.replicatedJobs",
                    f"runtime {name!r} has no trainer replicated job (named {NODE!r} or labelled "
                    f"{ANCESTOR_LABEL}={TRAINER_ANCESTOR})",
                    fix="fix the runtime",
                )
            )
        for index in sorted(
            {*(_trainer_indexes(rjobs, node_index)), *([] if node_index is None else [node_index])}
        ):
            if _node_container(rjobs[index]) is None:
                pod_field = (
                    f"{RUNTIME_FIELD}.template.spec.replicatedJobs[{index}].template.spec.template.spec"
                )
                name = rjobs[index].get("name")
                errors.append(
                    Invalid(
                        f"{pod_field}.containers",
                        f"the trainer replicated job {name!r} needs a container named {NODE!r}",
                        fix=f"name the main container {NODE!r}",
                    )
                )
        effective = {"replicatedJobs": rjobs}
        errors += validate_replicated_jobs(effective, f"{RUNTIME_FIELD}.template.spec")
        # a malformed quantity in the runtime is wrong even where resourcesPerNode overrides it
        for index, raw in enumerate(replicated_jobs(as_map(template_spec))):
            pod_field = f"{RUNTIME_FIELD}.template.spec.replicatedJobs[{index}].template.spec.template.spec"
            try:
                pod_requests(as_map(get_path(raw, ("template", "spec", "template", "spec"))), pod_field)
            except Invalid as exc:
                if exc.field not in {e.field for e in errors}:
                    errors.append(exc)
        return errors

    def podsets(self, job: Mapping[str, Any], runtime: Mapping[str, Any] | None = None) -> list[PodSet]:
        if runtime is None:
            raise Invalid(
                "spec.runtimeRef",
                "the runtime is needed to compute PodSets",
                fix="create the referenced ClusterTrainingRuntime or TrainingRuntime",
            )
        raise_first(
            self._validate_ref(job)
            + self._validate_trainer(job, runtime)
            + self._validate_runtime(job, runtime)
        )
        out = []
        for index, rjob in enumerate(effective_replicated_jobs(job, runtime)):
            job_spec = as_map(get_path(rjob, ("template", "spec")))
            count = int_or(rjob.get("replicas"), 1) * int_or(job_spec.get("parallelism"), 1)
            if count > 0:
                out.append(
                    podset_for(
                        str(rjob.get("name")),
                        count,
                        as_map(job_spec.get("template")),
                        f"{RUNTIME_FIELD}.template.spec.replicatedJobs[{index}].template.spec.template",
                    )
                )
        return out

    def finished(self, job: Mapping[str, Any]) -> Finished | None:
        return finished_from_conditions(job, "Complete", "Failed")


TRAINJOB = TrainJobKind(
    name="TrainJob",
    group=GROUP,
    version=VERSION,
    plural="trainjobs",
    controller=labels.TRAINJOB_CONTROLLER,
    managed_by_path=("spec", "managedBy"),
    suspend_path=("spec", "suspend"),
)
