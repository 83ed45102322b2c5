"""PyTorchJob PodSets count the ``init-pytorch`` init container the agent adds to Worker pods.

KUBEFLOW.md A.4: with a Master, every Worker pod gets ``init-pytorch`` (requests cpu 50m /
memory 10Mi); the scheduler charges max(any init container, sum of containers), so a Worker
whose containers request less than that needs the init container's figure.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from federation.kinds.pytorch import PYTORCHJOB
from federation.podset import parse_quantity


def _replica(replicas: int, requests: dict[str, str] | None, init: list[dict[str, Any]] | None = None
             ) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "pytorch", "image": "busybox"}
    if requests is not None:
        container["resources"] = {"requests": requests}
    spec: dict[str, Any] = {"containers": [container]}
    if init is not None:
        spec["initContainers"] = init
    return {"replicas": replicas, "template": {"spec": spec}}


def _job(**specs: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
            "metadata": {"name": "tiny", "namespace": "default"},
            "spec": {"pytorchReplicaSpecs": specs}}


def q(value: str) -> Decimal:
    return parse_quantity(value, "test")


def test_tiny_worker_is_charged_the_init_container_when_a_master_exists() -> None:
    job = _job(Master=_replica(1, {"cpu": "10m", "memory": "1Mi"}),
               Worker=_replica(3, {"cpu": "10m", "memory": "1Mi"}))
    master, worker = PYTORCHJOB.podsets(job)
    assert (master.name, worker.name, worker.count) == ("master", "worker", 3)
    assert worker.requests["cpu"] == q("50m") and worker.requests["memory"] == q("10Mi")
    assert master.requests["cpu"] == q("10m") and master.requests["memory"] == q("1Mi")
    assert worker.total()["cpu"] == q("150m")
    # the template itself is left as written: the agent adds the init container when it builds the pod
    assert "initContainers" not in worker.template["spec"]


def test_large_worker_and_no_resources_worker() -> None:
    big = PYTORCHJOB.podsets(_job(Master=_replica(1, None), Worker=_replica(1, {"cpu": "2", "memory": "4Gi"})))[1]
    assert big.requests["cpu"] == q("2") and big.requests["memory"] == q("4Gi")
    bare = PYTORCHJOB.podsets(_job(Master=_replica(1, None), Worker=_replica(2, None)))[1]
    assert bare.requests["cpu"] == q("50m") and bare.requests["memory"] == q("10Mi")
    assert bare.requests["pods"] == 1


def test_no_master_no_init_container_charge() -> None:
    (worker,) = PYTORCHJOB.podsets(_job(Worker=_replica(2, {"cpu": "10m", "memory": "1Mi"})))
    assert worker.requests["cpu"] == q("10m") and worker.requests["memory"] == q("1Mi")


def test_init_container_runs_after_user_init_containers_not_beside_them() -> None:
    user_init = [{"name": "fetch", "image": "busybox", "resources": {"requests": {"cpu": "30m", "memory": "40Mi"}}}]
    worker = PYTORCHJOB.podsets(_job(Master=_replica(1, None),
                                     Worker=_replica(1, {"cpu": "10m"}, init=user_init)))[1]
    # sequential init containers: the peak is the larger of each, not their sum
    assert worker.requests["cpu"] == q("50m") and worker.requests["memory"] == q("40Mi")
