"""Stand-ins for Kueue and for MultiKueue's check controller on a kubesim manager, for the Kueue-mode tests.

:class:`KueueStandIn` does for batch Jobs labelled with a LocalQueue what Kueue v0.19.2's job reconciler,
workload controller and scheduler do, writing each Workload status as ``tests/fixtures/kueue_v0192_admission_check.json``
recorded them (the conditions' types, statuses, reasons and messages are taken from the recording): it creates
the Workload (owned by its Job), keeps its ``status.admissionChecks`` in line with its ClusterQueue's checks
(``reconcileSyncAdmissionChecks``: new ones Pending, dropped ones removed), reserves quota while the
ClusterQueue is not held (quota itself is not counted: every Workload fits), admits once every check is
Ready and then unsuspends the Job, evicts on Retry (checks reset to Pending) or deactivates on Rejected,
suspends the Job, releases the quota once it is suspended and requeues it, and finishes the Workload when
the Job's status says it ended. :class:`MultiKueueStandIn` serves the checks whose controllerName is MultiKueue's as MultiKueue's workload
controller does (``pkg/controller/admissioncheck/multikueue/workload.go``): only Workloads carrying such a
check, once quota is reserved and every other check is Ready; it "runs" the Job on a cluster of its own
(writes a Running, then a finished status onto the manager Job as MultiKueue copies its remote Job's) and
remembers every Job it ran.
"""

from __future__ import annotations

import asyncio
import copy
import json
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from federation.errors import FederationError
from federation.kube import Kube, Resource

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "kueue_v0192_admission_check.json"
JOBS = Resource("batch", "v1", "jobs", "Job")
WORKLOADS = Resource("kueue.x-k8s.io", "v1beta2", "workloads", "Workload")
CLUSTER_QUEUES = Resource("kueue.x-k8s.io", "v1beta2", "clusterqueues", "ClusterQueue", namespaced=False)
LOCAL_QUEUES = Resource("kueue.x-k8s.io", "v1beta2", "localqueues", "LocalQueue")
ADMISSION_CHECKS = Resource("kueue.x-k8s.io", "v1beta2", "admissionchecks", "AdmissionCheck", namespaced=False)
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"


def recorded() -> dict[str, dict[str, Any]]:
    """The recorded Workloads by step name."""
    doc = json.loads(FIXTURE.read_text())
    return {s["step"]: s["workload"] for s in doc["steps"]}


def checks_message(checks: list[dict[str, Any]], state: str) -> str:
    """pkg/controller/core/workload_controller.go buildAdmissionChecksMessage."""
    parts = [f'"{c["name"]}" ({c["message"]})' if c.get("message") else f'"{c["name"]}"' for c in checks]
    noun = "AdmissionChecks" if len(checks) > 1 else "AdmissionCheck"
    return f"{noun} in {state} state: {'; '.join(parts)}"


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _cond(step: dict[str, Any], type_: str) -> dict[str, Any]:
    return copy.deepcopy(next(c for c in step["status"]["conditions"] if c["type"] == type_))


def _set(conds: list[dict[str, Any]], new: dict[str, Any]) -> None:
    """apimeta.SetStatusCondition: the transition time moves only when the status does."""
    for c in conds:
        if c["type"] == new["type"]:
            if c["status"] != new["status"]:
                c["lastTransitionTime"] = new["lastTransitionTime"]
            c.update({k: v for k, v in new.items() if k != "lastTransitionTime"})
            return
    conds.append(new)


def _true(obj: dict[str, Any], type_: str) -> bool:
    return any(c["type"] == type_ and c["status"] == "True" for c in (obj.get("status") or {}).get("conditions", []))


