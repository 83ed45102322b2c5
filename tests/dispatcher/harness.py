"""Test helpers for the dispatcher: a kubesim manager with the PyTorchJob CRD, fake agents, a running dispatcher.

Fake agents are written here on purpose (the real worker agent is another package the dispatcher
never imports): they publish heartbeats and Reports with ``federation.messages`` and record the
Commands they receive.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from dispatcher.app import Dispatcher
from dispatcher.settings import DispatcherSettings
from federation import labels, messages, topics
from federation.kube import CRDS, Kube, Resource
from federation.mqtt import MqttLink
from federation.settings import KubeSettings, MqttSettings, SigningSettings
from tests import keys
from tests.waiting import eventually

__all__ = ["eventually"]  # re-exported: the dispatcher's tests import it from here

PYTORCHJOBS = Resource("kubeflow.org", "v1", "pytorchjobs", "PyTorchJob")

PYTORCH_CRD: dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
    "metadata": {"name": "pytorchjobs.kubeflow.org"},
    "spec": {
        "group": "kubeflow.org", "scope": "Namespaced",
        "names": {"plural": "pytorchjobs", "singular": "pytorchjob", "kind": "PyTorchJob", "listKind": "PyTorchJobList"},
        "versions": [{"name": "v1", "served": True, "storage": True, "subresources": {"status": {}},
                      "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}}],
    },
}


def pytorchjob(name: str, *, managed_by: str | None = labels.MULTIKUEUE, workers: int = 1, cpu: str = "1",
               gpu: int = 0, suspend: bool | None = None, namespace: str = "default") -> dict[str, Any]:
    requests: dict[str, Any] = {"cpu": cpu, "memory": "1Gi"}
    if gpu:
        requests["nvidia.com/gpu"] = str(gpu)

    def replica(n: int) -> dict[str, Any]:
        return {"replicas": n, "restartPolicy": "OnFailure", "template": {"spec": {"containers": [
            {"name": "pytorch", "image": "example/train:1", "resources": {"requests": dict(requests)}}]}}}
    run_policy: dict[str, Any] = {}
    if managed_by is not None:
        run_policy["managedBy"] = managed_by
    if suspend is not None:
        run_policy["suspend"] = suspend
    specs = {"Master": replica(1)}
    if workers:
        specs["Worker"] = replica(workers)
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"runPolicy": run_policy, "pytorchReplicaSpecs": specs}}


async def install_crd(kubeconfig: Path) -> None:
    async with Kube(kubeconfig) as kube:
        await kube.create(CRDS, copy.deepcopy(PYTORCH_CRD))
        await eventually(lambda: kube.served(PYTORCHJOBS), what="the PyTorchJob CRD to be served")


def settings(kubeconfig: Path, database_url: str, mqtt_url: str, topic_root: str, **extra: Any) -> DispatcherSettings:
    """The dispatcher signs with ``keys.DISPATCHER`` and trusts worker-1 .. worker-9 (``keys.cluster_keys``)."""
    extra.setdefault("signing", SigningSettings(private_key=keys.private(keys.DISPATCHER)))
    extra.setdefault("cluster_public_keys", keys.cluster_keys())
    return DispatcherSettings(
        kube=KubeSettings(kubeconfig=kubeconfig),
        database_url=database_url,
        mqtt=MqttSettings(url=mqtt_url, topic_root=topic_root, client_id=f"d-{uuid.uuid4().hex[:8]}"),
        **extra,
    )


@contextlib.asynccontextmanager
async def running(s: DispatcherSettings, **kwargs: Any) -> AsyncIterator[Dispatcher]:
    """A dispatcher running in the background; stopped (and its failure raised) on exit."""
    stop = asyncio.Event()
    async with Dispatcher(s, **kwargs) as d:
        task = asyncio.create_task(d.run(stop))
        try:
            yield d
        finally:
            stop.set()
            await asyncio.wait_for(task, 20)


def is_place(payload: bytes) -> bool:
    """Whether an outbox payload is a Place Command, in the clear or sealed to its cluster's key (only
    Places are sealed)."""
    return payload.startswith((b'{"v":1,"type":"place"', b'{"v":1,"type":"sealed"'))


def capacity(cpu: str = "64", memory: str = "256Gi", gpu: int = 0, node_cpu: str | None = None) -> messages.Capacity:
    alloc = {"cpu": cpu, "memory": memory, "pods": "1000"}
    if gpu:
        alloc["nvidia.com/gpu"] = str(gpu)
    largest = dict(alloc)
    if node_cpu:
        largest["cpu"] = node_cpu
    return messages.Capacity(allocatable=alloc, free=dict(alloc), largest_node_free=largest)


class FakeAgent:
    """Subscribes to one cluster's commands; heartbeats; answers Place with Accepted when ``auto_accept``."""

    def __init__(self, name: str, mqtt_url: str, topic_root: str, *, cap: messages.Capacity | None = None,
                 auto_accept: bool = True, beat_every: float | None = None) -> None:
        self.name = name
        self.root = topic_root
        self.settings = MqttSettings(url=mqtt_url, topic_root=topic_root)
        self.cap = cap or capacity()
        self.auto_accept = auto_accept
        self.beat_every = beat_every
        self._beats: asyncio.Task[None] | None = None
        self.commands: list[messages.Place | messages.Delete | messages.Resync] = []
        self.leases: list[messages.Lease] = []
        self.messages: list[int] = []
        """Per message received on the commands topic, how many Commands it carried."""
        self.seq = 0
        self.link: MqttLink | None = None
        self._task: asyncio.Task[None] | None = None
        self.received = asyncio.Event()
        self.policy: Any = None
        """The worker policy this agent announces (``federation.policy.PolicySettings``); None: none."""
        self.signer = keys.Signer(name)
        """Reports leave sealed with this cluster's test key, as the real agent's do."""

    def places(self) -> list[messages.Place]:
        return [c for c in self.commands if isinstance(c, messages.Place)]

    def deletes(self) -> list[messages.Delete]:
        return [c for c in self.commands if isinstance(c, messages.Delete)]

    async def __aenter__(self) -> FakeAgent:
        self.link = await MqttLink(self.settings, client_id=f"agent-{self.name}-{uuid.uuid4().hex[:6]}",
                                   persistent=False).__aenter__()
        await self.link.subscribe(topics.commands(self.name, self.root))
        self._task = asyncio.create_task(self._listen())
        await self.heartbeat()
        if self.beat_every:
            self._beats = asyncio.create_task(self._beat())
        return self

    async def _beat(self) -> None:
        assert self.beat_every
        while True:
            await asyncio.sleep(self.beat_every)
            await self.heartbeat()

    def stop_beating(self) -> None:
        if self._beats is not None:
            self._beats.cancel()

    async def __aexit__(self, *exc: object) -> None:
        self.stop_beating()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        if self.link is not None:
            await self.link.__aexit__(None, None, None)

    async def heartbeat(self, online: bool = True) -> None:
        assert self.link is not None
        hb = messages.Heartbeat(cluster=self.name, online=online, capacity=self.cap, agent_version="fake",
                                policy=self.policy)
        topic = topics.presence(self.name, self.root)
        await self.link.publish(topic, self.signer.seal(topic, messages.encode(hb)), retain=True)

    async def report(self, msg: messages.Accepted | messages.Rejected | messages.Status | messages.Inventory) -> None:
        assert self.link is not None
        topic = topics.reports(self.name, self.root)
        await self.link.publish(topic, self.signer.seal(topic, messages.encode(msg)))

    async def report_batch(self, msgs: list[messages.ReportBase]) -> None:
        """Several Reports in one message, numbered on this agent's stream, as the agent's outbox sends them
        (the dispatcher then knows it opens batched Commands too)."""
        assert self.link is not None
        topic = topics.reports(self.name, self.root)
        parts = [messages.encode_numbered(m, self.signer.stream, next(self.signer._n)) for m in msgs]
        await self.link.publish(topic, self.signer.seal(topic, messages.encode_reports(parts)))

    def next_seq(self) -> int:
        self.seq += 1
        return self.seq

    async def status(self, place: messages.Place, status: dict[str, Any], *, seq: int | None = None,
                     finished: Any = None, gone: bool = False) -> None:
        await self.report(messages.Status(cluster=self.name, placement=place.placement,
                                          seq=self.next_seq() if seq is None else seq, status=status,
                                          finished=finished, gone=gone))

    async def _listen(self) -> None:
        assert self.link is not None
        async for msg in self.link.messages():
            items = keys.unseal_all(msg.payload, msg.topic)
            self.messages.append(len(items))
            for item in items:
                cmd = messages.decode_command(item)
                if isinstance(cmd, messages.Lease):  # a renewal per heartbeat (fencing): kept apart
                    self.leases.append(cmd)
                    continue
                self.commands.append(cmd)
                self.received.set()
                if isinstance(cmd, messages.Place) and self.auto_accept:
                    await self.report(messages.Accepted(cluster=self.name, placement=cmd.placement,
                                                        spec_version=cmd.spec_version, seq=self.next_seq()))
