"""A heartbeat never announces capacity measured from node and pod caches whose informers have not listed yet.

The agent is restarted on a Kube whose node (or pod) list waits on an event, so the list is late
deterministically; what the fake dispatcher receives on the new agent's stream is checked.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from federation.kube import NODES, PODS, Kube, ListResult, Resource
from federation.messages import Capacity, Heartbeat
from tests.agent.conftest import AgentHarness
from worker_agent.app import Agent


class LateList(Kube):
    """A Kube whose lists of ``late`` wait for ``gate``: an API server slow to answer them at start. Only the
    whole list (the capacity cache's) is late: the agent's own placed Pods, listed by their origin label for its
    Inventory, are not what a heartbeat's capacity is measured from."""

    late: Resource = NODES
    gate: asyncio.Event

    async def list(self, res: Resource, namespace: str | None = None, **kw: Any) -> ListResult:
        if res.plural == self.late.plural and not kw.get("label_selector"):
            await self.gate.wait()
        return await super().list(res, namespace, **kw)


async def restart_late(h: AgentHarness, late: Resource, **overrides: Any) -> tuple[asyncio.Event, str]:
    """Stop the agent and start it again on a Kube whose list of ``late`` waits; returns (gate, stream)."""
    await h.stop_agent()
    gate = asyncio.Event()

    async def run(stop: asyncio.Event) -> None:
        async with LateList.from_settings(h.settings.kube_settings()) as kube:
            assert isinstance(kube, LateList)
            kube.late, kube.gate = late, gate
            h.agent = Agent(h.settings, kube)
            await h.agent.run(stop)

    h._run_agent = run  # type: ignore[method-assign]
    await h.start_agent(**overrides)
    assert h.agent is not None
    return gate, h.agent.outbox.stream


def cpu_memory(figures: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in figures.items() if k in ("cpu", "memory")}


def online_on(stream: str) -> Any:
    return lambda r: isinstance(r, Heartbeat) and r.online and r.stream == stream


async def test_first_heartbeat_waits_for_the_node_list(harness: AgentHarness) -> None:
    # a long interval: the first heartbeat may wait for the lists up to that long
    gate, stream = await restart_late(harness, NODES, heartbeat_interval_seconds=30.0)
    gate.set()  # connected (the Inventory came): the nodes are listed only now
    first: Heartbeat = await harness.wait_report(online_on(stream))
    assert cpu_memory(first.capacity.allocatable) == {"cpu": "24", "memory": "96Gi"}
    assert cpu_memory(first.capacity.free) == {"cpu": "24", "memory": "96Gi"}
    assert {n.name for n in first.capacity.nodes} == {"node-a", "node-b"}


async def test_lists_late_beyond_an_interval_claim_no_room_then_the_truth(
        harness: AgentHarness, caplog: pytest.LogCaptureFixture) -> None:
    # 4 CPUs and 4Gi held on node-a by a pod: free is 20 CPUs, never the 24 a missing pod list suggests
    await harness.kube.create(PODS, {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "held", "namespace": "default"},
        "spec": {"nodeName": "node-a", "containers": [
            {"name": "c", "image": "busybox", "resources": {"requests": {"cpu": "4", "memory": "4Gi"}}}]}}, "default")
    caplog.set_level(logging.WARNING, logger="worker_agent.app")
    gate, stream = await restart_late(harness, PODS)  # the harness's interval: 0.5 s
    # the pods never list within an interval: a heartbeat goes anyway (it renews the lease and keeps
    # the cluster online) and claims no room rather than the free figures of a cache without pods
    first: Heartbeat = await harness.wait_report(online_on(stream))
    assert first.capacity == Capacity()
    assert any("not listed" in r.getMessage() for r in caplog.records)
    gate.set()
    true: Heartbeat = await harness.wait_report(lambda r: online_on(stream)(r) and r.capacity != Capacity())
    assert cpu_memory(true.capacity.allocatable) == {"cpu": "24", "memory": "96Gi"}
    assert cpu_memory(true.capacity.free) == {"cpu": "20", "memory": "92Gi"}
    assert [r.capacity for r in harness.reports if online_on(stream)(r)][:2] == [Capacity(), true.capacity]
