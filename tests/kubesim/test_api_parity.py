"""Places where kubesim once diverged from the real kube-apiserver, pinned by scenarios through the official client.

Scheduling gates may be removed from a pod (never added), and a gated pod may gain nodeSelector entries;
a Job with only ``parallelism`` keeps ``completions`` unset and runs as a work queue; a suspended Job's pod
template accepts scheduling directives (nodeSelector, tolerations, nodeAffinity, schedulingGates, labels,
annotations) only while ``status.startTime`` is unset; elastic Indexed Jobs change completions only in tandem
with parallelism. Tests marked ``realcluster`` touch only the API and also run against a real cluster.
"""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client

from kubesim.testing import eventually, pod_body, status_of

GATE_A = "example.com/quota"
GATE_B = "example.com/placement"


def job_body(name: str, annotations: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name}, "spec": {
        "template": {"metadata": {"annotations": annotations or {}},
                     "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]}},
        **spec}}


def rejected(call: Any, *args: Any) -> dict[str, Any]:
    """Run an API call expected to fail with 422 Invalid; return the Status body."""
    with pytest.raises(client.ApiException) as ei:
        call(*args)
    assert ei.value.status == 422, ei.value.body
    st = status_of(ei.value)
    assert st["reason"] == "Invalid"
    return st


def scheduled(v1: client.CoreV1Api, name: str, ns: str) -> Any:
    cond = [c for c in (v1.read_namespaced_pod(name, ns).status.conditions or []) if c.type == "PodScheduled"]
    return cond[0] if cond else None


# ------------------------------------------------------------------ scheduling gates


@pytest.mark.realcluster
def test_scheduling_gates_may_be_removed_but_not_added(api: client.ApiClient, ns: str) -> None:
    v1 = client.CoreV1Api(api)
    v1.create_namespaced_pod(ns, pod_body("g", schedulingGates=[{"name": GATE_A}, {"name": GATE_B}]))
    st = rejected(v1.patch_namespaced_pod, "g", ns,
                  [{"op": "add", "path": "/spec/schedulingGates/-", "value": {"name": "example.com/new"}}])
    causes = st["details"]["causes"]
    assert [c["field"] for c in causes] == ["spec.schedulingGates[2].name"]
    assert causes[0]["reason"] == "FieldValueForbidden"
    assert "only deletion is allowed, but found new scheduling gate 'example.com/new'" in causes[0]["message"]
    # Removing one gate by a full replace is an allowed update (the old behaviour refused any change).
    pod = v1.read_namespaced_pod("g", ns)
    pod.spec.scheduling_gates = [client.V1PodSchedulingGate(name=GATE_B)]
    assert [g.name for g in v1.replace_namespaced_pod("g", ns, pod).spec.scheduling_gates] == [GATE_B]
    # Swapping the remaining gate for another is an addition, hence refused.
    rejected(v1.patch_namespaced_pod, "g", ns,
             [{"op": "replace", "path": "/spec/schedulingGates/0/name", "value": GATE_A}])


