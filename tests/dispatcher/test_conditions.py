"""The manager Job's MultiClusterDispatched condition follows the Workload: pending first, then placed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from federation import labels
from federation.kube import Kube
from tests.dispatcher.harness import PYTORCHJOBS, FakeAgent, eventually, pytorchjob, running, settings
from tests.dispatcher.test_flow import cond


async def test_dispatched_goes_from_false_to_true_when_a_cluster_appears(
        manager: Path, kube: Kube, db_url: str, mqtt_url: str, topic_root: str) -> None:
    s = settings(manager, db_url, mqtt_url, topic_root)
    async with running(s):
        await kube.create(PYTORCHJOBS, pytorchjob("early"), "default")

        async def status_is(value: str) -> Any:
            c = cond(await kube.get(PYTORCHJOBS, "early", "default"), labels.CONDITION_DISPATCHED)
            return c if c and c["status"] == value else None
        c = await eventually(lambda: status_is("False"), what="pending condition")
        assert c["reason"] == "NoFittingCluster"
        # kubectl get's STATE column is the last condition's type (the CRD prints .status.conditions[-1:].type):
        # a Job that fits nowhere must not read "MultiClusterDispatched" there, but pending, and say why
        conds = (await kube.get(PYTORCHJOBS, "early", "default"))["status"]["conditions"]
        assert conds[-1]["type"] == labels.CONDITION_PENDING
        assert (conds[-1]["status"], conds[-1]["reason"], conds[-1]["message"]) == (
            "True", "NoFittingCluster", c["message"])
        async with FakeAgent("worker-1", mqtt_url, topic_root) as agent:
            await eventually(lambda: agent.places(), what="placed once the agent heartbeats")
            await eventually(lambda: status_is("True"), what="MultiClusterDispatched=True")
            conds = (await kube.get(PYTORCHJOBS, "early", "default"))["status"]["conditions"]
            assert [c["type"] for c in conds] == [labels.CONDITION_DISPATCHED]  # pending no more
            await agent.status(agent.places()[0], {"startTime": "2026-01-01T00:00:00Z", "conditions": [
                {"type": "Created", "status": "True", "reason": "Created", "message": "",
                 "lastTransitionTime": "2026-01-01T00:00:00Z"}]})

            async def mirrored() -> Any:
                st = (await kube.get(PYTORCHJOBS, "early", "default")).get("status") or {}
                return st if st.get("startTime") else None
            st = await eventually(mirrored, what="status mirrored")
            assert {c["type"]: c["status"] for c in st["conditions"]} == {
                "Created": "True", labels.CONDITION_DISPATCHED: "True"}


async def test_finished_then_gone_is_finished_not_requeued_and_accepted_may_be_missing(
        manager: Path, kube: Kube, db_url: str, mqtt_url: str, topic_root: str) -> None:
    from dispatcher.db import models as m
    from tests.dispatcher.test_flow import rows
    s = settings(manager, db_url, mqtt_url, topic_root)
    async with FakeAgent("worker-1", mqtt_url, topic_root, auto_accept=False) as agent, running(s):
        await kube.create(PYTORCHJOBS, pytorchjob("ttl"), "default")
        await eventually(lambda: agent.places(), what="Place")
        place = agent.places()[0]
        # no Accepted at all: the first Status stands in for it (condition included)
        await agent.status(place, {"startTime": "2026-01-01T00:00:00Z", "conditions": []})

        async def dispatched() -> Any:
            c = cond(await kube.get(PYTORCHJOBS, "ttl", "default"), labels.CONDITION_DISPATCHED)
            return c if c and c["status"] == "True" else None
        await eventually(dispatched, what="MultiClusterDispatched=True without an Accepted")
        done = {"startTime": "2026-01-01T00:00:00Z", "completionTime": "2026-01-01T00:01:00Z", "conditions": [
            {"type": "Succeeded", "status": "True", "reason": "PyTorchJobSucceeded", "message": "",
             "lastTransitionTime": "2026-01-01T00:01:00Z"}]}
        await agent.status(place, done, finished="Succeeded", gone=True)  # finished, then removed by TTL

        async def finished() -> bool:
            return [w.state for w in await rows(db_url, m.workloads)] == ["finished"]
        await eventually(finished, what="finished, not requeued")
    assert len(agent.places()) == 1
    assert [p.state for p in await rows(db_url, m.placements)] == ["finished"]