class KueueStandIn:
    """See the module docstring; ``namespace``: where its Jobs are."""

    def __init__(self, kube: Kube, namespace: str) -> None:
        self.kube = kube
        self.namespace = namespace
        self.steps = recorded()
        self.admitted: Counter[str] = Counter()
        """Job name → times its Workload was admitted."""

    def _like(self, step: str, type_: str, **subst: str) -> dict[str, Any]:
        c = _cond(self.steps[step], type_)
        for old, new in subst.items():
            c["message"] = c["message"].replace(old, new)
        c["lastTransitionTime"] = now()
        c.pop("observedGeneration", None)
        return c

    async def run(self) -> None:
        while True:
            try:
                await self.step()
            except FederationError:
                pass  # a conflict: the next round sees the newer version
            await asyncio.sleep(0.2)

    async def step(self) -> None:
        cqs = {o["metadata"]["name"]: o for o in (await self.kube.list(CLUSTER_QUEUES)).items}
        lqs = {o["metadata"]["name"]: o["spec"]["clusterQueue"]
               for o in (await self.kube.list(LOCAL_QUEUES, self.namespace)).items}
        wls = {o["metadata"]["ownerReferences"][0]["uid"]: o
               for o in (await self.kube.list(WORKLOADS, self.namespace)).items}
        for job in (await self.kube.list(JOBS, self.namespace)).items:
            queue = (job["metadata"].get("labels") or {}).get(QUEUE_LABEL)
            cq = cqs.get(lqs.get(queue or "", ""))
            if cq is None:
                continue
            wl = wls.get(job["metadata"]["uid"])
            if wl is None:
                await self._create(job, queue or "")
                continue
            await self._reconcile(job, wl, cq)

    async def _create(self, job: dict[str, Any], queue: str) -> None:
        md = job["metadata"]
        template = job["spec"]["template"]
        body = {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
                "metadata": {"name": f"job-{md['name']}-{md['uid'][:5]}", "namespace": self.namespace,
                             "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": md["name"],
                                                  "uid": md["uid"], "controller": True,
                                                  "blockOwnerDeletion": True}]},
                "spec": {"queueName": queue, "active": True,
                         "podSets": [{"name": "main", "count": job["spec"].get("parallelism", 1),
                                      "template": template}]}}
        await self.kube.create(WORKLOADS, body, self.namespace)

    async def _write(self, wl: dict[str, Any]) -> None:
        await self.kube.replace(WORKLOADS, wl, self.namespace, subresource="status")

    async def _suspend(self, job: dict[str, Any], value: bool) -> None:
        if bool(job["spec"].get("suspend")) != value:
            await self.kube.patch(JOBS, job["metadata"]["name"], {"spec": {"suspend": value}}, self.namespace)

    async def _reconcile(self, job: dict[str, Any], wl: dict[str, Any], cq: dict[str, Any]) -> None:
        wl = copy.deepcopy(wl)
        status = wl.setdefault("status", {})
        conds = status.setdefault("conditions", [])
        name = job["metadata"]["name"]
        if _true(wl, "Finished"):
            return
        # reconcileSyncAdmissionChecks: the ClusterQueue's checks, new ones Pending, dropped ones removed
        wanted = [r["name"] for r in (cq["spec"].get("admissionChecksStrategy") or {}).get("admissionChecks") or []]
        have = {c["name"]: c for c in status.get("admissionChecks") or []}
        synced = sorted(([have[n] if n in have else {"name": n, "state": "Pending", "message": "",
                                                    "lastTransitionTime": now()} for n in wanted]),
                        key=lambda c: c["name"])
        if synced != (status.get("admissionChecks") or []):
            status["admissionChecks"] = synced
            await self._write(wl)
            return
        job_conds = {c["type"] for c in (job.get("status") or {}).get("conditions") or [] if c["status"] == "True"}
        if job_conds & {"Complete", "Failed"}:
            reason = "Succeeded" if "Complete" in job_conds else "Failed"
            fin = self._like("finished", "Finished")
            fin["reason"] = reason
            _set(conds, fin)
            await self._write(wl)
            return
        reserved = "admission" in status and _true(wl, "QuotaReserved")
        checks = status.get("admissionChecks") or []
        if reserved and _true(wl, "Evicted"):
            if job["spec"].get("suspend"):  # the job reconciler releases the quota once the Job is stopped
                template = self.steps["requeued"]["status"]
                status.pop("admission", None)
                ev = next(x for x in conds if x["type"] == "Evicted")
                for type_ in ("QuotaReserved", "Admitted", "Requeued"):
                    c = {**next(x for x in template["conditions"] if x["type"] == type_), "lastTransitionTime": now()}
                    c.pop("observedGeneration", None)
                    if type_ == "QuotaReserved":  # the eviction's message
                        c["message"] = ev["message"]
                    _set(conds, c)
                await self._write(wl)
            else:
                await self._suspend(job, True)
            return
        if reserved and any(c["state"] in ("Retry", "Rejected") for c in checks):
            rejected = any(c["state"] == "Rejected" for c in checks)
            template = self.steps["rejected_deactivated" if rejected else "evicted_by_retry"]
            ev = {**_cond(template, "Evicted"), "lastTransitionTime": now()}
            ev.pop("observedGeneration", None)
            retry = sorted((c for c in checks if c["state"] == "Retry"), key=lambda c: c["name"])
            ev["message"] = "Evicted due to " + checks_message(retry, "Retry")
            if rejected:
                wl_spec = {"spec": {"active": False}}
                await self.kube.patch(WORKLOADS, wl["metadata"]["name"], wl_spec, self.namespace)
                return  # the next round evicts the deactivated Workload
            by_retry = {c["name"]: c for c in template["status"]["admissionChecks"]}
            for c in checks:  # resetChecksOnEviction
                if c["state"] != "Pending":
                    prev = c["state"]
                    c.update(state="Pending", lastTransitionTime=now(),
                             message=by_retry.get(c["name"], {}).get("message", "").replace("Retry", prev)
                             or f"Reset to Pending after eviction. Previously: {prev}")
            _set(conds, ev)
            await self._write(wl)
            return
        if reserved and wl["spec"].get("active") is False and not _true(wl, "Evicted"):
            ev = {**_cond(self.steps["rejected_deactivated"], "Evicted"), "lastTransitionTime": now()}
            ev.pop("observedGeneration", None)
            _set(conds, ev)
            await self._write(wl)
            return
        if not reserved:
            if (cq["spec"].get("stopPolicy") or "None") != "None" or wl["spec"].get("active") is False:
                return
            if _true(wl, "Evicted"):  # requeued: the eviction condition turns False when admitted again
                pass
            flavor = cq["spec"]["resourceGroups"][0]["flavors"][0]["name"]
            step = self.steps["quota_reserved"]
            admission = copy.deepcopy(step["status"]["admission"])
            admission["clusterQueue"] = cq["metadata"]["name"]
            for a in admission["podSetAssignments"]:
                a["flavors"] = {r: flavor for r in a["flavors"]}
                a["count"] = wl["spec"]["podSets"][0]["count"]
            status["admission"] = admission
            _set(conds, self._like("quota_reserved", "QuotaReserved", **{"cq-mkd": cq["metadata"]["name"]}))
            if _true(wl, "Evicted"):
                ev = next(x for x in conds if x["type"] == "Evicted")
                ev.update(status="False", reason="QuotaReserved", lastTransitionTime=now(),
                          message=f"Previously: {ev['message']}")
            await self._write(wl)
            return
        if all(c["state"] == "Ready" for c in checks) and not _true(wl, "Admitted"):
            _set(conds, self._like("admitted", "Admitted"))
            await self._write(wl)
            self.admitted[name] += 1
            return
        if _true(wl, "Admitted"):
            await self._suspend(job, False)


