"""The Kubeflow v1 family: PyTorchJob on the example shapes, TFJob/XGBoostJob/PaddleJob/JAXJob rules,
conditions, suspend, managedBy and the worker copy."""

from __future__ import annotations

import copy
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import yaml

from federation import labels
from federation.errors import Invalid
from federation.kinds.base import Finished
from federation.kinds.jax import JAXJOB
from federation.kinds.paddle import PADDLEJOB
from federation.kinds.pytorch import PYTORCHJOB
from federation.kinds.tfjob import TFJOB
from federation.kinds.xgboost import XGBOOSTJOB
from tests.federation.mutations import delete_at, set_at

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
D = Decimal
Job = dict[str, Any]


def example(name: str) -> Job:
    doc = yaml.safe_load((EXAMPLES / name).read_text())
    assert isinstance(doc, dict)
    return doc


def fields(errors: list[Invalid]) -> list[str]:
    return [e.field for e in errors]


def replica(container_name: str, replicas: int | None = 1, **resources: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "template": {
            "spec": {
                "containers": [
                    {
                        "name": container_name,
                        "image": "example.com/train:1",
                        "resources": {"requests": resources},
                    }
                ]
            }
        }
    }
    if replicas is not None:
        spec["replicas"] = replicas
    return spec


def v1_job(kind: str, field: str, specs: dict[str, Any], name: str = "job-1") -> Job:
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": kind,
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"runPolicy": {"managedBy": labels.MULTIKUEUE}, field: specs},
    }


# --- PyTorchJob --------------------------------------------------------------------------------


def test_simple_example_podsets() -> None:
    job = example("pytorch/simple.yaml")
    assert PYTORCHJOB.validate(job) == []
    podsets = PYTORCHJOB.podsets(job)
    assert [(p.name, p.count) for p in podsets] == [("master", 1), ("worker", 1)]
    assert podsets[0].requests == {"cpu": D("0.5"), "memory": D(512 * 2**20), "pods": D(1)}
    assert podsets[1].template["spec"]["containers"][0]["name"] == "pytorch"


def test_sendrecv_counts_and_elastic_without_master() -> None:
    sendrecv = PYTORCHJOB.podsets(example("pytorch/sendrecv.yaml"))
    assert [(p.name, p.count) for p in sendrecv] == [("master", 1), ("worker", 3)]
    echo = example("pytorch/elastic-echo.yaml")
    assert PYTORCHJOB.validate(echo) == []
    assert [(p.name, p.count) for p in PYTORCHJOB.podsets(echo)] == [("worker", 2)]


def test_podset_order_follows_replica_types_not_the_map() -> None:
    job = v1_job(
        "PyTorchJob", "pytorchReplicaSpecs", {"Worker": replica("pytorch", 2), "Master": replica("pytorch")}
    )
    assert [p.name for p in PYTORCHJOB.podsets(job)] == ["master", "worker"]


def test_worker_replicas_default_to_one_but_master_must_say_one() -> None:
    job = v1_job(
        "PyTorchJob",
        "pytorchReplicaSpecs",
        {"Master": replica("pytorch"), "Worker": replica("pytorch", None)},
    )
    assert PYTORCHJOB.validate(job) == []
    assert [p.count for p in PYTORCHJOB.podsets(job)] == [1, 1]
    del job["spec"]["pytorchReplicaSpecs"]["Master"]["replicas"]  # the webhook sees the raw object
    assert [e.field for e in PYTORCHJOB.validate(job)] == ["spec.pytorchReplicaSpecs.Master.replicas"]
    tf = v1_job("TFJob", "tfReplicaSpecs", {"Chief": replica("tensorflow", None)})
    assert TFJOB.validate(tf) == []


def test_per_pod_requests_count_init_containers_and_overhead() -> None:
    job = example("pytorch/simple.yaml")
    pod = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
    pod["initContainers"] = [{"name": "fetch", "image": "busybox", "resources": {"requests": {"cpu": "2"}}}]
    pod["overhead"] = {"memory": "64Mi"}
    worker = PYTORCHJOB.podsets(job)[1]
    assert worker.requests == {"cpu": D(2), "memory": D(576 * 2**20), "pods": D(1)}



def _rename_master(job: Job) -> None:
    specs = job["spec"]["pytorchReplicaSpecs"]
    specs["master"] = specs.pop("Master")


def _elastic_without_worker(job: Job) -> None:
    del job["spec"]["pytorchReplicaSpecs"]["Worker"]
    job["spec"]["elasticPolicy"] = {"minReplicas": 1, "maxReplicas": 2}


