"""The agent's own metrics port: reconcile latency, API calls by verb and code, objects owned, the MQTT
link, and /healthz /readyz (the worker Deployment's probes), on a real agent against kubesim."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from tests.agent.conftest import AgentHarness, place
from tests.agent.conftest import harness as agent_harness  # noqa: F401  (the fixture, by its name)
from tests.agent.render_harness import example


@pytest.fixture
async def served(agent_harness: AgentHarness) -> AsyncIterator[tuple[AgentHarness, str]]:  # noqa: F811
    h = agent_harness
    await h.stop_agent()
    await h.start_agent(metrics_port=0, metrics_host="127.0.0.1")
    assert h.agent is not None and h.agent.metrics_server is not None
    await asyncio.wait_for(h.agent.metrics_server.started.wait(), 10)
    yield h, f"http://127.0.0.1:{h.agent.metrics_server.port}"


async def test_agent_metrics_and_probes(served: tuple[AgentHarness, str], tmp_path: Path) -> None:
    h, base = served
    job = example("pytorch-simple.yaml")
    job["spec"]["pytorchReplicaSpecs"]["Master"]["template"].setdefault("metadata", {}).setdefault(
        "annotations", {})["kubesim.mkd.dev/run-seconds"] = "0.5"
    await h.send(place(job))
    await h.wait_report(lambda r: r.type == "status" and r.finished == "Succeeded")
    async with httpx.AsyncClient(base_url=base, timeout=10) as client:
        assert (await client.get("/healthz")).text == "ok"
        ready = await client.get("/readyz")
        assert ready.status_code == 200, ready.text
        text = (await client.get("/metrics")).text
    for family in ("mkd_agent_reconcile_duration_seconds", "mkd_agent_api_calls_total", "mkd_agent_objects_owned",
                   "mkd_agent_mqtt_reconnects_total", "mkd_agent_mqtt_connected", "process_cpu_seconds_total"):
        assert f"# TYPE {family.removesuffix('_total')}" in text, family
    assert _value(text, 'mkd_agent_reconcile_duration_seconds_count{kind="PyTorchJob"}') >= 2
    assert _value(text, 'mkd_agent_api_calls_total{code="201",verb="POST"}') >= 3  # job, pods, services
    assert _value(text, 'mkd_agent_objects_owned{resource="pytorchjobs"}') == 1
    assert _value(text, 'mkd_agent_objects_owned{resource="pods"}') >= 2
    assert _value(text, "mkd_agent_mqtt_connected") == 1


def _value(text: str, series: str) -> float:
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{series} not in the metrics page")




async def test_not_ready_until_the_node_and_pod_caches_listed(agent_harness: AgentHarness) -> None:  # noqa: F811
    """Ready means the agent would claim the capacity it has: not before its node and pod informers listed."""
    from federation.kube import NODES
    from tests.agent.test_heartbeat_listed import restart_late

    h = agent_harness
    gate, _ = await restart_late(h, NODES, metrics_port=0, metrics_host="127.0.0.1")
    assert h.agent is not None and h.agent.metrics_server is not None
    await asyncio.wait_for(h.agent.metrics_server.started.wait(), 10)
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{h.agent.metrics_server.port}", timeout=10) as client:
        assert h.agent.connected.is_set()  # the Inventory came: discovery ran and the link is up
        ready = await client.get("/readyz")
        assert ready.status_code == 503, ready.text
        assert ready.text.startswith("not ready: ") and "nodes" in ready.text and "not listed" in ready.text
        gate.set()
        await asyncio.wait_for(h.agent.capacity_known.wait(), 10)
        ready = await client.get("/readyz")
        assert ready.status_code == 200, ready.text
