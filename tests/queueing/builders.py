"""Kueue objects and cluster views for the pure queueing tests, written as users write the YAML."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from dispatcher.placement import ClusterView, Need, NodeView, PodSetDemand
from dispatcher.queueing.catalog import Catalog
from dispatcher.queueing.scheduler import Entry
from federation.podset import parse_quantity

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
V = "kueue.x-k8s.io/v1beta2"


def flavor(name: str, labels: dict[str, str] | None = None, taints: list[dict[str, str]] | None = None,
           tolerations: list[dict[str, str]] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {}
    if labels:
        spec["nodeLabels"] = labels
    if taints:
        spec["nodeTaints"] = taints
    if tolerations:
        spec["tolerations"] = tolerations
    return {"apiVersion": V, "kind": "ResourceFlavor", "metadata": {"name": name}, "spec": spec}


def cq(name: str, *, flavors: dict[str, dict[str, Any]] | None = None, cohort: str | None = None,
       strategy: str | None = None, selector: dict[str, Any] | None = None, version: str = V,
       **spec_extra: Any) -> dict[str, Any]:
    """``flavors``: flavor -> resource -> nominal quota, or (nominal, borrowingLimit, lendingLimit)."""
    flavors = flavors if flavors is not None else {"default": {"cpu": "10"}}
    covered = sorted({r for quotas in flavors.values() for r in quotas})
    fl = []
    for fname, quotas in flavors.items():
        res = []
        for r in covered:
            q = quotas.get(r, "0")
            item: dict[str, Any] = {"name": r}
            if isinstance(q, tuple):
                item["nominalQuota"] = q[0]
                if q[1] is not None:
                    item["borrowingLimit"] = q[1]
                if len(q) > 2 and q[2] is not None:
                    item["lendingLimit"] = q[2]
            else:
                item["nominalQuota"] = q
            res.append(item)
        fl.append({"name": fname, "resources": res})
    spec: dict[str, Any] = {"resourceGroups": [{"coveredResources": covered, "flavors": fl}],
                            "namespaceSelector": selector if selector is not None else {}}
    if cohort:
        spec["cohortName" if version == V else "cohort"] = cohort
    if strategy:
        spec["queueingStrategy"] = strategy
    spec.update(spec_extra)
    return {"apiVersion": version, "kind": "ClusterQueue", "metadata": {"name": name}, "spec": spec}


def lq(namespace: str, name: str, cluster_queue: str) -> dict[str, Any]:
    return {"apiVersion": V, "kind": "LocalQueue", "metadata": {"namespace": namespace, "name": name},
            "spec": {"clusterQueue": cluster_queue}}


def catalog(*objs: dict[str, Any], namespaces: dict[str, dict[str, str]] | None = None) -> Catalog:
    c = Catalog()
    for o in objs:
        c.apply(o["kind"], o)
    for ns, labels in (namespaces or {"default": {}}).items():
        c.apply("Namespace", {"metadata": {"name": ns, "labels": labels}})
    return c


def need(cpu: str | int = 1, count: int = 1, *, podset: str = "worker", selector: dict[str, str] | None = None,
         tolerations: tuple[tuple[str, str, str, str], ...] = (), extra: dict[str, str] | None = None) -> Need:
    per_pod = {"cpu": parse_quantity(str(cpu), "cpu")} | {k: parse_quantity(v, k) for k, v in (extra or {}).items()}
    ps = PodSetDemand(podset, count, per_pod, tuple(sorted((selector or {}).items())), tolerations)
    return Need("PyTorchJob", {k: v * count for k, v in per_pod.items()}, ((podset, per_pod),), (ps,))


_seq = [0]


def entry(name: str, n: Need | None = None, *, queue: str = "q", namespace: str = "default", priority: int = 0,
          at: float = 0.0) -> Entry:
    _seq[0] += 1
    return Entry(uid=f"uid-{name}", namespace=namespace, name=name, queue=queue, priority=priority,
                 queued_at=NOW.timestamp() + at, seq=_seq[0], need=n or need())


def node(name: str, cpu: int | str, labels: dict[str, str] | None = None,
         taints: tuple[tuple[str, str, str], ...] = ()) -> NodeView:
    return NodeView(name, labels or {}, taints, {"cpu": Decimal(str(cpu)), "pods": Decimal(110)})


def cluster(name: str, *nodes: NodeView, labels: dict[str, str] | None = None,
            allocatable: dict[str, Decimal] | None = None) -> ClusterView:
    free: dict[str, Decimal] = {}
    for n in nodes:
        for k, v in n.free.items():
            free[k] = free.get(k, Decimal(0)) + v
    largest = {k: max(n.free.get(k, Decimal(0)) for n in nodes) for k in free}
    return ClusterView(name, True, NOW, allocatable or dict(free), free, largest, None, labels or {}, list(nodes))
