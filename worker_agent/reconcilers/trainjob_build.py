"""TrainJob -> JobSet: the trainer runtime framework's build, as pure functions (KUBEFLOW.md D.3).

From the TrainJob and its (Cluster)TrainingRuntime: one PodSet per replicatedJob, with its count,
replicas and ``resourcesPerNode`` from ``federation.kinds.trainjob.effective_replicated_jobs`` (the
one computation the dispatcher places by as well), then the ML policy: torch (PET_* env, port 29500), mpi (ssh Secret and
hostfile ConfigMap volumes, launcher env, the hostfile text) or plain (count and env only); then
PreBuildSync (endpoints, parallelism = completions = count) and Build (initializer and trainer
overrides, replicas 1, suspend mirrored). The result is the JobSet's labels, annotations and spec.
Not reproduced: torchtune command rewriting, runtime patches, jax/xgboost/flux, pod-group policies.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from federation.errors import Invalid
from federation.kinds.trainjob import effective_replicated_jobs
from federation.podset import parse_quantity

GROUP = "trainer.kubeflow.org"
ANCESTOR_LABEL = f"{GROUP}/trainjob-ancestor-step"
TRAINER, NODE, LAUNCHER = "trainer", "node", "launcher"
DATASET_INITIALIZER, MODEL_INITIALIZER = "dataset-initializer", "model-initializer"
TRAINER_PORT = 29500
COMPLETION_INDEX_PATH = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
MPI_SSH_SUFFIX, MPI_SSH_VOLUME = "-mpi-ssh-auth", "mpi-ssh-auth"
MPI_HOSTFILE_SUFFIX, MPI_HOSTFILE_VOLUME, MPI_HOSTFILE_DIR = "-mpi-hostfile", "mpi-hostfile", "/etc/mpi"


@dataclass
class Built:
    """What the framework produces for one TrainJob."""

    labels: dict[str, str]
    annotations: dict[str, str]
    spec: dict[str, Any]                     # the JobSet spec
    hostfile: str | None = None              # mpi only: ConfigMap {tj}-mpi-hostfile data
    endpoints: dict[str, list[str]] = field(default_factory=dict)


def _upsert(items: list[dict[str, Any]], new: dict[str, Any], key: str = "name") -> None:
    for i, item in enumerate(items):
        if item.get(key) == new.get(key):
            items[i] = new
            return
    items.append(new)


def _containers(rjob: dict[str, Any]) -> list[dict[str, Any]]:
    pod_spec = rjob.setdefault("template", {}).setdefault("spec", {}).setdefault("template", {}) \
        .setdefault("spec", {})
    containers: list[dict[str, Any]] = pod_spec.setdefault("containers", [])
    return containers


def _pod_spec(rjob: dict[str, Any]) -> dict[str, Any]:
    _containers(rjob)
    spec: dict[str, Any] = rjob["template"]["spec"]["template"]["spec"]
    return spec


def _ancestor(rjob: Mapping[str, Any]) -> str:
    return str((((rjob.get("template") or {}).get("metadata") or {}).get("labels") or {}).get(ANCESTOR_LABEL, ""))


def _node_container(rjob: dict[str, Any]) -> dict[str, Any] | None:
    return next((c for c in _containers(rjob) if c.get("name") == NODE), None)


def _gpus(resources: Mapping[str, Any]) -> int:
    def count(values: Mapping[str, Any] | None) -> int:
        for name, qty in (values or {}).items():
            if "gpu" in name.lower():
                return math.ceil(parse_quantity(qty, f"resources.{name}"))
        return 0
    requested = count(resources.get("requests"))
    return requested or count(resources.get("limits"))


def _cpus(resources: Mapping[str, Any]) -> int:
    for key in ("requests", "limits"):
        qty = (resources.get(key) or {}).get("cpu")
        if qty is not None and parse_quantity(qty, f"resources.{key}.cpu") != 0:
            return math.ceil(parse_quantity(qty, f"resources.{key}.cpu"))
    return 0


def build(trainjob: Mapping[str, Any], runtime: Mapping[str, Any]) -> Built:
    """The JobSet the runtime framework would apply for ``trainjob``; raises Invalid on a bad runtime."""
    tj_name = str(trainjob["metadata"]["name"])
    trainer: dict[str, Any] | None = (trainjob.get("spec") or {}).get("trainer")
    rt_spec = runtime.get("spec") or {}
    ml = rt_spec.get("mlPolicy")
    template = copy.deepcopy(rt_spec.get("template") or {})
    spec: dict[str, Any] = template.get("spec") or {}
    rjobs: list[dict[str, Any]] = spec.setdefault("replicatedJobs", [])
    if not rjobs:
        raise Invalid("runtime.spec.template.spec.replicatedJobs", "the runtime defines no replicatedJobs")
    mpi = (ml or {}).get("mpi")
    torch = (ml or {}).get("torch")
    launcher_as_node = bool(mpi and mpi.get("runLauncherAsNode"))

    # PodSets (counts, replicas, resourcesPerNode): the ONE computation the dispatcher places by too
    spec["replicatedJobs"] = rjobs = effective_replicated_jobs(trainjob, runtime)
    counts = {str(r["name"]): int(((r.get("template") or {}).get("spec") or {}).get("parallelism", 1))
              for r in rjobs}
    trainer_rjob = next((r for r in rjobs if _ancestor(r) == TRAINER), None)

    def resources_per_node() -> dict[str, Any]:
        if trainer and trainer.get("resourcesPerNode") is not None:
            return dict(trainer["resourcesPerNode"])
        node = _node_container(trainer_rjob) if trainer_rjob is not None else None
        return dict((node or {}).get("resources") or {})

    hostfile: str | None = None
    slots = 1
    if torch is not None:
        nproc: str = "auto"
        if trainer and trainer.get("numProcPerNode") is not None:
            nproc = str(trainer["numProcPerNode"])
        res = resources_per_node()
        if nproc == "auto" and _gpus(res) == 0:
            nproc = str(max(1, _cpus(res)))
        node = _node_container(trainer_rjob) if (trainer_rjob is not None and trainer) else None
        if node is not None and trainer is not None:
            env: list[dict[str, Any]] = node.setdefault("env", [])
            for item in trainer.get("env") or []:
                _upsert(env, copy.deepcopy(item))
            nnodes = counts[trainer_rjob["name"]] if trainer_rjob is not None else 1
            for item in ({"name": "PET_NNODES", "value": str(nnodes)},
                         {"name": "PET_NPROC_PER_NODE", "value": nproc},
                         {"name": "PET_NODE_RANK",
                          "valueFrom": {"fieldRef": {"fieldPath": COMPLETION_INDEX_PATH}}},
                         {"name": "PET_MASTER_ADDR", "value": f"{tj_name}-{NODE}-0-0.{tj_name}"},
                         {"name": "PET_MASTER_PORT", "value": str(TRAINER_PORT)}):
                _upsert(env, item)
            _upsert(node.setdefault("ports", []), {"containerPort": TRAINER_PORT}, key="containerPort")
    elif mpi is not None:
        slots = int(mpi.get("numProcPerNode") or 1)
        if trainer and trainer.get("numProcPerNode") is not None:
            slots = int(trainer["numProcPerNode"])
        elif slots == 1 and _gpus(resources_per_node()) > 1:
            slots = _gpus(resources_per_node())
        mount = str(mpi.get("sshAuthMountPath") or "/root/.ssh")
        for rjob in rjobs:
            if rjob["name"] not in (NODE, LAUNCHER):
                continue
            pod_spec = _pod_spec(rjob)
            volumes: list[dict[str, Any]] = pod_spec.setdefault("volumes", [])
            _upsert(volumes, {"name": MPI_SSH_VOLUME, "secret": {
                "secretName": f"{tj_name}{MPI_SSH_SUFFIX}", "defaultMode": 0o400,
                "items": [{"key": "ssh-privatekey", "path": "id_rsa", "mode": 0o640},
                          {"key": "ssh-publickey", "path": "id_rsa.pub", "mode": 0o644},
                          {"key": "ssh-publickey", "path": "authorized_keys", "mode": 0o644}]}})
            if rjob["name"] == LAUNCHER:
                _upsert(volumes, {"name": MPI_HOSTFILE_VOLUME, "configMap": {
                    "name": f"{tj_name}{MPI_HOSTFILE_SUFFIX}",
                    "items": [{"key": "hostfile", "path": "hostfile", "mode": 0o444}]}})
            for container in _containers(rjob):
                if container.get("name") != NODE:
                    continue
                mounts: list[dict[str, Any]] = container.setdefault("volumeMounts", [])
                _upsert(mounts, {"name": MPI_SSH_VOLUME, "mountPath": mount})
                if rjob["name"] == LAUNCHER:
                    _upsert(mounts, {"name": MPI_HOSTFILE_VOLUME, "mountPath": MPI_HOSTFILE_DIR})
                    env = container.setdefault("env", [])
                    for item in ({"name": "OMPI_MCA_orte_default_hostfile", "value": "/etc/mpi/hostfile"},
                                 {"name": "OMPI_MCA_orte_keep_fqdn_hostnames", "value": "true"},
                                 {"name": "OMPI_MCA_orte_set_default_slots", "value": str(slots)},
                                 {"name": "OMPI_MCA_plm_rsh_args", "value": "-o ConnectionAttempts=10"}):
                        _upsert(env, item)
    else:  # plain ML: the env merge only (the count is in effective_replicated_jobs)
        node = _node_container(trainer_rjob) if (trainer_rjob is not None and trainer) else None
        if node is not None and trainer is not None and trainer.get("env"):
            env = node.setdefault("env", [])
            for item in trainer.get("env") or []:
                _upsert(env, copy.deepcopy(item))

    # PreBuildSync: endpoints and parallelism = completions = count
    sub = str((spec.get("network") or {}).get("subdomain") or tj_name)
    endpoints: dict[str, list[str]] = {}
    for rjob in rjobs:
        replicas = int(rjob.get("replicas") or 1)
        endpoints[rjob["name"]] = [f"{tj_name}-{rjob['name']}-{r}-{p}.{sub}"
                                   for r in range(replicas) for p in range(counts[rjob["name"]])]
        job_spec = rjob.setdefault("template", {}).setdefault("spec", {})
        job_spec["parallelism"] = counts[rjob["name"]]
        job_spec["completions"] = counts[rjob["name"]]
    if mpi is not None:
        hostfile = "".join(f"{e} slots={slots}\n" for rjob in rjobs
                           if rjob["name"] == NODE or (launcher_as_node and rjob["name"] == LAUNCHER)
                           for e in endpoints[rjob["name"]])

    _initializers(rjobs, trainjob)
    _trainer_overrides(rjobs, trainer, launcher_as_node)
    suspend = (trainjob.get("spec") or {}).get("suspend")
    if suspend is not None:
        spec["suspend"] = bool(suspend)
    meta = template.get("metadata") or {}
    return Built(labels=dict(meta.get("labels") or {}), annotations=dict(meta.get("annotations") or {}),
                 spec=spec, hostfile=hostfile, endpoints=endpoints)


def _initializers(rjobs: list[dict[str, Any]], trainjob: Mapping[str, Any]) -> None:
    init = (trainjob.get("spec") or {}).get("initializer") or {}
    for rjob in rjobs:
        ancestor = _ancestor(rjob)
        if ancestor not in (DATASET_INITIALIZER, MODEL_INITIALIZER):
            continue
        rjob["replicas"] = 1
        source = init.get("dataset" if ancestor == DATASET_INITIALIZER else "model")
        if not source:
            continue
        for container in _containers(rjob):
            if container.get("name") != ancestor:
                continue
            env = container.setdefault("env", [])
            if source.get("storageUri"):
                _upsert(env, {"name": "STORAGE_URI", "value": source["storageUri"]})
            for item in source.get("env") or []:
                _upsert(env, copy.deepcopy(item))
            if source.get("secretRef"):
                container.setdefault("envFrom", []).append({"secretRef": {"name": source["secretRef"]["name"]}})


def _trainer_overrides(rjobs: list[dict[str, Any]], trainer: Mapping[str, Any] | None,
                       launcher_as_node: bool) -> None:
    for rjob in rjobs:
        is_trainer = _ancestor(rjob) == TRAINER
        if is_trainer:
            rjob["replicas"] = 1
        for container in _containers(rjob):
            if container.get("name") != NODE or not trainer:
                continue
            if is_trainer:
                for key in ("image", "command", "args"):
                    if trainer.get(key) is not None:
                        container[key] = copy.deepcopy(trainer[key])
            if (is_trainer or (launcher_as_node and rjob["name"] == NODE)) and trainer.get("env"):
                env = container.setdefault("env", [])
                for item in trainer.get("env") or []:
                    _upsert(env, copy.deepcopy(item))