@pytest.mark.needs_running_pods("the released pod must be scheduled and run")
def test_gated_pod_released_by_removing_its_gates_gets_scheduled(sim: Any, api: client.ApiClient,
                                                                 ns: str) -> None:
    v1 = client.CoreV1Api(api)
    v1.create_namespaced_pod(ns, pod_body("held", schedulingGates=[{"name": GATE_A}, {"name": GATE_B}]))
    cond = eventually(lambda: (c := scheduled(v1, "held", ns)) and c.reason == "SchedulingGated" and c,
                      what="PodScheduled=False/SchedulingGated")
    assert cond.status == "False"
    # While gated, placement may be narrowed (what a queueing system does before releasing a pod) ...
    pod = v1.patch_namespaced_pod("held", ns, {"spec": {"nodeSelector": {"pool": "gpu"}}})
    assert pod.spec.node_selector == {"pool": "gpu"}
    # ... but an existing selector entry may not change.
    st = rejected(v1.patch_namespaced_pod, "held", ns, {"spec": {"nodeSelector": {"pool": "cpu"}}})
    assert st["details"]["causes"][0]["field"] == "spec.nodeSelector"
    v1.patch_namespaced_pod("held", ns, [{"op": "remove", "path": "/spec/schedulingGates/0"}])
    assert v1.read_namespaced_pod("held", ns).spec.node_name is None  # one gate left: still held
    v1.patch_namespaced_pod("held", ns, [{"op": "remove", "path": "/spec/schedulingGates"}])
    node = eventually(lambda: v1.read_namespaced_pod("held", ns).spec.node_name, what="the released pod bound")
    assert node == "node-a"  # the only node labelled pool=gpu
    assert eventually(lambda: (c := scheduled(v1, "held", ns)) and c.status == "True" and c).reason is None
    # Once ungated the nodeSelector is frozen again, like every other field.
    rejected(v1.patch_namespaced_pod, "held", ns, {"spec": {"nodeSelector": {"extra": "x"}}})


# ------------------------------------------------------------------ job defaulting / work queues


@pytest.mark.realcluster
def test_job_completions_and_parallelism_defaults(api: client.ApiClient, ns: str) -> None:
    batch = client.BatchV1Api(api)
    both = batch.create_namespaced_job(ns, job_body("both", suspend=True))
    assert (both.spec.completions, both.spec.parallelism) == (1, 1)
    queue = batch.create_namespaced_job(ns, job_body("queue", suspend=True, parallelism=3))
    assert (queue.spec.completions, queue.spec.parallelism) == (None, 3)
    fixed = batch.create_namespaced_job(ns, job_body("fixed", suspend=True, completions=4))
    assert (fixed.spec.completions, fixed.spec.parallelism) == (4, 1)
    # Unset completions stays unset across updates (no immutable-field error from a re-defaulted value).
    queue = batch.patch_namespaced_job("queue", ns, {"spec": {"parallelism": 2}})
    assert (queue.spec.completions, queue.spec.parallelism) == (None, 2)


@pytest.mark.needs_running_pods("the Job's pods must run and succeed (kubesim.mkd.dev/run-seconds)")
def test_work_queue_job_completes_when_a_pod_succeeds_and_none_is_active(sim: Any, api: client.ApiClient,
                                                                         ns: str) -> None:
    batch = client.BatchV1Api(api)
    v1 = client.CoreV1Api(api)
    batch.create_namespaced_job(ns, job_body("wq", {"kubesim.mkd.dev/run-seconds": "0.3"}, parallelism=2))

    def complete() -> Any:
        j = batch.read_namespaced_job("wq", ns)
        return j if any(c.type == "Complete" and c.status == "True" for c in j.status.conditions or []) else None

    job = eventually(complete, what="work-queue Job Complete")
    assert job.spec.completions is None
    pods = v1.list_namespaced_pod(ns, label_selector="batch.kubernetes.io/job-name=wq").items
    # parallelism pods ran at once (a defaulted completions=1 would have started one), none was replaced.
    assert len(pods) == 2 and {p.status.phase for p in pods} == {"Succeeded"}
    assert job.status.succeeded == 2 and not job.status.active and job.status.completion_time is not None


# ------------------------------------------------------------------ suspended job templates