M = ["spec", "pytorchReplicaSpecs", "Master"]
MC = [*M, "template", "spec", "containers"]
BROKEN_PYTORCH: list[tuple[str, Callable[[Job], None], str]] = [
    ("no replica specs", delete_at(["spec", "pytorchReplicaSpecs"]), "spec.pytorchReplicaSpecs"),
    ("lower-case type", _rename_master, "spec.pytorchReplicaSpecs.master"),
    ("two masters", set_at([*M, "replicas"], 2), "spec.pytorchReplicaSpecs.Master.replicas"),
    ("master count left out", delete_at([*M, "replicas"]), "spec.pytorchReplicaSpecs.Master.replicas"),
    (
        "zero workers",
        set_at(["spec", "pytorchReplicaSpecs", "Worker", "replicas"], 0),
        "spec.pytorchReplicaSpecs.Worker.replicas",
    ),
    (
        "replicas not a number",
        set_at(["spec", "pytorchReplicaSpecs", "Worker", "replicas"], "two"),
        "spec.pytorchReplicaSpecs.Worker.replicas",
    ),
    (
        "no pytorch container",
        set_at([*MC, 0, "name"], "main"),
        "spec.pytorchReplicaSpecs.Master.template.spec.containers",
    ),
    (
        "no image",
        delete_at([*MC, 0, "image"]),
        "spec.pytorchReplicaSpecs.Master.template.spec.containers[0].image",
    ),
    ("no containers", set_at(MC, []), "spec.pytorchReplicaSpecs.Master.template.spec.containers"),
    ("no template", delete_at([*M, "template"]), "spec.pytorchReplicaSpecs.Master.template"),
    (
        "bad quantity",
        set_at([*MC, 0, "resources", "requests", "cpu"], "half"),
        "spec.pytorchReplicaSpecs.Master.template.spec.containers[0].resources.requests.cpu",
    ),
    ("bad name", set_at(["metadata", "name"], "Pytorch_Simple"), "metadata.name"),
    ("name too long", set_at(["metadata", "name"], "p" * 64), "metadata.name"),
    (
        "unknown managedBy",
        set_at(["spec", "runPolicy", "managedBy"], "example.com/mine"),
        "spec.runPolicy.managedBy",
    ),
    (
        "bad restart policy",
        set_at([*M, "restartPolicy"], "Sometimes"),
        "spec.pytorchReplicaSpecs.Master.restartPolicy",
    ),
    ("elastic without worker", _elastic_without_worker, "spec.pytorchReplicaSpecs.Worker"),
    ("bad nprocPerNode", set_at(["spec", "nprocPerNode"], "many"), "spec.nprocPerNode"),
    (
        "bad cleanPodPolicy",
        set_at(["spec", "runPolicy", "cleanPodPolicy"], "Some"),
        "spec.runPolicy.cleanPodPolicy",
    ),
    ("negative backoffLimit", set_at(["spec", "runPolicy", "backoffLimit"], -1), "spec.runPolicy.backoffLimit"),
    ("suspend not bool", set_at(["spec", "runPolicy", "suspend"], "yes"), "spec.runPolicy.suspend"),
]


@pytest.mark.parametrize(("what", "mutate", "field"), BROKEN_PYTORCH, ids=[b[0] for b in BROKEN_PYTORCH])
def test_broken_pytorchjob_names_the_field(what: str, mutate: Callable[[Job], None], field: str) -> None:
    job = example("pytorch/simple.yaml")
    mutate(job)
    errors = PYTORCHJOB.validate(job)
    assert field in fields(errors), (what, [str(e) for e in errors])
    assert all(e.fix for e in errors)


def test_all_failures_are_collected() -> None:
    job = example("pytorch/simple.yaml")
    job["metadata"]["name"] = "Bad"
    job["spec"]["runPolicy"]["managedBy"] = "nobody"
    job["spec"]["pytorchReplicaSpecs"]["Master"]["replicas"] = 3
    del job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["image"]
    assert set(fields(PYTORCHJOB.validate(job))) == {
        "metadata.name",
        "spec.runPolicy.managedBy",
        "spec.pytorchReplicaSpecs.Master.replicas",
        "spec.pytorchReplicaSpecs.Worker.template.spec.containers[0].image",
    }


