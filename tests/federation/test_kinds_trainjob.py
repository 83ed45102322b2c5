"""TrainJob: PodSets from the runtime's JobSet template plus trainer overrides (torch, MPI, multi-step),
runtimeRef, validation against the runtime, managedBy without an invented default, status."""

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
from federation.kinds.base import Finished, RuntimeRef
from federation.kinds.trainjob import ANCESTOR_LABEL, TRAINJOB, effective_replicated_jobs
from tests.federation.mutations import delete_at, set_at

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
D = Decimal
Obj = dict[str, Any]


def load(name: str) -> Obj:
    doc = yaml.safe_load((EXAMPLES / name).read_text())
    assert isinstance(doc, dict)
    return doc


def torch_runtime() -> Obj:
    return load("trainjob/torch-distributed-runtime.yaml")


def multi_node() -> Obj:
    return load("trainjob/multi-node.yaml")


def rjob(
    name: str,
    *,
    ancestor: str | None = None,
    container: str = "node",
    image: str | None = "img:1",
    parallelism: int | None = None,
    replicas: int | None = None,
    **requests: str,
) -> Obj:
    c: Obj = {"name": container, "resources": {"requests": dict(requests)} if requests else {}}
    if image:
        c["image"] = image
    spec: Obj = {"template": {"spec": {"containers": [c]}}}
    if parallelism is not None:
        spec["parallelism"] = parallelism
    out: Obj = {"name": name, "template": {"spec": spec}}
    if ancestor:
        out["template"]["metadata"] = {"labels": {ANCESTOR_LABEL: ancestor}}
    if replicas is not None:
        out["replicas"] = replicas
    return out


def runtime(*rjobs: Obj, kind: str = "ClusterTrainingRuntime", **ml_policy: Any) -> Obj:
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": kind,
        "metadata": {"name": "rt"},
        "spec": {"mlPolicy": ml_policy, "template": {"spec": {"replicatedJobs": list(rjobs)}}},
    }


def trainjob(**trainer: Any) -> Obj:
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": "tj", "namespace": "team-a"},
        "spec": {"managedBy": labels.MULTIKUEUE, "runtimeRef": {"name": "rt"}, "trainer": trainer},
    }


