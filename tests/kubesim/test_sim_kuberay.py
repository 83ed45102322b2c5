"""The simulated KubeRay (RayCluster and RayJob) seen through the official client: pods per group, KubeRay's
status fields, the submitter Job, Complete / Failed, shutdownAfterJobFinishes, suspend, managedBy."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config

import kubesim
from federation.kinds.crds import load_crds
from kubesim import ClusterSpec, KubeletSpec, NodeSpec
from kubesim.testing import eventually
from tests.kubesim.test_api_printing import get_table

pytestmark = pytest.mark.kubesim_only("drives kubesim's stand-in for KubeRay (kubesim.mkd.dev/* annotations)")

NS = "default"


@contextmanager
def cluster(tmp_path: Path) -> Iterator[client.ApiClient]:
    spec = ClusterSpec("r", [NodeSpec("node-1", cpu="32", memory="64Gi")],
                       kubelet=KubeletSpec(start_seconds=0.02, run_seconds=0.2))
    with kubesim.serve([spec], tmp_path) as sim:
        api = config.new_client_from_config(config_file=str(sim.kubeconfig("r")))
        ext = client.ApiextensionsV1Api(api)
        for crd in load_crds():
            if crd["spec"]["group"] == "ray.io":
                ext.create_custom_resource_definition(crd)
        try:
            yield api
        finally:
            api.close()


def ray_spec() -> dict[str, Any]:
    pod = {"spec": {"containers": [{"name": "ray", "image": "rayproject/ray:2.46.0",
                                    "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}]}}
    return {"headGroupSpec": {"rayStartParams": {}, "template": pod},
            "workerGroupSpecs": [{"groupName": "small", "replicas": 2, "template": pod}]}


def rayjob(name: str, annotations: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "ray.io/v1", "kind": "RayJob",
            "metadata": {"name": name, "annotations": annotations or {}},
            "spec": {"entrypoint": "python -c 'print(1)'", "shutdownAfterJobFinishes": True,
                     "rayClusterSpec": ray_spec(), **spec}}


def get(api: client.ApiClient, plural: str, name: str) -> dict[str, Any]:
    out: dict[str, Any] = client.CustomObjectsApi(api).get_namespaced_custom_object("ray.io", "v1", NS, plural, name)
    return out


def pods(api: client.ApiClient, cluster: str) -> list[Any]:
    return list(client.CoreV1Api(api).list_namespaced_pod(NS, label_selector=f"ray.io/cluster={cluster}").items)


def test_raycluster_pods_and_status(tmp_path: Path) -> None:
    with cluster(tmp_path) as api:
        client.CustomObjectsApi(api).create_namespaced_custom_object(
            "ray.io", "v1", NS, "rayclusters",
            {"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": "c1"}, "spec": ray_spec()})
        status = eventually(lambda: (s := get(api, "rayclusters", "c1").get("status") or {}).get("state") == "ready"
                            and s, what="RayCluster ready")
        assert (status["desiredWorkerReplicas"], status["availableWorkerReplicas"]) == (2, 2)
        assert (status["desiredCPU"], status["desiredMemory"]) == ("3", "3Gi")
        names = sorted(p.metadata.labels["ray.io/node-type"] for p in pods(api, "c1"))
        assert names == ["head", "worker", "worker"]
        assert status["head"]["podName"].startswith("c1-head-")
        assert any(c["type"] == "HeadPodReady" and c["status"] == "True" for c in status["conditions"])


def test_rayjob_runs_its_cluster_and_submitter_and_shuts_down(tmp_path: Path) -> None:
    with cluster(tmp_path) as api:
        objs = client.CustomObjectsApi(api)
        objs.create_namespaced_custom_object("ray.io", "v1", NS, "rayjobs",
                                             rayjob("ok", {"kubesim.mkd.dev/run-seconds": "0.3"}))
        objs.create_namespaced_custom_object("ray.io", "v1", NS, "rayjobs",
                                             rayjob("bad", {"kubesim.mkd.dev/exit-code": "3"},
                                                    submitterPodTemplate={"spec": {"containers": [
                                                        {"name": "submit", "image": "rayproject/ray:2.46.0"}]}}))
        done = eventually(lambda: (s := get(api, "rayjobs", "ok").get("status") or {})
                          .get("jobDeploymentStatus") == "Complete" and s, timeout=20, what="RayJob Complete")
        assert done["jobStatus"] == "SUCCEEDED" and done["rayClusterName"].startswith("ok-")
        assert done["startTime"] and done["endTime"] and done["jobId"].startswith("ok-")
        assert client.BatchV1Api(api).read_namespaced_job("ok", NS).metadata.owner_references[0].kind == "RayJob"
        eventually(lambda: not pods(api, done["rayClusterName"]) or None, timeout=10, what="cluster deleted")
        failed = eventually(lambda: (s := get(api, "rayjobs", "bad").get("status") or {})
                            .get("jobDeploymentStatus") == "Failed" and s, timeout=30, what="RayJob Failed")
        assert (failed["jobStatus"], failed["reason"]) == ("FAILED", "AppFailed")


def test_rayjob_managed_elsewhere_or_suspended_is_left_alone(tmp_path: Path) -> None:
    with cluster(tmp_path) as api:
        objs = client.CustomObjectsApi(api)
        objs.create_namespaced_custom_object("ray.io", "v1", NS, "rayjobs",
                                             rayjob("mk", managedBy="kueue.x-k8s.io/multikueue"))
        objs.create_namespaced_custom_object("ray.io", "v1", NS, "rayjobs", rayjob("held", suspend=True))
        held = eventually(lambda: (s := get(api, "rayjobs", "held").get("status") or {})
                          .get("jobDeploymentStatus") == "Suspended" and s, what="Suspended")
        assert not held.get("rayClusterName")
        assert "status" not in get(api, "rayjobs", "mk")
        assert objs.list_namespaced_custom_object("ray.io", "v1", NS, "rayclusters")["items"] == []


def rayservice(name: str, **spec: Any) -> dict[str, Any]:
    config = "applications:\n- name: fruit\n  import_path: fruit.app\n  deployments:\n  - name: MangoStand\n"
    return {"apiVersion": "ray.io/v1", "kind": "RayService", "metadata": {"name": name},
            "spec": {"serveConfigV2": config, "rayClusterConfig": ray_spec(), **spec}}


def test_a_rayservice_serves_on_its_cluster_with_kuberays_status(tmp_path: Path) -> None:
    with cluster(tmp_path) as api:
        crs = client.CustomObjectsApi(api)
        crs.create_namespaced_custom_object("ray.io", "v1", NS, "rayservices", rayservice("serve"))

        def ready() -> dict[str, Any] | None:
            obj: dict[str, Any] = crs.get_namespaced_custom_object("ray.io", "v1", NS, "rayservices", "serve")
            return obj if (obj.get("status") or {}).get("serviceStatus") == "Running" else None

        status = eventually(ready, timeout=10)["status"]
        active = status["activeServiceStatus"]
        assert active["rayClusterName"].startswith("serve-") and status["pendingServiceStatus"] == {}
        assert active["applicationStatuses"] == {
            "fruit": {"status": "RUNNING", "serveDeploymentStatuses": {"MangoStand": {"status": "HEALTHY"}}}}
        assert active["rayClusterStatus"]["state"] == "ready"
        assert status["numServeEndpoints"] == 3  # the head and two workers
        conditions = {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}
        assert conditions == {"Ready": ("True", "NonZeroServeEndpoints"),
                              "UpgradeInProgress": ("False", "NoPendingCluster")}
        table = get_table(api, f"/apis/ray.io/v1/namespaces/{NS}/rayservices")  # kubectl get rayservices
        assert [c["name"] for c in table["columnDefinitions"]] == ["Name", "service status", "num serve endpoints"]
        assert table["rows"][0]["cells"][:2] == ["serve", "Running"]
        owned = crs.get_namespaced_custom_object("ray.io", "v1", NS, "rayclusters", active["rayClusterName"])
        assert owned["metadata"]["labels"]["ray.io/originated-from-crd"] == "RayService"

        # Kueue suspends a RayService in its cluster config: the pods go, the endpoints drop to zero
        crs.patch_namespaced_custom_object("ray.io", "v1", NS, "rayservices", "serve",
                                           {"spec": {"rayClusterConfig": {"suspend": True}}})

        def stopped() -> dict[str, Any] | None:
            obj: dict[str, Any] = crs.get_namespaced_custom_object("ray.io", "v1", NS, "rayservices", "serve")
            return obj if obj["status"].get("numServeEndpoints") == 0 else None

        status = eventually(stopped, timeout=10)["status"]
        assert "serviceStatus" not in status
        assert {c["type"]: c["reason"] for c in status["conditions"]}["Ready"] == "ZeroServeEndpoints"


def test_a_rayservice_managed_by_multikueue_is_left_alone(tmp_path: Path) -> None:
    with cluster(tmp_path) as api:
        crs = client.CustomObjectsApi(api)
        crs.create_namespaced_custom_object("ray.io", "v1", NS, "rayservices",
                                            rayservice("elsewhere", managedBy="kueue.x-k8s.io/multikueue"))
        with pytest.raises(AssertionError):
            eventually(lambda: crs.list_namespaced_custom_object("ray.io", "v1", NS, "rayclusters")["items"] or None,
                       timeout=1)
