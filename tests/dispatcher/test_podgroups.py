"""Intake of Pods: a group is passed on once complete, as one object; a member deleted ends it; the status of a
group is written per Pod, keeping a gated manager pod's SchedulingGated until its worker twin is scheduled."""

from __future__ import annotations

from typing import Any

from dispatcher.intake.podgroups import PodGroups, not_gated
from dispatcher.mirror import podstatus
from federation import labels
from federation.kinds import pod as pods


def member(name: str, *, group: str | None = "g", count: str = "3", gated: bool = True) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "team-a", "uid": f"uid-{name}",
                            "labels": {labels.QUEUE_NAME: "default"}}
    if group is not None:
        meta["labels"][pods.GROUP_NAME_LABEL] = group
        meta["annotations"] = {pods.GROUP_TOTAL_COUNT: count}
    spec: dict[str, Any] = {"containers": [{"name": "c", "image": "busybox"}]}
    if gated:
        spec["schedulingGates"] = [{"name": pods.ADMISSION_GATE}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def test_a_group_is_passed_on_once_its_total_count_of_pods_exists() -> None:
    groups = PodGroups()
    assert groups.feed(member("a"), False) == []
    assert groups.feed(member("b"), False) == []
    ((obj, deleted),) = groups.feed(member("c"), False)
    assert not deleted and [p["metadata"]["name"] for p in obj["spec"]["pods"]] == ["a", "b", "c"]
    # a status change of a member passes the same group on (intake's filter drops what the engine need not see)
    ((again, _),) = groups.feed({**member("b"), "status": {"phase": "Running"}}, False)
    assert again["metadata"]["uid"] == obj["metadata"]["uid"]
    assert again["status"]["pods"]["b"] == {"phase": "Running"}


def test_a_group_without_a_usable_total_count_is_passed_on_at_once_to_be_refused() -> None:
    """With no count to wait for, the group would wait forever unseen: it is passed on, and refused naming the
    annotation (Kueue's webhook refuses such a Pod at creation)."""
    for count in ("zero", "0", ""):
        ((obj, deleted),) = PodGroups().feed(member("a", count=count), False)
        assert not deleted
        assert pods.TOTAL_COUNT_FIELD in [e.field for e in pods.POD.validate(obj)]
    uncounted = member("a")
    del uncounted["metadata"]["annotations"]
    ((obj, _),) = PodGroups().feed(uncounted, False)
    assert pods.TOTAL_COUNT_FIELD in [e.field for e in pods.POD.validate(obj)]


def test_a_member_deleted_ends_the_group_and_pods_made_again_are_a_new_one() -> None:
    groups = PodGroups()
    for name in "abc":
        out = groups.feed(member(name), False)
    ((obj, _),) = out
    ((gone, deleted),) = groups.feed({"metadata": {"name": "b", "namespace": "team-a"}}, True)
    assert deleted and gone["metadata"]["uid"] == obj["metadata"]["uid"]
    assert groups.feed({**member("a"), "metadata": {**member("a")["metadata"], "deletionTimestamp": "t"}},
                       False) == []
    remade = {**member("b"), "metadata": {**member("b")["metadata"], "uid": "uid-b-2"}}
    assert groups.feed(remade, False) == []  # a and b only: a was being deleted
    ((new, deleted),) = groups.feed({**member("a"), "metadata": {**member("a")["metadata"], "uid": "uid-a-2"}},
                                    False)
    assert not deleted and new["metadata"]["uid"] != obj["metadata"]["uid"]


def test_a_single_pod_is_its_own_group_at_once() -> None:
    ((obj, deleted),) = PodGroups().feed(member("alone", group=None), False)
    assert not deleted and obj["metadata"]["uid"] == "uid-alone" and obj["metadata"]["name"] == "alone"


def test_a_queued_pod_without_the_gate_is_told_how_to_fix_it() -> None:
    text = not_gated(member("x", gated=False))
    assert text is not None and pods.ADMISSION_GATE in text and "spec.schedulingGates" in text
    assert not_gated(member("x")) is None


def test_each_pod_gets_its_worker_twins_status_and_mkds_conditions() -> None:
    gated = {"type": "PodScheduled", "status": "False", "reason": "SchedulingGated"}
    mine = {"phase": "Pending", "conditions": [gated]}
    current = {"pods": {"a": mine, "b": mine}}
    dispatched = {"type": labels.CONDITION_DISPATCHED, "status": "True", "reason": "Placed", "message": "on w-1",
                  "lastTransitionTime": "2026-01-01T00:00:00Z"}
    worker = {"pods": {"a": {"phase": "Running", "conditions": [{"type": "PodScheduled", "status": "True"}]},
                       "b": {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False",
                                                                 "reason": "Unschedulable"}]}}}
    out = podstatus.targets(worker, {labels.CONDITION_DISPATCHED: dispatched}, current, ["a", "b"])
    a_before, a_after = out["a"]
    assert a_before == mine and a_after["phase"] == "Running"
    assert a_after["conditions"] == [dispatched, {"type": "PodScheduled", "status": "True"}]
    # b is not scheduled on its worker yet: it keeps SchedulingGated (the manager's autoscaler ignores it)
    assert out["b"][1]["conditions"] == [dispatched, gated]
    # no worker status yet: each pod keeps its own, with mkd's conditions
    assert podstatus.targets(None, {labels.CONDITION_DISPATCHED: dispatched}, current, ["a"])["a"][1] == {
        "phase": "Pending", "conditions": [dispatched, gated]}


def test_a_single_pod_is_kept_nowhere_and_its_deletion_passes_its_uid() -> None:
    groups = PodGroups()
    groups.feed(member("alone", group=None), False)
    assert groups.members == {} and groups.passed == {}
    ((gone, deleted),) = groups.feed({"metadata": {"name": "alone", "namespace": "team-a", "uid": "uid-alone"}}, True)
    assert deleted and gone["metadata"]["uid"] == "uid-alone"
