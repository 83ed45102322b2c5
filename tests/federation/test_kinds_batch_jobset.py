"""batch/v1 Job and JobSet: PodSets, validation, status, and the worker copy of a server-defaulted Job."""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import yaml

from federation import labels
from federation.kinds.base import Finished
from federation.kinds.batchjob import BATCH_JOB
from federation.kinds.jobset import JOBSET
from tests.federation.mutations import delete_at, set_at

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
D = Decimal
Obj = dict[str, Any]


def load(name: str) -> Obj:
    doc = yaml.safe_load((EXAMPLES / name).read_text())
    assert isinstance(doc, dict)
    return doc



# --- batch/v1 Job ----------------------------------------------------------------------------------


def test_job_example_podset() -> None:
    job = load("batch/job.yaml")
    assert BATCH_JOB.validate(job) == []
    [main] = BATCH_JOB.podsets(job)
    assert (main.name, main.count) == ("main", 2)
    assert main.total() == {"cpu": D("0.5"), "memory": D(512 * 2**20), "pods": D(2)}
    assert BATCH_JOB.managed_by(job) == labels.MULTIKUEUE


@pytest.mark.parametrize(
    ("parallelism", "completions", "count"),
    [(None, None, 1), (4, None, 4), (4, 2, 2), (1, 10, 1), (0, None, 0)],
)
def test_job_count_is_parallelism_capped_by_completions(
    parallelism: int | None, completions: int | None, count: int
) -> None:
    job = load("batch/job.yaml")
    for key, value in (("parallelism", parallelism), ("completions", completions)):
        job["spec"].pop(key, None)
        if value is not None:
            job["spec"][key] = value
    assert BATCH_JOB.podsets(job)[0].count == count


TPL = ["spec", "template", "spec"]
BROKEN_JOB: list[tuple[str, Callable[[Obj], None], str]] = [
    ("no template", delete_at(["spec", "template"]), "spec.template"),
    ("no restartPolicy", delete_at([*TPL, "restartPolicy"]), "spec.template.spec.restartPolicy"),
    ("restartPolicy Always", set_at([*TPL, "restartPolicy"], "Always"), "spec.template.spec.restartPolicy"),
    ("no containers", set_at([*TPL, "containers"], []), "spec.template.spec.containers"),
    ("no image", set_at([*TPL, "containers", 0, "image"], " "), "spec.template.spec.containers[0].image"),
    ("no container name", delete_at([*TPL, "containers", 0, "name"]), "spec.template.spec.containers[0].name"),
    (
        "bad request",
        set_at([*TPL, "containers", 0, "resources", "requests", "cpu"], "1.5.0"),
        "spec.template.spec.containers[0].resources.requests.cpu",
    ),
    ("negative parallelism", set_at(["spec", "parallelism"], -1), "spec.parallelism"),
    ("unknown managedBy", set_at(["spec", "managedBy"], "kueue.x-k8s.io/other"), "spec.managedBy"),
    ("bad name", set_at(["metadata", "name"], "Batch_Pi"), "metadata.name"),
    ("suspend not bool", set_at(["spec", "suspend"], "true"), "spec.suspend"),
]


@pytest.mark.parametrize(("what", "mutate", "field"), BROKEN_JOB, ids=[b[0] for b in BROKEN_JOB])
def test_broken_job_names_the_field(what: str, mutate: Callable[[Obj], None], field: str) -> None:
    job = load("batch/job.yaml")
    mutate(job)
    assert field in [e.field for e in BATCH_JOB.validate(job)], what


def test_job_status_and_suspend() -> None:
    job = load("batch/job.yaml")
    assert BATCH_JOB.finished(job) is None
    job["status"] = {
        "conditions": [
            {"type": "SuccessCriteriaMet", "status": "True"},
            {"type": "Complete", "status": "True", "reason": "CompletionsReached"},
        ]
    }
    assert BATCH_JOB.finished(job) == Finished("Succeeded", "CompletionsReached", "")
    job["status"]["conditions"] = [
        {"type": "FailureTarget", "status": "True"},
        {
            "type": "Failed",
            "status": "True",
            "reason": "BackoffLimitExceeded",
            "message": "Job has reached the specified backoff limit",
        },
    ]
    assert BATCH_JOB.finished(job) == Finished(
        "Failed", "BackoffLimitExceeded", "Job has reached the specified backoff limit"
    )
    assert BATCH_JOB.with_suspended(job, True)["spec"]["suspend"] is True
    assert not BATCH_JOB.is_suspended(job)