@pytest.mark.realcluster
def test_suspended_never_started_job_accepts_only_scheduling_directives(api: client.ApiClient, ns: str) -> None:
    batch = client.BatchV1Api(api)
    batch.create_namespaced_job(ns, job_body("sus", suspend=True))
    node_affinity = {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["gpu"]}]}]}}
    job = batch.patch_namespaced_job("sus", ns, {"spec": {"template": {
        "metadata": {"labels": {"queue": "a"}, "annotations": {"note": "x"}},
        "spec": {"nodeSelector": {"pool": "gpu"}, "affinity": {"nodeAffinity": node_affinity},
                 "tolerations": [{"key": "dedicated", "operator": "Exists"}],
                 "schedulingGates": [{"name": GATE_A}]}}}})
    tspec = job.spec.template.spec
    assert tspec.node_selector == {"pool": "gpu"} and tspec.affinity.node_affinity is not None
    assert [g.name for g in tspec.scheduling_gates] == [GATE_A]
    assert job.spec.template.metadata.labels["queue"] == "a"
    pod_affinity = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"app": "x"}}, "topologyKey": "kubernetes.io/hostname"}]}}
    for patch in ({"spec": {"template": {"spec": {"containers": [{"name": "c", "image": "other"}]}}}},
                  {"spec": {"template": {"spec": {"activeDeadlineSeconds": 5}}}},
                  {"spec": {"template": {"spec": {"affinity": pod_affinity}}}}):
        st = rejected(batch.patch_namespaced_job, "sus", ns, patch)
        # v1.36 names the pod spec of a suspended Job's template (older servers said spec.template).
        assert st["details"]["causes"][0]["field"] == "spec.template.spec", patch


@pytest.mark.needs_running_pods("the Job must start running pods (kubesim.mkd.dev/run-forever)")
def test_suspended_job_template_frozen_once_started_until_start_time_cleared(sim: Any, api: client.ApiClient,
                                                                           ns: str) -> None:
    batch = client.BatchV1Api(api)
    batch.create_namespaced_job(ns, job_body("ran", {"kubesim.mkd.dev/run-forever": "true"}, suspend=True))
    batch.patch_namespaced_job("ran", ns, {"spec": {"suspend": False}})
    eventually(lambda: batch.read_namespaced_job("ran", ns).status.start_time, what="startTime set on resume")
    batch.patch_namespaced_job("ran", ns, {"spec": {"suspend": True}})
    assert batch.read_namespaced_job("ran", ns).status.start_time is not None  # suspending keeps startTime
    directive = {"spec": {"template": {"spec": {"nodeSelector": {"pool": "gpu"}}}}}
    st = rejected(batch.patch_namespaced_job, "ran", ns, directive)
    assert st["details"]["causes"][0]["field"] == "spec.template"
    # A running (not suspended) Job refuses them too, whatever its startTime.
    batch.create_namespaced_job(ns, job_body("live", {"kubesim.mkd.dev/run-forever": "true"}))
    rejected(batch.patch_namespaced_job, "live", ns, directive)
    # Clearing startTime (as Kueue does when it suspends a Job) makes the directives mutable again.
    batch.patch_namespaced_job_status("ran", ns, {"status": {"startTime": None}})
    job = batch.patch_namespaced_job("ran", ns, directive)
    assert job.spec.template.spec.node_selector == {"pool": "gpu"}


@pytest.mark.realcluster
def test_elastic_indexed_job_changes_completions_only_with_parallelism(api: client.ApiClient, ns: str) -> None:
    batch = client.BatchV1Api(api)
    batch.create_namespaced_job(ns, job_body("el", suspend=True, completionMode="Indexed", completions=2,
                                             parallelism=2))
    st = rejected(batch.patch_namespaced_job, "el", ns, {"spec": {"completions": 3}})
    assert "can only be modified in tandem with spec.parallelism" in st["details"]["causes"][0]["message"]
    job = batch.patch_namespaced_job("el", ns, {"spec": {"completions": 3, "parallelism": 3}})
    assert (job.spec.completions, job.spec.parallelism) == (3, 3)
    batch.create_namespaced_job(ns, job_body("ne", suspend=True, completions=2))
    st = rejected(batch.patch_namespaced_job, "ne", ns, {"spec": {"completions": 3, "parallelism": 3}})
    assert "field is immutable" in st["details"]["causes"][0]["message"]