def test_podsets_refuse_an_invalid_job() -> None:
    job = example("pytorch/simple.yaml")
    job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["resources"] = {
        "limits": {"memory": "1Gb"}
    }
    with pytest.raises(Invalid) as info:
        PYTORCHJOB.podsets(job)
    assert (
        info.value.field
        == "spec.pytorchReplicaSpecs.Worker.template.spec.containers[0].resources.limits.memory"
    )


# --- the rest of the family ------------------------------------------------------------------------


def test_tfjob_roles_and_rules() -> None:
    job = v1_job(
        "TFJob",
        "tfReplicaSpecs",
        {
            "Worker": replica("tensorflow", 2, cpu="1"),
            "PS": replica("tensorflow", 1),
            "Chief": replica("tensorflow"),
        },
    )
    assert TFJOB.validate(job) == []
    assert [(p.name, p.count) for p in TFJOB.podsets(job)] == [("chief", 1), ("ps", 1), ("worker", 2)]
    job["spec"]["tfReplicaSpecs"]["Master"] = replica("tensorflow")
    job["spec"]["tfReplicaSpecs"]["Chief"]["replicas"] = 2
    job["spec"]["tfReplicaSpecs"]["PS"]["template"]["spec"]["containers"][0]["name"] = "tf"
    assert set(fields(TFJOB.validate(job))) == {
        "spec.tfReplicaSpecs",
        "spec.tfReplicaSpecs.Chief.replicas",
        "spec.tfReplicaSpecs.PS.template.spec.containers",
    }


def test_xgboost_needs_its_master() -> None:
    job = v1_job(
        "XGBoostJob", "xgbReplicaSpecs", {"Master": replica("xgboost"), "Worker": replica("xgboost", 3)}
    )
    assert XGBOOSTJOB.validate(job) == []
    assert [(p.name, p.count) for p in XGBOOSTJOB.podsets(job)] == [("master", 1), ("worker", 3)]
    del job["spec"]["xgbReplicaSpecs"]["Master"]["replicas"]
    assert fields(XGBOOSTJOB.validate(job)) == ["spec.xgbReplicaSpecs.Master.replicas"]
    del job["spec"]["xgbReplicaSpecs"]["Master"]
    assert fields(XGBOOSTJOB.validate(job)) == ["spec.xgbReplicaSpecs.Master"]


def test_paddle_master_count_is_free_and_container_is_paddle() -> None:
    job = v1_job(
        "PaddleJob", "paddleReplicaSpecs", {"Master": replica("paddle", 2), "Worker": replica("paddle", 2)}
    )
    assert PADDLEJOB.validate(job) == []
    job["spec"]["paddleReplicaSpecs"]["Worker"] = replica("pytorch", 2)
    assert fields(PADDLEJOB.validate(job)) == ["spec.paddleReplicaSpecs.Worker.template.spec.containers"]


def test_jax_has_only_workers() -> None:
    job = v1_job("JAXJob", "jaxReplicaSpecs", {"Worker": replica("jax", 4, cpu="250m")})
    assert JAXJOB.validate(job) == []
    assert JAXJOB.podsets(job)[0].total()["cpu"] == D(1)
    job["spec"]["jaxReplicaSpecs"]["Master"] = replica("jax")
    assert fields(JAXJOB.validate(job)) == ["spec.jaxReplicaSpecs.Master"]


# --- status, suspend, managedBy, the worker copy ------------------------------------------------------


def cond(type_: str, status: str = "True", reason: str = "", message: str = "") -> dict[str, str]:
    return {"type": type_, "status": status, "reason": reason, "message": message}


def test_finished_from_conditions() -> None:
    job = example("pytorch/simple.yaml")
    assert PYTORCHJOB.finished(job) is None
    job["status"] = {"conditions": [cond("Created"), cond("Running", "False")]}
    assert PYTORCHJOB.finished(job) is None
    job["status"]["conditions"].append(cond("Succeeded", reason="PyTorchJobSucceeded", message="done"))
    assert PYTORCHJOB.finished(job) == Finished("Succeeded", "PyTorchJobSucceeded", "done")
    job["status"]["conditions"] = [cond("Failed", reason="PyTorchJobFailed", message="boom")]
    assert PYTORCHJOB.finished(job) == Finished("Failed", "PyTorchJobFailed", "boom")
    job["status"]["conditions"] = [cond("Failed", "False"), cond("Running")]
    assert PYTORCHJOB.finished(job) is None


