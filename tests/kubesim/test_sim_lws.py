"""The simulated LeaderWorkerSet controller seen through the official client: a leader and size − 1 workers per
group with LWS's names and labels, LWS's status fields and conditions, scaling down, and a cluster without it."""

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

pytestmark = pytest.mark.kubesim_only("drives kubesim's stand-in for LWS's controller")

NS = "default"
GROUP, VERSION, PLURAL = "leaderworkerset.x-k8s.io", "v1", "leaderworkersets"


@contextmanager
def cluster(tmp_path: Path, without: tuple[str, ...] = ()) -> Iterator[client.ApiClient]:
    spec = ClusterSpec("l", [NodeSpec("node-1", cpu="32", memory="64Gi")],
                       kubelet=KubeletSpec(start_seconds=0.02, run_seconds=0.2), without=without)
    with kubesim.serve([spec], tmp_path) as sim:
        api = config.new_client_from_config(config_file=str(sim.kubeconfig("l")))
        ext = client.ApiextensionsV1Api(api)
        for crd in load_crds():
            if crd["spec"]["group"] == GROUP:
                ext.create_custom_resource_definition(crd)
        try:
            yield api
        finally:
            api.close()


def lws(name: str, replicas: int, size: int) -> dict[str, Any]:
    pod = {"spec": {"containers": [{"name": "vllm", "image": "vllm/vllm-openai:v0.9",
                                    "resources": {"requests": {"cpu": "500m"}}}]}}
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "LeaderWorkerSet", "metadata": {"name": name},
            "spec": {"replicas": replicas, "leaderWorkerTemplate": {"size": size, "workerTemplate": pod}}}


def test_groups_of_pods_status_and_scaling(tmp_path: Path) -> None:
    with cluster(tmp_path) as api:
        crs, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
        created = crs.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, lws("serve", 2, 3))
        assert created["spec"]["startupPolicy"] == "LeaderCreated"  # the CRD's defaults
        assert created["spec"]["leaderWorkerTemplate"]["restartPolicy"] == "RecreateGroupOnPodRestart"

        def available() -> dict[str, Any] | None:
            obj: dict[str, Any] = crs.get_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "serve")
            return obj if (obj.get("status") or {}).get("readyReplicas") == 2 else None

        obj = eventually(available, timeout=10)
        pods = core.list_namespaced_pod(NS, label_selector="leaderworkerset.sigs.k8s.io/name=serve").items
        assert sorted(p.metadata.name for p in pods) == ["serve-0", "serve-0-1", "serve-0-2",
                                                         "serve-1", "serve-1-1", "serve-1-2"]
        worker = next(p for p in pods if p.metadata.name == "serve-1-2")
        assert worker.metadata.labels["leaderworkerset.sigs.k8s.io/group-index"] == "1"
        assert worker.metadata.labels["leaderworkerset.sigs.k8s.io/worker-index"] == "2"
        assert worker.metadata.annotations["leaderworkerset.sigs.k8s.io/leader-name"] == "serve-1"
        assert worker.metadata.owner_references[0].kind == "LeaderWorkerSet"
        status = obj["status"]
        assert (status["replicas"], status["updatedReplicas"]) == (2, 2)
        assert status["hpaPodSelector"] == "leaderworkerset.sigs.k8s.io/name=serve,leaderworkerset.sigs.k8s.io/worker-index=0"
        conditions = {c["type"]: c for c in status["conditions"]}
        assert (conditions["Available"]["status"], conditions["Available"]["reason"]) == ("True", "AllGroupsReady")
        assert conditions["Progressing"]["status"] == "False"  # exclusive with Available, as LWS keeps them

        # kubectl get lws: LWS's printer columns
        table = get_table(api, f"/apis/{GROUP}/{VERSION}/namespaces/{NS}/{PLURAL}")
        assert [c["name"] for c in table["columnDefinitions"]] == ["Name", "Ready", "Desired", "Up-to-date", "Age"]
        assert table["rows"][0]["cells"][:4] == ["serve", 2, 2, 2]

        crs.patch_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "serve", {"spec": {"replicas": 1}})

        def one_group() -> list[str] | None:
            names = sorted(p.metadata.name for p in core.list_namespaced_pod(
                NS, label_selector="leaderworkerset.sigs.k8s.io/name=serve").items
                if p.metadata.deletion_timestamp is None)
            return names if names == ["serve-0", "serve-0-1", "serve-0-2"] else None

        eventually(one_group, timeout=10)


def test_a_cluster_without_the_controller_runs_nothing(tmp_path: Path) -> None:
    with cluster(tmp_path, without=("leaderworkerset",)) as api:
        crs, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
        crs.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, lws("idle", 1, 2))
        with pytest.raises(AssertionError):
            eventually(lambda: core.list_namespaced_pod(NS).items or None, timeout=1)
        assert "status" not in crs.get_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "idle")
