"""Plain Pods and pod groups as Kueue's pod integration reads them: the opt-in (queue label and admission gate),
its webhook's refusals of group metadata and the controller's of an inconsistent group (field and fix), the
group's PodSets per role, finished / succeeded / failed, and the status MultiKueue mirrors onto a manager pod."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from federation import labels
from federation.kinds import pod as pods


def make_pod(name: str = "p-0", *, group: str | None = "sample-group", count: str | None = "3", cpu: str = "1",
             queue: str = "user-queue", gated: bool = True, phase: str | None = None, **spec: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "team-a", "labels": {labels.QUEUE_NAME: queue}}
    if group is not None:
        meta["labels"][pods.GROUP_NAME_LABEL] = group
    if count is not None:
        meta["annotations"] = {pods.GROUP_TOTAL_COUNT: count}
    body: dict[str, Any] = {"containers": [{"name": "c", "image": "busybox",
                                            "resources": {"requests": {"cpu": cpu}}}], **spec}
    if gated:
        body["schedulingGates"] = [{"name": pods.ADMISSION_GATE}]
    out: dict[str, Any] = {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": body}
    if phase is not None:
        out["status"] = {"phase": phase}
    return out


def test_opt_in_is_the_queue_label_and_the_admission_gate() -> None:
    assert pods.headed_for_multikueue(make_pod())
    # without the gate the manager's scheduler runs it: taking it to a worker would run it twice
    assert not pods.headed_for_multikueue(make_pod(gated=False))
    no_queue = make_pod()
    del no_queue["metadata"]["labels"][labels.QUEUE_NAME]
    assert not pods.headed_for_multikueue(no_queue)
    owned = make_pod()
    owned["metadata"]["ownerReferences"] = [{"apiVersion": "batch/v1", "kind": "Job", "name": "j", "uid": "u",
                                             "controller": True}]
    assert not pods.headed_for_multikueue(owned)


def test_group_metadata_refused_with_field_and_fix() -> None:
    assert pods.validate_pod(make_pod()) == []
    assert pods.validate_pod(make_pod(group=None, count=None)) == []  # a single Pod
    (missing,) = pods.validate_pod(make_pod(count=None))
    assert missing.field == pods.TOTAL_COUNT_FIELD and "is required" in missing.detail
    assert pods.GROUP_TOTAL_COUNT in missing.fix
    (orphan,) = pods.validate_pod(make_pod(group=None))
    assert orphan.field == pods.GROUP_NAME_FIELD and pods.GROUP_NAME_LABEL in orphan.fix
    for bad in ("0", "-1", "three", ""):
        (wrong,) = pods.validate_pod(make_pod(count=bad))
        assert wrong.field == pods.TOTAL_COUNT_FIELD and "positive integer" in wrong.detail
    (name,) = pods.validate_pod(make_pod(group="Bad_Name"))
    assert name.field == pods.GROUP_NAME_FIELD
    no_image = make_pod()
    del no_image["spec"]["containers"][0]["image"]
    (image,) = pods.validate_pod(no_image)
    assert image.field == "spec.containers[0].image"


def test_inconsistent_group_refused_naming_the_pod_and_the_fix() -> None:
    group = [make_pod("p-0"), make_pod("p-1", count="2"), make_pod("p-2", queue="other")]
    count, queue = pods.validate_group(group)
    assert count.field == f"{pods.TOTAL_COUNT_FIELD} (pod p-1)" and "differs from 3 on pod p-0" in count.detail
    assert "same" in count.fix
    assert queue.field == f"metadata.labels[{labels.QUEUE_NAME}] (pod p-2)"
    (extra,) = pods.validate_group([make_pod(f"p-{i}", count="2") for i in range(3)])
    assert extra.field == pods.TOTAL_COUNT_FIELD and "3 pods, more than its total count 2" in extra.detail
    many = [make_pod(f"p-{i}", count="9", cpu=f"{i + 1}") for i in range(9)]
    (roles,) = pods.validate_group(many)
    assert "9 distinct pod roles" in roles.detail


def test_the_workload_waits_for_total_count_runnable_pods() -> None:
    assert not pods.group_complete([make_pod("p-0"), make_pod("p-1")])
    assert pods.group_complete([make_pod(f"p-{i}") for i in range(3)])
    # a failed member does not count: Kueue composes the Workload from runnable pods
    assert not pods.group_complete([make_pod("p-0"), make_pod("p-1"), make_pod("p-2", phase="Failed")])


def test_group_podsets_one_per_role_counting_its_pods_by_name() -> None:
    group = [make_pod("driver", cpu="2"), make_pod("w-0"), make_pod("w-1")]
    sets = pods.group_podsets(group)
    assert sorted(p.count for p in sets) == [1, 2]
    assert [p.name for p in sets] == sorted(p.name for p in sets)
    assert all(len(p.name) == 8 for p in sets)
    by_count = {p.count: p for p in sets}
    assert by_count[1].requests["cpu"] == Decimal(2) and by_count[2].requests["cpu"] == Decimal(1)
    # the name or image of a pod is not part of its role; its requests, ports and node selector are
    renamed = make_pod("w-9")
    renamed["spec"]["containers"][0]["image"] = "other"
    assert pods.role_of(renamed) == pods.role_of(make_pod("w-0"))
    assert pods.role_of(make_pod(nodeSelector={"gpu": "a100"})) != pods.role_of(make_pod())
    # Kueue's webhook wrote the role: its name is the PodSet's
    hashed = make_pod()
    hashed["metadata"]["annotations"][pods.ROLE_HASH] = "0a1b2c3d"
    assert pods.role_of(hashed) == "0a1b2c3d"


def test_single_pod_is_one_podset_of_one() -> None:
    (main,) = pods.single_podsets(make_pod(group=None, count=None, cpu="3"))
    assert (main.name, main.count, main.requests["cpu"]) == ("main", 1, Decimal(3))


def test_finished_single_pod_by_phase() -> None:
    assert pods.single_finished(make_pod(phase="Running")) is None
    assert pods.single_finished(make_pod(phase="Succeeded")).outcome == "Succeeded"  # type: ignore[union-attr]
    failed = make_pod(phase="Failed")
    failed["status"].update(reason="DeadlineExceeded", message="too slow")
    assert pods.single_finished(failed) == ("Failed", "DeadlineExceeded", "too slow")


def test_group_finished_when_every_pod_has_ended() -> None:
    running = [make_pod("a", phase="Succeeded"), make_pod("b", phase="Succeeded"), make_pod("c", phase="Running")]
    assert pods.group_finished(running, 3) is None
    done = [make_pod(n, phase="Succeeded") for n in "abc"]
    assert pods.group_finished(done, 3) == ("Succeeded", "Succeeded", "Pods succeeded: 3/3.")
    one_failed = [make_pod("a", phase="Succeeded"), make_pod("b", phase="Failed"), make_pod("c", phase="Succeeded")]
    assert pods.group_finished(one_failed, 3) == ("Failed", "PodFailed", "Pods succeeded: 2/3.")
    assert pods.group_finished(done[:2], 3) is None  # a member not there yet has not ended


def test_mirrored_status_keeps_scheduling_gated_until_the_worker_pod_is_scheduled() -> None:
    gated = {"type": "PodScheduled", "status": "False", "reason": "SchedulingGated"}
    local = {"phase": "Pending", "conditions": [gated]}
    unschedulable = {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False",
                                                         "reason": "Unschedulable"}]}
    assert pods.mirrored_status(local, unschedulable)["conditions"] == [gated]
    running = {"phase": "Running", "podIP": "10.0.0.7",
               "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "True"}]}
    assert pods.mirrored_status(local, running) == running
    reported = {"phase": "Succeeded", "startTime": "2026-01-01T00:00:00Z", "conditions": [{"type": "Ready",
                                                                                            "status": "False"}]}
    assert pods.mirrored_status(local, reported) == reported  # ran on the worker: scheduled, gated no more


def test_worker_copy_is_ungated_and_stamped() -> None:
    manager = make_pod(nodeName="manager-node")
    manager["spec"]["schedulingGates"].append({"name": "example.com/other"})
    manager["metadata"].update(uid="u-1", resourceVersion="7", creationTimestamp="2026-01-01T00:00:00Z")
    copy = pods.worker_pod(manager, {labels.ORIGIN: "mkd"})
    assert copy["spec"]["schedulingGates"] == [{"name": "example.com/other"}]
    assert "nodeName" not in copy["spec"] and "status" not in copy
    assert not {"uid", "resourceVersion", "creationTimestamp"} & set(copy["metadata"])
    assert copy["metadata"]["labels"][labels.ORIGIN] == "mkd"
    assert copy["metadata"]["labels"][pods.GROUP_NAME_LABEL] == "sample-group"
    assert manager["spec"]["schedulingGates"][0]["name"] == pods.ADMISSION_GATE  # the input is left as it was


def with_uid(pod: dict[str, Any]) -> dict[str, Any]:
    pod["metadata"]["uid"] = f"uid-{pod['metadata']['name']}"
    return pod


def test_a_group_is_one_job_named_by_its_lead_pod_with_a_uid_of_its_members() -> None:
    group = [with_uid(make_pod(n)) for n in ("w-1", "driver", "w-0")]
    obj = pods.group_object(group)
    assert obj["metadata"]["name"] == "driver" and [p["metadata"]["name"] for p in obj["spec"]["pods"]] == [
        "driver", "w-0", "w-1"]
    assert obj["metadata"]["uid"] == pods.group_object(list(reversed(group)))["metadata"]["uid"]
    again = [*group[:2], with_uid(make_pod("w-0"))]
    again[2]["metadata"]["uid"] = "uid-w-0-made-again"
    assert pods.group_object(again)["metadata"]["uid"] != obj["metadata"]["uid"]
    single = with_uid(make_pod("alone", group=None, count=None))
    assert pods.group_object([single])["metadata"]["uid"] == "uid-alone"
    assert pods.POD.managed_by(obj) == labels.MULTIKUEUE
    group[1]["spec"].pop("schedulingGates")
    assert pods.POD.managed_by(pods.group_object(group)) is None  # one pod would run on the manager


def test_the_worker_gets_the_lead_pod_carrying_the_group() -> None:
    obj = pods.group_object([with_uid(make_pod(n)) for n in ("driver", "w-0", "w-1")])
    lead = pods.POD.prepare_for_worker(obj, stamp={labels.ORIGIN: "mkd"}, managed_by=None)
    assert lead["metadata"]["name"] == "driver" and "schedulingGates" not in lead["spec"]
    assert lead["metadata"]["labels"][labels.ORIGIN] == "mkd"
    members = pods.members_of(lead)
    assert [m["metadata"]["name"] for m in members] == ["driver", "w-0", "w-1"]
    assert all("uid" not in m["metadata"] for m in members)  # the manager's uids mean nothing on a worker
    # the same on the worker's side: validated and prepared again from the lead pod alone
    assert pods.POD.validate(lead) == []
    assert pods.members_of(pods.POD.prepare_for_worker(lead, stamp={}, managed_by=None)) == members
    assert [(p.count) for p in pods.POD.podsets(lead)] == [3]


def test_the_group_status_finishes_when_every_pod_ended() -> None:
    obj = pods.group_object([with_uid(make_pod(n)) for n in ("a", "b")])
    ended = {"status": {"pods": {"a": {"phase": "Succeeded"}, "b": {"phase": "Running"}}}}
    assert pods.POD.finished(ended) is None
    ended["status"]["pods"]["b"] = {"phase": "Failed"}
    assert pods.POD.finished(ended) == ("Failed", "PodFailed", "Pods succeeded: 1/2.")
    # the worker's lead pod of a group does not end the group with its own phase
    lead = pods.POD.prepare_for_worker(obj, stamp={}, managed_by=None)
    assert pods.POD.finished({**lead, "status": {"phase": "Succeeded"}}) is None
    # a pod on its own (a single Pod, or one pod of a group as the manager shows it) ends with its phase
    assert pods.POD.finished(make_pod(phase="Succeeded")) == ("Succeeded", "Succeeded", "")


def test_an_empty_or_oversized_group_is_refused() -> None:
    (empty,) = pods.POD.validate({"spec": {"pods": []}})
    assert empty.field == "spec.pods"
    big = [with_uid(make_pod(f"p-{i}", count="40")) for i in range(40)]
    for pod in big:
        pod["metadata"]["annotations"]["note"] = "x" * 6000
    problems = pods.POD.validate(pods.group_object(big))
    assert any(p.field == pods.GROUP_NAME_FIELD and "KiB" in p.detail for p in problems)


def test_the_group_object_shows_the_lead_pods_conditions() -> None:
    """mkd writes its conditions on every pod of a group alike: the lead pod's stand for the group's (what a
    restarted dispatcher checks against its Workloads)."""
    lead = with_uid(make_pod("a"))
    dispatched = {"type": labels.CONDITION_DISPATCHED, "status": "True"}
    lead["status"] = {"phase": "Pending", "conditions": [
        {"type": "PodScheduled", "status": "False", "reason": "SchedulingGated"}, dispatched]}
    obj = pods.group_object([lead, with_uid(make_pod("b"))])
    assert obj["status"]["conditions"] == [dispatched]  # the pod's own stay in status.pods
    assert set(obj["status"]["pods"]) == {"a", "b"}
