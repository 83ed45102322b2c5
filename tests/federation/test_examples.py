"""Every manifest in examples/: it validates, its PodSets are the documented ones, it suits the demo
(handed to mkd, small requests, short kubesim run time), and broken variants fail naming the field."""

from __future__ import annotations

import copy
import functools
import os
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from federation import labels
from federation.errors import Invalid
from federation.kinds import pod as pods
from federation.kinds import registry
from federation.kinds.declared import load
from federation.kinds.registry import KINDS, by_api
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
    "ray/rayjob.yaml": [("head", 1), ("workers", 2), ("submitter", 1)],
    "ray/rayservice.yaml": [("head", 1), ("workers", 1)],
    "appwrapper/appwrapper.yaml": [("appwrapper-pi-0", 2)],
    "lws/leaderworkerset.yaml": [("leader", 2), ("worker", 4)],
    "special/too-large.yaml": [("master", 1), ("worker", 1)],
    "special/other-controller.yaml": [("master", 1)],
    "trainingrun/trainingrun.yaml": [("launcher", 1), ("workers", 2)],
    "pods/pod-group.yaml": [("driver", 1), ("worker", 2)],
}
"""The documented PodSets (examples/README.md); a pod group's PodSets are named by role hashes, listed here by the
name of the role's first container."""
SERVING = ("LeaderWorkerSet", "RayService")
"""Kinds whose examples serve until deleted: no run time of their own."""

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
    "ray/rayjob.yaml": "spec.rayClusterSpec.workerGroupSpecs[0].template",
    "ray/rayservice.yaml": "spec.rayClusterConfig.workerGroupSpecs[0].template",
    "appwrapper/appwrapper.yaml": "spec.components[0].template.spec.template",
    "lws/leaderworkerset.yaml": "spec.leaderWorkerTemplate.workerTemplate",
    "special/too-large.yaml": "spec.pytorchReplicaSpecs.Master.template",
    "special/other-controller.yaml": "spec.pytorchReplicaSpecs.Master.template",
    "trainingrun/trainingrun.yaml": "spec.workers.template",
    "pods/pod-group.yaml": "spec.pods[1]",
}
"""A pod template of each example (its field path; ``runtime.`` = in the TrainJob's runtime)."""


