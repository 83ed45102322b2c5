"""Traces and configurations for the what-if tests, written as users write them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import yaml

from dispatcher.whatif import config, trace
from federation.kube import NAMESPACES, Kube, Resource

CPU_QUEUES = "demo/queues/queues.yaml"
QUEUE_TEXT = Path(CPU_QUEUES).read_text()


async def install_queues(kube: Kube) -> None:
    """Kueue's CRDs and the demo's queue objects in a kubesim manager cluster, as ``make demo`` installs them."""
    from tests.dispatcher.test_queueing import install_kueue

    await install_kueue(kube)
    for ns in ("team-a", "team-b"):
        await kube.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    for obj in yaml.safe_load_all(QUEUE_TEXT):
        plural = obj["kind"].lower() + ("es" if obj["kind"].endswith("s") else "s")
        group, _, version = obj["apiVersion"].partition("/")
        await kube.create(Resource(group, version, plural, obj["kind"], obj["kind"] == "LocalQueue"), obj,
                          obj["metadata"].get("namespace"))


def job(name: str, ns: str, arrival: float, run: float, *pods: tuple[str, int, str], queue: str | None = None,
        priority_class: str = "", **extra: Any) -> str:
    """One trace line; ``pods``: (PodSet, count, cpu per pod)."""
    line: dict[str, Any] = {"name": name, "namespace": ns, "queue": queue or ns, "arrival": arrival,
                            "runSeconds": run, "kind": "PyTorchJob",
                            "podSets": [{"name": p, "count": c, "requests": {"cpu": cpu}} for p, c, cpu in pods]}
    if priority_class:
        line["priorityClass"] = priority_class
    line.update(extra)
    return orjson.dumps(line).decode()


def cluster(name: str, nodes: int, cpu: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "whatif.mkd.dev/v1", "kind": "WorkerCluster", "metadata": {"name": name},
            "spec": {"nodes": [{"name": f"{name}-n", "count": nodes, "allocatable": {"cpu": cpu, "memory": "64Gi"}}],
                     **spec}}


def demo_config(*clusters: dict[str, Any], extra: list[dict[str, Any]] | None = None) -> config.Config:
    base = config.load([CPU_QUEUES])
    return config.load_documents([("test", i + 1, c) for i, c in enumerate([*clusters, *(extra or [])])], base)


def jobs(*lines: str) -> list[trace.TraceJob]:
    return trace.parse(lines)
