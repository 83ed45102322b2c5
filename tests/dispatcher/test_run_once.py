"""A Rejected never makes a Job run twice: a refused later Command leaves the accepted copy in place,
a refusal before acceptance deletes whatever the agent half-made before the Workload goes elsewhere."""

from __future__ import annotations

import asyncio
from pathlib import Path

from dispatcher.db import models as m
from federation import messages
from federation.kube import Kube
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


async def test_a_refused_suspend_of_an_accepted_placement_is_not_placed_again(
        manager: Path, kube: Kube, db_url: str, mqtt_url: str, topic_root: str) -> None:
    s = settings(manager, db_url, mqtt_url, topic_root, place_resend_seconds=1.0)
    async with FakeAgent("worker-1", mqtt_url, topic_root) as one, \
            FakeAgent("worker-2", mqtt_url, topic_root, cap=capacity(cpu="32")) as two, running(s):
        job = await kube.create(PYTORCHJOBS, pytorchjob("once"), "default")
        await eventually(lambda: one.places(), what="placed on the roomiest cluster")
        first = one.places()[0]

        async def accepted() -> bool:
            return [p.state for p in await rows(db_url, m.placements)] == ["accepted"]
        await eventually(accepted, what="accepted")
        # the agent gave up applying a later Command (a suspend, after 5 temporary failures)
        await one.report(messages.Rejected(cluster="worker-1", placement=first.placement, spec_version=2, seq=9,
                                           reason="AgentError", message="the worker cluster kept failing",
                                           permanent=False))
        await eventually(lambda: len(one.places()) >= 2, what="the Command sent again to the same copy")
        await asyncio.sleep(0.3)  # real time: a second copy, had one been placed, lands now
        # and a Stale refusal (the agent holds a newer epoch for it) changes nothing either
        await one.report(messages.Rejected(cluster="worker-1", placement=first.placement, spec_version=1, seq=10,
                                           reason="Stale", message="newer epoch applied"))
        await asyncio.sleep(0.5)  # real time: a restart or a second copy, had there been one, lands now
    assert two.places() == [] and one.deletes() == []  # never a second copy, never a restart
    assert {p.placement.attempt for p in one.places()} == {1}
    (p,) = await rows(db_url, m.placements)
    assert p.state == "accepted"
    (w,) = await rows(db_url, m.workloads)
    assert w.state == "running" and w.attempt == 1 and "could not apply" in w.reason
    assert job["metadata"]["uid"] == w.uid


async def test_a_refusal_before_acceptance_deletes_the_attempt_before_placing_elsewhere(
        manager: Path, kube: Kube, db_url: str, mqtt_url: str, topic_root: str) -> None:
    s = settings(manager, db_url, mqtt_url, topic_root)
    async with FakeAgent("worker-1", mqtt_url, topic_root, auto_accept=False) as one, \
            FakeAgent("worker-2", mqtt_url, topic_root, cap=capacity(cpu="32")) as two, running(s):
        await kube.create(PYTORCHJOBS, pytorchjob("half"), "default")
        await eventually(lambda: one.places(), what="placed")
        first = one.places()[0]
        await one.report(messages.Rejected(cluster="worker-1", placement=first.placement, spec_version=1, seq=1,
                                           reason="AgentError", message="timed out creating it", permanent=False))
        await eventually(lambda: two.places(), what="placed elsewhere")
        await eventually(lambda: one.deletes(), what="the first attempt deleted")
    assert [d.placement.attempt for d in one.deletes()] == [1]
    assert two.places()[0].placement.attempt == 2