class MultiKueueStandIn:
    """See the module docstring."""

    def __init__(self, kube: Kube, namespace: str, cluster: str = "mk-worker") -> None:
        self.kube = kube
        self.namespace = namespace
        self.cluster = cluster
        self.ran: Counter[str] = Counter()
        """Job name → times MultiKueue dispatched it."""
        self.finish = True

    async def run(self) -> None:
        while True:
            try:
                await self.step()
            except FederationError:
                pass
            await asyncio.sleep(0.2)

    async def step(self) -> None:
        controllers = {o["metadata"]["name"]: o["spec"]["controllerName"]
                       for o in (await self.kube.list(ADMISSION_CHECKS)).items}
        jobs = {o["metadata"]["uid"]: o for o in (await self.kube.list(JOBS, self.namespace)).items}
        for wl in (await self.kube.list(WORKLOADS, self.namespace)).items:
            status = wl.get("status") or {}
            checks = status.get("admissionChecks") or []
            mine = next((c for c in checks if controllers.get(c["name"]) == "kueue.x-k8s.io/multikueue"), None)
            job = jobs.get(wl["metadata"]["ownerReferences"][0]["uid"])
            if mine is None or job is None or mine["state"] == "Rejected" or _true(wl, "Finished"):
                continue  # workload.go: a Workload without MultiKueue's check is skipped
            reserved = "admission" in status and _true(wl, "QuotaReserved")
            others_ready = all(c["state"] == "Ready" for c in checks if c is not mine)
            if reserved and mine["state"] == "Pending" and others_ready:
                wl = copy.deepcopy(wl)
                mine = next(c for c in wl["status"]["admissionChecks"] if c["name"] == mine["name"])
                mine.update(state="Ready", lastTransitionTime=now(),
                            message=f'The workload got reservation on "{self.cluster}", Previously: "Pending"')
                wl["status"]["clusterName"] = self.cluster
                await self.kube.replace(WORKLOADS, wl, self.namespace, subresource="status")
                self.ran[job["metadata"]["name"]] += 1
                continue
            if reserved and mine["state"] == "Ready" and _true(wl, "Admitted"):
                await self._mirror(job)

    async def _mirror(self, job: dict[str, Any]) -> None:
        """The remote Job's status copied onto the manager Job: Running, then (``finish``) Complete."""
        status = job.get("status") or {}
        if "Complete" in {c["type"] for c in status.get("conditions") or []}:
            return
        t = now()
        if not status.get("startTime"):
            new = {"startTime": t, "active": 1, "ready": 1}
        elif self.finish:
            new = {"startTime": status["startTime"], "completionTime": t, "succeeded": 1, "active": 0, "ready": 0,
                   "conditions": [{"type": "SuccessCriteriaMet", "status": "True", "reason": "CompletionsReached",
                                   "message": "Reached expected number of succeeded pods",
                                   "lastProbeTime": t, "lastTransitionTime": t},
                                  {"type": "Complete", "status": "True", "reason": "CompletionsReached",
                                   "message": "Reached expected number of succeeded pods",
                                   "lastProbeTime": t, "lastTransitionTime": t}]}
        else:
            return
        await self.kube.replace(JOBS, {**job, "status": new}, self.namespace, subresource="status")
