"""PyTorchJob (kubeflow.org/v1): env vars, master port, init container and elastic rules of KUBEFLOW.md A.4.

Everything else (Pods and Services per index, conditions, restarts, suspend, deadlines, TTL)
comes from the shared Kubeflow v1 base. Env vars are appended to every container in this
order: PYTHONUNBUFFERED; MASTER_PORT, PET_MASTER_PORT, MASTER_ADDR, PET_MASTER_ADDR,
WORLD_SIZE, RANK, PET_NODE_RANK (only with a Master); PET_NPROC_PER_NODE (when
``nprocPerNode`` is set, which defaulting makes ``auto``); then the elastic set or PET_NNODES.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from federation.errors import Invalid
from federation.kinds.pytorch import PYTORCHJOB
from worker_agent.reconcilers.kubeflow import KubeflowV1Reconciler, ReplicaSpec

INIT_IMAGE = "alpine:3.10"
INIT_MAX_TRIES = 100


_ATOI = re.compile(r"[+-]?[0-9]+")


def _atoi(value: str | None) -> int:
    """getNprocPerNodeInt: Go's strconv.Atoi of nprocPerNode (ASCII digits, optional sign), else 1."""
    if value is None or not _ATOI.fullmatch(value):
        return 1
    return int(value)


def _env(name: str, value: object) -> dict[str, Any]:
    return {"name": name, "value": str(value)}


class PyTorchJobReconciler(KubeflowV1Reconciler):
    job_kind = PYTORCHJOB

    def __init__(self, *, init_image: str = INIT_IMAGE, init_max_tries: int = INIT_MAX_TRIES) -> None:
        self.init_image = init_image
        self.init_max_tries = init_max_tries

    @staticmethod
    def _spec(job: Mapping[str, Any]) -> Mapping[str, Any]:
        spec = job.get("spec")
        return spec if isinstance(spec, Mapping) else {}

    def nproc_per_node(self, job: Mapping[str, Any]) -> str | None:
        """spec.nprocPerNode after defaulting: ``auto`` unless the deprecated elastic field is set."""
        spec = self._spec(job)
        value = spec.get("nprocPerNode")
        if value is None and (spec.get("elasticPolicy") or {}).get("nProcPerNode") is None:
            return "auto"
        return None if value is None else str(value)

    def _port(self, specs: Mapping[str, ReplicaSpec], rtype: str) -> int:
        """getPortFromPyTorchJob: the ``pytorchjob-port`` of the replica's ``pytorch`` container."""
        port = self.port_of(specs.get(rtype))
        if port is None:
            raise Invalid(f"spec.{self.specs_field}.{rtype}", "port not found",
                          fix=f"name a container {self.container!r} (it gets the {self.port_name} port)")
        return port

    def any_worker_success(self, job: Mapping[str, Any]) -> bool:
        return self._spec(job).get("elasticPolicy") is not None

    def pod_env(self, job: Mapping[str, Any], specs: Mapping[str, ReplicaSpec], rtype: str,
                index: int) -> list[dict[str, Any]]:
        name = str(job.get("metadata", {}).get("name", ""))
        spec = self._spec(job)
        env = [_env("PYTHONUNBUFFERED", "1")]
        total = sum(s.replicas for s in specs.values())
        nproc = self.nproc_per_node(job)
        if "Master" in specs:
            port = self._port(specs, "Master")
            env += [_env("MASTER_PORT", port), _env("PET_MASTER_PORT", port),
                    _env("MASTER_ADDR", f"{name}-master-0"), _env("PET_MASTER_ADDR", f"{name}-master-0")]
            nproc_int = _atoi(nproc)
            rank = index + 1 if rtype == "Worker" else index
            env += [_env("WORLD_SIZE", total * nproc_int), _env("RANK", rank), _env("PET_NODE_RANK", rank)]
        if nproc is not None:
            env.append(_env("PET_NPROC_PER_NODE", nproc))
        elastic = spec.get("elasticPolicy")
        if elastic is not None:
            env += self.elastic_env(name, specs, elastic)
        else:
            env.append(_env("PET_NNODES", total))
        return env

    def elastic_env(self, name: str, specs: Mapping[str, ReplicaSpec],
                    elastic: Mapping[str, Any]) -> list[dict[str, Any]]:
        worker = specs.get("Worker")
        # pointer semantics upstream: only an absent field falls back (an empty host stays empty)
        host = elastic.get("rdzvHost")
        host = f"{name}-worker-0" if host is None else host
        port = elastic.get("rdzvPort")
        port = self._port(specs, "Worker") if port is None else port
        env = [_env("PET_RDZV_ENDPOINT", f"{host}:{port}"),
               _env("PET_RDZV_BACKEND", elastic.get("rdzvBackend") or "c10d")]
        low, high = elastic.get("minReplicas"), elastic.get("maxReplicas")
        # in-memory defaulting: one bound copies the other; neither means Worker.replicas for both
        replicas = worker.replicas if worker else 0
        low = high if low is None else low
        high = low if high is None else high
        if low is None:
            low = high = replicas
        env.append(_env("PET_NNODES", f"{low}:{high}"))
        if elastic.get("maxRestarts") is not None:
            env.append(_env("PET_MAX_RESTARTS", elastic["maxRestarts"]))
        if elastic.get("nProcPerNode") is not None:
            env.append(_env("PET_NPROC_PER_NODE", elastic["nProcPerNode"]))
        if elastic.get("rdzvId") is not None:
            env.append(_env("PET_RDZV_ID", elastic["rdzvId"]))
        if elastic.get("rdzvConf"):
            conf = ",".join(f"{kv.get('key')}={kv.get('value')}" for kv in elastic["rdzvConf"])
            env.append(_env("PET_RDZV_CONF", conf))
        if elastic.get("standalone"):
            env.append(_env("PET_STANDALONE", ""))
        return env

    def init_containers(self, job: Mapping[str, Any], specs: Mapping[str, ReplicaSpec], rtype: str,
                        index: int) -> list[dict[str, Any]]:
        if "Master" not in specs or rtype != "Worker":
            return []
        master = f"{job.get('metadata', {}).get('name', '')}-master-0"
        script = (f"err=1;for i in $(seq {self.init_max_tries}); do if nslookup {master}; then err=0 && break; "
                  f"fi;echo waiting for master; sleep 2; done; exit $err")
        return [{"name": "init-pytorch", "image": self.init_image, "imagePullPolicy": "IfNotPresent",
                 "resources": {"limits": {"cpu": "100m", "memory": "20Mi"},
                               "requests": {"cpu": "50m", "memory": "10Mi"}},
                 "command": ["sh", "-c", script]}]
