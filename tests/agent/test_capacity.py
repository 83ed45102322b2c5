"""The capacity a heartbeat announces, from the node and pod caches: totals, per-node free, terminal pods left out."""

from __future__ import annotations

from typing import Any

from worker_agent.cache import ObjectCache
from worker_agent.reports import CapacityMeter


def node(name: str, cpu: str, memory: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "resourceVersion": "1", "labels": {"zone": name}},
            "status": {"allocatable": {"cpu": cpu, "memory": memory},
                       "conditions": [{"type": "Ready", "status": "True"}]}}


def pod(i: int, node_name: str | None, phase: str, cpu: str = "500m") -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "c", "resources": {"requests": {"cpu": cpu, "memory": "1Gi"}}}]}
    if node_name:
        spec["nodeName"] = node_name
    return {"metadata": {"name": f"p{i}", "namespace": "ns", "resourceVersion": str(10 + i), "uid": f"u{i}"},
            "spec": spec, "status": {"phase": phase}}


def test_many_pods_of_few_shapes_are_summed_per_node() -> None:
    nodes, pods = ObjectCache("nodes"), ObjectCache("pods")
    nodes.upsert(node("a", "16", "64Gi"))
    nodes.upsert(node("b", "8", "32Gi"))
    i = 0
    for where, phase, n in (("a", "Running", 10), ("b", "Running", 3), (None, "Pending", 4), ("a", "Succeeded", 5),
                            ("b", "Failed", 2)):
        for _ in range(n):
            pods.upsert(pod(i, where, phase))
            i += 1
    pods.upsert(pod(i, "b", "Running", cpu="2"))  # another shape on b
    cap = CapacityMeter(nodes, pods).measure()
    assert cap.allocatable == {"cpu": "24", "memory": "96Gi"}
    # 17 pods of 500m / 1Gi count (terminal ones do not), plus one of 2 CPUs / 1Gi
    assert cap.free == {"cpu": "13500m", "memory": "78Gi"}
    assert cap.largest_node_free == {"cpu": "11", "memory": "54Gi"}  # a: 16 - 10 x 500m; 64Gi - 10Gi
    assert {n.name: n.free for n in cap.nodes} == {"a": {"cpu": "11", "memory": "54Gi"},
                                                   "b": {"cpu": "4500m", "memory": "28Gi"}}


def test_a_heartbeat_of_many_labelled_nodes_stays_under_the_message_limit() -> None:
    """2,000 nodes with a real cloud's labels took the heartbeat above 1 MiB (refused on encode): the nodes'
    allocatable figures go first, then the node list, never the heartbeat."""
    from federation.messages import MAX_PAYLOAD_BYTES, Capacity, NodeFree, NodeTaint, encode
    from worker_agent.reports import heartbeat

    labels = {"kubernetes.io/hostname": "node-xxxxx-0001", "kubernetes.io/arch": "amd64", "kubernetes.io/os": "linux",
              "node.kubernetes.io/instance-type": "p4d.24xlarge", "topology.kubernetes.io/zone": "us-east-1a",
              "topology.kubernetes.io/region": "us-east-1", "nvidia.com/gpu.present": "true",
              "nvidia.com/gpu.product": "A100-SXM4-40GB"}
    res = {"cpu": "96", "memory": "1152Gi", "pods": "110", "ephemeral-storage": "7600Gi", "nvidia.com/gpu": "8"}

    def beat(count: int) -> Any:
        nodes = [NodeFree(name=f"node-{i:05d}", labels=labels, taints=[NodeTaint(key="nvidia.com/gpu", value="true")],
                          free=res, allocatable=res) for i in range(count)]
        return heartbeat("c", Capacity(allocatable=res, free=res, largest_node_free=res, nodes=nodes), version="1",
                         interval=10, cluster_labels={}, reconciled=[], delegated={}, running=0)

    small = beat(100)
    assert small.capacity.nodes[0].allocatable == res  # far below the limit: everything
    big = beat(2000)
    assert len(encode(big)) <= MAX_PAYLOAD_BYTES
    assert big.capacity.largest_node_free == res and big.capacity.allocatable == res
