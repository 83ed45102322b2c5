"""The simulated scheduler seen through the official client: fitting, unschedulable messages, retries.

Each test starts its own small cluster (``kubesim.serve``) so node capacity is not shared between tests.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import pytest
from kubernetes import client, config

import kubesim
from kubesim import ClusterSpec, KubeletSpec, NodeSpec
from kubesim.testing import eventually as wait_for

pytestmark = pytest.mark.kubesim_only("checks kubesim's simulated scheduler on its own ClusterSpecs")

T = TypeVar("T")
NS = "default"


@contextmanager
def cluster(tmp_path: Path, nodes: list[NodeSpec], seed: int = 0,
            kubelet: KubeletSpec | None = None) -> Iterator[client.CoreV1Api]:
    spec = ClusterSpec("c", nodes, seed=seed, kubelet=kubelet or KubeletSpec(start_seconds=0.02, run_seconds=30))
    with kubesim.serve([spec], tmp_path) as sim:
        api = config.new_client_from_config(config_file=str(sim.kubeconfig("c")))
        try:
            yield client.CoreV1Api(api)
        finally:
            api.close()


def pod(name: str, cpu: str = "100m", memory: str | None = None, gpu: str | None = None,
        annotations: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    requests: dict[str, str] = {"cpu": cpu}
    if memory:
        requests["memory"] = memory
    resources: dict[str, Any] = {"requests": requests}
    if gpu:
        resources["limits"] = {"nvidia.com/gpu": gpu}  # extended resources: limits stand in for requests
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "annotations": annotations or {}},
            "spec": {"restartPolicy": "Never",
                     "containers": [{"name": "main", "image": "busybox", "resources": resources}], **spec}}


def node_of(core: client.CoreV1Api, name: str) -> str | None:
    return core.read_namespaced_pod(name, NS).spec.node_name  # type: ignore[no-any-return]


def scheduled_condition(core: client.CoreV1Api, name: str) -> Any:
    for cond in core.read_namespaced_pod(name, NS).status.conditions or ():
        if cond.type == "PodScheduled":
            return cond
    return None


def test_pods_bind_where_they_fit_and_spread_by_least_allocated(tmp_path: Path) -> None:
    with cluster(tmp_path, [NodeSpec("n1", cpu="2"), NodeSpec("n2", cpu="2")]) as core:
        core.create_namespaced_pod(NS, pod("p1", cpu="1"))
        first = wait_for(lambda: node_of(core, "p1"), what="p1 bound")
        core.create_namespaced_pod(NS, pod("p2", cpu="1"))
        second = wait_for(lambda: node_of(core, "p2"), what="p2 bound")
        assert {first, second} == {"n1", "n2"}  # LeastAllocated puts the second pod on the emptier node
        cond = wait_for(lambda: scheduled_condition(core, "p2"))
        assert cond.status == "True"


def test_unschedulable_message_event_and_retry_when_capacity_frees(tmp_path: Path) -> None:
    nodes = [NodeSpec("a", cpu="2"), NodeSpec("b", cpu="2"), NodeSpec("c", cpu="1", extended={"nvidia.com/gpu": "1"})]
    with cluster(tmp_path, nodes) as core:
        core.create_namespaced_pod(NS, pod("gpu", cpu="1500m", gpu="1"))

        def unschedulable() -> Any:
            cond = scheduled_condition(core, "gpu")
            return cond if cond is not None and cond.reason == "Unschedulable" else None

        cond = wait_for(unschedulable, what="Unschedulable condition")
        assert cond.status == "False"
        assert cond.message.startswith(
            "0/3 nodes are available: 1 Insufficient cpu, 2 Insufficient nvidia.com/gpu. preemption: ")
        assert core.read_namespaced_pod("gpu", NS).status.phase == "Pending"
        events = wait_for(lambda: [e for e in core.list_namespaced_event(NS).items
                                   if e.reason == "FailedScheduling" and e.involved_object.name == "gpu"],
                          what="FailedScheduling event")
        assert events[0].type == "Warning"
        assert events[0].message == cond.message



def test_unschedulable_pods_retry_when_a_pod_goes_or_a_node_grows(tmp_path: Path) -> None:
    with cluster(tmp_path, [NodeSpec("n1", cpu="2")]) as core:
        core.create_namespaced_pod(NS, pod("hog", cpu="2"))
        wait_for(lambda: node_of(core, "hog"), what="hog bound")
        core.create_namespaced_pod(NS, pod("waiter", cpu="1"))
        core.create_namespaced_pod(NS, pod("later", cpu="1"))
        cond = wait_for(lambda: (c := scheduled_condition(core, "waiter")) and c.reason == "Unschedulable" and c)
        assert cond.message.startswith("0/1 nodes are available: 1 Insufficient cpu.")
        core.delete_namespaced_pod("hog", NS)
        assert wait_for(lambda: node_of(core, "waiter"), what="waiter bound after hog deleted") == "n1"
        assert wait_for(lambda: node_of(core, "later"), what="later bound") == "n1"
        core.create_namespaced_pod(NS, pod("third", cpu="1"))
        wait_for(lambda: (c := scheduled_condition(core, "third")) and c.reason == "Unschedulable")
        core.patch_node_status("n1", {"status": {"allocatable": {"cpu": "3"}, "capacity": {"cpu": "3"}}})
        assert wait_for(lambda: node_of(core, "third"), what="third bound after the node grew") == "n1"
        assert scheduled_condition(core, "third").status == "True"


def test_finished_pods_free_their_resources(tmp_path: Path) -> None:
    with cluster(tmp_path, [NodeSpec("n1", cpu="1")]) as core:
        core.create_namespaced_pod(NS, pod("short", cpu="1", annotations={"kubesim.mkd.dev/run-seconds": "0.1"}))
        core.create_namespaced_pod(NS, pod("next", cpu="1"))
        wait_for(lambda: core.read_namespaced_pod("short", NS).status.phase == "Succeeded", what="short done")
        assert wait_for(lambda: node_of(core, "next"), what="next bound once short finished") == "n1"


def test_node_selector_taints_and_affinity(tmp_path: Path) -> None:
    nodes = [NodeSpec("plain"), NodeSpec("gpu-node", labels={"pool": "gpu"})]
    with cluster(tmp_path, nodes) as core:
        core.patch_node("plain", {"spec": {"taints": [{"key": "dedicated", "value": "infra", "effect": "NoSchedule"}]}})
        core.create_namespaced_pod(NS, pod("sel", nodeSelector={"pool": "gpu"}))
        assert wait_for(lambda: node_of(core, "sel")) == "gpu-node"
        core.create_namespaced_pod(NS, pod("tol", tolerations=[{"key": "dedicated", "operator": "Equal",
                                                                 "value": "infra", "effect": "NoSchedule"}],
                                        affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                                            "nodeSelectorTerms": [{"matchExpressions": [
                                                {"key": "pool", "operator": "DoesNotExist"}]}]}}}))
        assert wait_for(lambda: node_of(core, "tol")) == "plain"
        core.create_namespaced_pod(NS, pod("nowhere", nodeSelector={"pool": "tpu"}))
        cond = wait_for(lambda: (c := scheduled_condition(core, "nowhere")) and c.reason == "Unschedulable" and c)
        assert cond.message.startswith("0/2 nodes are available: 1 node(s) didn't match Pod's node "
                                       "affinity/selector, 1 node(s) had untolerated taint {dedicated: infra}.")
        assert "2 Preemption is not helpful for scheduling" in cond.message


def test_scheduling_gates_hold_a_pod_until_removed(tmp_path: Path) -> None:
    with cluster(tmp_path, [NodeSpec("n1")]) as core:
        core.create_namespaced_pod(NS, pod("gated", schedulingGates=[{"name": "example.com/wait"}]))
        cond = wait_for(lambda: (c := scheduled_condition(core, "gated")) and c.reason == "SchedulingGated" and c)
        assert cond.status == "False"
        time.sleep(0.2)  # give the scheduler every chance to (wrongly) bind it
        assert node_of(core, "gated") is None


def test_placement_is_deterministic_under_a_seed(tmp_path: Path) -> None:
    def placements(run: int) -> list[str | None]:
        nodes = [NodeSpec(f"n{i}", cpu="4") for i in range(4)]
        with cluster(tmp_path / str(run), nodes, seed=7) as core:
            names = [f"p{i}" for i in range(8)]
            for name in names:
                core.create_namespaced_pod(NS, pod(name, cpu="500m"))
            wait_for(lambda: all(node_of(core, n) for n in names), what="all bound")
            return [node_of(core, n) for n in names]

    (tmp_path / "0").mkdir()
    (tmp_path / "1").mkdir()
    first, second = placements(0), placements(1)
    assert first == second
    assert len(set(first)) == 4  # and the pods spread over every node
