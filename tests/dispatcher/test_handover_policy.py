"""HandoverPolicy parsing, selection, the stable share, precedence, and the webhook's answer."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from dispatcher.handover import policy as hp
from dispatcher.handover.webhook import review
from federation import labels
from federation.errors import Invalid
from federation.kinds.registry import KINDS

KIND_NAMES = [k.name for k in KINDS]
BY_GK = {(k.group, k.name): k for k in KINDS}


def pol(name: str, mode: str, **spec: Any) -> hp.Policy:
    return hp.parse({"metadata": {"name": name}, "spec": {"mode": mode, **spec}}, KIND_NAMES)


def decide(policies: list[hp.Policy], name: str = "job", namespace: str = "team-a",
           ns_labels: dict[str, str] | None = None, kind: str = "PyTorchJob") -> hp.Decision:
    return hp.decide(policies, kind=kind, namespace=namespace, name=name,
                     namespace_labels=ns_labels if ns_labels is not None else {"team": "a"}, job_labels={})


@pytest.mark.parametrize("spec,field", [
    ({"mode": "Migrate"}, "spec.mode"),
    ({"mode": "Route", "percent": 101}, "spec.percent"),
    ({"mode": "Route", "percent": "10%"}, "spec.percent"),
    ({"mode": "Route", "kinds": ["PyTorchJob", "SparkApplication"]}, "spec.kinds[1]"),
    ({"mode": "Route", "namespaceSelector": {"matchExpressions": [{"key": "a", "operator": "Has"}]}},
     "spec.namespaceSelector.matchExpressions[0].operator"),
    ({"mode": "Route", "jobSelector": {"matchExpressions": [{"key": "a", "operator": "In"}]}},
     "spec.jobSelector.matchExpressions[0].values"),
])
def test_a_bad_policy_names_the_field_and_the_fix(spec: dict[str, Any], field: str) -> None:
    with pytest.raises(Invalid) as bad:
        hp.parse({"metadata": {"name": "p"}, "spec": spec}, KIND_NAMES)
    assert bad.value.field == field and bad.value.fix


def test_the_share_is_stable_and_raising_it_keeps_the_first_jobs() -> None:
    names = [f"job-{i}" for i in range(1000)]
    at10 = {n for n in names if decide([pol("r", "Route", percent=10)], n).route}
    at50 = {n for n in names if decide([pol("r", "Route", percent=50)], n).route}
    assert 60 <= len(at10) <= 140 and 420 <= len(at50) <= 580
    assert at10 <= at50
    assert at10 == {n for n in names if decide([pol("other-name", "Route", percent=10)], n).route}
    assert not any(decide([pol("r", "Route", percent=0)], n).route for n in names)


def test_selection_by_namespace_labels_kind_and_precedence() -> None:
    route = pol("route-a", "Route", namespaceSelector={"matchLabels": {"team": "a"}}, kinds=["PyTorchJob"])
    assert decide([route]).route
    assert not decide([route], ns_labels={"team": "b"}).route
    assert decide([route], ns_labels={"team": "b"}).policy is None
    assert not decide([route], kind="MPIJob").route
    drain = pol("drain-all", "Drain")
    d = decide([route, drain])
    assert not d.route and d.mode == "Drain" and d.policy == "drain-all"
    shadow = decide([pol("watch", "Shadow")])
    assert not shadow.route and shadow.mode == "Shadow"


def request(obj: dict[str, Any], operation: str = "CREATE") -> dict[str, Any]:
    api = obj["apiVersion"]
    group = api.rpartition("/")[0]
    return {"uid": "u-1", "operation": operation, "kind": {"group": group, "version": "v", "kind": obj["kind"]},
            "namespace": obj["metadata"]["namespace"], "object": obj}


def ops(answer: dict[str, Any]) -> list[dict[str, Any]]:
    assert answer["allowed"] is True
    return json.loads(base64.b64decode(answer["patch"])) if "patch" in answer else []


def routes(*_: Any) -> hp.Decision:
    return hp.Decision(True, "route-a", "Route", "HandoverPolicy route-a routes 100%")


def test_the_webhook_sets_managedby_only_when_the_user_left_it_unset() -> None:
    job = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": "j", "namespace": "team-a"},
           "spec": {"pytorchReplicaSpecs": {}}}
    assert ops(review(request(job), BY_GK, routes)) == [
        {"op": "add", "path": "/spec/runPolicy", "value": {}},
        {"op": "add", "path": "/spec/runPolicy/managedBy", "value": labels.MULTIKUEUE}]
    explicit = {**job, "spec": {"runPolicy": {"managedBy": labels.TRAINING_OPERATOR}}}
    assert ops(review(request(explicit), BY_GK, routes)) == []  # the user's choice wins
    assert ops(review(request(job, "UPDATE"), BY_GK, routes)) == []  # never after creation
    kept = hp.Decision(False, "route-a", "Route", "outside the share")
    assert ops(review(request(job), BY_GK, lambda *_: kept)) == []
    batch = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "b", "namespace": "team-a"}, "spec": {}}
    assert ops(review(request(batch), BY_GK, routes)) == [
        {"op": "add", "path": "/spec/managedBy", "value": labels.MULTIKUEUE}]
    # a CRD that defaults managedBy fills it before webhooks run: the default counts as unset
    train = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
             "metadata": {"name": "t", "namespace": "team-a"}, "spec": {"managedBy": labels.TRAINJOB_CONTROLLER}}
    assert ops(review(request(train), BY_GK, routes)) == [
        {"op": "add", "path": "/spec/managedBy", "value": labels.MULTIKUEUE}]
