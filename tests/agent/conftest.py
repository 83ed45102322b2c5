"""Fixtures for agent tests at real seams: kubesim over HTTP, a real broker, Commands sent as the dispatcher would."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from federation.errors import NotFound
from federation.kinds.crds import load_crds
from federation.kube import CRDS, Kube, Resource
from federation.messages import (
    Delete,
    Heartbeat,
    JobRef,
    Place,
    PlacementKey,
    Resync,
    decode_reports,
    encode,
)
from federation.mqtt import MqttLink
from federation.sealing import PlaceSealer, recipients
from federation.settings import MqttSettings, SigningSettings
from federation.signing import Opener, Refused, parse_public_key
from kubesim import ClusterSpec, NodeSpec, serve_async
from tests import keys
from tests.waiting import eventually
from worker_agent.app import Agent
from worker_agent.settings import AgentSettings

CLUSTER = "worker-1"
PYTORCHJOBS = Resource("kubeflow.org", "v1", "pytorchjobs", "PyTorchJob")
Report = Any


class AgentHarness:
    """One kubesim cluster with mkd's CRDs, the agent under test, and a fake dispatcher on the broker."""

    def __init__(self, kube: Kube, settings: AgentSettings) -> None:
        self.kube = kube
        self.settings = settings
        self.reports: list[Report] = []
        self._changed = asyncio.Event()
        self._stop: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self.link: MqttLink | None = None
        self.agent: Agent | None = None
        self.signer = keys.Signer(keys.DISPATCHER, stream="e1")
        self.opener = Opener()
        self.agent_keys = [parse_public_key(keys.public(CLUSTER))]
        self.places = PlaceSealer()

    async def start_agent(self, **overrides: Any) -> None:
        if overrides:
            self.settings = self.settings.model_copy(update=overrides)
        self._stop = asyncio.Event()
        seen = len(self.reports)
        self._task = asyncio.create_task(self._run_agent(self._stop))
        # the agent announces itself with an Inventory once subscribed; Commands sent before would be lost
        self.inventory = await self.wait_report(lambda r: r.type == "inventory", after=seen)

    async def _run_agent(self, stop: asyncio.Event) -> None:
        """``worker_agent.app.run``, keeping the Agent at hand for tests that look inside it."""
        async with Kube.from_settings(self.settings.kube_settings()) as kube:
            self.agent = Agent(self.settings, kube)
            await self.agent.run(stop)

    async def stop_agent(self) -> None:
        assert self._stop is not None and self._task is not None
        self._stop.set()
        await asyncio.wait_for(self._task, 15)

    @contextlib.asynccontextmanager
    async def listen(self) -> AsyncIterator[None]:
        async with MqttLink(self.settings.mqtt, client_id=f"test-dispatcher-{uuid.uuid4().hex[:8]}") as link:
            root = self.settings.mqtt.topic_root
            await link.subscribe(f"{root}/{CLUSTER}/reports", f"{root}/{CLUSTER}/presence")
            self.link = link
            task = asyncio.create_task(self._collect(link))
            try:
                yield
            finally:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    async def _collect(self, link: MqttLink) -> None:
        async for message in link.messages():
            try:  # the agent's seal is checked as the dispatcher would
                body = self.opener.open(message.topic, message.payload, self.agent_keys, check_age=False).body
            except Refused as exc:
                if exc.why == "replay":
                    continue  # a retained heartbeat delivered again, a QoS 1 duplicate
                raise
            self.reports.extend(decode_reports(body))
            self._changed.set()

    async def send(self, command: Place | Delete | Resync) -> None:
        """Publish ``command`` as the dispatcher does: a Place encrypted to the agent's key, every
        Command sealed with the dispatcher's test key."""
        assert self.link is not None
        topic = f"{self.settings.mqtt.topic_root}/{CLUSTER}/commands"
        body = encode(command)
        if isinstance(command, Place):
            body = self.places.seal(topic, body, recipients(self.agent_keys))
        await self.link.publish(topic, self.signer.seal(topic, body))

    async def wait_report(self, match: Callable[[Report], bool], *, within: float = 15.0,
                          after: int = 0) -> Report:
        """The first report (from index ``after``) matching ``match``; fails after ``within`` seconds."""
        async def scan() -> Report:
            seen = after
            while True:
                for report in self.reports[seen:]:
                    if match(report):
                        return report
                seen = len(self.reports)
                self._changed.clear()
                await self._changed.wait()
        return await asyncio.wait_for(scan(), within)

    def statuses(self, uid: str) -> list[Report]:
        return [r for r in self.reports if r.type == "status" and r.placement.workload_uid == uid]

    def heartbeats(self) -> list[Heartbeat]:
        return [r for r in self.reports if isinstance(r, Heartbeat)]

    async def get(self, res: Resource, name: str, namespace: str) -> dict[str, Any] | None:
        try:
            return await self.kube.get(res, name, namespace)
        except NotFound:
            return None


def place(manifest: dict[str, Any], *, uid: str | None = None, attempt: int = 1, epoch: int = 1,
          spec_version: int = 1, namespace: str = "team-a") -> Place:
    meta = manifest["metadata"]
    return Place(placement=PlacementKey(workload_uid=uid or f"wl-{meta['name']}", attempt=attempt, epoch=epoch),
                 spec_version=spec_version,
                 job=JobRef(kind=manifest["kind"], api_version=manifest["apiVersion"], namespace=namespace,
                            name=meta["name"]),
                 manifest={**manifest, "metadata": {**meta, "namespace": namespace}})


def conditions(status: dict[str, Any]) -> list[tuple[str, str, str]]:
    return [(c["type"], c["status"], c["reason"]) for c in status.get("conditions") or []]


@pytest.fixture
async def harness(tmp_path: Path, mqtt_url: str, topic_root: str) -> AsyncIterator[AgentHarness]:
    spec = ClusterSpec(name=CLUSTER, nodes=[NodeSpec(name="node-a", cpu="16", memory="64Gi"),
                                            NodeSpec(name="node-b", cpu="8", memory="32Gi")])
    async with serve_async([spec], tmp_path / "sim") as sim:
        async with Kube(sim.kubeconfig(CLUSTER)) as kube:
            for crd in load_crds():
                await kube.create(CRDS, crd)
            await eventually(lambda: kube.served(PYTORCHJOBS), what="the CRDs to be served (once established)")
            settings = AgentSettings(cluster_name=CLUSTER, kubeconfig=sim.kubeconfig(CLUSTER),
                                     mqtt=MqttSettings(url=mqtt_url, topic_root=topic_root, backoff_initial=0.1,
                                                       client_id=f"agent-{uuid.uuid4().hex[:10]}"),
                                     heartbeat_interval_seconds=0.5, capacity_debounce_seconds=0.05,
                                     accept_hold_seconds=0,  # these tests wait for the Accepted; test_accept_hold.py holds it
                                     signing=SigningSettings(private_key=keys.private(CLUSTER)),
                                     dispatcher_public_keys=[keys.public(keys.DISPATCHER)])
            h = AgentHarness(kube, settings)
            async with h.listen():
                await h.start_agent()
                try:
                    yield h
                finally:
                    await h.stop_agent()
