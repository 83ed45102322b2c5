"""A small stand-in for KubeRay's RayService controller (ray.io/v1), for tests and the demo.

A RayService whose managedBy is unset or ``ray.io/kuberay-operator`` (KubeRay 1.6 and later) gets a RayCluster
``<service>-<5>`` from ``rayClusterConfig``, owned by it and labelled ``ray.io/originated-from-crd:
RayService``; kubesim's RayCluster stand-in runs its pods. While that cluster is not ready it is the
``pendingServiceStatus`` cluster; once it is, it becomes the ``activeServiceStatus`` one, with the cluster's
status and, per application of ``serveConfigV2``, ``RUNNING`` with its deployments ``HEALTHY``.
``numServeEndpoints`` counts the cluster's running Ray pods (the head's unless ``excludeHeadPodFromServeSvc``),
and the conditions are KubeRay's: ``Ready`` (``Initializing``, then ``NonZeroServeEndpoints`` or
``ZeroServeEndpoints``) and ``UpgradeInProgress`` (``Initializing``, then ``NoPendingCluster``);
``serviceStatus`` is ``Running`` while ``Ready`` is True. A changed ``rayClusterConfig`` (its ``suspend``, which
is where Kueue suspends a RayService, included) is written into the cluster in place. What the real operator
does and this does not: the Serve application deployment through the dashboard (applications are RUNNING
once the cluster is ready), the serve Services and their endpoints (the pods are counted), zero-downtime
upgrades through a pending cluster, ``spec.suspend``, the initializing timeout and Gateway traffic shifting.
"""

from __future__ import annotations

import copy
import string
from collections.abc import Mapping
from typing import Any

import yaml

from kubesim.sim.common import Batched, Key, key_of, log, now_ts, set_condition
from kubesim.sim.kuberay import CLUSTER_LABEL, CLUSTERS, KUBERAY, NODE_TYPE, ORIGIN_KIND, ORIGIN_NAME

SERVICES = "rayservices.ray.io"
RESOURCES = frozenset({SERVICES})


def _ours(obj: Mapping[str, Any]) -> bool:
    return (obj.get("spec") or {}).get("managedBy") in (None, KUBERAY)


def _applications(config: Any) -> dict[str, Any]:
    """``applicationStatuses`` of a served ``serveConfigV2``: every application RUNNING, its deployments HEALTHY."""
    try:
        parsed = yaml.safe_load(config) if isinstance(config, str) else None
    except yaml.YAMLError:
        return {}
    out: dict[str, Any] = {}
    apps = parsed.get("applications") if isinstance(parsed, dict) else None
    for app in apps if isinstance(apps, list) else []:
        if isinstance(app, dict) and app.get("name"):
            deployments = {str(d["name"]): {"status": "HEALTHY"} for d in app.get("deployments") or []
                           if isinstance(d, dict) and d.get("name")}
            out[str(app["name"])] = {"status": "RUNNING", "serveDeploymentStatuses": deployments}
    return out


