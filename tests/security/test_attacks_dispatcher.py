"""Attacks on the dispatcher through the broker: forged Reports and presence.

The dispatcher is the real one (kubesim manager, a real database and broker); ``FakeAgent`` plays a
genuine agent. The attacker is another client on the broker without that agent's key.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dispatcher.db import models as m
from federation import labels, messages, topics
from federation.kube import EVENTS, Kube
from federation.policy import PolicySettings
from federation.refusals import count
from tests.dispatcher.harness import (
    PYTORCHJOBS,
    FakeAgent,
    capacity,
    eventually,
    pytorchjob,
    running,
    settings,
)
from tests.dispatcher.test_flow import rows
from tests.dispatcher.test_lifecycle import condition
from tests.security.attacks import BIG
from tests.security.conftest import attacker


async def workload_state(db_url: str, name: str) -> str | None:
    found = await rows(db_url, m.workloads, name=name)
    return found[0].state if found else None


async def test_forged_status_with_a_huge_seq_neither_fails_the_job_nor_hides_the_real_outcome(
        manager: Path, kube: Kube, db_url: str, mqtt_url: str, topic_root: str) -> None:
    s = settings(manager, db_url, mqtt_url, topic_root)
    async with FakeAgent("worker-1", mqtt_url, topic_root) as agent, running(s):
        await kube.create(PYTORCHJOBS, pytorchjob("victim"), "default")
        place = (await eventually(lambda: agent.places(), what="a Place"))[0]
        await eventually(lambda: _is(db_url, "victim", "running"), what="victim running")
        forged = messages.Status(cluster="worker-1", placement=place.placement, seq=BIG, finished="Failed",
                                 status={"conditions": [{"type": "Failed", "status": "True", "reason": "Forged"}]})
        unsigned = count("unsigned")
        async with attacker(mqtt_url) as evil:
            await evil.publish(topics.reports("worker-1", topic_root), messages.encode(forged))
        await eventually(lambda: count("unsigned") == unsigned + 1, what="the forged Status refused")
        assert await workload_state(db_url, "victim") == "running"
        await agent.status(place, {"conditions": [{"type": "Succeeded", "status": "True", "reason": "Done"}]},
                           finished="Succeeded")
        await eventually(lambda: _is(db_url, "victim", "finished"), what="the real Succeeded applied")


async def _is(db_url: str, name: str, state: str) -> bool:
    return await workload_state(db_url, name) == state


async def test_retained_fake_heartbeat_creates_no_ghost_cluster(
        manager: Path, kube: Kube, db_url: str, mqtt_url: str, topic_root: str) -> None:
    s = settings(manager, db_url, mqtt_url, topic_root, cluster_keys_refresh_seconds=0.2)
    ghost = messages.Heartbeat(cluster="ghost", capacity=capacity(cpu="100000", gpu=1000), agent_version="evil")
    async with attacker(mqtt_url) as evil:
        await evil.publish(topics.presence("ghost", topic_root), messages.encode(ghost), retain=True)
    try:
        async with FakeAgent("worker-1", mqtt_url, topic_root) as agent, running(s) as d:
            async with attacker(mqtt_url) as evil:  # a live one too, not only the retained copy
                await evil.publish(topics.presence("ghost", topic_root), messages.encode(ghost), retain=True)
            await kube.create(PYTORCHJOBS, pytorchjob("wanted"), "default")
            await eventually(lambda: agent.places(), what="a Place on the genuine cluster")
            await eventually(lambda: _refused_shown(db_url, "ghost"), what="ghost shown as refused")
            assert d.engine is not None and "ghost" not in d.engine.book.heartbeats
            clusters = {c.name: c for c in await rows(db_url, m.clusters)}
            assert "ghost" not in clusters or not clusters["ghost"].online
    finally:
        async with attacker(mqtt_url) as evil:
            await evil.publish(topics.presence("ghost", topic_root), b"", retain=True)


async def _refused_shown(db_url: str, name: str) -> bool:
    return any(r.name == name and r.reason == "unregistered" for r in await rows(db_url, m.cluster_refusals))


async def test_forged_offline_presence_does_not_lose_a_healthy_cluster(
        manager: Path, kube: Kube, db_url: str, mqtt_url: str, topic_root: str) -> None:
    s = settings(manager, db_url, mqtt_url, topic_root)
    async with FakeAgent("worker-1", mqtt_url, topic_root), running(s) as d:
        assert d.engine is not None
        await eventually(lambda: "worker-1" in d.engine.book.heartbeats, what="worker-1 heard")  # type: ignore[union-attr]
        offline = messages.Heartbeat(cluster="worker-1", online=False, agent_version="evil")
        refused = count("unsigned") + count("stale_will")
        async with attacker(mqtt_url) as evil:
            await evil.publish(topics.presence("worker-1", topic_root), messages.encode(offline), retain=True)
        await eventually(lambda: count("unsigned") + count("stale_will") == refused + 1, what="refused")
        assert "worker-1" not in d.engine.lost
        assert d.engine.book.heartbeats["worker-1"].online


def privileged(job: dict[str, Any]) -> dict[str, Any]:
    for spec in job["spec"]["pytorchReplicaSpecs"].values():
        pod = spec["template"]["spec"]
        pod["hostPID"] = True
        pod["containers"][0]["securityContext"] = {"privileged": True}
    return job


async def test_a_job_every_cluster_policy_refuses_is_never_placed_and_says_why(
        manager: Path, kube: Kube, db_url: str, mqtt_url: str, topic_root: str) -> None:
    s = settings(manager, db_url, mqtt_url, topic_root, placement_retry_seconds=0.3)
    strict = FakeAgent("worker-1", mqtt_url, topic_root)
    strict.policy = PolicySettings()  # baseline
    async with strict, running(s):
        await kube.create(PYTORCHJOBS, privileged(pytorchjob("sneaky")), "default")
        async def refused() -> Any:
            c = await condition(kube, "sneaky", labels.CONDITION_DISPATCHED, "False")
            return c if c and c["reason"] == "PolicyViolation" else None
        c = await eventually(refused, what="MultiClusterDispatched=False, PolicyViolation")
        assert "worker-1" in c["message"] and "spec.pytorchReplicaSpecs.Master.template.spec.hostPID" in c["message"]
        assert ".containers[0].securityContext.privileged" in c["message"]

        async def warning() -> Any:
            return [e for e in (await kube.list(EVENTS, "default")).items
                    if e.get("type") == "Warning" and e.get("reason") == "PolicyViolation"]
        await eventually(warning, what="a PolicyViolation Event")
        assert strict.places() == []
        # a cluster whose policy allows it takes it
        lenient = FakeAgent("worker-2", mqtt_url, topic_root)
        lenient.policy = PolicySettings(pod_security="privileged")
        async with lenient:
            await eventually(lambda: lenient.places(), what="placed on the lenient cluster")
        assert strict.places() == []
