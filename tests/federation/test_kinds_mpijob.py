"""MPIJob v2beta1: PodSets of the pi example, mpi-operator's defaults-then-validate rules, status."""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import yaml

from federation import labels
from federation.errors import Invalid
from federation.kinds.base import Finished
from federation.kinds.mpijob import MPIJOB, with_defaults
from tests.federation.mutations import delete_at, set_at

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
D = Decimal
Job = dict[str, Any]


def pi() -> Job:
    doc = yaml.safe_load((EXAMPLES / "mpi/pi.yaml").read_text())
    assert isinstance(doc, dict)
    return doc


def test_pi_podsets() -> None:
    job = pi()
    assert MPIJOB.validate(job) == []
    launcher, worker = MPIJOB.podsets(job)
    assert (launcher.name, launcher.count, worker.name, worker.count) == ("launcher", 1, "worker", 2)
    # limits stand in for requests
    assert worker.requests == {"cpu": D("0.5"), "memory": D(512 * 2**20), "pods": D(1)}
    assert MPIJOB.managed_by(job) == labels.MULTIKUEUE


def test_defaults_are_applied_in_memory_only() -> None:
    job = pi()
    del job["spec"]["slotsPerWorker"]
    defaulted = with_defaults(job)
    assert defaulted["spec"]["slotsPerWorker"] == 1
    assert defaulted["spec"]["mpiImplementation"] == "OpenMPI"
    assert defaulted["spec"]["runPolicy"]["cleanPodPolicy"] == "Running"  # kept as written
    assert defaulted["spec"]["mpiReplicaSpecs"]["Launcher"]["restartPolicy"] == "OnFailure"
    assert defaulted["spec"]["mpiReplicaSpecs"]["Worker"]["restartPolicy"] == "Never"
    assert "slotsPerWorker" not in job["spec"]
    assert "restartPolicy" not in job["spec"]["mpiReplicaSpecs"]["Launcher"]


def test_launcher_only_job_has_one_podset() -> None:
    job = pi()
    del job["spec"]["mpiReplicaSpecs"]["Worker"]
    assert MPIJOB.validate(job) == []
    assert [p.name for p in MPIJOB.podsets(job)] == ["launcher"]



L = ["spec", "mpiReplicaSpecs", "Launcher"]
W = ["spec", "mpiReplicaSpecs", "Worker"]
BROKEN: list[tuple[str, Callable[[Job], None], str]] = [
    ("no replica specs", delete_at(["spec", "mpiReplicaSpecs"]), "spec.mpiReplicaSpecs"),
    ("no launcher", delete_at(L), "spec.mpiReplicaSpecs.Launcher"),
    ("two launchers", set_at([*L, "replicas"], 2), "spec.mpiReplicaSpecs.Launcher.replicas"),
    ("zero workers", set_at([*W, "replicas"], 0), "spec.mpiReplicaSpecs.Worker.replicas"),
    ("launcher Always", set_at([*L, "restartPolicy"], "Always"), "spec.mpiReplicaSpecs.Launcher.restartPolicy"),
    ("worker ExitCode", set_at([*W, "restartPolicy"], "ExitCode"), "spec.mpiReplicaSpecs.Worker.restartPolicy"),
    (
        "no worker containers",
        set_at([*W, "template", "spec", "containers"], []),
        "spec.mpiReplicaSpecs.Worker.template.spec.containers",
    ),
    (
        "no image",
        delete_at([*L, "template", "spec", "containers", 0, "image"]),
        "spec.mpiReplicaSpecs.Launcher.template.spec.containers[0].image",
    ),
    (
        "bad limit",
        set_at([*W, "template", "spec", "containers", 0, "resources", "limits", "cpu"], "1 core"),
        "spec.mpiReplicaSpecs.Worker.template.spec.containers[0].resources.limits.cpu",
    ),
    ("unknown type", set_at(["spec", "mpiReplicaSpecs", "Master"], {}), "spec.mpiReplicaSpecs.Master"),
    ("negative slots", set_at(["spec", "slotsPerWorker"], -1), "spec.slotsPerWorker"),
    ("empty ssh path", set_at(["spec", "sshAuthMountPath"], ""), "spec.sshAuthMountPath"),
    ("bad implementation", set_at(["spec", "mpiImplementation"], "MVAPICH"), "spec.mpiImplementation"),
    ("bad creation policy", set_at(["spec", "launcherCreationPolicy"], "Later"), "spec.launcherCreationPolicy"),
    (
        "bad clean policy",
        set_at(["spec", "runPolicy", "cleanPodPolicy"], "Some"),
        "spec.runPolicy.cleanPodPolicy",
    ),
    (
        "unknown managedBy",
        set_at(["spec", "runPolicy", "managedBy"], labels.TRAINING_OPERATOR),
        "spec.runPolicy.managedBy",
    ),
    ("worker hostname too long", set_at(["metadata", "name"], "p" * 55), "metadata.name"),
    ("bad name", set_at(["metadata", "name"], "1pi"), "metadata.name"),
]


@pytest.mark.parametrize(("what", "mutate", "field"), BROKEN, ids=[b[0] for b in BROKEN])
def test_broken_mpijob_names_the_field(what: str, mutate: Callable[[Job], None], field: str) -> None:
    job = pi()
    mutate(job)
    errors = MPIJOB.validate(job)
    assert field in [e.field for e in errors], (what, [str(e) for e in errors])


def test_name_rule_uses_the_last_worker_hostname() -> None:
    job = pi()
    job["metadata"]["name"] = "p" * 54  # p...-worker-1 is 63 characters: fine
    assert MPIJOB.validate(job) == []
    job["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] = 11  # -worker-10 is one character longer
    assert [e.field for e in MPIJOB.validate(job)] == ["metadata.name"]


def test_own_controller_value_is_accepted() -> None:
    job = pi()
    job["spec"]["runPolicy"]["managedBy"] = labels.MPI_OPERATOR
    assert MPIJOB.validate(job) == []


def test_podsets_refuse_missing_launcher() -> None:
    job = pi()
    del job["spec"]["mpiReplicaSpecs"]["Launcher"]
    with pytest.raises(Invalid) as info:
        MPIJOB.podsets(job)
    assert info.value.field == "spec.mpiReplicaSpecs.Launcher"


def test_status_suspend_and_worker_copy() -> None:
    job = pi()
    job["status"] = {
        "conditions": [
            {"type": "Created", "status": "True"},
            {"type": "Failed", "status": "True", "reason": "MPIJobEvicted", "message": "1/2"},
        ]
    }
    assert MPIJOB.finished(job) == Finished("Failed", "MPIJobEvicted", "1/2")
    assert MPIJOB.is_suspended(MPIJOB.with_suspended(job, True))
    out = MPIJOB.prepare_for_worker(job, stamp={labels.JOB_KIND: "MPIJob"}, managed_by=labels.MPI_OPERATOR)
    assert out["spec"]["runPolicy"]["managedBy"] == labels.MPI_OPERATOR
    assert out["apiVersion"] == "kubeflow.org/v2beta1" and "status" not in out
    assert out["metadata"]["labels"] == {labels.JOB_KIND: "MPIJob"}