@functools.cache
def _documents() -> tuple[tuple[str, Obj], ...]:
    out = []
    for path in sorted(EXAMPLES.rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            out.append((str(path.relative_to(EXAMPLES)), doc))
    return tuple(out)


def documents() -> list[tuple[str, Obj]]:
    """Fresh copies, so a test may mutate what it gets."""
    return copy.deepcopy(list(_documents()))


def runtimes() -> dict[tuple[str, str], Obj]:
    return {(d["kind"], d["metadata"]["name"]): d for _, d in documents() if d.get("kind") in RUNTIME_PLURALS}


def jobs() -> dict[str, Obj]:
    """The job manifests: not the runtimes, nor a declared kind's CRD and declarations file. The Pods of a file
    are one pod group, as intake makes it (its group object)."""
    out: dict[str, Obj] = {}
    group: dict[str, list[Obj]] = {}
    for name, d in documents():
        if d.get("kind") == "Pod":
            d["metadata"]["uid"] = f"uid-{d['metadata']['name']}"
            group.setdefault(name, []).append(d)
        elif d.get("kind") not in (*RUNTIME_PLURALS, "CustomResourceDefinition", None):
            out[name] = d
    for name, members in group.items():
        out[name] = pods.group_object(members)
    return out


def podset_names(job: Obj, podsets: list[Any]) -> list[str]:
    """PodSet names as documented: a pod group's roles by their first container's name."""
    if job["kind"] != "Pod":
        return [p.name for p in podsets]
    return [p.template["spec"]["containers"][0]["name"] for p in podsets]


@pytest.fixture(autouse=True)
def declared_example_kinds() -> Iterator[None]:
    """The kinds examples/trainingrun/kinds.yaml declares, known while a test runs (as to the demo's services)."""
    with registry.declared(load(EXAMPLES / "trainingrun" / "kinds.yaml", KINDS)):
        yield


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
    for name in [*PODSETS, "trainjob/torch-distributed-runtime.yaml", "trainingrun/crd.yaml",
                 "trainingrun/kinds.yaml"]:
        assert f"`{name}`" in readme


@pytest.mark.parametrize("name", sorted(PODSETS))
def test_example_validates_and_has_its_podsets(name: str) -> None:
    job = jobs()[name]
    kind = by_api(job["apiVersion"], job["kind"])
    assert kind is not None
    runtime = runtime_for(job)
    assert kind.validate(job, runtime) == []
    podsets = kind.podsets(job, runtime)
    assert sorted(zip(podset_names(job, podsets), [p.count for p in podsets], strict=True)) == sorted(PODSETS[name])
    for podset in podsets:
        annotations = podset.template.get("metadata", {}).get("annotations", {})
        if job["kind"] == "Pod":  # a pod's own annotations, not a template's
            annotations = next(p["metadata"]["annotations"] for p in job["spec"]["pods"]
                               if p["spec"] == podset.template["spec"])
        if job["kind"] not in SERVING and (job["kind"] != "RayJob" or podset.name == "submitter"):
            # (Ray's nodes serve until the job ends, a serving kind's pods until it is deleted)
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
    # a pod of a group names its own fields, and which pod it is
    prefix, suffix = (template_path, "") if job["kind"] != "Pod" else ("", f" (pod {template['metadata']['name']})")
    if how == "no image":
        del container["image"]
        field = f"{prefix}.spec.containers[0].image".lstrip(".") + suffix
    elif how == "bad cpu":
        container.setdefault("resources", {}).setdefault("requests", {})["cpu"] = "one"
        field = f"{prefix}.spec.containers[0].resources.requests.cpu".lstrip(".") + suffix
    elif how in ("bad managedBy", "bad name") and job["kind"] == "Pod":  # a Pod: its group's metadata
        template["metadata"]["annotations"][pods.GROUP_TOTAL_COUNT] = "two"
        field = pods.TOTAL_COUNT_FIELD + suffix
    elif how == "bad managedBy" and not kind.managed_by_path:
        pytest.skip(f"{kind.name} has no managedBy field (it is handed to mkd by its queue label)")
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


# --- robustness: user input never crashes a kind ----------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 3) | st.floats(allow_nan=True) | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=6,
)


def paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix] if prefix else []
    if isinstance(node, dict):
        for key, value in node.items():
            out += paths(value, (*prefix, key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            out += paths(value, (*prefix, index))
    return out


@settings(
    max_examples=int(os.environ.get("MKD_FUZZ_EXAMPLES", "200")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(st.sampled_from(sorted(PODSETS)), st.data())
def test_mutated_examples_yield_invalid_never_a_crash(name: str, data: st.DataObject) -> None:
    job = copy.deepcopy(jobs()[name])
    kind = by_api(job["apiVersion"], job["kind"])
    assert kind is not None
    runtime = runtime_for(job)
    for _ in range(data.draw(st.integers(1, 3))):
        in_runtime = runtime is not None and data.draw(st.booleans())
        target = runtime if in_runtime and runtime is not None else job
        candidates = paths(target)
        if not candidates:
            break
        path = data.draw(st.sampled_from(candidates))
        node: Any = target
        for key in path[:-1]:
            node = node[key]
        if data.draw(st.booleans()):
            node[path[-1]] = data.draw(json_values)
        elif isinstance(node, dict):
            del node[path[-1]]
    errors = kind.validate(job, runtime)
    assert all(isinstance(e, Invalid) and e.field for e in errors)
    try:
        podsets = kind.podsets(job, runtime)
    except Invalid:
        return
    assert all(p.count >= 0 and p.requests["pods"] == 1 for p in podsets)
    kind.finished(job)
    kind.is_suspended(job)
    kind.managed_by(job)
    kind.runtime_ref(job)
    kind.prepare_for_worker(job, stamp={labels.ORIGIN: "o"}, managed_by=None)
