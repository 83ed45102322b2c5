"""PyTorchJob (kubeflow.org/v1): the Kubeflow v1 base plus the PyTorch webhook's own rules.

Replica types Master (``replicas: 1`` written out: the webhook sees the raw object) and Worker
(at least 1); every replica has a container named
``pytorch``; ``elasticPolicy`` needs a Worker spec; ``spec.nprocPerNode`` is ``auto``, ``cpu``,
``gpu`` or an integer and may not be combined with the deprecated ``elasticPolicy.nProcPerNode``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from federation import labels
from federation.errors import Invalid
from federation.kinds.base import get_path
from federation.kinds.kubeflow import GROUP, RUN_POLICY, KubeflowV1Kind

CONTAINER = "pytorch"
DEFAULT_PORT_NAME = "pytorchjob-port"
DEFAULT_PORT = 23456
NPROC_WORDS = ("auto", "cpu", "gpu")
RDZV_BACKENDS = ("c10d", "etcd", "etcd-v2")


@dataclass(frozen=True)
class PyTorchJobKind(KubeflowV1Kind):
    """PyTorchJob: see the module docstring."""

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
    min_replicas=1,
    single_replicas_explicit=True,
)