def test_suspend_lives_in_run_policy() -> None:
    job = example("pytorch/simple.yaml")
    assert not PYTORCHJOB.is_suspended(job)
    suspended = PYTORCHJOB.with_suspended(job, True)
    assert suspended["spec"]["runPolicy"]["suspend"] is True and PYTORCHJOB.is_suspended(suspended)
    assert "suspend" not in job["spec"]["runPolicy"]  # the original is untouched
    assert not PYTORCHJOB.is_suspended(PYTORCHJOB.with_suspended(suspended, False))


def test_managed_by_is_read_as_written() -> None:
    assert PYTORCHJOB.managed_by(example("pytorch/simple.yaml")) == labels.MULTIKUEUE
    assert PYTORCHJOB.managed_by(example("special/other-controller.yaml")) == labels.TRAINING_OPERATOR
    job = example("pytorch/simple.yaml")
    del job["spec"]["runPolicy"]
    assert PYTORCHJOB.managed_by(job) is None  # no default invented
    assert PYTORCHJOB.validate(job) == []


def server_side(job: Job) -> Job:
    job = copy.deepcopy(job)
    job["metadata"].update(
        {
            "uid": "0d7c",
            "resourceVersion": "42",
            "creationTimestamp": "2026-01-01T00:00:00Z",
            "generation": 3,
            "managedFields": [{"manager": "kubectl"}],
            "finalizers": ["x"],
            "ownerReferences": [{"uid": "p"}],
            "labels": {"team": "a"},
            "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{}", "keep": "me"},
        }
    )
    job["status"] = {"conditions": [cond("Created")]}
    return job


def test_prepare_for_worker_strips_server_metadata_and_stamps_labels() -> None:
    job = server_side(example("pytorch/simple.yaml"))
    stamp = {labels.ORIGIN: "mkd-a", labels.WORKLOAD_UID: "0d7c", labels.PLACEMENT_ATTEMPT: "1"}
    out = PYTORCHJOB.prepare_for_worker(job, stamp=stamp, managed_by=None)
    meta = out["metadata"]
    assert set(meta) == {"name", "namespace", "labels", "annotations"}
    assert meta["labels"] == {"team": "a", **stamp}
    assert meta["annotations"] == {"keep": "me"}
    assert "status" not in out and "managedBy" not in out["spec"]["runPolicy"]
    assert out["spec"]["pytorchReplicaSpecs"] == job["spec"]["pytorchReplicaSpecs"]
    assert job["metadata"]["uid"] == "0d7c" and "status" in job  # input untouched
    delegated = PYTORCHJOB.prepare_for_worker(job, stamp=stamp, managed_by=labels.TRAINING_OPERATOR)
    assert delegated["spec"]["runPolicy"]["managedBy"] == labels.TRAINING_OPERATOR


def test_a_template_found_valid_once_is_still_checked_against_each_kinds_rules_and_edits() -> None:
    """Valid pod templates are remembered (kinds/base.py): the memory is per template, field and
    container rule, so another kind's rule, another field or an edited template is checked again."""
    template = {"spec": {"containers": [{"name": "pytorch", "image": "x", "resources": {"requests": {"cpu": "1"}}}]}}

    def job(kind_field: str, kind: str, tmpl: dict[str, Any]) -> dict[str, Any]:
        return {"apiVersion": "kubeflow.org/v1", "kind": kind, "metadata": {"name": "j"},
                "spec": {kind_field: {"Master": {"replicas": 1, "template": copy.deepcopy(tmpl)},
                                      "Worker": {"replicas": 1, "template": copy.deepcopy(tmpl)}}}}
    assert PYTORCHJOB.validate(job("pytorchReplicaSpecs", "PyTorchJob", template)) == []
    assert PYTORCHJOB.validate(job("pytorchReplicaSpecs", "PyTorchJob", template)) == []
    tf = TFJOB.validate(job("tfReplicaSpecs", "TFJob", {**template}))
    assert any("name tensorflow" in e.message for e in tf)  # TFJob's container rule, same template
    bad = copy.deepcopy(template)
    bad["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "one"
    errors = PYTORCHJOB.validate(job("pytorchReplicaSpecs", "PyTorchJob", bad))
    assert [e.field for e in errors] == ["spec.pytorchReplicaSpecs.Master.template.spec.containers[0].resources"
                                         ".requests.cpu", "spec.pytorchReplicaSpecs.Worker.template.spec"
                                         ".containers[0].resources.requests.cpu"]
    again = PYTORCHJOB.validate(job("pytorchReplicaSpecs", "PyTorchJob", bad))  # invalid: checked afresh
    assert [e.field for e in again] == [e.field for e in errors] and not set(map(id, again)) & set(map(id, errors))
