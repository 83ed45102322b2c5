"""kubesim's generic stand-in for a declared kind, through the official client: configured by its ConfigMap, it
makes the declared PodSets' pods, writes the declared success (a condition, or a status field) or failure, leaves
suspended objects and other controllers' objects alone, and picks up a kind declared after it started."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, config

import kubesim
from kubesim import ClusterSpec, KubeletSpec, NodeSpec
from kubesim.sim import generic
from kubesim.testing import eventually

pytestmark = pytest.mark.kubesim_only("drives kubesim's generic stand-in operator")

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "trainingrun"
NS = "default"
GROUP, VERSION, PLURAL = "example.com", "v1", "trainingruns"


@contextmanager
def cluster(tmp_path: Path, declarations: str | None) -> Iterator[client.ApiClient]:
    spec = ClusterSpec("a", [NodeSpec("node-1", cpu="32", memory="64Gi")],
                       kubelet=KubeletSpec(start_seconds=0.02, run_seconds=0.2))
    with kubesim.serve([spec], tmp_path) as sim:
        api = config.new_client_from_config(config_file=str(sim.kubeconfig("a")))
        client.ApiextensionsV1Api(api).create_custom_resource_definition(
            yaml.safe_load((EXAMPLE / "crd.yaml").read_text()))
        if declarations is not None:
            configure(api, declarations)
        try:
            yield api
        finally:
            api.close()


def configure(api: client.ApiClient, declarations: str) -> None:
    client.CoreV1Api(api).create_namespaced_config_map(generic.CONFIG_NAMESPACE, {
        "metadata": {"name": generic.CONFIG_NAME}, "data": {generic.CONFIG_KEY: declarations}})


def run(name: str, **spec: Any) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((EXAMPLE / "trainingrun.yaml").read_text())
    doc["metadata"] = {"name": name}
    del doc["spec"]["managedBy"]
    doc["spec"].update(spec)
    return doc


def get(api: client.ApiClient, name: str) -> dict[str, Any]:
    out: dict[str, Any] = client.CustomObjectsApi(api).get_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, name)
    return out


def pods(api: client.ApiClient, name: str) -> list[Any]:
    return list(client.CoreV1Api(api).list_namespaced_pod(
        NS, label_selector=f"{generic.OWNER_LABEL}={name}").items)


def condition(api: client.ApiClient, name: str, ctype: str) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        return next((c for c in (get(api, name).get("status") or {}).get("conditions") or []
                     if c["type"] == ctype and c["status"] == "True"), None)
    found: dict[str, Any] = eventually(check, timeout=20, what=f"{name} {ctype}")
    return found


def test_the_declared_pods_run_and_success_or_failure_is_written(tmp_path: Path) -> None:
    with cluster(tmp_path, (EXAMPLE / "kinds.yaml").read_text()) as api:
        objs = client.CustomObjectsApi(api)
        objs.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, run("ok"))
        bad = run("bad")
        bad["spec"]["workers"]["template"]["metadata"]["annotations"]["kubesim.mkd.dev/exit-code"] = "3"
        objs.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, bad)
        done = condition(api, "ok", "Succeeded")
        assert done["reason"] == "PodsSucceeded"
        made = pods(api, "ok")
        assert sorted(p.metadata.name for p in made) == ["ok-launcher-0", "ok-workers-0", "ok-workers-1"]
        assert {p.metadata.owner_references[0].kind for p in made} == {"TrainingRun"}
        assert {p.spec.restart_policy for p in made} == {"Never"}
        assert condition(api, "bad", "Failed")["reason"] == "PodFailed"


def test_suspended_and_other_controllers_objects_are_left_alone(tmp_path: Path) -> None:
    with cluster(tmp_path, (EXAMPLE / "kinds.yaml").read_text()) as api:
        objs = client.CustomObjectsApi(api)
        objs.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, run("held", suspend=True))
        objs.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL,
                                             run("theirs", managedBy="kueue.x-k8s.io/multikueue"))
        objs.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, run("later"))
        condition(api, "later", "Succeeded")  # the stand-in has had its turn
        assert pods(api, "held") == [] and pods(api, "theirs") == []
        assert not (get(api, "held").get("status") or {}).get("conditions")
        objs.patch_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "held", {"spec": {"suspend": False}})
        condition(api, "held", "Succeeded")


def test_a_status_field_rule_and_a_kind_declared_after_start(tmp_path: Path) -> None:
    doc = yaml.safe_load((EXAMPLE / "kinds.yaml").read_text())
    doc["externalFrameworks"][0]["success"] = {"field": "status.phase", "values": ["Done"]}
    with cluster(tmp_path, None) as api:
        objs = client.CustomObjectsApi(api)
        objs.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, run("early"))
        assert pods(api, "early") == []  # nothing runs the kind yet
        configure(api, yaml.safe_dump(doc))
        found = eventually(lambda: (get(api, "early").get("status") or {}).get("phase") == "Done" or None,
                           timeout=20, what="early Done")
        assert found
