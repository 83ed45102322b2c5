"""Traces and configurations for the what-if tests, written as users write them."""

from __future__ import annotations

from typing import Any

import orjson

from dispatcher.whatif import config, trace

CPU_QUEUES = "demo/queues/queues.yaml"


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
