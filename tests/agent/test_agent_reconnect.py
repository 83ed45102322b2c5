"""The agent rides out a broker restart: it reconnects, re-announces itself, and Commands work again."""

from __future__ import annotations

import asyncio
import socket
import uuid
from pathlib import Path

from federation.embedded_broker import EmbeddedBroker
from federation.kinds.crds import load_crds
from federation.kube import CRDS, Kube
from federation.settings import MqttSettings, SigningSettings
from kubesim import ClusterSpec, NodeSpec, serve_async
from tests import keys
from tests.agent.conftest import CLUSTER, PYTORCHJOBS, AgentHarness, place
from tests.agent.render_harness import example
from tests.agent.test_agent_pytorch import FOREVER, with_annotations
from tests.waiting import eventually
from worker_agent.settings import AgentSettings


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def test_broker_restart(tmp_path: Path) -> None:
    port = free_port()
    spec = ClusterSpec(name=CLUSTER, nodes=[NodeSpec(name="node-a")])
    async with serve_async([spec], tmp_path / "sim") as sim, Kube(sim.kubeconfig(CLUSTER)) as kube:
        for crd in load_crds():
            await kube.create(CRDS, crd)
        await eventually(lambda: kube.served(PYTORCHJOBS), what="the CRDs to be served (once established)")
        settings = AgentSettings(cluster_name=CLUSTER, kubeconfig=sim.kubeconfig(CLUSTER),
                                 mqtt=MqttSettings(url=f"mqtt://127.0.0.1:{port}", topic_root="t/v1",
                                                   backoff_initial=0.1, backoff_max=0.5,
                                                   client_id=f"agent-{uuid.uuid4().hex[:8]}"),
                                 heartbeat_interval_seconds=0.5,
                                 accept_hold_seconds=0,  # these tests wait for the Accepted; test_accept_hold.py holds it
                                 signing=SigningSettings(private_key=keys.private(CLUSTER)),
                                 dispatcher_public_keys=[keys.public(keys.DISPATCHER)])
        h = AgentHarness(kube, settings)
        async with EmbeddedBroker(port=port):
            async with h.listen():
                await h.start_agent()
                await h.send(place(with_annotations(example("pytorch-simple.yaml"), **{FOREVER: "true"})))
                await h.wait_report(lambda r: r.type == "accepted")
        # the broker is gone for a moment; the agent keeps its jobs and retries
        await asyncio.sleep(0.5)  # real time: the broker really is away while the agent's MQTT keepalive notices
        async with EmbeddedBroker(port=port):
            seen = len(h.reports)
            async with h.listen():
                # heartbeats are periodic, so one arrives whatever the order of the two reconnects
                beat = await h.wait_report(lambda r: r.type == "heartbeat" and r.online, after=seen, within=20)
                assert beat.running == 1  # the job placed before the outage is still there
                second = example("pytorch-sendrecv.yaml")
                await h.send(place(with_annotations(second, **{FOREVER: "true"})))
                accepted = await h.wait_report(lambda r: r.type == "accepted", after=seen)
                assert accepted.placement.workload_uid == "wl-pytorch-dist-basic-sendrecv"
                await h.wait_report(lambda r: r.type == "heartbeat" and r.running == 2, after=seen)
                await h.stop_agent()
