"""The agent stamps each PodSet's flavor nodeSelector and tolerations on the matching pod templates."""

from __future__ import annotations

from typing import Any

from federation.flavorstamp import stamp
from federation.messages import PodScheduling


def pytorch() -> dict[str, Any]:
    def replica(n: int) -> dict[str, Any]:
        return {"replicas": n, "template": {"spec": {"nodeSelector": {"disk": "ssd"},
                                                     "containers": [{"name": "pytorch", "image": "x"}]}}}
    return {"kind": "PyTorchJob", "spec": {"pytorchReplicaSpecs": {"Master": replica(1), "Worker": replica(2)}}}


def test_per_podset_flavors_go_to_their_replica_templates() -> None:
    job = pytorch()
    n = stamp(job, {"master": PodScheduling(node_selector={"pool": "cpu"}),
                    "worker": PodScheduling(node_selector={"pool": "gpu"},
                                            tolerations=[{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}])})
    assert n == 2
    specs = job["spec"]["pytorchReplicaSpecs"]
    assert specs["Master"]["template"]["spec"]["nodeSelector"] == {"disk": "ssd", "pool": "cpu"}
    assert specs["Worker"]["template"]["spec"]["nodeSelector"] == {"disk": "ssd", "pool": "gpu"}
    assert specs["Worker"]["template"]["spec"]["tolerations"] == [
        {"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert "tolerations" not in specs["Master"]["template"]["spec"]


def test_jobset_replicated_jobs_by_name_and_one_flavor_for_all() -> None:
    jobset = {"spec": {"replicatedJobs": [
        {"name": "driver", "template": {"spec": {"template": {"spec": {"containers": [{"name": "c"}]}}}}},
        {"name": "workers", "template": {"spec": {"template": {"spec": {"containers": [{"name": "c"}]}}}}}]}}
    assert stamp(jobset, {"driver": PodScheduling(node_selector={"a": "1"}),
                          "workers": PodScheduling(node_selector={"b": "2"})}) == 2
    rj = jobset["spec"]["replicatedJobs"]
    assert rj[0]["template"]["spec"]["template"]["spec"]["nodeSelector"] == {"a": "1"}
    assert rj[1]["template"]["spec"]["template"]["spec"]["nodeSelector"] == {"b": "2"}
    same = pytorch()
    assert stamp(same, {"launcher": PodScheduling(node_selector={"z": "1"})}) == 2   # one flavor: every template
    assert stamp(pytorch(), {}) == 0
