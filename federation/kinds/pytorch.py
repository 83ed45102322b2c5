"""PyTorchJob (kubeflow.org/v1): the Kubeflow v1 base plus the PyTorch webhook's own rules.

Replica types Master (``replicas: 1`` written out: the webhook sees the raw object) and Worker
(at least 1); every replica has a container named
``pytorch``; ``elasticPolicy`` needs a Worker spec; ``spec.nprocPerNode`` is ``auto``, ``cpu``,
``gpu`` or an integer and may not be combined with the deprecated ``elasticPolicy.nProcPerNode``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from federation import labels
from federation.errors import Invalid
from federation.jsoncopy import json_copy
from federation.kinds.base import as_map, get_path
from federation.kinds.kubeflow import GROUP, RUN_POLICY, KubeflowV1Kind
from federation.podset import PodSet, pod_requests

CONTAINER = "pytorch"
DEFAULT_PORT_NAME = "pytorchjob-port"
DEFAULT_PORT = 23456
NPROC_WORDS = ("auto", "cpu", "gpu")
RDZV_BACKENDS = ("c10d", "etcd", "etcd-v2")
INIT_CONTAINER: dict[str, Any] = {
    "name": "init-pytorch",
    "resources": {"limits": {"cpu": "100m", "memory": "20Mi"}, "requests": {"cpu": "50m", "memory": "10Mi"}},
}
"""What counts of the init container the agent adds to Worker pods when a Master exists (KUBEFLOW.md A.4)."""


@dataclass(frozen=True)
class PyTorchJobKind(KubeflowV1Kind):
    """PyTorchJob: see the module docstring."""

    def podsets(self, job: Mapping[str, Any], runtime: Mapping[str, Any] | None = None) -> list[PodSet]:
        """The base PodSets, with the Worker's per-pod requests counting ``init-pytorch`` when a Master
        exists: the worker agent (like the training-operator) appends that init container to every
        Worker pod, and the scheduler charges max(any init container, sum of containers)."""
        out = super().podsets(job, runtime)
        if "Master" not in self.replica_specs(job):
            return out
        fixed = []
        for podset in out:
            if podset.name == "worker":
                spec = dict(json_copy(as_map(podset.template.get("spec"))))
                spec["initContainers"] = [*(spec.get("initContainers") or []), INIT_CONTAINER]
                path = f"spec.{self.replica_specs_field}.Worker.template.spec"
                podset = replace(podset, requests=pod_requests(spec, path))
            fixed.append(podset)
        return fixed

    def validate(self, job: Mapping[str, Any], runtime: Mapping[str, Any] | None = None) -> list[Invalid]:
        errors = super().validate(job, runtime)
        elastic = get_path(job, ("spec", "elasticPolicy"))
        specs = get_path(job, self.specs_path)
        if elastic is not None:
            if not isinstance(specs, Mapping) or "Worker" not in specs:
                errors.append(
                    Invalid(
                        "spec.pytorchReplicaSpecs.Worker",
                        "must be configured if elastic policy is used",
                        fix="add a Worker replica spec or drop spec.elasticPolicy",
                    )
                )
            if isinstance(elastic, Mapping):
                backend = elastic.get("rdzvBackend")
                if backend is not None and backend not in RDZV_BACKENDS:
                    errors.append(
                        Invalid(
                            "spec.elasticPolicy.rdzvBackend",
                            f"unsupported value {backend!r}",
                            fix=f"use one of {', '.join(RDZV_BACKENDS)}",
                        )
                    )
                if (
                    elastic.get("nProcPerNode") is not None
                    and get_path(job, ("spec", "nprocPerNode")) is not None
                ):
                    errors.append(
                        Invalid(
                            "spec.elasticPolicy.nProcPerNode",
                            "must not be used with spec.nprocPerNode",
                            fix="keep only spec.nprocPerNode (elasticPolicy.nProcPerNode is deprecated)",
                        )
                    )
        nproc = get_path(job, ("spec", "nprocPerNode"))
        if nproc is not None and not (
            isinstance(nproc, str) and (nproc in NPROC_WORDS or re.fullmatch(r"[0-9]+", nproc))
        ):
            errors.append(
                Invalid(
                    "spec.nprocPerNode",
                    f"{nproc!r} is not auto, cpu, gpu or an integer string",
                    fix='write e.g. nprocPerNode: "2" or "auto"',
                )
            )
        return errors


PYTORCHJOB = PyTorchJobKind(
    name="PyTorchJob",
    group=GROUP,
    version="v1",
    plural="pytorchjobs",
    controller=labels.TRAINING_OPERATOR,
    managed_by_path=(*RUN_POLICY, "managedBy"),
    suspend_path=(*RUN_POLICY, "suspend"),
    replica_specs_field="pytorchReplicaSpecs",
    replica_types=("Master", "Worker"),
    container_name=CONTAINER,
    operator_name="pytorchjob-controller",
    port_name="pytorchjob-port",
    default_port=23456,
    default_restart_policy="OnFailure",
    min_replicas=1,
    single_replicas_explicit=True,
)
