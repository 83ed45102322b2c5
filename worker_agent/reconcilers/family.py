"""The other Kubeflow v1 members (TFJob, XGBoostJob, PaddleJob, JAXJob): a few lines each on the shared base.

Each member's kind facts (names, spec field, main container, replica types, operator name, port and restart
defaults) come from its ``federation.kinds`` JobKind; labels, selectors, per-index headless Services, restart handling and conditions
from ``kubeflow.KubeflowV1Reconciler``. The env rules here are the well-known core of each upstream
controller (TF_CONFIG; MASTER_*/WORKER_*; PADDLE_*; JAX coordinator), not every knob: see the module's
members for what each sets.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from federation.kinds.jax import JAXJOB
from federation.kinds.paddle import PADDLEJOB
from federation.kinds.tfjob import TFJOB
from federation.kinds.xgboost import XGBOOSTJOB
from worker_agent.reconcilers.kubeflow import KubeflowV1Reconciler, ReplicaSpec


def _env(name: str, value: object) -> dict[str, Any]:
    return {"name": name, "value": str(value)}


def _name(job: Mapping[str, Any]) -> str:
    return str((job.get("metadata") or {}).get("name", ""))


def _namespace(job: Mapping[str, Any]) -> str:
    return str((job.get("metadata") or {}).get("namespace", ""))


class TFJobReconciler(KubeflowV1Reconciler):
    job_kind = TFJOB

    def leader(self, specs: Mapping[str, ReplicaSpec]) -> str | None:
        return "Chief" if "Chief" in specs else "Master" if "Master" in specs else None

    def is_master_role(self, specs: Mapping[str, ReplicaSpec], rtype: str, index: int) -> bool:
        leader = self.leader(specs)
        return rtype == leader if leader else rtype == "Worker" and index == 0

    def pod_env(self, job: Mapping[str, Any], specs: Mapping[str, ReplicaSpec], rtype: str,
                index: int) -> list[dict[str, Any]]:
        if sum(s.replicas for s in specs.values()) <= 1:
            return []  # local training: upstream sets no TF_CONFIG
        cluster: dict[str, list[str]] = {}
        for rt, spec in specs.items():
            if rt == "Evaluator":
                continue
            port = self.port_of(spec)
            cluster[rt.lower()] = [f"{_name(job)}-{rt.lower()}-{i}.{_namespace(job)}.svc:{port}"
                                   for i in range(spec.replicas)]
        config = {"cluster": dict(sorted(cluster.items())), "task": {"type": rtype.lower(), "index": index},
                  "environment": "cloud"}
        return [_env("TF_CONFIG", json.dumps(config, separators=(",", ":")))]


class XGBoostJobReconciler(KubeflowV1Reconciler):
    job_kind = XGBOOSTJOB

    def pod_env(self, job: Mapping[str, Any], specs: Mapping[str, ReplicaSpec], rtype: str,
                index: int) -> list[dict[str, Any]]:
        master = specs.get("Master")
        if master is None:
            return []
        port = self.port_of(master)
        rank = index + 1 if rtype == "Worker" else index
        env = [_env("MASTER_PORT", port), _env("MASTER_ADDR", f"{_name(job)}-master-0"),
               _env("WORLD_SIZE", sum(s.replicas for s in specs.values())), _env("RANK", rank),
               _env("PYTHONUNBUFFERED", "0")]
        worker = specs.get("Worker")
        if worker is not None:
            env.append(_env("WORKER_PORT", self.port_of(worker)))
            env.append(_env("WORKER_ADDRS", ",".join(f"{_name(job)}-worker-{i}" for i in range(worker.replicas))))
        return env


class PaddleJobReconciler(KubeflowV1Reconciler):
    job_kind = PADDLEJOB

    def pod_env(self, job: Mapping[str, Any], specs: Mapping[str, ReplicaSpec], rtype: str,
                index: int) -> list[dict[str, Any]]:
        total = sum(s.replicas for s in specs.values())
        env = [_env("PYTHONUNBUFFERED", "1")]
        master = specs.get("Master")
        if master is not None:
            env.append(_env("PADDLE_MASTER", f"{_name(job)}-master-0:{self.port_of(master)}"))
        env += [_env("PADDLE_NNODES", total), _env("PADDLE_JOB_ID", _name(job))]
        return env


class JAXJobReconciler(KubeflowV1Reconciler):
    job_kind = JAXJOB

    def pod_env(self, job: Mapping[str, Any], specs: Mapping[str, ReplicaSpec], rtype: str,
                index: int) -> list[dict[str, Any]]:
        worker = specs.get("Worker")
        if worker is None:
            return []
        return [_env("PYTHONUNBUFFERED", "1"), _env("COORDINATOR_PORT", self.port_of(worker)),
                _env("COORDINATOR_ADDRESS", f"{_name(job)}-worker-0"),
                _env("NUM_PROCESSES", worker.replicas), _env("PROCESS_ID", index)]
