"""An Inventory too large for one payload reaches the dispatcher in parts and is answered whole."""

from __future__ import annotations

from pathlib import Path

from federation import chunks, messages
from federation.kube import Kube
from tests.dispatcher.harness import PYTORCHJOBS, FakeAgent, eventually, pytorchjob, running, settings


async def test_an_inventory_of_twelve_thousand_jobs_is_answered(manager: Path, kube: Kube, db_url: str, mqtt_url: str,
                                                                topic_root: str) -> None:
    s = settings(manager, db_url, mqtt_url, topic_root)
    async with FakeAgent("worker-1", mqtt_url, topic_root) as agent, running(s):
        job = await kube.create(PYTORCHJOBS, pytorchjob("real"), "default")
        await eventually(lambda: agent.places(), what="placed")
        place = agent.places()[0]
        strays = [messages.InventoryItem(
            placement=messages.PlacementKey(workload_uid=f"stray-{i:06d}-0000-0000-000000000000", attempt=1, epoch=1),
            spec_version=1, last_seq=1,
            job=messages.JobRef(kind="PyTorchJob", api_version="kubeflow.org/v1", namespace="default", name=f"s-{i}"))
            for i in range(12_000)]
        parts = chunks.split(messages.Inventory(cluster="worker-1", items=strays))  # the real Job is missing
        assert len(parts) > 1
        for p in parts:
            await agent.report(p)
        await eventually(lambda: [c for c in agent.commands if isinstance(c, messages.Resync)], within=15,
                         what="the Resync answering the whole Inventory")
        await eventually(lambda: len(agent.places()) == 2, what="the missing Place re-sent")
    (resync,) = [c for c in agent.commands if isinstance(c, messages.Resync)]
    assert [k.workload_uid for k in resync.expected] == [job["metadata"]["uid"]]
    assert agent.places()[1].placement == place.placement
