"""What the agent tells of a placed Job's pods (worker_agent/podanswers.py): each pod's role and index from the labels its kind's controller sets, the lead pod a log is read from by default, and why a pod waits or last ended."""

from __future__ import annotations

from typing import Any

from worker_agent.podanswers import lead_order, pod_role, pod_summary


def pod(name: str, labels: dict[str, str], status: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels, "creationTimestamp": "2026-12-04T22:00:00Z"},
            "spec": {"nodeName": "n1", "containers": [{"name": "pytorch"}]}, "status": status or {"phase": "Running"}}


def kubeflow(name: str, rtype: str, index: int) -> dict[str, Any]:
    return pod(name, {"training.kubeflow.org/replica-type": rtype, "training.kubeflow.org/replica-index": str(index),
                      "training.kubeflow.org/job-role": "master" if rtype == "master" else ""})


def test_roles_and_indexes_of_each_kind() -> None:
    assert pod_role(kubeflow("t-worker-1", "worker", 1)) == ("worker", 1)
    assert pod_role(pod("pi-launcher-x", {"training.kubeflow.org/job-role": "launcher"})) == ("launcher", 0)
    assert pod_role(pod("pi-worker-2", {"training.kubeflow.org/job-role": "worker",
                                        "training.kubeflow.org/replica-index": "2"})) == ("worker", 2)
    assert pod_role(pod("b-3-abc", {"batch.kubernetes.io/job-completion-index": "3"})) == ("main", 3)
    assert pod_role(pod("js-node-0-1-x", {"jobset.sigs.k8s.io/replicatedjob-name": "node",
                                          "jobset.sigs.k8s.io/job-index": "0",
                                          "batch.kubernetes.io/job-completion-index": "1"})) == ("node", 1)
    assert pod_role(pod("js-workers-2-0-x", {"jobset.sigs.k8s.io/replicatedjob-name": "workers",
                                             "jobset.sigs.k8s.io/job-index": "2",
                                             "batch.kubernetes.io/job-completion-index": "0"})) == ("workers", 2)


def test_the_lead_pod_is_the_first_of_the_lead_role() -> None:
    pods = [kubeflow("t-worker-0", "worker", 0), kubeflow("t-worker-1", "worker", 1), kubeflow("t-master-0", "master", 0)]
    assert [p["metadata"]["name"] for p in sorted(pods, key=lead_order)] == ["t-master-0", "t-worker-0", "t-worker-1"]
    mpi = [pod("pi-worker-0", {"training.kubeflow.org/job-role": "worker", "training.kubeflow.org/replica-index": "0"}),
           pod("pi-launcher-x", {"training.kubeflow.org/job-role": "launcher"})]
    assert sorted(mpi, key=lead_order)[0]["metadata"]["name"] == "pi-launcher-x"
    workers = [kubeflow("w-1", "worker", 1), kubeflow("w-0", "worker", 0)]
    assert sorted(workers, key=lead_order)[0]["metadata"]["name"] == "w-0"  # no lead role: index 0


def test_why_a_pod_waits_or_ended() -> None:
    pulling = pod("p", {}, {"phase": "Pending", "containerStatuses": [{"name": "pytorch", "ready": False, "restartCount": 0,
                          "state": {"waiting": {"reason": "ImagePullBackOff",
                                                "message": 'Back-off pulling image "nope:1"'}}}]})
    assert pod_summary(pulling)["reason"] == "ImagePullBackOff"
    assert pod_summary(pulling)["message"] == 'Back-off pulling image "nope:1"'
    oom = pod("p", {}, {"phase": "Running", "containerStatuses": [{"name": "pytorch", "ready": True, "restartCount": 2,
                        "state": {"running": {}}, "lastState": {"terminated": {"reason": "OOMKilled", "exitCode": 137}}}]})
    summary = pod_summary(oom)
    assert (summary["reason"], summary["message"], summary["restarts"], summary["ready"]) == (
        "OOMKilled", "exit code 137", 2, "1/1")
    unschedulable = pod("p", {}, {"phase": "Pending", "conditions": [{
        "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
        "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."}]})
    assert pod_summary(unschedulable)["reason"] == "Unschedulable"
    assert "Insufficient nvidia.com/gpu" in pod_summary(unschedulable)["message"]
    fine = pod("p", {}, {"phase": "Running", "containerStatuses": [{"name": "pytorch", "ready": True, "restartCount": 0,
                         "state": {"running": {}}}]})
    assert pod_summary(fine)["reason"] == ""
    creating = pod("p", {}, {"phase": "Pending", "containerStatuses": [{"name": "pytorch", "ready": False,
                             "state": {"waiting": {"reason": "ContainerCreating"}}}]})
    assert pod_summary(creating)["reason"] == ""  # starting is not a problem


def test_ray_and_lws_pods_have_their_podsets_roles() -> None:
    head = pod("c-head-x", {"ray.io/node-type": "head", "ray.io/group": "headgroup", "ray.io/cluster": "c"})
    worker = pod("c-gpu-worker-y", {"ray.io/node-type": "worker", "ray.io/group": "GPU", "ray.io/cluster": "c"})
    submitter = pod("rj-abc", {"ray.io/originated-from-crd": "RayJob", "batch.kubernetes.io/job-completion-index": "0"})
    assert [pod_role(p) for p in (head, worker, submitter)] == [("head", 0), ("gpu", 0), ("submitter", 0)]
    assert sorted([worker, head, submitter], key=lead_order)[0] is submitter  # it prints the Ray job's log
    leader = pod("lw-1", {"leaderworkerset.sigs.k8s.io/worker-index": "0", "leaderworkerset.sigs.k8s.io/group-index": "1"})
    member = pod("lw-1-2", {"leaderworkerset.sigs.k8s.io/worker-index": "2", "leaderworkerset.sigs.k8s.io/group-index": "1"})
    member["metadata"]["annotations"] = {"leaderworkerset.sigs.k8s.io/size": "3"}
    assert (pod_role(leader), pod_role(member)) == (("leader", 1), ("worker", 3))
