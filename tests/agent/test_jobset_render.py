"""JobSet render: webhook defaults, child Jobs and labels, the one headless Service, status and policies."""

from __future__ import annotations

from typing import Any

import yaml

from tests.agent.test_jobset_harness import Sim, ts
from worker_agent.reconcilers.jobset import JobSetReconciler

JS = "jobset.sigs.k8s.io"

MANIFEST = """
apiVersion: jobset.x-k8s.io/v1alpha2
kind: JobSet
metadata: {name: js, namespace: ns1, labels: {mkd.dev/origin: fed-a}}
spec:
  replicatedJobs:
  - name: leader
    template:
      spec:
        parallelism: 1
        completions: 1
        template:
          spec:
            containers: [{name: main, image: busybox}]
  - name: workers
    replicas: 2
    template:
      metadata: {labels: {team: ml}}
      spec:
        parallelism: 2
        completions: 2
        backoffLimit: 0
        template:
          metadata: {annotations: {a: b}}
          spec:
            containers: [{name: main, image: busybox}]
"""


def jobset(**spec: Any) -> dict[str, Any]:
    js: dict[str, Any] = yaml.safe_load(MANIFEST)
    js["spec"].update(spec)
    return js


def finish(sim: Sim, name: str, ctype: str, reason: str = "") -> None:
    job = sim.obj("jobs", name)
    job["status"] = {"conditions": [{"type": ctype, "status": "True", "reason": reason,
                                     "lastTransitionTime": ts(sim.now)}],
                     "succeeded" if ctype == "Complete" else "failed": job["spec"]["parallelism"]}


def test_children_labels_service_and_defaults() -> None:
    sim = Sim(JobSetReconciler(), jobset())
    plan = sim.step()
    assert [(r.plural, b["metadata"]["name"]) for r, b in plan.creates] == [
        ("services", "js"), ("jobs", "js-leader-0"), ("jobs", "js-workers-0"), ("jobs", "js-workers-1")]
    svc = sim.obj("services", "js")
    assert svc["spec"] == {"clusterIP": "None", "selector": {f"{JS}/jobset-name": "js"},
                           "publishNotReadyAddresses": True}
    job = sim.obj("jobs", "js-workers-1")
    expected = {f"{JS}/jobset-name": "js", f"{JS}/jobset-uid": "uid-js", f"{JS}/replicatedjob-name": "workers",
                f"{JS}/restart-attempt": "0", f"{JS}/replicatedjob-replicas": "2", f"{JS}/global-replicas": "3",
                f"{JS}/job-index": "1", f"{JS}/job-global-index": "2", f"{JS}/group-name": "default",
                f"{JS}/group-replicas": "3", f"{JS}/job-group-index": "2"}
    labels = job["metadata"]["labels"]
    assert {k: labels[k] for k in expected} == expected
    assert labels["team"] == "ml" and labels["mkd.dev/origin"] == "fed-a" and labels["mkd.dev/owner-uid"] == "uid-js"
    assert len(labels[f"{JS}/job-key"]) == 40
    pod = job["spec"]["template"]
    assert {k: pod["metadata"]["labels"][k] for k in expected} == expected
    assert pod["metadata"]["annotations"]["a"] == "b"
    assert pod["metadata"]["annotations"][f"{JS}/job-index"] == "1"
    assert pod["spec"]["subdomain"] == "js" and pod["spec"]["restartPolicy"] == "OnFailure"
    assert job["spec"]["completionMode"] == "Indexed" and job["spec"]["suspend"] is False
    assert sim.job is not None
    assert sim.job["status"] == {"restarts": 0, "replicatedJobsStatus": [
        {"name": "leader", "ready": 0, "succeeded": 0, "failed": 0, "active": 0, "suspended": 0},
        {"name": "workers", "ready": 0, "succeeded": 0, "failed": 0, "active": 0, "suspended": 0}]}
    assert not sim.step().creates  # the Service is only created if absent; Jobs exist


def test_ready_counts_and_completion() -> None:
    sim = Sim(JobSetReconciler(), jobset())
    sim.step()
    for name in ("js-workers-0", "js-workers-1"):
        sim.obj("jobs", name)["status"] = {"active": 2, "ready": 2}
    sim.obj("jobs", "js-leader-0")["status"] = {"active": 1, "ready": 0}
    sim.step()
    assert sim.job is not None
    assert sim.job["status"]["replicatedJobsStatus"][1] == {
        "name": "workers", "ready": 2, "succeeded": 0, "failed": 0, "active": 2, "suspended": 0}
    for name in ("js-leader-0", "js-workers-0", "js-workers-1"):
        finish(sim, name, "Complete")
    sim.advance(3)
    sim.step()
    assert sim.job["status"]["conditions"] == [{"type": "Completed", "status": "True", "reason": "AllJobsCompleted",
                                                "message": "jobset completed successfully",
                                                "lastTransitionTime": ts(sim.now)}]
    assert sim.job["status"]["terminalState"] == "Completed"
    assert ("Normal", "AllJobsCompleted", "jobset completed successfully") in sim.events