class RayServiceController(Batched[Key]):
    """The RayService stand-in of one cluster; fed by the Simulation's store subscription."""

    name = "rayservice"

    def on_change(self, event: str, res: str, obj: Mapping[str, Any]) -> None:
        if res == SERVICES:
            if event != "DELETED":
                self._mark(key_of(obj))
        elif res == CLUSTERS:
            labels = (obj.get("metadata") or {}).get("labels") or {}
            if labels.get(ORIGIN_KIND) == "RayService" and labels.get(ORIGIN_NAME):
                self._mark((key_of(obj)[0], labels[ORIGIN_NAME]))

    def reconcile(self, key: Key) -> None:
        service = self.store.get(SERVICES, *key)
        if service is None or service["metadata"].get("deletionTimestamp") or not _ours(service):
            return
        ns, name = key
        spec, status = service.get("spec") or {}, copy.deepcopy(service.get("status") or {})
        active, pending = status.get("activeServiceStatus") or {}, status.get("pendingServiceStatus") or {}
        cluster_name = active.get("rayClusterName") or pending.get("rayClusterName") or ""
        cluster = self.store.get(CLUSTERS, ns, cluster_name) if cluster_name else None
        wanted = copy.deepcopy(spec.get("rayClusterConfig") or {})
        if cluster is None:
            cluster_name = f"{name}-{self._random()}"
            meta = service["metadata"]
            cluster = self.store.create(CLUSTERS, {
                "apiVersion": "ray.io/v1", "kind": "RayCluster",
                "metadata": {"name": cluster_name, "namespace": ns,
                             "labels": {ORIGIN_KIND: "RayService", ORIGIN_NAME: name},
                             "ownerReferences": [{"apiVersion": "ray.io/v1", "kind": "RayService", "name": name,
                                                  "uid": meta["uid"], "controller": True,
                                                  "blockOwnerDeletion": True}]},
                "spec": wanted})
            active, pending = {}, {"rayClusterName": cluster_name}
        elif cluster.get("spec") != wanted:
            cluster = self.store.update(CLUSTERS, {**cluster, "spec": wanted})
        cluster_status = copy.deepcopy(cluster.get("status") or {})
        if cluster_status.get("state") == "ready":
            active = {"rayClusterName": cluster_name, "rayClusterStatus": cluster_status,
                      "applicationStatuses": _applications(spec.get("serveConfigV2"))}
            pending = {}
        elif active:
            active = {**active, "rayClusterStatus": cluster_status}
        else:
            pending = {"rayClusterName": cluster_name, "rayClusterStatus": cluster_status}
        status["activeServiceStatus"], status["pendingServiceStatus"] = active, pending
        status["numServeEndpoints"] = self._endpoints(ns, active.get("rayClusterName"),
                                                      bool(spec.get("excludeHeadPodFromServeSvc")))
        status["observedGeneration"] = service["metadata"].get("generation", 1)
        self._conditions(status)
        self._write(service, status)

    def _endpoints(self, ns: str, cluster: str | None, exclude_head: bool) -> int:
        if not cluster:
            return 0
        pods = self.store.list("pods", ns, label_selector=f"{CLUSTER_LABEL}={cluster}")
        return sum(1 for p in pods if (p.get("status") or {}).get("phase") == "Running"
                   and not p["metadata"].get("deletionTimestamp")
                   and not (exclude_head and p["metadata"]["labels"].get(NODE_TYPE) == "head"))

    @staticmethod
    def _conditions(status: dict[str, Any]) -> None:
        conditions = status.setdefault("conditions", [])
        if not conditions:
            for ctype in ("Ready", "UpgradeInProgress"):
                set_condition(conditions, ctype, "False", "Initializing", "RayService is initializing")
        ready = next(c for c in conditions if c["type"] == "Ready")
        if status["numServeEndpoints"] > 0:
            set_condition(conditions, "Ready", "True", "NonZeroServeEndpoints",
                          "Number of serve endpoints is greater than 0")
        elif ready["status"] == "True":
            set_condition(conditions, "Ready", "False", "ZeroServeEndpoints", "Number of serve endpoints dropped to 0")
        if status["activeServiceStatus"]:
            set_condition(conditions, "UpgradeInProgress", "False", "NoPendingCluster",
                          "Active Ray cluster exists and no pending Ray cluster")
        for condition in conditions:
            condition["observedGeneration"] = status.get("observedGeneration", 0)
        if ready["status"] == "True":
            status["serviceStatus"] = "Running"
        else:
            status.pop("serviceStatus", None)  # NotRunning is "" (omitted)

    def _random(self) -> str:
        return "".join(self.store.rng.choice(string.ascii_lowercase + string.digits) for _ in range(5))

    def _write(self, service: dict[str, Any], status: dict[str, Any]) -> None:
        before = service.get("status") or {}
        if {k: v for k, v in status.items() if k != "lastUpdateTime"} == {
                k: v for k, v in before.items() if k != "lastUpdateTime"}:
            return
        status["lastUpdateTime"] = now_ts()
        try:
            self.store.update(SERVICES, {**service, "status": status}, subresource="status")
        except Exception as exc:  # a conflict: the next event reconciles again
            log.debug("kuberay: status of RayService %s: %s", service["metadata"]["name"], exc)
            self._mark(key_of(service))