def test_multi_node_example() -> None:
    job, rt = multi_node(), torch_runtime()
    assert TRAINJOB.validate(job, rt) == []
    [node] = TRAINJOB.podsets(job, rt)
    assert (node.name, node.count) == ("node", 3)
    # resourcesPerNode replaced the runtime's 250m / 256Mi per key
    assert node.requests == {"cpu": D("0.5"), "memory": D(512 * 2**20), "pods": D(1)}
    assert node.total() == {"cpu": D("1.5"), "memory": D(1536 * 2**20), "pods": D(3)}
    container = node.template["spec"]["containers"][0]
    assert container["command"] == job["spec"]["trainer"]["command"]
    assert container["resources"]["limits"] == {"cpu": "1", "memory": "1Gi"}
    assert (
        container["image"]
        == rt["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"][
            "containers"
        ][0]["image"]
    )
    [effective] = effective_replicated_jobs(job, rt)
    assert effective["template"]["spec"]["parallelism"] == effective["template"]["spec"]["completions"] == 3
    assert (
        "parallelism" not in rt["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]
    )  # untouched


def test_num_nodes_falls_back_to_the_runtime_then_one() -> None:
    job = multi_node()
    del job["spec"]["trainer"]["numNodes"]
    rt = torch_runtime()
    assert TRAINJOB.podsets(job, rt)[0].count == 1
    rt["spec"]["mlPolicy"]["numNodes"] = 4
    assert TRAINJOB.podsets(job, rt)[0].count == 4
    del rt["spec"]["mlPolicy"]["numNodes"]
    assert TRAINJOB.podsets(job, rt)[0].count == 1


def test_image_args_and_env_override_the_node_container() -> None:
    rt = runtime(rjob("node", ancestor="trainer", cpu="1"), torch={})
    node = rt["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"][
        "containers"
    ][0]
    node["env"] = [{"name": "KEEP", "value": "1"}, {"name": "OVERRIDE", "value": "old"}]
    job = trainjob(
        numNodes=2, image="mine:2", args=["--lr", "0.1"], env=[{"name": "OVERRIDE", "value": "new"}]
    )
    [podset] = TRAINJOB.podsets(job, rt)
    container = podset.template["spec"]["containers"][0]
    assert container["image"] == "mine:2" and container["args"] == ["--lr", "0.1"]
    assert container["env"] == [{"name": "KEEP", "value": "1"}, {"name": "OVERRIDE", "value": "new"}]
    assert podset.requests["cpu"] == D(1)


def deepspeed_like(launcher_as_node: bool = True) -> Obj:
    return runtime(
        rjob("launcher", ancestor="trainer", cpu="500m"),
        rjob("node", cpu="2", memory="2Gi"),
        numNodes=1,
        mpi={"numProcPerNode": 1, "runLauncherAsNode": launcher_as_node},
    )


def test_mpi_launcher_as_node_takes_one_node() -> None:
    job = trainjob(
        numNodes=3, image="ds:1", command=["mpirun", "train"], resourcesPerNode={"requests": {"cpu": "4"}}
    )
    rt = deepspeed_like()
    assert TRAINJOB.validate(job, rt) == []
    launcher, node = TRAINJOB.podsets(job, rt)
    assert (launcher.name, launcher.count, node.name, node.count) == ("launcher", 1, "node", 2)
    # resourcesPerNode reaches the node pods and the launcher that runs as a node
    assert launcher.requests["cpu"] == node.requests["cpu"] == D(4)
    assert node.requests["memory"] == D(2 * 2**30)
    assert launcher.template["spec"]["containers"][0]["command"] == ["mpirun", "train"]
    assert "command" not in node.template["spec"]["containers"][0]  # node pods keep sshd
    assert node.template["spec"]["containers"][0]["image"] == "ds:1"
    rt = deepspeed_like(launcher_as_node=False)
    launcher, node = TRAINJOB.podsets(job, rt)
    # upstream merges resourcesPerNode into the trainer ancestor (here the launcher), and into the
    # node job only when the launcher runs as a node
    assert (launcher.count, node.count, launcher.requests["cpu"], node.requests["cpu"]) == (1, 3, D(4), D(2))


def test_one_node_with_launcher_as_node_still_runs_one_node_job() -> None:
    # upstream's MPI policy: node count = max(numNodes - 1, 1)
    assert [(p.name, p.count) for p in TRAINJOB.podsets(trainjob(numNodes=1), deepspeed_like())] == [
        ("launcher", 1), ("node", 1)
    ]


def test_initializer_steps_are_their_own_podsets() -> None:
    rt = runtime(
        rjob(
            "dataset-initializer",
            ancestor="dataset-initializer",
            container="dataset-initializer",
            cpu="1",
            replicas=3,
        ),
        rjob("node", ancestor="trainer", cpu="2"),
        numNodes=1,
        torch={},
    )
    podsets = TRAINJOB.podsets(trainjob(numNodes=2), rt)
    assert [(p.name, p.count) for p in podsets] == [("dataset-initializer", 1), ("node", 2)]
    from federation.podset import total_requests

    assert total_requests(podsets)["cpu"] == D(5)


def test_plain_jobs_count_replicas_times_parallelism() -> None:
    rt = runtime(
        rjob("node", ancestor="trainer"),
        rjob("sidecar-job", container="helper", parallelism=2, replicas=2),
        torch={},
    )
    assert [(p.name, p.count) for p in TRAINJOB.podsets(trainjob(numNodes=1), rt)] == [
        ("node", 1),
        ("sidecar-job", 4),
    ]


def test_runtime_ref() -> None:
    assert TRAINJOB.runtime_ref(multi_node()) == RuntimeRef(
        "trainer.kubeflow.org/v1alpha1",
        "ClusterTrainingRuntime",
        "clustertrainingruntimes",
        "torch-distributed",
        None,
    )
    job = trainjob()
    assert TRAINJOB.runtime_ref(job) == RuntimeRef(  # kind defaults to ClusterTrainingRuntime
        "trainer.kubeflow.org/v1alpha1", "ClusterTrainingRuntime", "clustertrainingruntimes", "rt", None
    )
    job["spec"]["runtimeRef"]["kind"] = "TrainingRuntime"
    assert TRAINJOB.runtime_ref(job) == RuntimeRef(
        "trainer.kubeflow.org/v1alpha1", "TrainingRuntime", "trainingruntimes", "rt", "team-a"
    )
    job["spec"]["runtimeRef"]["apiGroup"] = "example.com"
    assert TRAINJOB.runtime_ref(job) is None
    del job["spec"]["runtimeRef"]
    assert TRAINJOB.runtime_ref(job) is None


def test_podsets_need_the_runtime() -> None:
    with pytest.raises(Invalid) as info:
        TRAINJOB.podsets(multi_node(), None)
    assert info.value.field == "spec.runtimeRef"



T = ["spec", "trainer"]
BROKEN_JOB: list[tuple[str, Callable[[Obj], None], str]] = [
    ("no runtimeRef", delete_at(["spec", "runtimeRef"]), "spec.runtimeRef"),
    ("no runtime name", delete_at(["spec", "runtimeRef", "name"]), "spec.runtimeRef.name"),
    ("foreign group", set_at(["spec", "runtimeRef", "apiGroup"], "example.com"), "spec.runtimeRef.apiGroup"),
    ("unknown runtime kind", set_at(["spec", "runtimeRef", "kind"], "Runtime"), "spec.runtimeRef.kind"),
    ("zero nodes", set_at([*T, "numNodes"], 0), "spec.trainer.numNodes"),
    ("reserved env", set_at([*T, "env"], [{"name": "PET_NNODES", "value": "9"}]), "spec.trainer.env[0].name"),
    ("nameless env", set_at([*T, "env"], [{"value": "9"}]), "spec.trainer.env[0].name"),
    (
        "bad resourcesPerNode",
        set_at([*T, "resourcesPerNode", "requests", "memory"], "1GB"),
        "spec.trainer.resourcesPerNode.requests.memory",
    ),
    ("command not a list", set_at([*T, "command"], "torchrun"), "spec.trainer.command"),
    ("bad numProcPerNode", set_at([*T, "numProcPerNode"], 0), "spec.trainer.numProcPerNode"),
    ("bad name", set_at(["metadata", "name"], "Multi.Node"), "metadata.name"),
    (
        "prototype managedBy",
        set_at(["spec", "managedBy"], "kubeflow.org/trainjob-controller"),
        "spec.managedBy",
    ),
    ("zero deadline", set_at(["spec", "activeDeadlineSeconds"], 0), "spec.activeDeadlineSeconds"),
    ("suspend not bool", set_at(["spec", "suspend"], 1), "spec.suspend"),
]
RJ = ["spec", "template", "spec", "replicatedJobs"]
NODE_POD = [*RJ, 0, "template", "spec", "template", "spec"]
BROKEN_RUNTIME: list[tuple[str, Callable[[Obj], None], str]] = [
    (
        "no node container",
        set_at([*NODE_POD, "containers", 0, "name"], "trainer"),
        "runtime.spec.template.spec.replicatedJobs[0].template.spec.template.spec.containers",
    ),
    (
        "no trainer job",
        lambda rt: (set_at([*RJ, 0, "name"], "other")(rt), delete_at([*RJ, 0, "template", "metadata"])(rt)),
        "runtime.spec.template.spec.replicatedJobs",
    ),
    ("no replicated jobs", set_at(RJ, []), "runtime.spec.template.spec.replicatedJobs"),
    (
        "no image",
        delete_at([*NODE_POD, "containers", 0, "image"]),
        "runtime.spec.template.spec.replicatedJobs[0].template.spec.template.spec.containers[0].image",
    ),
    ("zero runtime nodes", set_at(["spec", "mlPolicy", "numNodes"], 0), "runtime.spec.mlPolicy.numNodes"),
    ("kind mismatch", set_at(["kind"], "TrainingRuntime"), "spec.runtimeRef.kind"),
    (
        "bad restart policy",
        set_at([*NODE_POD, "restartPolicy"], "Always"),
        "runtime.spec.template.spec.replicatedJobs[0].template.spec.template.spec.restartPolicy",
    ),
]


@pytest.mark.parametrize(("what", "mutate", "field"), BROKEN_JOB, ids=[b[0] for b in BROKEN_JOB])
def test_broken_trainjob_names_the_field(what: str, mutate: Callable[[Obj], None], field: str) -> None:
    job = multi_node()
    mutate(job)
    errors = TRAINJOB.validate(job, torch_runtime())
    assert field in [e.field for e in errors], (what, [str(e) for e in errors])


@pytest.mark.parametrize(("what", "mutate", "field"), BROKEN_RUNTIME, ids=[b[0] for b in BROKEN_RUNTIME])
def test_broken_runtime_names_the_field(what: str, mutate: Callable[[Obj], None], field: str) -> None:
    rt = torch_runtime()
    mutate(rt)
    errors = TRAINJOB.validate(multi_node(), rt)
    assert field in [e.field for e in errors], (what, [str(e) for e in errors])
    with pytest.raises(Invalid):
        TRAINJOB.podsets(multi_node(), rt)


def test_trainer_image_fills_a_runtime_without_one() -> None:
    rt = torch_runtime()
    del rt["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"][
        "containers"
    ][0]["image"]
    job = multi_node()
    job["spec"]["trainer"]["image"] = "mine:1"
    assert TRAINJOB.validate(job, rt) == []


def test_reserved_env_is_fine_for_an_mpi_runtime() -> None:
    job = trainjob(numNodes=2, env=[{"name": "PET_NNODES", "value": "2"}])
    assert TRAINJOB.validate(job, deepspeed_like()) == []
    assert [e.field for e in TRAINJOB.validate(job, None)] == ["spec.trainer.env[0].name"]


def test_managed_by_has_no_invented_default() -> None:
    job = multi_node()
    del job["spec"]["managedBy"]
    assert TRAINJOB.managed_by(job) is None
    assert TRAINJOB.validate(job, torch_runtime()) == []
    job["spec"]["managedBy"] = labels.TRAINJOB_CONTROLLER
    assert TRAINJOB.validate(job, torch_runtime()) == []


def test_status_suspend_and_worker_copy() -> None:
    job = multi_node()
    job["metadata"]["uid"] = "u1"
    job["status"] = {
        "conditions": [
            {
                "type": "Complete",
                "status": "True",
                "reason": "AllJobsCompleted",
                "message": "jobset completed successfully",
            }
        ]
    }
    assert TRAINJOB.finished(job) == Finished(
        "Succeeded", "AllJobsCompleted", "jobset completed successfully"
    )
    job["status"]["conditions"][0]["type"] = "Failed"
    failed = TRAINJOB.finished(job)
    assert failed is not None and failed.outcome == "Failed"
    assert TRAINJOB.is_suspended(TRAINJOB.with_suspended(job, True))
    out = TRAINJOB.prepare_for_worker(copy.deepcopy(job), stamp={labels.ORIGIN: "o"}, managed_by=None)
    assert "managedBy" not in out["spec"] and "uid" not in out["metadata"] and "status" not in out
    assert out["spec"]["runtimeRef"] == job["spec"]["runtimeRef"]