def test_failed_job_fails_the_jobset_and_deletes_active_jobs() -> None:
    sim = Sim(JobSetReconciler(), jobset())
    sim.step()
    finish(sim, "js-workers-1", "Failed", "BackoffLimitExceeded")
    sim.step()
    assert sim.job is not None
    cond = sim.job["status"]["conditions"][0]
    assert (cond["type"], cond["reason"], cond["message"]) == (
        "Failed", "FailedJobs", "jobset failed due to one or more job failures (first failed job: js-workers-1)")
    assert sim.job["status"]["terminalState"] == "Failed"
    plan = sim.step()
    assert sorted(n for _, n in plan.deletes) == ["js-leader-0", "js-workers-0"]


def test_restart_until_max_restarts() -> None:
    sim = Sim(JobSetReconciler(), jobset(failurePolicy={"maxRestarts": 1}))
    sim.step()
    finish(sim, "js-leader-0", "Failed")
    sim.step()
    assert sim.job is not None
    assert sim.job["status"]["restarts"] == 1 and sim.job["status"]["restartsCountTowardsMax"] == 1
    assert [(c["type"], c["status"], c["reason"]) for c in sim.job["status"]["conditions"]] == [
        ("Restarting", "True", "DefaultFailurePolicy")]
    plan = sim.step()  # the old attempt's Jobs go first ...
    assert sorted(n for _, n in plan.deletes) == ["js-leader-0", "js-workers-0", "js-workers-1"]
    assert plan.requeue_after is not None
    plan = sim.step()  # ... then they are recreated with restart-attempt 1
    assert len(plan.creates) == 3
    assert sim.obj("jobs", "js-leader-0")["metadata"]["labels"][f"{JS}/restart-attempt"] == "1"
    finish(sim, "js-workers-0", "Failed")
    sim.step()
    assert [(c["type"], c["status"], c["reason"]) for c in sim.job["status"]["conditions"]] == [
        ("Restarting", "False", "JobSetFailed"), ("Failed", "True", "ReachedMaxRestarts")]
    assert sim.job["status"]["conditions"][1]["message"] == (
        "jobset failed due to reaching max number of restarts (first failed job: js-workers-0)")


def test_suspend_resume_depends_on_and_ttl() -> None:
    js = jobset(suspend=True, ttlSecondsAfterFinished=30, network={"subdomain": "net", "publishNotReadyAddresses": False})
    js["spec"]["replicatedJobs"][1]["dependsOn"] = [{"name": "leader", "status": "Ready"}]
    sim = Sim(JobSetReconciler(), js)
    plan = sim.step()
    assert [b["metadata"]["name"] for _, b in plan.creates] == ["net", "js-leader-0"]
    assert sim.obj("services", "net")["spec"]["publishNotReadyAddresses"] is False
    assert sim.obj("jobs", "js-leader-0")["spec"]["suspend"] is True
    assert sim.obj("jobs", "js-leader-0")["spec"]["template"]["spec"]["subdomain"] == "net"
    assert sim.job is not None
    assert [(c["type"], c["status"], c["reason"]) for c in sim.job["status"]["conditions"]] == [
        ("Suspended", "True", "SuspendedJobs")]
    sim.job["spec"]["suspend"] = False
    sim.step()
    assert sim.obj("jobs", "js-leader-0")["spec"]["suspend"] is False
    assert [(c["type"], c["status"], c["reason"]) for c in sim.job["status"]["conditions"]] == [
        ("Suspended", "False", "ResumeJobs")]
    sim.obj("jobs", "js-leader-0")["status"] = {"active": 1, "ready": 1}
    plan = sim.step()  # leader Ready: the workers may start
    assert sorted(b["metadata"]["name"] for _, b in plan.creates) == ["js-workers-0", "js-workers-1"]
    for name in ("js-leader-0", "js-workers-0", "js-workers-1"):
        finish(sim, name, "Complete")
    sim.step()
    plan = sim.step()
    assert plan.requeue_after == 30.0 and not plan.delete_job
    sim.advance(30)
    assert sim.step().delete_job


def test_managed_elsewhere_is_left_alone() -> None:
    plan = Sim(JobSetReconciler(), jobset(managedBy="kueue.x-k8s.io/multikueue")).step()
    assert not (plan.creates or plan.status or plan.events)
