"""A small stand-in for KubeRay's RayCluster and RayJob controllers (ray.io/v1), for tests and the demo.

A RayCluster whose managedBy is unset or ``ray.io/kuberay-operator`` and that is not suspended gets a head
pod ``<cluster>-head-<5>`` and, per worker group, ``replicas`` × ``numOfHosts`` pods
``<cluster>-<group>-worker-<5>`` (lower-cased, as KubeRay names them), labelled ``ray.io/cluster``, ``ray.io/node-type``, ``ray.io/group`` and
``ray.io/is-ray-node`` and owned by the cluster; they run until deleted (``ray start --block``). Its status
carries KubeRay's fields: ``state`` ``ready`` once every pod runs (``suspended`` when suspended), the
desired/ready/available worker counts, ``desiredCPU`` / ``desiredMemory`` / ``desiredGPU`` / ``desiredTPU``,
``head.podName`` / ``podIP``, the ``HeadPodReady`` and ``RayClusterProvisioned`` conditions and
``observedGeneration``. A RayJob (K8sJobMode) gets a RayCluster ``<job>-<5>`` from its ``rayClusterSpec``,
then, once that is ready, the submitter batch Job named as the RayJob (``submitterPodTemplate`` or KubeRay's
default ``ray-job-submitter`` container; the RayJob's ``kubesim.mkd.dev/*`` annotations go onto its pod, so
the submitter's run time and exit code stand for the Ray job's); ``jobDeploymentStatus`` goes Initializing,
Running, then Complete (``jobStatus`` SUCCEEDED) or Failed (FAILED, reason AppFailed) as the submitter Job
ends, with ``startTime``, ``endTime``, ``jobId``, ``rayClusterName``, ``rayClusterStatus``; with
``shutdownAfterJobFinishes`` the cluster is deleted after ``ttlSecondsAfterFinished``. Suspending deletes
the cluster and the submitter (``Suspended``). What the real operator does and this does not: no head
Service, no Ray dashboard (the job's state is the submitter Job's), no HTTPMode, InteractiveMode or
SidecarMode submission (such RayJobs stay Initializing), no autoscaling, retries (``backoffLimit``),
``activeDeadlineSeconds``. RayService: ``rayservice.py``.
"""

from __future__ import annotations

import asyncio
import copy
import string
from collections.abc import Mapping
from typing import Any

from kubesim.sim.common import Batched, Key, StoreLike, key_of, log, now_ts, set_condition
from kubesim.sim.resources import format_amount, pod_requests

CLUSTERS = "rayclusters.ray.io"
RAYJOBS = "rayjobs.ray.io"
RESOURCES = frozenset({CLUSTERS, RAYJOBS})
KUBERAY = "ray.io/kuberay-operator"
CLUSTER_LABEL = "ray.io/cluster"
NODE_TYPE = "ray.io/node-type"
GROUP_LABEL = "ray.io/group"
ORIGIN_KIND = "ray.io/originated-from-crd"
ORIGIN_NAME = "ray.io/originated-from-cr-name"
RUN_FOREVER = "kubesim.mkd.dev/run-forever"
SUBMITTER = "ray-job-submitter"


def _ours(obj: Mapping[str, Any]) -> bool:
    managed = (obj.get("spec") or {}).get("managedBy")
    return managed in (None, KUBERAY)


def _owner(obj: Mapping[str, Any], kind: str) -> dict[str, Any]:
    meta = obj["metadata"]
    return {"apiVersion": "ray.io/v1", "kind": kind, "name": meta["name"], "uid": meta["uid"],
            "controller": True, "blockOwnerDeletion": True}


