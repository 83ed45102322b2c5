"""A pod group on a worker: the Place's lead pod is created, the agent creates the group's other Pods (ungated,
stamped, owned by the lead) and reports the group's status (each pod's, ``status.pods``), never writing a Pod's
status; a group whose Pods all succeeded is reported finished; without a lease renewal the group's Pods are
deleted (a Pod cannot be suspended)."""

from __future__ import annotations

from typing import Any

from federation import labels
from federation.kinds import pod as pods
from federation.kube import PODS
from tests.agent.conftest import AgentHarness, place
from tests.waiting import eventually


def group(run_seconds: str = "1") -> dict[str, Any]:
    members = []
    for name, cpu in (("g-driver", "200m"), ("g-worker-0", "100m"), ("g-worker-1", "100m")):
        members.append({"apiVersion": "v1", "kind": "Pod",
                        "metadata": {"name": name, "namespace": "team-a", "uid": f"manager-{name}",
                                     "labels": {labels.QUEUE_NAME: "default", pods.GROUP_NAME_LABEL: "g"},
                                     "annotations": {pods.GROUP_TOTAL_COUNT: "3",
                                                     "kubesim.mkd.dev/run-seconds": run_seconds}},
                        "spec": {"schedulingGates": [{"name": pods.ADMISSION_GATE}], "restartPolicy": "Never",
                                 "containers": [{"name": "c", "image": "busybox",
                                                 "resources": {"requests": {"cpu": cpu}}}]}})
    obj = pods.group_object(members)
    return pods.POD.prepare_for_worker(obj, stamp={}, managed_by=None)


async def listed(harness: AgentHarness) -> dict[str, dict[str, Any]]:
    return {p["metadata"]["name"]: p for p in (await harness.kube.list(PODS, "team-a")).items
            if p["metadata"]["name"].startswith("g-")}


async def test_a_pod_group_is_created_from_its_lead_and_its_status_reported(harness: AgentHarness) -> None:
    cmd = place(group(), uid="wl-group")
    await harness.send(cmd)
    await harness.wait_report(lambda r: r.type == "accepted" and r.placement == cmd.placement)

    async def all_three() -> dict[str, dict[str, Any]] | None:
        now = await listed(harness)
        return now if len(now) == 3 else None

    made = await eventually(all_three, what="the group's three pods on the worker")
    lead = made["g-driver"]
    assert lead["metadata"]["labels"][labels.WORKLOAD_UID] == "wl-group"
    for name in ("g-worker-0", "g-worker-1"):
        pod = made[name]
        assert pod["metadata"]["ownerReferences"][0]["uid"] == lead["metadata"]["uid"]
        assert pod["metadata"]["labels"][labels.OWNER_UID] == lead["metadata"]["uid"]
        assert labels.WORKLOAD_UID not in pod["metadata"]["labels"]  # the lead alone is the placed copy
        assert not pod["spec"].get("schedulingGates")
    done = await harness.wait_report(lambda r: r.type == "status" and r.placement == cmd.placement
                                     and r.finished == "Succeeded", within=30)
    assert set(done.status["pods"]) == {"g-driver", "g-worker-0", "g-worker-1"}
    assert {s["phase"] for s in done.status["pods"].values()} == {"Succeeded"}
    gated = {"conditions": [{"type": "PodScheduled", "status": "False", "reason": "SchedulingGated"}]}
    for status in done.status["pods"].values():
        # the worker scheduled and ran each pod: the manager's twin must not stay SchedulingGated
        mirrored = pods.mirrored_status(gated, status)
        assert [c for c in mirrored["conditions"] if c["type"] == "PodScheduled" and c["status"] != "True"] == []
        ended = status["containerStatuses"][0]["state"]["terminated"]
        assert ended["startedAt"] and ended["finishedAt"]  # kubectl describe shows when it ran


async def test_without_renewals_a_pod_group_is_deleted(harness: AgentHarness) -> None:
    await harness.stop_agent()
    await harness.start_agent(lease_startup_grace_seconds=4.0, lease_stop_before_seconds=1.0,
                              heartbeat_interval_seconds=0.5)
    cmd = place(group(run_seconds="600"), uid="wl-fenced-group")
    await harness.send(cmd)
    await harness.wait_report(lambda r: r.type == "accepted" and r.placement == cmd.placement)
    await eventually(lambda: _count(harness, 3), what="the group's three pods on the worker")
    await eventually(lambda: _count(harness, 0), what="the group's pods deleted once the grace ran out", within=30)


async def _count(harness: AgentHarness, n: int) -> bool:
    live = [p for p in (await listed(harness)).values() if not p["metadata"].get("deletionTimestamp")]
    return len(live) == n