def test_job_worker_copy_drops_the_generated_selector_and_labels() -> None:
    job = load("batch/job.yaml")
    uid = "6b9f"
    generated = {
        "batch.kubernetes.io/controller-uid": uid,
        "batch.kubernetes.io/job-name": "batch-pi",
        "controller-uid": uid,
        "job-name": "batch-pi",
    }
    job["metadata"].update({"uid": uid, "resourceVersion": "7", "labels": {**generated, "team": "a"}})
    job["spec"]["selector"] = {"matchLabels": {"batch.kubernetes.io/controller-uid": uid}}
    job["spec"]["template"]["metadata"]["labels"] = {**generated, "app": "pi"}
    out = BATCH_JOB.prepare_for_worker(job, stamp={labels.ORIGIN: "o"}, managed_by=None)
    assert "selector" not in out["spec"] and "managedBy" not in out["spec"]
    assert out["spec"]["template"]["metadata"]["labels"] == {"app": "pi"}
    assert out["metadata"]["labels"] == {"team": "a", labels.ORIGIN: "o"}
    assert job["spec"]["selector"]  # input untouched
    job["spec"]["manualSelector"] = True  # a hand-written selector is the user's: kept
    assert "selector" in BATCH_JOB.prepare_for_worker(job, stamp={}, managed_by=None)["spec"]


# --- JobSet ----------------------------------------------------------------------------------------


def test_jobset_example_podsets() -> None:
    js = load("jobset/jobset.yaml")
    assert JOBSET.validate(js) == []
    driver, workers = JOBSET.podsets(js)
    assert (driver.name, driver.count, workers.name, workers.count) == ("driver", 1, "workers", 4)
    assert workers.requests == {"cpu": D("0.25"), "memory": D(256 * 2**20), "pods": D(1)}


def test_jobset_replicas_default_to_one_and_zero_is_left_out() -> None:
    js = load("jobset/jobset.yaml")
    del js["spec"]["replicatedJobs"][1]["replicas"]
    assert [p.count for p in JOBSET.podsets(js)] == [1, 2]
    js["spec"]["replicatedJobs"][1]["replicas"] = 0
    assert [p.name for p in JOBSET.podsets(js)] == ["driver"]


def test_jobset_pods_per_replica_are_parallelism_capped_by_completions() -> None:
    """Kueue's ``PodsCountPerReplica``: a replicated Job runs min(parallelism, completions) pods at once."""
    js = load("jobset/jobset.yaml")
    workers = js["spec"]["replicatedJobs"][1]
    workers["template"]["spec"].update(parallelism=4, completions=1)
    assert [p.count for p in JOBSET.podsets(js)] == [1, 2]


def test_jobset_pod_restart_policy_may_be_left_to_its_webhook() -> None:
    js = load("jobset/jobset.yaml")
    del js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["restartPolicy"]
    assert JOBSET.validate(js) == []


RJ = ["spec", "replicatedJobs"]
WPOD = [*RJ, 1, "template", "spec", "template", "spec"]
BROKEN_JOBSET: list[tuple[str, Callable[[Obj], None], str]] = [
    ("no replicated jobs", delete_at(RJ), "spec.replicatedJobs"),
    ("empty replicated jobs", set_at(RJ, []), "spec.replicatedJobs"),
    ("duplicate names", set_at([*RJ, 1, "name"], "driver"), "spec.replicatedJobs[1].name"),
    ("bad rjob name", set_at([*RJ, 1, "name"], "Workers"), "spec.replicatedJobs[1].name"),
    ("negative replicas", set_at([*RJ, 1, "replicas"], -2), "spec.replicatedJobs[1].replicas"),
    ("no job template", delete_at([*RJ, 1, "template"]), "spec.replicatedJobs[1].template.spec"),
    (
        "no image",
        delete_at([*WPOD, "containers", 0, "image"]),
        "spec.replicatedJobs[1].template.spec.template.spec.containers[0].image",
    ),
    (
        "restartPolicy Always",
        set_at([*WPOD, "restartPolicy"], "Always"),
        "spec.replicatedJobs[1].template.spec.template.spec.restartPolicy",
    ),
    (
        "bad quantity",
        set_at([*WPOD, "containers", 0, "resources", "requests", "memory"], "256MB"),
        "spec.replicatedJobs[1].template.spec.template.spec.containers[0].resources.requests.memory",
    ),
    ("unknown managedBy", set_at(["spec", "managedBy"], labels.BATCH_JOB_CONTROLLER), "spec.managedBy"),
    ("bad name", set_at(["metadata", "name"], "-x"), "metadata.name"),
]


@pytest.mark.parametrize(("what", "mutate", "field"), BROKEN_JOBSET, ids=[b[0] for b in BROKEN_JOBSET])
def test_broken_jobset_names_the_field(what: str, mutate: Callable[[Obj], None], field: str) -> None:
    js = load("jobset/jobset.yaml")
    mutate(js)
    assert field in [e.field for e in JOBSET.validate(js)], what


def test_jobset_status_and_worker_copy() -> None:
    js = load("jobset/jobset.yaml")
    js["status"] = {
        "conditions": [
            {
                "type": "Completed",
                "status": "True",
                "reason": "AllJobsCompleted",
                "message": "jobset completed successfully",
            }
        ]
    }
    assert JOBSET.finished(js) == Finished("Succeeded", "AllJobsCompleted", "jobset completed successfully")
    out = JOBSET.prepare_for_worker(js, stamp={labels.ORIGIN: "o"}, managed_by=labels.JOBSET_CONTROLLER)
    assert out["spec"]["managedBy"] == labels.JOBSET_CONTROLLER and "status" not in out
    assert out["spec"]["replicatedJobs"] == js["spec"]["replicatedJobs"]