class KubeRay(Batched[tuple[str, Key]]):
    """The RayCluster and RayJob stand-ins of one cluster; fed by the Simulation's store subscription."""

    name = "kuberay"

    def __init__(self, store: StoreLike, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(store, loop)
        self.cluster_of_pod: dict[Key, Key] = {}
        self.rayjob_of: dict[Key, Key] = {}
        """RayCluster or submitter Job key -> its RayJob."""
        self.timers: dict[Key, asyncio.TimerHandle] = {}

    def stop(self) -> None:
        super().stop()
        for handle in self.timers.values():
            handle.cancel()

    def _random(self) -> str:
        return "".join(self.store.rng.choice(string.ascii_lowercase + string.digits) for _ in range(5))

    # --- events -------------------------------------------------------------------------------
    def on_change(self, event: str, res: str, obj: Mapping[str, Any]) -> None:
        key = key_of(obj)
        if res == CLUSTERS:
            if event != "DELETED":
                self._mark((CLUSTERS, key))
            if key in self.rayjob_of:
                self._mark((RAYJOBS, self.rayjob_of[key]))
        elif res == RAYJOBS and event != "DELETED":
            self._mark((RAYJOBS, key))
        elif res == "pods":
            cluster = ((obj.get("metadata") or {}).get("labels") or {}).get(CLUSTER_LABEL)
            if cluster:
                self._mark((CLUSTERS, (key[0], cluster)))
        elif res == "jobs.batch" and key in self.rayjob_of:
            self._mark((RAYJOBS, self.rayjob_of[key]))

    def reconcile(self, item: tuple[str, Key]) -> None:
        res, key = item
        if res == CLUSTERS:
            self.reconcile_cluster(key)
        else:
            self.reconcile_rayjob(key)

    # --- RayCluster ---------------------------------------------------------------------------
    def reconcile_cluster(self, key: Key) -> None:
        cluster = self.store.get(CLUSTERS, *key)
        if cluster is None or cluster["metadata"].get("deletionTimestamp") or not _ours(cluster):
            return
        ns, name = key
        spec = cluster.get("spec") or {}
        pods = [p for p in self.store.list("pods", ns, label_selector=f"{CLUSTER_LABEL}={name}")
                if not p["metadata"].get("deletionTimestamp")]
        suspended = spec.get("suspend") is True
        if suspended:
            for pod in pods:
                self.store.delete("pods", ns, pod["metadata"]["name"])
            pods = []
        else:
            wanted = [("headgroup", "head", 1, (spec.get("headGroupSpec") or {}).get("template") or {})]
            for group in spec.get("workerGroupSpecs") or []:
                replicas = group.get("replicas", 1)
                hosts = group.get("numOfHosts", 1) or 1
                wanted.append((group["groupName"], "worker", replicas * hosts, group.get("template") or {}))
            for group_name, node_type, count, template in wanted:
                have = [p for p in pods if p["metadata"]["labels"].get(GROUP_LABEL) == group_name]
                for _ in range(count - len(have)):
                    pods.append(self._create_pod(cluster, group_name, node_type, template))
        self._cluster_status(cluster, pods, suspended)

    def _create_pod(self, cluster: Mapping[str, Any], group: str, node_type: str,
                    template: Mapping[str, Any]) -> dict[str, Any]:
        meta = cluster["metadata"]
        prefix = meta["name"] if node_type == "head" else f"{meta['name']}-{group}"
        pod_meta = copy.deepcopy(template.get("metadata") or {})
        # KubeRay's utils.PodName: the prefix cut to 50 characters, lower-cased
        pod_meta.update(name=f"{prefix[:50]}-{node_type}-{self._random()}".lower(), namespace=meta["namespace"],
                        ownerReferences=[_owner(cluster, "RayCluster")])
        pod_meta["labels"] = {**(pod_meta.get("labels") or {}), CLUSTER_LABEL: meta["name"], NODE_TYPE: node_type,
                              GROUP_LABEL: group, "ray.io/is-ray-node": "yes",
                              "app.kubernetes.io/created-by": "kuberay-operator",
                              "app.kubernetes.io/name": "kuberay"}
        pod_meta["annotations"] = {RUN_FOREVER: "true", **(pod_meta.get("annotations") or {})}
        spec = copy.deepcopy(template.get("spec") or {})
        spec.setdefault("restartPolicy", "Always")
        return self.store.create("pods", {"apiVersion": "v1", "kind": "Pod", "metadata": pod_meta, "spec": spec})

    def _cluster_status(self, cluster: dict[str, Any], pods: list[dict[str, Any]], suspended: bool) -> None:
        spec = cluster.get("spec") or {}
        status = copy.deepcopy(cluster.get("status") or {})
        running = [p for p in pods if (p.get("status") or {}).get("phase") == "Running"]
        workers = [p for p in pods if p["metadata"]["labels"].get(NODE_TYPE) == "worker"]
        ready_workers = [p for p in workers if p in running]
        desired = 0
        totals: dict[str, int] = {}
        for group in spec.get("workerGroupSpecs") or []:
            count = group.get("replicas", 1) * (group.get("numOfHosts", 1) or 1)
            desired += count
            for resource, amount in pod_requests(((group.get("template") or {}).get("spec")) or {}).items():
                totals[resource] = totals.get(resource, 0) + amount * count
        head_spec = ((spec.get("headGroupSpec") or {}).get("template") or {}).get("spec") or {}
        for resource, amount in pod_requests(head_spec).items():
            totals[resource] = totals.get(resource, 0) + amount
        head = next((p for p in pods if p["metadata"]["labels"].get(NODE_TYPE) == "head"), None)
        status.update(desiredWorkerReplicas=desired, readyWorkerReplicas=len(ready_workers),
                      availableWorkerReplicas=len(ready_workers),
                      minWorkerReplicas=sum(g.get("minReplicas", 0) for g in spec.get("workerGroupSpecs") or []),
                      maxWorkerReplicas=sum(g.get("maxReplicas", 0) for g in spec.get("workerGroupSpecs") or []),
                      desiredCPU=format_amount("cpu", totals.get("cpu", 0)),
                      desiredMemory=format_amount("memory", totals.get("memory", 0)),
                      desiredGPU=format_amount("nvidia.com/gpu", totals.get("nvidia.com/gpu", 0)),
                      desiredTPU=format_amount("google.com/tpu", totals.get("google.com/tpu", 0)),
                      observedGeneration=cluster["metadata"].get("generation", 1))
        conditions = status.setdefault("conditions", [])
        head_ready = head is not None and head in running
        set_condition(conditions, "HeadPodReady", "True" if head_ready else "False",
                      "HeadPodRunningAndReady" if head_ready else "HeadPodNotFound" if head is None else "HeadPodPending")
        all_ready = not suspended and head_ready and len(ready_workers) >= desired
        if all_ready:
            set_condition(conditions, "RayClusterProvisioned", "True", "AllPodRunningAndReadyFirstTime",
                          "All Ray Pods are ready for the first time")
            status["state"] = "ready"
            status.setdefault("readyTimestamp", now_ts())
        elif suspended:
            status["state"] = "suspended"
            status.pop("readyTimestamp", None)
        if head is not None:
            status["head"] = {"podName": head["metadata"]["name"],
                              "podIP": (head.get("status") or {}).get("podIP", ""),
                              "serviceName": f"{cluster['metadata']['name']}-head-svc"}
        if status != cluster.get("status"):
            status["lastUpdateTime"] = now_ts()
            self.store.update(CLUSTERS, {**cluster, "status": status}, subresource="status")

    # --- RayJob -------------------------------------------------------------------------------
    def reconcile_rayjob(self, key: Key) -> None:
        job = self.store.get(RAYJOBS, *key)
        if job is None or job["metadata"].get("deletionTimestamp") or not _ours(job):
            return
        ns, name = key
        spec, status = job.get("spec") or {}, copy.deepcopy(job.get("status") or {})
        deployment = status.get("jobDeploymentStatus") or ""
        cluster_name = status.get("rayClusterName") or ""
        cluster = self.store.get(CLUSTERS, ns, cluster_name) if cluster_name else None
        submitter = self.store.get("jobs.batch", ns, name)
        if spec.get("suspend") is True:
            if deployment not in ("Complete", "Failed"):
                self._shut_down(ns, cluster_name, submitter)
                status.update(jobDeploymentStatus="Suspended", jobStatus="", rayClusterName="")
                status.pop("startTime", None)
            self._write_rayjob(job, status)
            return
        if deployment in ("Complete", "Failed"):
            self._after_finish(job, status, cluster_name)
            return
        if (spec.get("submissionMode") or "K8sJobMode") != "K8sJobMode":
            return  # not reproduced (see the module docstring)
        if cluster is None:
            cluster_name = cluster_name or f"{name}-{self._random()}"
            cluster = self.store.create(CLUSTERS, {
                "apiVersion": "ray.io/v1", "kind": "RayCluster",
                "metadata": {"name": cluster_name, "namespace": ns, "ownerReferences": [_owner(job, "RayJob")],
                             "labels": {ORIGIN_KIND: "RayJob", ORIGIN_NAME: name}},
                "spec": copy.deepcopy(spec.get("rayClusterSpec") or {})})
            self.rayjob_of[(ns, cluster_name)] = key
            status.update(jobDeploymentStatus="Initializing", rayClusterName=cluster_name,
                          jobId=status.get("jobId") or f"{name}-{self._random()}", startTime=now_ts())
        self.rayjob_of[(ns, cluster_name)] = key
        status["rayClusterStatus"] = copy.deepcopy(cluster.get("status") or {})
        if (cluster.get("status") or {}).get("state") == "ready" and submitter is None:
            submitter = self._create_submitter(job)
            status.update(jobDeploymentStatus="Running", jobStatus="PENDING")
        if submitter is not None:
            self.rayjob_of[(ns, name)] = key
            conditions = (submitter.get("status") or {}).get("conditions") or []
            done = {c.get("type") for c in conditions if c.get("status") == "True"}
            if (submitter.get("status") or {}).get("active") and status.get("jobStatus") == "PENDING":
                status["jobStatus"] = "RUNNING"
            if "Complete" in done:
                status.update(jobStatus="SUCCEEDED", jobDeploymentStatus="Complete", endTime=now_ts(),
                              message="Job finished successfully.")
            elif "Failed" in done:
                status.update(jobStatus="FAILED", jobDeploymentStatus="Failed", endTime=now_ts(), reason="AppFailed",
                              message=f"Job {status.get('jobId', '')} failed: the submitter Job failed")
        self._write_rayjob(job, status)

    def _create_submitter(self, job: Mapping[str, Any]) -> dict[str, Any]:
        meta, spec = job["metadata"], job.get("spec") or {}
        template = copy.deepcopy(spec.get("submitterPodTemplate") or {})
        if not template:
            head = (((spec.get("rayClusterSpec") or {}).get("headGroupSpec") or {}).get("template") or {})
            image = ((head.get("spec") or {}).get("containers") or [{}])[0].get("image", "")
            template = {"spec": {"restartPolicy": "Never", "containers": [{
                "name": SUBMITTER, "image": image,
                "command": ["ray", "job", "submit", "--address", "http://127.0.0.1:8265", "--", "bash", "-c",
                            str(spec.get("entrypoint") or "")],
                "resources": {"requests": {"cpu": "500m", "memory": "200Mi"},
                              "limits": {"cpu": "1", "memory": "1Gi"}}}]}}
        template.setdefault("spec", {}).setdefault("restartPolicy", "Never")
        sim = {k: v for k, v in (meta.get("annotations") or {}).items() if k.startswith("kubesim.mkd.dev/")}
        tmeta = template.setdefault("metadata", {})
        tmeta["annotations"] = {**sim, **(tmeta.get("annotations") or {})}
        tmeta["labels"] = {**(tmeta.get("labels") or {}), ORIGIN_KIND: "RayJob", ORIGIN_NAME: meta["name"]}
        return self.store.create("jobs.batch", {
            "apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": meta["name"], "namespace": meta["namespace"], "ownerReferences": [_owner(job, "RayJob")],
                         "labels": {ORIGIN_KIND: "RayJob", ORIGIN_NAME: meta["name"],
                                    "app.kubernetes.io/created-by": "kuberay-operator"}},
            "spec": {"backoffLimit": 2, "template": template}})

    def _shut_down(self, ns: str, cluster_name: str, submitter: Mapping[str, Any] | None) -> None:
        if cluster_name and self.store.get(CLUSTERS, ns, cluster_name) is not None:
            self.store.delete(CLUSTERS, ns, cluster_name)
        if submitter is not None:
            self.store.delete("jobs.batch", ns, submitter["metadata"]["name"])

    def _after_finish(self, job: dict[str, Any], status: dict[str, Any], cluster_name: str) -> None:
        spec = job.get("spec") or {}
        if spec.get("shutdownAfterJobFinishes") is not True or not cluster_name:
            return
        ttl = int(spec.get("ttlSecondsAfterFinished") or 0)
        key = key_of(job)
        if ttl > 0 and key not in self.timers:
            self.timers[key] = self.loop.call_later(ttl, self._expire, key)
            return
        if ttl <= 0:
            self._expire(key)

    def _expire(self, key: Key) -> None:
        self.timers.pop(key, None)
        job = self.store.get(RAYJOBS, *key)
        if job is None:
            return
        name = (job.get("status") or {}).get("rayClusterName") or ""
        if name and self.store.get(CLUSTERS, key[0], name) is not None:
            self.store.delete(CLUSTERS, key[0], name)

    def _write_rayjob(self, job: dict[str, Any], status: dict[str, Any]) -> None:
        if status == (job.get("status") or {}):
            return
        status["observedGeneration"] = job["metadata"].get("generation", 1)
        try:
            self.store.update(RAYJOBS, {**job, "status": status}, subresource="status")
        except Exception as exc:  # a conflict: the next event reconciles again
            log.debug("kuberay: status of %s: %s", job["metadata"]["name"], exc)
            self._mark((RAYJOBS, key_of(job)))
