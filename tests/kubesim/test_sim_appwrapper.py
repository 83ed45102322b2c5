"""The simulated AppWrapper operator seen through the official client: components created and owned, the
operator's phases and conditions (Resuming, Running, Succeeded / Failed), suspend, managedBy."""

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

pytestmark = pytest.mark.kubesim_only("drives kubesim's stand-in for the AppWrapper operator")

NS = "default"
GROUP, VERSION, PLURAL = "workload.codeflare.dev", "v1beta2", "appwrappers"


@contextmanager
def cluster(tmp_path: Path) -> Iterator[client.ApiClient]:
    spec = ClusterSpec("a", [NodeSpec("node-1", cpu="32", memory="64Gi")],
                       kubelet=KubeletSpec(start_seconds=0.02, run_seconds=0.2))
    with kubesim.serve([spec], tmp_path) as sim:
        api = config.new_client_from_config(config_file=str(sim.kubeconfig("a")))
        ext = client.ApiextensionsV1Api(api)
        for crd in load_crds():
            if crd["spec"]["group"] == GROUP:
                ext.create_custom_resource_definition(crd)
        try:
            yield api
        finally:
            api.close()


def appwrapper(name: str, annotations: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    pod = {"metadata": {"annotations": annotations or {}},
           "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]}}
    component = {"template": {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": f"{name}-job"},
                              "spec": {"parallelism": 2, "completions": 2, "backoffLimit": 0, "template": pod}}}
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "AppWrapper", "metadata": {"name": name},
            "spec": {"components": [component], **spec}}


def get(api: client.ApiClient, name: str) -> dict[str, Any]:
    out: dict[str, Any] = client.CustomObjectsApi(api).get_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, name)
    return out


def phase(api: client.ApiClient, name: str, want: str) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        status = get(api, name).get("status") or {}
        return status if status.get("phase") == want else None
    found: dict[str, Any] = eventually(check, timeout=20, what=f"{name} {want}")
    return found


def condition(status: dict[str, Any], ctype: str) -> dict[str, Any]:
    return next(c for c in status["conditions"] if c["type"] == ctype)


def test_components_run_and_the_appwrapper_succeeds_or_fails(tmp_path: Path) -> None:
    with cluster(tmp_path) as api:
        objs = client.CustomObjectsApi(api)
        objs.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, appwrapper("ok"))
        objs.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL,
                                             appwrapper("bad", {"kubesim.mkd.dev/exit-code": "3"}))
        done = phase(api, "ok", "Succeeded")
        assert condition(done, "QuotaReserved")["status"] == "False"
        assert condition(done, "ResourcesDeployed")["reason"] == "Succeeded"
        assert done["componentStatus"][0]["podSets"] == [{"path": "template.spec.template", "replicas": 2}]
        job = client.BatchV1Api(api).read_namespaced_job("ok-job", NS)
        assert job.metadata.owner_references[0].kind == "AppWrapper"
        assert job.metadata.labels["workload.codeflare.dev/appwrapper"] == "ok"
        failed = phase(api, "bad", "Failed")
        assert condition(failed, "Unhealthy")["reason"] == "FoundFailedPods"
        assert condition(failed, "ResourcesDeployed")["status"] == "False"
        eventually(lambda: not client.BatchV1Api(api).list_namespaced_job(NS, label_selector=
                   "workload.codeflare.dev/appwrapper=bad").items or None, what="bad's Job deleted")


def test_suspended_or_managed_elsewhere_deploys_nothing(tmp_path: Path) -> None:
    with cluster(tmp_path) as api:
        objs = client.CustomObjectsApi(api)
        objs.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, appwrapper("held", {"kubesim.mkd.dev/run-seconds": "60"}, suspend=True))
        objs.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL,
                                             appwrapper("mk", managedBy="kueue.x-k8s.io/multikueue"))
        phase(api, "held", "Suspended")
        assert "status" not in get(api, "mk")
        assert client.BatchV1Api(api).list_namespaced_job(NS).items == []
        objs.patch_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "held", {"spec": {"suspend": False}})
        running = phase(api, "held", "Running")
        assert condition(running, "QuotaReserved")["reason"] == "Resuming"
        objs.patch_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "held", {"spec": {"suspend": True}})
        phase(api, "held", "Suspended")
        eventually(lambda: not client.BatchV1Api(api).list_namespaced_job(NS).items or None, what="Job deleted")


def test_a_component_with_generate_name_is_tracked_by_the_name_it_got(tmp_path: Path) -> None:
    with cluster(tmp_path) as api:
        obj = appwrapper("gen", {"kubesim.mkd.dev/run-seconds": "60"})
        obj["spec"]["components"][0]["template"]["metadata"] = {"generateName": "gen-job-"}
        client.CustomObjectsApi(api).create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, obj)
        running = phase(api, "gen", "Running")
        name = running["componentStatus"][0]["name"]
        assert name.startswith("gen-job-") and len(client.BatchV1Api(api).list_namespaced_job(NS).items) == 1
        client.CustomObjectsApi(api).patch_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "gen",
                                                                    {"spec": {"suspend": True}})
        phase(api, "gen", "Suspended")
        eventually(lambda: not client.BatchV1Api(api).list_namespaced_job(NS).items or None, what="Job deleted")
