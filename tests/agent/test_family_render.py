"""The other Kubeflow v1 members share the PyTorchJob machinery: names, labels, Services, conditions."""

from __future__ import annotations

import json
from typing import Any

from tests.agent.render_harness import MemCluster
from worker_agent.reconcilers.family import (
    JAXJobReconciler,
    PaddleJobReconciler,
    TFJobReconciler,
    XGBoostJobReconciler,
)
from worker_agent.reconcilers.kubeflow import KubeflowV1Reconciler


def job(kind: str, field: str, container: str, specs: dict[str, int]) -> dict[str, Any]:
    return {"apiVersion": "kubeflow.org/v1", "kind": kind,
            "metadata": {"name": "demo", "namespace": "ns", "uid": "u1"},
            "spec": {field: {rt: {"replicas": n, "template": {"spec": {"containers": [
                {"name": container, "image": "img"}]}}} for rt, n in specs.items()}}}


def env(pod: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in pod["spec"]["containers"][0].get("env", [])}


def test_tfjob_names_tf_config_and_chief_success() -> None:
    c = MemCluster(TFJobReconciler(), job("TFJob", "tfReplicaSpecs", "tensorflow", {"Chief": 1, "PS": 1, "Worker": 2}))
    c.settle()
    assert sorted(c.objects["pods"]) == ["demo-chief-0", "demo-ps-0", "demo-worker-0", "demo-worker-1"]
    chief = c.pod("demo-chief-0")
    assert chief["metadata"]["labels"]["training.kubeflow.org/operator-name"] == "tfjob-controller"
    assert chief["metadata"]["labels"]["training.kubeflow.org/job-role"] == "master"
    assert chief["spec"]["restartPolicy"] == "Never"
    config = json.loads(env(c.pod("demo-worker-1"))["TF_CONFIG"])
    assert config == {"cluster": {"chief": ["demo-chief-0.ns.svc:2222"], "ps": ["demo-ps-0.ns.svc:2222"],
                                  "worker": ["demo-worker-0.ns.svc:2222", "demo-worker-1.ns.svc:2222"]},
                      "task": {"type": "worker", "index": 1}, "environment": "cloud"}
    assert c.objects["services"]["demo-ps-0"]["spec"]["ports"] == [{"name": "tfjob-port", "port": 2222}]
    c.all_phase("Running")
    c.step()
    c.set_phase("demo-chief-0", "Succeeded", 0, container="tensorflow")
    c.step()
    assert c.conditions()[-1] == ("Succeeded", "True", "TFJobSucceeded")


def test_other_members_shape() -> None:
    cases: list[tuple[KubeflowV1Reconciler, dict[str, Any], str, str]] = [
        (XGBoostJobReconciler(), job("XGBoostJob", "xgbReplicaSpecs", "xgboost", {"Master": 1, "Worker": 2}),
         "demo-worker-1", "xgboostjob-controller"),
        (PaddleJobReconciler(), job("PaddleJob", "paddleReplicaSpecs", "paddle", {"Master": 1, "Worker": 1}),
         "demo-worker-0", "paddlejob-controller"),
        (JAXJobReconciler(), job("JAXJob", "jaxReplicaSpecs", "jax", {"Worker": 2}),
         "demo-worker-1", "jaxjob-controller"),
    ]
    for reconciler, manifest, pod_name, operator in cases:
        c = MemCluster(reconciler, manifest)
        c.settle()
        pod = c.pod(pod_name)
        assert pod["metadata"]["labels"]["training.kubeflow.org/operator-name"] == operator
        assert pod_name in c.objects["services"]
        assert c.conditions() == [("Created", "True", f"{manifest['kind']}Created")]
    xgb = MemCluster(XGBoostJobReconciler(), cases[0][1])
    xgb.step()
    assert env(xgb.pod("demo-worker-1"))["RANK"] == "2" and env(xgb.pod("demo-worker-1"))["MASTER_PORT"] == "9999"
    jax = MemCluster(JAXJobReconciler(), cases[2][1])
    jax.step()
    assert env(jax.pod("demo-worker-1"))["PROCESS_ID"] == "1"
    assert env(jax.pod("demo-worker-1"))["COORDINATOR_ADDRESS"] == "demo-worker-0"
