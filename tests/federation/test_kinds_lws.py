"""LeaderWorkerSet: PodSets as Kueue counts them for quota (per group: leader × 1 and worker × size − 1, or main
× size; all groups of one LWS together), the refusals of LWS's webhook and CRD with field and fix, no managedBy
(handed over by its queue label), never finished, and zero groups as its suspend."""

from __future__ import annotations

from typing import Any

import pytest

from federation import labels
from federation.errors import Invalid
from federation.kinds.leaderworkerset import LEADERWORKERSET, SUSPENDED_REPLICAS
from federation.kinds.manifests import handed_over
from federation.kinds.registry import KINDS


def template(cpu: str = "1", name: str = "vllm") -> dict[str, Any]:
    return {"spec": {"containers": [{"name": name, "image": "vllm/vllm-openai:v0.9", "resources": {"requests": {"cpu": cpu}}}]}}


def lws(*, queue: str | None = "default", leader: bool = True, **spec: Any) -> dict[str, Any]:
    lwt: dict[str, Any] = {"size": 4, "workerTemplate": template("2")}
    if leader:
        lwt["leaderTemplate"] = template("1")
    meta: dict[str, Any] = {"name": "serve", "namespace": "team-a"}
    if queue:
        meta["labels"] = {labels.QUEUE_NAME: queue}
    return {"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet", "metadata": meta,
            "spec": {"replicas": 3, "leaderWorkerTemplate": lwt, **spec}}


def test_podsets_are_kueues_per_group_times_the_groups() -> None:
    sets = LEADERWORKERSET.podsets(lws())
    assert [(p.name, p.count) for p in sets] == [("leader", 3), ("worker", 9)]
    assert sets[0].requests["cpu"] == 1 and sets[1].requests["cpu"] == 2
    # without a leader template every pod of a group is the worker template's: Kueue's "main" PodSet
    assert [(p.name, p.count) for p in LEADERWORKERSET.podsets(lws(leader=False))] == [("main", 12)]
    # the defaults: one group of one pod; size 1 keeps Kueue's empty worker PodSet
    one = lws()
    del one["spec"]["replicas"], one["spec"]["leaderWorkerTemplate"]["size"]
    assert [(p.name, p.count) for p in LEADERWORKERSET.podsets(one)] == [("leader", 1), ("worker", 0)]


def test_an_lws_is_mkds_when_it_names_a_queue() -> None:
    assert LEADERWORKERSET.managed_by(lws()) == labels.MULTIKUEUE
    assert LEADERWORKERSET.managed_by(lws(queue=None)) is None
    assert LEADERWORKERSET.managed_by_field == f"metadata.labels[{labels.QUEUE_NAME}]"
    # no managedBy field: no handover webhook rule, admission policy or HandoverPolicy enum entry for it
    assert LEADERWORKERSET not in handed_over(KINDS) and LEADERWORKERSET in KINDS
    copy = LEADERWORKERSET.prepare_for_worker(lws(), stamp={labels.ORIGIN: "o"}, managed_by=None)
    assert copy["metadata"]["labels"] == {labels.QUEUE_NAME: "default", labels.ORIGIN: "o"}
    assert copy["spec"] == lws()["spec"]


@pytest.mark.parametrize(("change", "field", "fix"), [
    ({"replicas": -1}, "spec.replicas", ">= 0"),
    ({"replicas": 1_000_001}, "spec.replicas", "at most"),
    ({"replicas": 1_000_000, "size": 4000}, "spec.replicas", "fewer or smaller"),
    ({"size": 0}, "spec.leaderWorkerTemplate.size", ">= 1"),
    ({"startupPolicy": "Eager"}, "spec.startupPolicy", "LeaderCreated"),
    ({"restartPolicy": "Always"}, "spec.leaderWorkerTemplate.restartPolicy", "RecreateGroupOnPodRestart"),
    ({"workerTemplate": {"spec": {"containers": []}}}, "spec.leaderWorkerTemplate.workerTemplate.spec.containers",
     "container"),
    ({"leaderTemplate": {"spec": {"containers": [{"name": "l"}]}}},
     "spec.leaderWorkerTemplate.leaderTemplate.spec.containers[0].image", "image"),
    ({"name": "Serve_1"}, "metadata.name", "rename"),
])
def test_refusals_name_the_field_and_the_fix(change: dict[str, Any], field: str, fix: str) -> None:
    job = lws()
    for key, value in change.items():
        if key in ("replicas", "startupPolicy"):
            job["spec"][key] = value
        elif key == "name":
            job["metadata"]["name"] = value
        else:
            job["spec"]["leaderWorkerTemplate"][key] = value
    problems = LEADERWORKERSET.validate(job)
    assert [p.field for p in problems] == [field], problems
    assert fix in problems[0].fix
    with pytest.raises(Invalid):
        LEADERWORKERSET.podsets(job)


def test_missing_template_is_refused() -> None:
    job = lws()
    del job["spec"]["leaderWorkerTemplate"]
    assert [p.field for p in LEADERWORKERSET.validate(job)] == ["spec.leaderWorkerTemplate"]


def test_never_finished_and_suspended_as_zero_groups() -> None:
    job = lws()
    job["status"] = {"readyReplicas": 3, "conditions": [{"type": "Available", "status": "True"}]}
    assert LEADERWORKERSET.finished(job) is None
    assert not LEADERWORKERSET.is_suspended(job)
    stopped = LEADERWORKERSET.with_suspended(job, True)
    assert stopped["spec"]["replicas"] == 0 and LEADERWORKERSET.is_suspended(stopped)
    assert stopped["metadata"]["annotations"][SUSPENDED_REPLICAS] == "3"
    back = LEADERWORKERSET.with_suspended(stopped, False)
    assert back["spec"]["replicas"] == 3 and SUSPENDED_REPLICAS not in back["metadata"]["annotations"]
    assert LEADERWORKERSET.suspend_patch(stopped, False) == {
        "spec": {"replicas": 3}, "metadata": {"annotations": {SUSPENDED_REPLICAS: None}}}
    # a zero-group LWS on the manager holds no quota: mkd counts it as suspended
    assert [(p.name, p.count) for p in LEADERWORKERSET.podsets(lws(replicas=0))] == [("leader", 0), ("worker", 0)]
