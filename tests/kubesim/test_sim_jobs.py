"""The simulated batch/v1 Job controller seen through the official client.

Covers NonIndexed and Indexed Jobs (pod names, hostnames, index annotation/label, completedIndexes),
backoffLimit failure, suspend/resume, ttlSecondsAfterFinished, managedBy and the job pod labels.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
from kubernetes import client, config

import kubesim
from kubesim import ClusterSpec, KubeletSpec, NodeSpec
from kubesim.testing import eventually as wait_for

pytestmark = pytest.mark.kubesim_only("drives kubesim's simulated Job controller and kubelet (own ClusterSpecs, "
                                      "kubesim.mkd.dev/* pod annotations for run times and exit codes)")

T = TypeVar("T")
NS = "default"
INDEX = "batch.kubernetes.io/job-completion-index"


@dataclass
class Apis:
    core: client.CoreV1Api
    batch: client.BatchV1Api


@contextmanager
def cluster(tmp_path: Path, seed: int = 0) -> Iterator[Apis]:
    spec = ClusterSpec("j", [NodeSpec("node-1", cpu="16"), NodeSpec("node-2", cpu="16")], seed=seed,
                       kubelet=KubeletSpec(start_seconds=0.02, run_seconds=0.1))
    with kubesim.serve([spec], tmp_path) as sim:
        api = config.new_client_from_config(config_file=str(sim.kubeconfig("j")))
        try:
            yield Apis(client.CoreV1Api(api), client.BatchV1Api(api))
        finally:
            api.close()


def job(name: str, annotations: dict[str, str] | None = None, restart: str = "Never", **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
            "spec": {"template": {"metadata": {"annotations": annotations or {}},
                                  "spec": {"restartPolicy": restart,
                                           "containers": [{"name": "main", "image": "busybox"}]}}, **spec}}


def status(apis: Apis, name: str) -> Any:
    return apis.batch.read_namespaced_job_status(name, NS).status


def condition(apis: Apis, name: str, ctype: str) -> Any:
    for cond in status(apis, name).conditions or ():
        if cond.type == ctype and cond.status == "True":
            return cond
    return None


def pods_of(apis: Apis, name: str) -> list[Any]:
    return apis.core.list_namespaced_pod(NS, label_selector=f"batch.kubernetes.io/job-name={name}").items  # type: ignore[no-any-return]


def test_non_indexed_job_completes_with_counts_and_conditions(tmp_path: Path) -> None:
    with cluster(tmp_path) as apis:
        created = apis.batch.create_namespaced_job(NS, job("simple", completions=3, parallelism=2))
        uid = created.metadata.uid
        active = wait_for(lambda: (s := status(apis, "simple")).active and s, what="active pods")
        assert active.active <= 2 and active.start_time is not None
        pods = pods_of(apis, "simple")
        assert pods and all(p.metadata.name.startswith("simple-") for p in pods)
        first = pods[0]
        assert first.metadata.labels["batch.kubernetes.io/controller-uid"] == uid
        assert first.metadata.labels["controller-uid"] == uid
        assert first.metadata.labels["job-name"] == "simple"
        owner = first.metadata.owner_references[0]
        assert (owner.kind, owner.name, owner.uid, owner.controller) == ("Job", "simple", uid, True)
        complete = wait_for(lambda: condition(apis, "simple", "Complete"), what="Complete")
        assert complete.reason == "CompletionsReached"
        assert complete.message == "Reached expected number of succeeded pods"
        final = status(apis, "simple")
        assert final.succeeded == 3 and not final.active and not final.failed
        assert final.completion_time is not None
        assert condition(apis, "simple", "SuccessCriteriaMet") is not None
        assert len(pods_of(apis, "simple")) == 3
        # Counted pods lose the tracking finalizer.
        assert all(not p.metadata.finalizers for p in pods_of(apis, "simple"))


def test_indexed_job_pods_hostnames_and_completed_indexes(tmp_path: Path) -> None:
    with cluster(tmp_path) as apis:
        body = job("idx", completions=3, parallelism=3, completionMode="Indexed",
                   annotations={"kubesim.mkd.dev/run-seconds": "0.3"})
        body["spec"]["template"]["spec"]["subdomain"] = "idx-svc"
        apis.batch.create_namespaced_job(NS, body)
        pods = wait_for(lambda: len(p := pods_of(apis, "idx")) == 3 and p, what="three pods")
        by_index = {int(p.metadata.annotations[INDEX]): p for p in pods}
        assert sorted(by_index) == [0, 1, 2]
        for i, p in by_index.items():
            assert p.metadata.labels[INDEX] == str(i)
            assert p.metadata.name.startswith(f"idx-{i}-") and len(p.metadata.name) == len(f"idx-{i}-") + 5
            assert p.spec.hostname == f"idx-{i}"
            assert p.spec.subdomain == "idx-svc"
            assert p.metadata.annotations["kubesim.mkd.dev/run-seconds"] == "0.3"
            env = {e.name: e for e in p.spec.containers[0].env}
            assert env["JOB_COMPLETION_INDEX"].value_from.field_ref.field_path == f"metadata.labels['{INDEX}']"
        wait_for(lambda: condition(apis, "idx", "Complete"), what="Complete")
        final = status(apis, "idx")
        assert final.completed_indexes == "0-2"
        assert final.succeeded == 3


def test_backoff_limit_fails_the_job(tmp_path: Path) -> None:
    with cluster(tmp_path) as apis:
        apis.batch.create_namespaced_job(NS, job("crash", backoffLimit=1,
                                                 annotations={"kubesim.mkd.dev/exit-code": "2"}))
        failed = wait_for(lambda: condition(apis, "crash", "Failed"), what="Failed")
        assert failed.reason == "BackoffLimitExceeded"
        assert failed.message == "Job has reached the specified backoff limit"
        assert condition(apis, "crash", "FailureTarget") is not None
        final = status(apis, "crash")
        assert final.failed == 2 and not final.active and final.completion_time is None
        assert all(p.status.phase == "Failed" for p in pods_of(apis, "crash"))


def test_fail_attempts_with_on_failure_count_restarts_not_pods(tmp_path: Path) -> None:
    with cluster(tmp_path) as apis:
        apis.batch.create_namespaced_job(NS, job("retry", restart="OnFailure", backoffLimit=4, annotations={
            "kubesim.mkd.dev/fail-attempts": "2", "kubesim.mkd.dev/run-seconds": "0.05"}))
        wait_for(lambda: condition(apis, "retry", "Complete"), what="Complete")
        pods = pods_of(apis, "retry")
        assert len(pods) == 1
        assert pods[0].status.container_statuses[0].restart_count == 2
        assert not status(apis, "retry").failed


def test_active_deadline_fails_the_job(tmp_path: Path) -> None:
    with cluster(tmp_path) as apis:
        apis.batch.create_namespaced_job(NS, job("slow", activeDeadlineSeconds=1,
                                                 annotations={"kubesim.mkd.dev/run-forever": "true"}))
        failed = wait_for(lambda: condition(apis, "slow", "Failed"), timeout=10, what="DeadlineExceeded")
        assert failed.reason == "DeadlineExceeded"
        wait_for(lambda: all(p.status.phase in ("Failed", "Succeeded") for p in pods_of(apis, "slow"))
                 or not pods_of(apis, "slow"), what="pods stopped")


def test_suspend_deletes_pods_and_resume_restarts_them(tmp_path: Path) -> None:
    with cluster(tmp_path) as apis:
        apis.batch.create_namespaced_job(NS, job("sus", parallelism=2, completions=2,
                                                 annotations={"kubesim.mkd.dev/run-forever": "true"}))
        wait_for(lambda: status(apis, "sus").active == 2, what="two active")
        first_start = status(apis, "sus").start_time
        apis.batch.patch_namespaced_job("sus", NS, {"spec": {"suspend": True}})
        suspended = wait_for(lambda: condition(apis, "sus", "Suspended"), what="Suspended")
        assert suspended.reason == "JobSuspended"
        wait_for(lambda: not pods_of(apis, "sus"), what="pods deleted")
        wait_for(lambda: not status(apis, "sus").active, what="no active pods")
        assert not status(apis, "sus").failed  # pods deleted for suspension are not failures
        assert status(apis, "sus").start_time == first_start  # the controller keeps it while suspended
        time.sleep(1.0)  # startTime has second precision; make the resumed one visibly later
        apis.batch.patch_namespaced_job("sus", NS, {"spec": {"suspend": False}})
        wait_for(lambda: status(apis, "sus").active == 2, what="active again")
        resumed = next(c for c in status(apis, "sus").conditions if c.type == "Suspended")
        assert (resumed.status, resumed.reason) == ("False", "JobResumed")
        assert status(apis, "sus").start_time > first_start


def test_job_created_suspended_creates_no_pods(tmp_path: Path) -> None:
    with cluster(tmp_path) as apis:
        apis.batch.create_namespaced_job(NS, job("held", suspend=True))
        wait_for(lambda: condition(apis, "held", "Suspended"), what="Suspended")
        assert not pods_of(apis, "held")
        assert status(apis, "held").start_time is None


def test_ttl_after_finished_deletes_job_and_pods(tmp_path: Path) -> None:
    with cluster(tmp_path) as apis:
        apis.batch.create_namespaced_job(NS, job("short", ttlSecondsAfterFinished=1))
        wait_for(lambda: condition(apis, "short", "Complete"), what="Complete")

        def gone() -> bool:
            return not [j for j in apis.batch.list_namespaced_job(NS).items if j.metadata.name == "short"]

        wait_for(gone, timeout=10, what="job deleted by TTL")
        wait_for(lambda: not pods_of(apis, "short"), what="pods garbage-collected")


def test_jobs_managed_by_another_controller_are_left_alone(tmp_path: Path) -> None:
    with cluster(tmp_path) as apis:
        apis.batch.create_namespaced_job(NS, job("elsewhere", managedBy="kueue.x-k8s.io/multikueue"))
        apis.batch.create_namespaced_job(NS, job("here"))
        wait_for(lambda: condition(apis, "here", "Complete"), what="the unmanaged Job completes")
        assert not pods_of(apis, "elsewhere")
        assert not status(apis, "elsewhere").start_time


def test_ttl_applies_to_jobs_finished_by_another_controller(tmp_path: Path) -> None:
    with cluster(tmp_path) as apis:
        apis.batch.create_namespaced_job(NS, job("foreign", managedBy="kueue.x-k8s.io/multikueue",
                                                 ttlSecondsAfterFinished=0))
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        apis.batch.patch_namespaced_job_status("foreign", NS, {"status": {
            "startTime": now, "completionTime": now, "succeeded": 1,
            "conditions": [{"type": "SuccessCriteriaMet", "status": "True", "lastTransitionTime": now},
                           {"type": "Complete", "status": "True", "lastTransitionTime": now}]}})
        wait_for(lambda: not [j for j in apis.batch.list_namespaced_job(NS).items
                              if j.metadata.name == "foreign"], what="TTL deletion")


def test_pod_names_are_deterministic_under_a_seed(tmp_path: Path) -> None:
    def names(run: int) -> list[str]:
        (tmp_path / str(run)).mkdir()
        with cluster(tmp_path / str(run), seed=11) as apis:
            apis.batch.create_namespaced_job(NS, job("det", completions=3, parallelism=3,
                                                     completionMode="Indexed"))
            pods = wait_for(lambda: len(p := pods_of(apis, "det")) == 3 and p, what="pods")
            return sorted(p.metadata.name for p in pods)

    assert names(0) == names(1)


def test_jobs_progress_across_a_cluster_restart(tmp_path: Path) -> None:
    spec = ClusterSpec("r", [NodeSpec("node-1")], kubelet=KubeletSpec(start_seconds=0.02, run_seconds=0.3))
    with kubesim.serve([spec], tmp_path) as sim:
        api = config.new_client_from_config(config_file=str(sim.kubeconfig("r")))
        try:
            apis = Apis(client.CoreV1Api(api), client.BatchV1Api(api))
            apis.batch.create_namespaced_job(NS, job("survivor", completions=2, parallelism=1))
            wait_for(lambda: status(apis, "survivor").active == 1, what="first pod active")
            sim.stop_cluster("r")
            sim.start_cluster("r")
            wait_for(lambda: condition(apis, "survivor", "Complete"), what="Complete after restart")
            assert status(apis, "survivor").succeeded == 2
            assert len(pods_of(apis, "survivor")) == 2
        finally:
            api.close()


def test_deleting_a_running_job_removes_it_and_its_pods(tmp_path: Path) -> None:
    with cluster(tmp_path) as apis:
        for name in ("fg", "bg"):
            apis.batch.create_namespaced_job(NS, job(name, parallelism=2, completions=2,
                                                     annotations={"kubesim.mkd.dev/run-forever": "true"}))
        wait_for(lambda: status(apis, "fg").active == 2 and status(apis, "bg").active == 2, what="running")
        apis.batch.delete_namespaced_job("fg", NS, propagation_policy="Foreground")
        apis.batch.delete_namespaced_job("bg", NS, propagation_policy="Background")

        def all_gone() -> bool:
            jobs = [j.metadata.name for j in apis.batch.list_namespaced_job(NS).items]
            return not jobs and not pods_of(apis, "fg") and not pods_of(apis, "bg")

        wait_for(all_gone, what="jobs and pods deleted")


def test_pod_failure_policy_fail_job_on_exit_code(tmp_path: Path) -> None:
    with cluster(tmp_path) as apis:
        policy = {"rules": [{"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]},
                            {"action": "FailJob", "onExitCodes": {"operator": "In", "values": [42]}}]}
        apis.batch.create_namespaced_job(NS, job("pfp", backoffLimit=6, podFailurePolicy=policy,
                                                 annotations={"kubesim.mkd.dev/exit-code": "42"}))
        failed = wait_for(lambda: condition(apis, "pfp", "Failed"), what="Failed by the policy")
        assert failed.reason == "PodFailurePolicy"
        pod_name = pods_of(apis, "pfp")[0].metadata.name
        assert failed.message == (f"Container main for pod {NS}/{pod_name} failed with exit code 42 "
                                  "matching FailJob rule at index 1")
        assert status(apis, "pfp").failed == 1


def test_pod_replacement_policy_decides_when_a_terminating_pod_is_replaced(tmp_path: Path) -> None:
    annotations = {"kubesim.mkd.dev/run-forever": "true", "kubesim.mkd.dev/termination-seconds": "2.5"}
    with cluster(tmp_path) as apis:
        for name, policy in (("eager", "TerminatingOrFailed"), ("patient", "Failed")):
            apis.batch.create_namespaced_job(NS, job(name, podReplacementPolicy=policy, annotations=annotations))
        for name in ("eager", "patient"):
            wait_for(lambda n=name: status(apis, n).active == 1, what=f"{name} active")  # type: ignore[misc]
            apis.core.delete_namespaced_pod(pods_of(apis, name)[0].metadata.name, NS)
        # TerminatingOrFailed replaces the pod while the old one is still terminating.
        eager = wait_for(lambda: (s := status(apis, "eager")).active == 1 and s.terminating == 1 and s,
                         what="eager replacement next to the terminating pod")
        assert eager.terminating == 1
        patient = status(apis, "patient")
        assert patient.terminating == 1 and not patient.active
        # Failed waits until the old pod has failed, then replaces it; the deleted pod counts as failed.
        wait_for(lambda: (s := status(apis, "patient")).active == 1 and not s.terminating, what="patient replaced")
        assert status(apis, "patient").failed == 1


def test_success_policy_completes_an_indexed_job_when_the_leader_succeeds(tmp_path: Path) -> None:
    with cluster(tmp_path) as apis:
        body = job("leader", completions=3, parallelism=3, completionMode="Indexed",
                   successPolicy={"rules": [{"succeededIndexes": "0"}]},
                   annotations={"kubesim.mkd.dev/run-forever": "true"})
        apis.batch.create_namespaced_job(NS, body)
        pods = wait_for(lambda: len(p := pods_of(apis, "leader")) == 3
                        and all(x.status.phase == "Running" for x in p) and p, what="three running pods")
        leader = next(p for p in pods if p.metadata.annotations[INDEX] == "0")
        # Only the leader finishes: its terminal phase is written through the status subresource, as its
        # kubelet would write it (every pod shares the template, so annotations cannot single it out).
        leader_status = apis.core.read_namespaced_pod_status(leader.metadata.name, NS)
        leader_status.status.phase = "Succeeded"
        apis.core.replace_namespaced_pod_status(leader.metadata.name, NS, leader_status)
        complete = wait_for(lambda: condition(apis, "leader", "Complete"), what="Complete by success policy")
        assert complete.reason == "SuccessPolicy"
        assert complete.message == "Matched rules at index 0"
        assert condition(apis, "leader", "SuccessCriteriaMet").reason == "SuccessPolicy"
        final = status(apis, "leader")
        assert final.completed_indexes == "0" and final.succeeded == 1
        assert not final.active


def test_backoff_limit_per_index(tmp_path: Path) -> None:
    with cluster(tmp_path) as apis:
        failing = {"kubesim.mkd.dev/exit-code": "1", "kubesim.mkd.dev/run-seconds": "0.05"}
        apis.batch.create_namespaced_job(NS, job("perindex", completions=2, parallelism=2, completionMode="Indexed",
                                                 backoffLimitPerIndex=1, annotations=failing))
        apis.batch.create_namespaced_job(NS, job("maxfailed", completions=3, parallelism=1, completionMode="Indexed",
                                                 backoffLimitPerIndex=0, maxFailedIndexes=0, annotations=failing))
        failed = wait_for(lambda: condition(apis, "perindex", "Failed"), what="perindex Failed")
        assert (failed.reason, failed.message) == ("FailedIndexes", "Job has failed indexes")
        final = status(apis, "perindex")
        assert final.failed_indexes == "0-1" and final.failed == 4  # each index ran twice
        retries = [p for p in pods_of(apis, "perindex")
                   if p.metadata.annotations.get("batch.kubernetes.io/job-index-failure-count") == "1"]
        assert len(retries) == 2
        failed = wait_for(lambda: condition(apis, "maxfailed", "Failed"), what="maxfailed Failed")
        assert failed.reason == "MaxFailedIndexesExceeded"
        assert status(apis, "maxfailed").failed_indexes == "0"
