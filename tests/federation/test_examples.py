"""Every manifest in examples/: it validates, its PodSets are the documented ones, it suits the demo
(handed to mkd, small requests, short kubesim run time), and broken variants fail naming the field."""

from __future__ import annotations

import copy
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import yaml

from federation import labels
from federation.kinds.registry import by_api
from federation.kinds.trainjob import RUNTIME_PLURALS
from federation.podset import total_requests

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
D = Decimal
Obj = dict[str, Any]

PODSETS = {
    "pytorch/simple.yaml": [("master", 1), ("worker", 1)],
    "pytorch/mnist-gloo.yaml": [("master", 1), ("worker", 1)],
    "pytorch/sendrecv.yaml": [("master", 1), ("worker", 3)],
    "pytorch/cpu-demo.yaml": [("master", 1), ("worker", 1)],
    "pytorch/elastic-echo.yaml": [("worker", 2)],
    "mpi/pi.yaml": [("launcher", 1), ("worker", 2)],
    "trainjob/multi-node.yaml": [("node", 3)],
    "batch/job.yaml": [("main", 2)],
    "jobset/jobset.yaml": [("driver", 1), ("workers", 4)],
    "special/too-large.yaml": [("master", 1), ("worker", 1)],
    "special/other-controller.yaml": [("master", 1)],
}
"""The documented PodSets (examples/README.md)."""

TEMPLATE = {
    "pytorch/simple.yaml": "spec.pytorchReplicaSpecs.Master.template",
    "pytorch/mnist-gloo.yaml": "spec.pytorchReplicaSpecs.Worker.template",
    "pytorch/sendrecv.yaml": "spec.pytorchReplicaSpecs.Worker.template",
    "pytorch/cpu-demo.yaml": "spec.pytorchReplicaSpecs.Master.template",
    "pytorch/elastic-echo.yaml": "spec.pytorchReplicaSpecs.Worker.template",
    "mpi/pi.yaml": "spec.mpiReplicaSpecs.Worker.template",
    "trainjob/multi-node.yaml": "runtime.spec.template.spec.replicatedJobs[0].template.spec.template",
    "batch/job.yaml": "spec.template",
    "jobset/jobset.yaml": "spec.replicatedJobs[1].template.spec.template",
    "special/too-large.yaml": "spec.pytorchReplicaSpecs.Master.template",
    "special/other-controller.yaml": "spec.pytorchReplicaSpecs.Master.template",
}
"""A pod template of each example (its field path; ``runtime.`` = in the TrainJob's runtime)."""


def documents() -> list[tuple[str, Obj]]:
    out = []
    for path in sorted(EXAMPLES.rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            out.append((str(path.relative_to(EXAMPLES)), doc))
    return out


def runtimes() -> dict[tuple[str, str], Obj]:
    return {(d["kind"], d["metadata"]["name"]): d for _, d in documents() if d["kind"] in RUNTIME_PLURALS}


def jobs() -> dict[str, Obj]:
    return {name: d for name, d in documents() if d["kind"] not in RUNTIME_PLURALS}


def runtime_for(job: Obj) -> Obj | None:
    if job["kind"] != "TrainJob":
        return None
    ref = job["spec"]["runtimeRef"]
    return copy.deepcopy(runtimes()[(ref.get("kind", "ClusterTrainingRuntime"), ref["name"])])


def resolve(obj: Obj, dotted: str) -> Any:
    node: Any = obj
    for part in dotted.replace("]", "").replace("[", ".").split("."):
        node = node[int(part)] if part.isdigit() else node[part]
    return node


def test_every_example_is_listed_here_and_in_the_readme() -> None:
    assert set(jobs()) == set(PODSETS)
    readme = (EXAMPLES / "README.md").read_text()
    for name in [*PODSETS, "trainjob/torch-distributed-runtime.yaml"]:
        assert f"`{name}`" in readme


@pytest.mark.parametrize("name", sorted(PODSETS))
def test_example_validates_and_has_its_podsets(name: str) -> None:
    job = jobs()[name]
    kind = by_api(job["apiVersion"], job["kind"])
    assert kind is not None
    runtime = runtime_for(job)
    assert kind.validate(job, runtime) == []
    podsets = kind.podsets(job, runtime)
    assert [(p.name, p.count) for p in podsets] == PODSETS[name]
    for podset in podsets:
        annotations = podset.template.get("metadata", {}).get("annotations", {})
        assert annotations.get("kubesim.mkd.dev/run-seconds") == "3", podset.name
        assert D("0.25") <= podset.requests["cpu"] <= D(1)
        assert 256 * 2**20 <= podset.requests["memory"] <= 2**30
    assert job["metadata"]["namespace"] in ("default", "team-a")
    expected = labels.TRAINING_OPERATOR if name == "special/other-controller.yaml" else labels.MULTIKUEUE
    assert kind.managed_by(job) == expected


def test_only_the_gpu_examples_ask_for_gpus_and_too_large_fits_no_demo_node() -> None:
    gpus = {}
    for name, job in jobs().items():
        kind = by_api(job["apiVersion"], job["kind"])
        assert kind is not None
        podsets = kind.podsets(job, runtime_for(job))
        gpus[name] = max(p.requests.get("nvidia.com/gpu", D(0)) for p in podsets)
        if name == "special/too-large.yaml":
            assert total_requests(podsets)["nvidia.com/gpu"] == 32
    assert {n for n, g in gpus.items() if g} == {"pytorch/mnist-gloo.yaml", "special/too-large.yaml"}
    assert gpus["special/too-large.yaml"] == 16  # the demo's GPU nodes have 4


BREAKS = ["no image", "bad cpu", "bad managedBy", "bad name"]


@pytest.mark.parametrize("name", sorted(PODSETS))
@pytest.mark.parametrize("how", BREAKS)
def test_broken_variant_names_the_field(name: str, how: str) -> None:
    job = copy.deepcopy(jobs()[name])
    kind = by_api(job["apiVersion"], job["kind"])
    assert kind is not None
    runtime = runtime_for(job)
    template_path = TEMPLATE[name]
    holder = runtime if template_path.startswith("runtime.") else job
    assert holder is not None
    template = resolve(holder, template_path.removeprefix("runtime."))
    container = template["spec"]["containers"][0]
    if how == "no image":
        del container["image"]
        field = f"{template_path}.spec.containers[0].image"
    elif how == "bad cpu":
        container.setdefault("resources", {}).setdefault("requests", {})["cpu"] = "one"
        field = f"{template_path}.spec.containers[0].resources.requests.cpu"
    elif how == "bad managedBy":
        node = job
        for key in kind.managed_by_path[:-1]:
            node = node[key]
        node[kind.managed_by_path[-1]] = "example.com/elsewhere"
        field = ".".join(kind.managed_by_path)
    else:
        job["metadata"]["name"] = "Not_A_Name"
        field = "metadata.name"
    errors = kind.validate(job, runtime)
    assert field in [e.field for e in errors], [str(e) for e in errors]
    assert all(e.fix for e in errors)
