"""TrainJob (trainer.kubeflow.org/v1alpha1): PodSets from its (Cluster)TrainingRuntime's JobSet template.

managedBy lives at ``spec.managedBy``; the CRD defaults it to the trainjob controller, so mkd
invents no default: absent means that controller. The runtime (``spec.runtimeRef``, kind
ClusterTrainingRuntime by default) holds a JobSet template; :func:`effective_replicated_jobs`
is the ONE computation of which pods it runs (counts, replicas and per-pod resources, the way
upstream trainer's runtime framework does it; KUBEFLOW.md D.3): the dispatcher's PodSets come from
it here, and the agent's JobSet render (``worker_agent/reconcilers/trainjob_build.py``) starts from
it. PodSet counts are replicas x parallelism; totals are per-pod requests x count.
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
from federation.kinds.jobset import replicated_job_pods, replicated_jobs, validate_replicated_jobs
from federation.podset import PodSet, parse_resources, pod_requests

GROUP = "trainer.kubeflow.org"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
ANCESTOR_LABEL = f"{GROUP}/trainjob-ancestor-step"
"""Label on a runtime's replicatedJob template naming its step.

Values: dataset-initializer, model-initializer, trainer.
"""
TRAINER_ANCESTOR = "trainer"
ANCESTORS_WITH_ONE_REPLICA = ("dataset-initializer", "model-initializer", TRAINER_ANCESTOR)
"""Steps the JobSet plugin's Build runs as one replica each."""
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


def _ancestor(rjob: Mapping[str, Any]) -> str | None:
    value = get_path(rjob, ("template", "metadata", "labels", ANCESTOR_LABEL))
    return value if isinstance(value, str) else None


def _is_trainer(rjob: Mapping[str, Any]) -> bool:
    return _ancestor(rjob) == TRAINER_ANCESTOR


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


def _ml_policy(runtime: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The runtime's ``mlPolicy``; None when absent (upstream's nil pointer: no numNodes, no merge)."""
    ml = get_path(runtime, ("spec", "mlPolicy"))
    return ml if isinstance(ml, Mapping) else None


def effective_replicated_jobs(job: Mapping[str, Any], runtime: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The runtime's replicatedJobs as the trainer runtime framework runs them: the ONE computation of
    a TrainJob's pods, shared by the dispatcher (PodSets) and the agent (the JobSet it renders).

    Follows upstream trainer (KUBEFLOW.md D.3; ``newRuntimeInfo``, the ML policies' ``EnforceMLPolicy``
    and the JobSet plugin's parallelism sync), per replicatedJob in template order:

    - count = its ``parallelism`` (default 1); a trainer ancestor's is ``mlPolicy.numNodes`` (default
      1) when the runtime has an mlPolicy;
    - ``trainer.numNodes``, when set, overrides it: with an MPI policy on the job named ``node``
      (``max(numNodes - 1, 1)`` when ``runLauncherAsNode``: the launcher is one of the nodes),
      otherwise (torch, jax, xgboost, plain) on the first trainer ancestor;
    - ``trainer.resourcesPerNode`` is merged (per resource, as a strategic merge patch does) into
      the ``node`` container of a trainer ancestor and, with ``runLauncherAsNode``, of the job named
      ``node`` too; never without an mlPolicy;
    - initializer and trainer ancestors run one replica; ``parallelism`` = ``completions`` = count.

    Pods per replicatedJob are ``replicas`` x ``parallelism``.
    """
    rjobs = [copy.deepcopy(dict(r)) for r in replicated_jobs(as_map(get_path(runtime, ("spec", "template", "spec"))))]
    ml = _ml_policy(runtime)
    mpi = as_map(ml.get("mpi")) if ml is not None and isinstance(ml.get("mpi"), Mapping) else None
    launcher_as_node = mpi is not None and mpi.get("runLauncherAsNode") is True
    trainer = as_map(get_path(job, ("spec", "trainer")))
    per_node = trainer.get("resourcesPerNode")
    counts: list[int] = []
    for rjob in rjobs:
        ancestor = _ancestor(rjob)
        count = int_or(get_path(rjob, ("template", "spec", "parallelism")), 1)
        trainer_step = ancestor == TRAINER_ANCESTOR and ml is not None
        if trainer_step:
            count = int_or(as_map(ml).get("numNodes"), 1)
        if isinstance(per_node, Mapping) and (trainer_step or (launcher_as_node and rjob.get("name") == NODE)):
            container = _node_container(rjob)
            if container is not None:
                _merge_resources(container, per_node)
        if ancestor in ANCESTORS_WITH_ONE_REPLICA:
            rjob["replicas"] = 1
        counts.append(count)
    num_nodes = trainer.get("numNodes")
    if isinstance(num_nodes, int) and not isinstance(num_nodes, bool):
        if mpi is not None:
            target = next((i for i, r in enumerate(rjobs) if r.get("name") == NODE), None)
            value = max(num_nodes - 1, 1) if launcher_as_node else num_nodes
        else:
            target = next((i for i, r in enumerate(rjobs) if _ancestor(r) == TRAINER_ANCESTOR), None)
            value = num_nodes
        if target is not None:
            counts[target] = value
    for rjob, count in zip(rjobs, counts, strict=True):
        job_spec = get_path(rjob, ("template", "spec"))
        if isinstance(job_spec, dict):  # otherwise validation reports the missing Job spec
            job_spec["parallelism"] = job_spec["completions"] = count
    return rjobs


def _with_trainer_overrides(rjobs: list[dict[str, Any]], job: Mapping[str, Any]) -> list[dict[str, Any]]:
    """``trainer.image`` / ``command`` / ``args`` / ``env`` on the trainer's ``node`` container: what the
    dispatcher checks (an image must exist somewhere); the agent renders the same in its build."""
    trainer = as_map(get_path(job, ("spec", "trainer")))
    node_index = _node_index(rjobs)
    trainer_indexes = _trainer_indexes(rjobs, node_index)
    for index, rjob in enumerate(rjobs):
        container = _node_container(rjob)
        if container is None:
            continue
        is_trainer = index in trainer_indexes
        if (is_trainer or index == node_index) and isinstance(trainer.get("image"), str):
            container["image"] = trainer["image"]
        if is_trainer:
            for key in ("command", "args"):
                if isinstance(trainer.get(key), list):
                    container[key] = list(trainer[key])
            if isinstance(trainer.get("env"), list):
                _upsert_env(container, trainer["env"])
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
        rjobs = _with_trainer_overrides(effective_replicated_jobs(job, runtime), job)
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
        for index, rjob in enumerate(_with_trainer_overrides(effective_replicated_jobs(job, runtime), job)):
            job_spec = as_map(get_path(rjob, ("template", "spec")))
            # its JobSet's count, as Kueue counts a TrainJob (completions = parallelism here)
            count = replicated_job_pods(rjob)
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
    max_conditions=8,  # TrainJobStatus.conditions: +kubebuilder:validation:MaxItems=8
    defaulted_by_crd=True,  # +kubebuilder:default="trainer.kubeflow.org/trainjob-controller"
    reads=tuple((GROUP, plural) for plural in RUNTIME_PLURALS.values()),
)
